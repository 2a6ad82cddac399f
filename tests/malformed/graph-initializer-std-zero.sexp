; expect: E-FORM-011 at 4:48
; message: :std must be greater than 0
(defgraph mlp (x)
  (linear x :out 3 :as head :init (normal :std 0)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
