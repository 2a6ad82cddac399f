; expect: E-GRAPH-002 at 8:4
; message: tahn
; message: tanh
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph layer (x) :out 8
  (tahn (linear x :out out :as fc)))
(defgraph net (x)
  (linear (layer x :as l1) :out 1 :as head))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
