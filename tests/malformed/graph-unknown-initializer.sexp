; expect: E-FORM-001 at 4:36
; message: Did you mean 'normal'?
(defgraph mlp (x)
  (linear x :out 3 :as head :init (normall :std 0.1)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
