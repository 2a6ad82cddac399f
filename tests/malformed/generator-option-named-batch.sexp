; expect: E-FORM-013 at 3:23
; message: given by the language
(defgenerator teacher :batch 8
  (record :x (normal (batch 4))))
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (generator teacher)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
