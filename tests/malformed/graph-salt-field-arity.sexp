; expect: E-FORM-009 at 4:34
; message: one record field name
(defgraph mlp (x)
  (dropout x :p 0.1 :salt (:step (field))))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
