; expect: E-FORM-007 at 11:20
; message: Did you mean 'teacher'?
(defgenerator teacher :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (generator techer)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
