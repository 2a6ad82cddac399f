; cnn: examples/cnn.sexp (bright bars across or down a 12x12 image, drawn by a generator)
; with its 32 images a step as 4 microbatches of 8: convolutions, pooling and their
; gradients, and on a GPU the cuDNN engines among the machine's choices.

(defgenerator bars :size 12 :noise 0.4 :sharpness 40
  (let rows (uniform (batch 1 size 1) :salt (:step :trip)))
  (let cols (uniform (batch 1 1 size) :salt (:step :trip)))
  (let across (exp (mul (sub rows (max rows :axis 2 :keep true)) sharpness)))
  (let down (exp (mul (sub cols (max cols :axis 3 :keep true)) sharpness)))
  (let label (cast (bernoulli (batch) :p 0.5 :salt (:step :trip)) f32))
  (let pick (reshape label (batch 1 1 1)))
  (let bars (add (mul pick (broadcast across (batch 1 size size)))
                 (mul (sub 1 pick) (broadcast down (batch 1 size size)))))
  (record :x (add bars (normal (batch 1 size size) :std noise :salt (:step :trip)))
          :y (cast label i32)))

(defgraph cnn (x) :width 8 :wide 16 :classes 2
  (let h1 (max-pool (relu (conv2d x :out width :kernel 3 :padding 1 :as conv1)) :kernel 2))
  (let h2 (relu (conv2d h1 :out wide :kernel 3 :padding 1 :as conv2)))
  (let pooled (avg-pool h2 :kernel 6))
  (linear (reshape pooled (batch -1)) :out classes :as head))

(defrun cnn
  :seed 20261201
  :data (generator bars)
  :model (cnn x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 8
  :microbatches 4
  :steps 120
  :passes ((eval :every 60 :batches 4))
  :checkpoint 60)
