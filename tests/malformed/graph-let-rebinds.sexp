; expect: E-FORM-013 at 6:8
; message: already bound
; message: :5:8)
(defgraph mlp (x)
  (let h (relu x))
  (let h (tanh h))
  h)
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
