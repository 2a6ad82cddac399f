; expect: E-FORM-002 at 4:27
; message: Did you mean ':step'?
(defgraph mlp (x)
  (dropout x :p 0.1 :salt :stpe))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
