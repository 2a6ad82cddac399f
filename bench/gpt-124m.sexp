; gpt-124m: GPT-2 small's shape (12 layers, width 768, 12 heads, context 1024, a vocabulary
; of 50304 tokens: GPT-2's 50257 rounded up to a multiple of 64), batch 8, on random tokens.
; Its head is not tied to its embedding, so it holds about 163M parameters (GPT-2 small's
; 124M, plus a second 768 x 50304 matrix). The CUDA benchmark's largest model:
; bench/bench_cuda.py times its steps against PyTorch.
;   sexpgpu run bench/gpt-124m.sexp --device cuda

(defgenerator tokens :vocab 50304 :context 1024
  (let text (randint (batch 1025) :low 0 :high vocab :salt (:step :trip)))
  (record :x (slice text :axis 1 :start 0 :stop context)
          :y (slice text :axis 1 :start 1 :stop 1025)))

(defgraph block (x) :width 768 :heads 12 :ff 3072
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph gpt (x) :vocab 50304 :context 1024 :width 768 :heads 12 :ff 3072 :layers 12
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun gpt-124m
  :seed 11
  :data (generator tokens)
  :model (gpt x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.0003 :weight-decay 0.01 :clip 1.0)
  :schedule (cosine :warmup 10 :min-lr 0.00003)
  :batch 8
  :steps 20)
