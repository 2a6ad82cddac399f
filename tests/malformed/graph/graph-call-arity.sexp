; expect: E-GRAPH-003 at 9:11
; message: layer
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph layer (a b)
  (add a b))
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
