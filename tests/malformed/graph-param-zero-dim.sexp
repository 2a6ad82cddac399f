; expect: E-FORM-011 at 4:23
; message: at least 1
(defgraph mlp (x)
  (matmul x (param w (0 3) :init zeros)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
