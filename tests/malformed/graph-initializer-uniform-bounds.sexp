; expect: E-FORM-011 at 4:35
; message: :low less than :high
(defgraph mlp (x)
  (linear x :out 3 :as head :init (uniform :low 1 :high -1)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
