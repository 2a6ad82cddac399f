; expect: E-SHAPE-001 at 14:9
; message: (8 3)
; message: (8 1)
; the model gives (8 3) and the target y is (8 1); the loss is reported where :loss names it
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (linear x :out 3 :as fc))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
