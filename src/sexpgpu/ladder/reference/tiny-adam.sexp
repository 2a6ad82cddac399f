; tiny-adam, the ladder's first tier: examples/tiny-adam.sexp with its 64 records a step
; split into 4 microbatches of 16, so that stacking 1, 2 and 4 are choices a machine can make.

(defgraph mlp (x) :hidden 64 :classes 3
  (let h1 (relu (linear x :out hidden :as fc1)))
  (let h2 (relu (linear h1 :out hidden :as fc2)))
  (linear h2 :out classes :as head))

(defrun tiny-adam
  :seed 20261129
  :data (records "data/spirals.npz" :shuffle true)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :schedule (cosine :warmup 10 :min-lr 0.001)
  :batch 16
  :microbatches 4
  :steps 200
  :passes ((eval :every 50 :batches 4))
  :checkpoint 100)
