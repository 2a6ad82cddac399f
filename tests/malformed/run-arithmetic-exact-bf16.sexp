; expect: E-FORM-011 at 6:1
; message: :arithmetic exact computes in float32, and :precision bf16 rounds products to bf16
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10
  :precision bf16
  :arithmetic exact)
