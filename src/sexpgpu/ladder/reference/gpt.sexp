; gpt: bench/gpt-50m.sexp cut to a quarter of its size for the GPU ladder (4 layers of
; width 384, 6 heads, a context of 256 and a vocabulary of 8192 random tokens, about 13M
; parameters), 16 sequences a step as 4 microbatches of 4: the long float32 products, whose
; implementations (ordinary, transposed, split-K) are among the machine's choices.

(defgenerator tokens :vocab 8192 :context 256
  (let text (randint (batch 257) :low 0 :high vocab :salt (:step :trip)))
  (record :x (slice text :axis 1 :start 0 :stop context)
          :y (slice text :axis 1 :start 1 :stop 257)))

(defgraph block (x) :width 384 :heads 6 :ff 1536
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph gpt (x) :vocab 8192 :context 256 :width 384 :heads 6 :ff 1536 :layers 4
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun gpt
  :seed 11
  :data (generator tokens)
  :model (gpt x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.0003 :weight-decay 0.01 :clip 1.0)
  :schedule (cosine :warmup 10 :min-lr 0.00003)
  :batch 4
  :microbatches 4
  :steps 100
  :passes ((eval :every 50 :batches 2))
  :checkpoint 50)
