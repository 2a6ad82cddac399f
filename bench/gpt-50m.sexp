; gpt-50m: a GPT-style causal transformer of about 50M parameters (8 layers, width 512,
; 8 heads, context 512, batch 32, a vocabulary of 24576 tokens) on random tokens.
; The CUDA benchmark's large model: bench/bench_cuda.py times its steps.
;   sexpgpu run bench/gpt-50m.sexp --device cuda

(defgenerator tokens :vocab 24576 :context 512
  (let text (randint (batch 513) :low 0 :high vocab :salt (:step :trip)))
  (record :x (slice text :axis 1 :start 0 :stop context)
          :y (slice text :axis 1 :start 1 :stop 513)))

(defgraph block (x) :width 512 :heads 8 :ff 2048
  (let attended (add x (attention (layernorm x :as ln1) :heads heads :as attn)))
  (let hidden (gelu (linear (layernorm attended :as ln2) :out ff :as up)))
  (add attended (linear hidden :out width :as down)))

(defgraph gpt (x) :vocab 24576 :context 512 :width 512 :heads 8 :ff 2048 :layers 8
  (let tokens (embedding x :vocab vocab :dim width :as embed))
  (let positions (param positions (context width) :init (normal :std 0.02)))
  (let h (repeat layers block (add tokens positions) :as block :width width :heads heads :ff ff))
  (linear (layernorm h :as final-norm) :out vocab :as head))

(defrun gpt-50m
  :seed 11
  :data (generator tokens)
  :model (gpt x)
  :loss (cross-entropy y)
  :optimizer (adamw :lr 0.0003 :weight-decay 0.01 :clip 1.0)
  :schedule (cosine :warmup 10 :min-lr 0.00003)
  :batch 32
  :steps 20)
