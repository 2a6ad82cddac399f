; expect: E-FORM-011 at 4:24
; message: :p of (dropout ...) must be at least 0 and less than 1
(defgraph mlp (x)
  (dropout (relu x) :p 1.5))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
