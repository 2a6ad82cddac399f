; expect: E-GRAPH-001 at 9:11
; message: hiden
; the name is reported where it is used
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (let hidden (relu (linear x :out 8 :as fc1)))
  (linear hiden :out 1 :as fc2))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
