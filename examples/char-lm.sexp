; char-lm: a small causal transformer learns the bytes of CPython's own documentation
; (pydoc_data.topics, shipped with every Python).
;   sexpgpu run examples/char-lm.sexp

(defgraph block (x) :width 64 :heads 4 :ff 256
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph char-lm (x) :vocab 256 :context 64 :width 64 :heads 4 :ff 256 :layers 2
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun char-lm
  :seed 7
  :data (text pydoc :context 64)
  :model (char-lm x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.003 :weight-decay 0.01 :clip 1.0)
  :schedule (cosine :warmup 20 :min-lr 0.0003)
  :batch 16
  :steps 200
  :passes ((eval :every 50 :batches 2)))
