; expect: E-FORM-008 at 12:11
; message: is a defgenerator
(defgenerator teacher :width 4
  (let x (normal (batch width) :salt (:step)))
  (record :x x :y (sum x :axis 1 :keep true)))
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (teacher x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
