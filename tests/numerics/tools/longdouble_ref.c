/* Reference float32 results from x87 long double (64-bit significand), for the dev-time
   exhaustive check (exhaustive_cpu.py, through ctypes).

   reference(fn, in, out, unsure, ours, err, n): for each float32 bit pattern in[i],
   out[i] is f(x) rounded to float32 (nearest even) from the long double value, unsure[i]
   is 1 when that value lies within 2^-34 float32 ulps of a rounding midpoint (the long
   double is not accurate enough to decide, and mpmath must), and err[i] is the distance of
   ours[i] (our float64 before its rounding) from the long double value, in float64 ulps,
   where the float32 result is finite, nonzero and not +-1 (elsewhere the algorithms clamp
   their argument and only the rounded result is meaningful).
   Build: gcc -O2 -shared -fPIC -o libref.so longdouble_ref.c -lm */
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef long double ld;

static ld apply(int fn, ld x) {
    switch (fn) {
    case 0: return expl(x);
    case 1: return expm1l(x);
    case 2: return logl(x);
    case 3: return log1pl(x);
    case 4: return tanhl(x);
    case 5: return 1.0L / (1.0L + expl(-x));
    case 6: return erfl(x);
    case 7: return cosl(x);
    case 8: return sinl(x);
    case 9: return 1.0L / sqrtl(x);
    }
    return NAN;
}

static ld midpoint_distance(ld a) {
    int e;
    a = fabsl(a);
    if (a == 0.0L || !isfinite(a)) return 1.0L;
    frexpl(a, &e);
    if (e > 128) return 1.0L;
    int ulp_exp = e - 24 < -149 ? -149 : e - 24;
    ld q = ldexpl(a, -ulp_exp);
    return fabsl(q - floorl(q) - 0.5L);
}

void reference(int fn, const uint32_t *in, uint32_t *out, uint8_t *unsure, const double *ours,
               double *err, long n) {
    const ld limit = ldexpl(1.0L, -34);
    for (long i = 0; i < n; i++) {
        float x, r;
        memcpy(&x, &in[i], 4);
        ld y = apply(fn, (ld)x);
        r = (float)y;
        memcpy(&out[i], &r, 4);
        if (r != r) out[i] = 0x7FC00000u;
        unsure[i] = midpoint_distance(y) < limit;
        err[i] = 0.0;
        if (isfinite(r) && r != 0.0f && fabsf(r) != 1.0f && isfinite(ours[i])) {
            int e;
            frexpl(y, &e);
            int ulp_exp = e - 53 < -1074 ? -1074 : e - 53;
            err[i] = (double)(fabsl((ld)ours[i] - y) / ldexpl(1.0L, ulp_exp));
        }
    }
}
