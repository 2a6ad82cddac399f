; expect: E-FORM-014 at 14:14
; message: 'target'
; message: x, y
(defgenerator teacher :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (generator teacher)
  :model (mlp x)
  :loss (mse target)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
