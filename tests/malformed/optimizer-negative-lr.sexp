; expect: E-FORM-011 at 11:23
; message: :lr must be greater than 0
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (sgd :lr -0.1)
  :batch 4
  :steps 10)
