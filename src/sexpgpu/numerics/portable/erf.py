"""erf: a Taylor series below 1, and 1 - exp(-x^2) erfcx(x) from 1 to 4.

Below 1 the series (2/sqrt(pi)) sum (-1)^n x^(2n+1) / (n! (2n+1)) through n = 18 is
truncated below 2^-62. On [1, 4], erfcx(x) = exp(x^2) erfc(x) is a degree-22 polynomial in
s = x - 5/2 (tests/numerics/tools/fit_erfcx.py, 2^-51.3 relative in float64), x^2 is exact,
and the product is at most 0.16, so its error stays far below the result's ulp. From 4 on,
erf rounds to 1.
"""

from . import numpy_ops as K
from .exp import clamp_f32, exp_f64, finish
from .ieee import absolute, f32_to_f64, horner_either, neg
from .tables import ERF_CASES

ERF_T = (1.1283791670955126, -0.37612638903183754, 0.11283791670955126,
         -0.026866170645131252, 0.005223977625442188, -0.0008548327023450853,
         0.00012055332981789664, -1.492565035840625e-05, 1.6462114365889248e-06,
         -1.6365844691234924e-07, 1.4807192815879218e-08, -1.2290555301717928e-09,
         9.422759064650411e-11, -6.7113668551641105e-12, 4.4632242632864775e-13,
         -2.7835162072109215e-14, 1.6342614095367152e-15, -9.063970842808673e-17,
         4.763348040515068e-18)
ERFCX_G = (0.2108063640611436, -0.07434734678979495, 0.02493799708665696, -0.008001569382090781, 0.0024670368156992977, -0.0007335909372640017, 0.00021101982430921638, -5.8868964030705185e-05, 1.5961853006132e-05, -4.214297919719682e-06, 1.0852230313786508e-06, -2.7294910415707813e-07, 6.713949125870635e-08, -1.617358802372231e-08, 3.817410913620512e-09, -8.807216258471182e-10, 2.0031019435942918e-10, -4.633682738083616e-11, 1.0146551782430207e-11, -1.6954156353454019e-12, 3.6677267755511203e-13, -1.6538069435089902e-13, 3.3641269918883144e-14)

ERF_T_PADDED = ERF_T + (0.0,) * (len(ERFCX_G) - len(ERF_T))


def erf_f32(bits, tab):
    x = f32_to_f64(bits)
    a = clamp_f32(absolute(x), bits & 0x7FFFFFFF, 0.0, 4.0)
    w = a * a
    small = a < 1.0
    # one Horner evaluation for both ranges; the series' missing top coefficients are zeros,
    # which leave its value exactly as a Horner evaluation of its own coefficients
    p = horner_either(K.where(small, w, a - 2.5), small, ERF_T_PADDED, ERFCX_G)
    y = K.where(small, a * p, 1.0 - exp_f64(neg(w), 0.0) * p)
    y = K.where(x < 0.0, neg(y), K.where(x == 0.0, x, y))
    return finish(bits, x != x, y, 0.0, tab, ERF_CASES)
