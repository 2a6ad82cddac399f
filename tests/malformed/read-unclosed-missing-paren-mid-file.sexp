; expect: E-READ-001 at 5:1
; message: is a ')' missing before it
; message: on line 9
; the defgraph lacks its last ')'; the hint names the line of the defrun
(defgraph mlp (x)
  (let h (relu x))
  (linear h :out 3 :as head)

(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
