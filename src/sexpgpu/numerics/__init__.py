"""Portable numerics: counter-based draws and correctly rounded float32 math.

Every draw and every function gives the same bits on the CPU (numpy) and on CUDA (Triton):
one source of float64 algorithms, using only IEEE + - * / and sqrt without fused
multiply-adds, runs on both (see retarget.py and docs/numerics.md). A leaf library: it
imports nothing else of sexpgpu, and needs only numpy (torch and triton for tensors).
"""

from sexpgpu.numerics.counter import philox4x32
from sexpgpu.numerics.functions import cos, erf, exp, expm1, log, log1p, pow, rsqrt, sigmoid, sin, tanh
from sexpgpu.numerics.initializers import PARAMETERS as INITIALIZERS
from sexpgpu.numerics.initializers import fans, initialize
from sexpgpu.numerics.keys import Key, fold_in, stream_key
from sexpgpu.numerics.sampling import PARAMETERS as DRAW_PARAMETERS
from sexpgpu.numerics.sampling import DrawSpec, bernoulli, draw, draw_spec, normal, randint, truncated_normal, uniform
from sexpgpu.numerics.device_draws import draw_args, draw_into, fold_keys
