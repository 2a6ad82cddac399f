; teacher-student: a generator draws a fixed random teacher network once, then a fresh
; microbatch of inputs every step; a student learns to imitate the teacher.
;   sexpgpu run examples/teacher-student.sexp

(defgenerator teacher :width 16 :hidden 32 :out 4
  (let w1 (normal (width hidden) :std 0.25))          ; unsalted: the same teacher at every step
  (let w2 (normal (hidden out) :std 0.18))
  (let x (normal (batch width) :salt (:step :trip)))  ; a new microbatch at every step and pass batch
  (record :x x :y (matmul (tanh (matmul x w1)) w2)))

(defgraph student (x) :hidden 64 :out 4
  (linear (tanh (linear x :out hidden :as fc1)) :out out :as fc2))

(defrun teacher-student
  :seed 3
  :data (generator teacher)
  :model (student x)
  :loss (mse y)
  :optimizer (momentum :lr 0.05 :momentum 0.9 :clip 5.0)
  :batch 64
  :steps 150
  :passes ((eval :every 50 :batches 4)))
