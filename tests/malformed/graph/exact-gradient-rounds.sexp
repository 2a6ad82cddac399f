; expect: E-EXACT-002 at 6:81
; message: the gradient grad/s must stay exact
; message: 'mul'
(defgraph net (x) :classes 256
  (let s (param s (256) :init ones))
  (mul (linear (embedding x :vocab 256 :dim 4 :as embed) :out classes :as head) (mul s s)))
(defrun tiny
  :seed 1
  :data (text pydoc :context 8)
  :model (net x)
  :loss (cross-entropy y)
  :optimizer (adam :lr 0.01)
  :batch 4
  :steps 10
  :arithmetic exact)
