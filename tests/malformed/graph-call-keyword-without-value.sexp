; expect: E-FORM-010 at 4:20
; message: :as in (linear ...) has no value
(defgraph mlp (x)
  (linear x :out 3 :as))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
