; expect: E-SHAPE-001 at 10:13
; message: (3 4)
; message: (5 4)
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (let a (param a (3 4) :init zeros))
  (let b (param b (5 4) :init zeros))
  (add (sum (add a b)) (linear x :out 1 :as fc)))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
