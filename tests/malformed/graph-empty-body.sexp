; expect: E-FORM-012 at 3:28
; message: has no body
(defgraph mlp (x) :hidden 4)
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
