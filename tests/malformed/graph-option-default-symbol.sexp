; expect: E-FORM-003 at 3:24
; message: the default of option :act
(defgraph mlp (x) :act relu
  (relu x))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (mlp x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10)
