; tiny-adam: a small perceptron learns to tell three interleaved spirals apart.
; It trains in a few seconds on two CPU cores:
;   sexpgpu run examples/tiny-adam.sexp

(defgraph mlp (x) :hidden 64 :classes 3
  (let h1 (relu (linear x :out hidden :as fc1)))
  (let h2 (relu (linear h1 :out hidden :as fc2)))
  (linear h2 :out classes :as head))

(defrun tiny-adam
  :seed 20261129
  :data (records "data/spirals.npz" :shuffle true)   ; fields x (2 floats) and y (a class)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :schedule (cosine :warmup 10 :min-lr 0.001)
  :batch 64
  :steps 200
  :passes ((eval :every 50 :batches 4))
  :checkpoint 100)
