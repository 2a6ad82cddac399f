"""Fit the polynomial of erf's middle range: erfcx(x) = exp(x^2) erfc(x) on [1, 4].

Chebyshev interpolation at 200 bits, converted to monomials in s = x - 5/2 and rounded to
float64; prints the coefficients for portable/erf.py and the worst relative error of the
float64 Horner evaluation on a fine grid. Run: python tests/numerics/tools/fit_erfcx.py
"""

import mpmath as mp

mp.mp.prec = 200
LOW, HIGH, DEGREE = 1, 4, 22
CENTER = mp.mpf(LOW + HIGH) / 2
HALF = mp.mpf(HIGH - LOW) / 2


def erfcx(x):
    return mp.exp(x * x) * mp.erfc(x)


def fit():
    n = DEGREE
    nodes = [mp.cos(mp.pi * (k + mp.mpf(1) / 2) / (n + 1)) for k in range(n + 1)]
    matrix = mp.matrix([[t**j for j in range(n + 1)] for t in nodes])
    coef = mp.lu_solve(matrix, mp.matrix([erfcx(CENTER + HALF * t) for t in nodes]))
    return [float(coef[j] / HALF**j) for j in range(n + 1)]


def horner(s, coefs):
    p = s * coefs[-1] + coefs[-2]
    for c in reversed(coefs[:-2]):
        p = p * s + c
    return p


def main():
    coefs = fit()
    worst = 0
    for i in range(20001):
        x = LOW + (HIGH - LOW) * i / 20000
        s = x - float(CENTER)
        worst = max(worst, abs(mp.mpf(horner(s, coefs)) / erfcx(mp.mpf(x)) - 1))
    print("ERFCX_G = (" + ", ".join(repr(c) for c in coefs) + ")")
    print("worst relative error: 2^%.2f" % float(mp.log(worst, 2)))


if __name__ == "__main__":
    main()
