; expect: E-SHAPE-001 at 9:3
; message: (8 4)
; message: (5 1)
; x is (batch width) = (8 4): its last axis does not meet w's first
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (matmul x (param w (5 1) :init zeros)))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
