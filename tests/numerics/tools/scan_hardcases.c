/* Exhaustive scan of binary32 inputs for values close to a float32 rounding midpoint.

   For each finite input x in the scanned range, f(x) is evaluated in x87 long double
   (64-bit significand) and a line is printed when d = |f(x) - m| / ulp is below 2^-26,
   where m is the nearest float32 rounding midpoint and ulp the float32 spacing there.
   The format is the one of ../shared/numerics/hardcases/*.txt, so check_candidates.py
   can re-check every line at 200 bits with mpmath.

   Build: gcc -O2 -o scan scan_hardcases.c -lm
   Run:   ./scan FUNCTION FIRST LAST      (inclusive bit patterns, hex)
   FUNCTION is one of cos sin expm1 log1p sigmoid. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef long double ld;

static ld f_cos(ld x) { return cosl(x); }
static ld f_sin(ld x) { return sinl(x); }
static ld f_expm1(ld x) { return expm1l(x); }
static ld f_log1p(ld x) { return log1pl(x); }
static ld f_sigmoid(ld x) { return 1.0L / (1.0L + expl(-x)); }

/* distance from y to the nearest float32 rounding midpoint, in float32 ulps; -1 if none */
static ld midpoint_distance(ld y) {
    ld a = fabsl(y);
    int e;
    if (a == 0.0L || a != a) return -1.0L;
    frexpl(a, &e);                 /* a in [2^(e-1), 2^e) */
    if (e > 128) return -1.0L;     /* rounds to infinity */
    int ulp_exp = e - 24 < -149 ? -149 : e - 24;
    ld q = ldexpl(a, -ulp_exp);    /* exact */
    return fabsl(q - floorl(q) - 0.5L);
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: scan FUNCTION FIRST LAST\n"); return 2; }
    ld (*f)(ld) = NULL;
    const char *name = argv[1];
    if (!strcmp(name, "cos")) f = f_cos;
    else if (!strcmp(name, "sin")) f = f_sin;
    else if (!strcmp(name, "expm1")) f = f_expm1;
    else if (!strcmp(name, "log1p")) f = f_log1p;
    else if (!strcmp(name, "sigmoid")) f = f_sigmoid;
    else { fprintf(stderr, "unknown function %s\n", name); return 2; }
    uint64_t first = strtoull(argv[2], NULL, 16), last = strtoull(argv[3], NULL, 16);
    const ld limit = ldexpl(1.0L, -26);
    ld bound[16];
    uint64_t hist[16] = {0};
    for (int k = 0; k < 16; k++) bound[k] = ldexpl(1.0L, -20 - k);
    for (uint64_t b = first; b <= last; b++) {
        uint32_t bits = (uint32_t)b;
        float x;
        memcpy(&x, &bits, 4);
        if (!isfinite(x)) continue;
        ld d = midpoint_distance(f((ld)x));
        if (d < 0.0L) continue;
        for (int k = 0; k < 16 && d < bound[k]; k++) hist[k]++;
        if (d < limit) {
            ld y = f((ld)x);
            printf("CAND %s x=%a (0x%08x) d=2^%.2Lf y=%La\n", name, (double)x, bits,
                   log2l(d), y);
            fflush(stdout);
        }
    }
    for (int k = 0; k < 16; k++)
        if (hist[k]) printf("HIST %s d<2^-%d : %llu\n", name, 20 + k, (unsigned long long)hist[k]);
    return 0;
}
