; expect: E-FORM-002 at 7:3
; message: Did you mean ':seed'?
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :sed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
