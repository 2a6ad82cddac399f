; expect: E-FORM-004 at 4:13
; message: neither :init nor :load
(defgraph mlp (x)
  (matmul x (param w (8 3))))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
