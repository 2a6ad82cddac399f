; expect: E-FORM-012 at 4:9
; message: only appear at the top
(defgraph mlp (x)
  (relu (let y x)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
