; expect: E-DTYPE-001 at 9:11
; message: f32
; message: bf16
(defgenerator points :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph net (x)
  (let a (param a (4) :init zeros :dtype bf16))
  (linear (add x a) :out 1 :as fc))
(defrun fit
  :seed 5
  :data (generator points)
  :model (net x)
  :loss (mse y)
  :optimizer (sgd :lr 0.1)
  :batch 8
  :steps 4)
