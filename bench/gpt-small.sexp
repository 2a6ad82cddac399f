; gpt-small: bench/gpt-50m.sexp at about a seventh of its size (4 layers, width 256, 4 heads,
; context 256, batch 16, a vocabulary of 8192 tokens; about 7M parameters), on random tokens.
; bench/bench_exact_mode.py --model gpt-small times :arithmetic exact on it, for when
; gpt-50m's exact step is too slow to time in a minute.
;   sexpgpu run bench/gpt-small.sexp --device cuda

(defgenerator tokens :vocab 8192 :context 256
  (let text (randint (batch 257) :low 0 :high vocab :salt (:step :trip)))
  (record :x (slice text :axis 1 :start 0 :stop context)
          :y (slice text :axis 1 :start 1 :stop 257)))

(defgraph block (x) :width 256 :heads 4 :ff 1024
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph gpt (x) :vocab 8192 :context 256 :width 256 :heads 4 :ff 1024 :layers 4
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun gpt-small
  :seed 11
  :data (generator tokens)
  :model (gpt x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.0003 :weight-decay 0.01 :clip 1.0)
  :schedule (cosine :warmup 10 :min-lr 0.00003)
  :batch 16
  :steps 20)
