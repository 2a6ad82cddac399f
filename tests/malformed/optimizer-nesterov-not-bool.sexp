; expect: E-FORM-003 at 11:42
; message: true or false
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (momentum :lr 0.1 :nesterov yes)
  :batch 4
  :steps 10)
