; expect: E-FORM-011 at 4:28
; message: from 0 to 1
(defgraph mlp (x)
  (mul x (bernoulli (8) :p -0.2)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
