; expect: E-FORM-013 at 3:19
; message: already bound
(defgraph mlp (x) :x 3
  (relu x))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
