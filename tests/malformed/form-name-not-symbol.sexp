; expect: E-FORM-003 at 6:9
; message: expected a symbol for the name of a defrun
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrun "tiny" :seed 1)
