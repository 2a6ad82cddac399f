; expect: E-FORM-011 at 11:36
; message: :beta2 must be at least 0 and less than 1
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01 :beta2 1.0)
  :batch 4
  :steps 10)
