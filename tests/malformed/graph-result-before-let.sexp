; expect: E-FORM-012 at 4:3
; message: expected (let NAME EXPR)
(defgraph mlp (x)
  (relu x)
  (let h (tanh x))
  h)
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
