; expect: E-FORM-009 at 4:3
; message: takes a name and one expression
(defgraph mlp (x)
  (let h)
  (relu x))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
