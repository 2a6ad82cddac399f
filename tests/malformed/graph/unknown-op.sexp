; expect: E-GRAPH-002 at 9:12
; message: rellu
; message: relu
; an unknown op is reported at its name; other graph-stage errors at the '(' of the offending call
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (linear (rellu x) :out 1 :as fc))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
