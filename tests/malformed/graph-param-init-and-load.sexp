; expect: E-FORM-016 at 4:13
; message: both :init and :load
(defgraph mlp (x)
  (matmul x (param w (8 3) :init zeros :load "w.safetensors")))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
