; expect: E-FORM-011 at 14:15
; message: :arithmetic must be one of float, exact, found fast
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
  :arithmetic fast)
