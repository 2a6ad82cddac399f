; expect: E-FORM-012 at 5:3
; message: is a let
(defgraph mlp (x)
  (let h (relu x))
  (let out (linear h :out 3 :as head)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
