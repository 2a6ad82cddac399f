; char-lm: examples/char-lm.sexp made small enough for the CPU interpreter (one block of
; width 32, a context of 32 bytes, 4 microbatches of 4 sequences): embedding, layer norm,
; attention and AdamW with clipping on the bytes of CPython's own documentation.

(defgraph block (x) :width 32 :heads 2 :ff 64
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph char-lm (x) :vocab 256 :context 32 :width 32 :heads 2 :ff 64 :layers 1
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun char-lm
  :seed 7
  :data (text pydoc :context 32)
  :model (char-lm x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.003 :weight-decay 0.01 :clip 1.0)
  :schedule (cosine :warmup 20 :min-lr 0.0003)
  :batch 4
  :microbatches 4
  :steps 120
  :passes ((eval :every 60 :batches 2))
  :checkpoint 60)
