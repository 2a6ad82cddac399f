; expect: E-GRAPH-001 at 4:25
; message: wdth
(defgenerator points :width 4
  (let x (normal (batch wdth) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (linear x :out 1 :as fc))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
