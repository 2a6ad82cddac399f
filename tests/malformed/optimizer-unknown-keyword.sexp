; expect: E-FORM-002 at 11:29
; message: Did you mean ':beta1'?
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01 :beta 0.9)
  :batch 4
  :steps 10)
