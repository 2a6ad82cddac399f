; expect: E-READ-001 at 7:1
; message: never closed
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))

(defrun tiny :seed 1 :steps (add 1 2)
