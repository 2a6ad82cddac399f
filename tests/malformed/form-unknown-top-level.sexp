; expect: E-FORM-001 at 6:2
; message: Did you mean 'defrun'?
(defgraph mlp (x) :hidden 32 :classes 3
  (let h (relu (linear x :out hidden :as fc1)))
  (linear h :out classes :as head))
(defrn tiny :seed 1)
