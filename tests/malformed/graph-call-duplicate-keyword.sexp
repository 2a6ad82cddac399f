; expect: E-FORM-005 at 4:29
; message: given twice
(defgraph mlp (x)
  (linear x :out 3 :as head :out 4))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
