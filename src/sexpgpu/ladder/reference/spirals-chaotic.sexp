; spirals-chaotic: tiny-adam's perceptron trained at ten times its learning rate, held
; constant, on 4 microbatches of 12 records. Adam then never settles: a difference in the
; last bit of one step's gradient grows until the loss curves of two runs part.

(defgraph mlp (x) :hidden 64 :classes 3
  (let h1 (relu (linear x :out hidden :as fc1)))
  (let h2 (relu (linear h1 :out hidden :as fc2)))
  (linear h2 :out classes :as head))

(defrun spirals-chaotic
  :seed 20261129
  :data (records "data/spirals.npz" :shuffle true)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.1)
  :batch 12
  :microbatches 4
  :steps 150
  :passes ((eval :every 75 :batches 4))
  :checkpoint 75)
