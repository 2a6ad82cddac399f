; expect: E-FORM-011 at 4:47
; message: f32, bf16
(defgraph mlp (x)
  (matmul x (param w (8 3) :init zeros :dtype f16)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
