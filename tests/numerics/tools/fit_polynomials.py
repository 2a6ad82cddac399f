"""Fit the polynomials of exp and erf and write src/sexpgpu/numerics/portable/polynomials.py.

    python tests/numerics/tools/fit_polynomials.py > src/sexpgpu/numerics/portable/polynomials.py

Each polynomial is a weighted minimax fit (Remez exchange at 160 bits) rounded to float64:

- exp: 2^(u/64) - 1 = u q(u) on |u| <= 1/2, q of degree 3, weighted so that the fit bounds
  the absolute error of u q(u); and the 64 steps 2^(j/64), rounded to nearest.
- erf: P(w) with erf(x) = x P(x^2) for |x| < 1/2, P(0) the float64 nearest 2/sqrt(pi) and
  the rest fitted to the relative error of x P(x^2); and one polynomial in s = |x| - c for
  each of the 24 pieces of [1/2, 4) whose float32 bits share their top 12 (eight a binade),
  c the piece's midpoint, fitted to the absolute error of erf.

The comments of the written module give each fit's error measured on a grid with float64
Horner evaluation, in units of 2^-53 (relative for exp and small erf, absolute for the
pieces): the float64 value's error bound that docs/numerics.md relies on comes from the
exhaustive comparisons of tools/exhaustive_compare.py, not from these figures.
"""

import mpmath as mp

mp.mp.prec = 160
EXP_STEPS = 64
EXP_DEGREE = 4  # u q(u), q of degree 3
ERF_DEGREE = 7  # every piece of erf: 8 coefficients
ERF_FIRST_PIECE = 0x3F000000 >> 20  # 1/2: pieces by the top 12 bits of the float32
ERF_LAST_PIECE = 0x40800000 >> 20  # 4: from here on erf rounds to 1
GRID = 1500


def remez(f, weight, low, high, basis, iterations=30):
    """Coefficients of sum c_j basis_j minimizing max |weight (sum c_j basis_j - f)| on
    [low, high], and that maximum. basis: functions of s."""
    n = len(basis)
    # Chebyshev nodes, moved off the middle, where a weight may vanish
    points = [(low + high) / 2 - (high - low) / 2 * (mp.cos(mp.pi * (i + mp.mpf(1) / 2) / (n + 1)) - 0.01)
              for i in range(n + 1)]
    grid = [low + (high - low) * mp.mpf(i) / GRID for i in range(GRID + 1)]
    for _ in range(iterations):
        rows = [[b(s) for b in basis] + [(-1) ** i / weight(s)] for i, s in enumerate(points)]
        solution = mp.lu_solve(mp.matrix(rows), mp.matrix([f(s) for s in points]))
        coefs = [solution[j] for j in range(n)]

        def error(s):
            return weight(s) * (sum(c * b(s) for c, b in zip(coefs, basis)) - f(s))

        values = [error(s) for s in grid]
        points = _alternating_extrema(grid, values, n + 1) or points
    return coefs, max(abs(v) for v in values)


def _alternating_extrema(grid, values, count):
    """The largest |value| of each run of one sign, reduced to `count` alternating ones by
    dropping the smaller end; None if there are too few runs."""
    runs = []
    for s, v in zip(grid, values):
        if v == 0:
            continue
        if runs and (runs[-1][1] > 0) == (v > 0):
            if abs(v) > abs(runs[-1][1]):
                runs[-1] = (s, v)
        else:
            runs.append((s, v))
    if len(runs) < count:
        return None
    while len(runs) > count:
        runs.pop(0 if abs(runs[0][1]) < abs(runs[-1][1]) else -1)
    return [s for s, _ in runs]


def horner(s, coefs):
    p = s * coefs[-1] + coefs[-2]
    for c in reversed(coefs[:-2]):
        p = p * s + c
    return p


def fit_exp():
    scale = mp.log(2) / EXP_STEPS

    def quotient(u):
        return mp.expm1(u * scale) / u if u else scale

    basis = [lambda u, j=j: u**j for j in range(EXP_DEGREE)]
    coefs, _ = remez(quotient, abs, mp.mpf(-0.5), mp.mpf(0.5), basis)
    q = [float(c) for c in coefs]
    worst = max(abs(mp.mpf(u) * horner(u, q) - mp.expm1(mp.mpf(u) * scale))
                for u in (i / 4000 - 0.5 for i in range(4001)))
    steps = [float(mp.mpf(2) ** (mp.mpf(j) / EXP_STEPS)) for j in range(EXP_STEPS)]
    return q, steps, worst * 2**53


def fit_erf_small():
    lead = 2 / mp.sqrt(mp.pi)

    def rest(w):  # (erf(x)/x - 2/sqrt(pi)) / w, w = x^2
        x = mp.sqrt(w)
        return (mp.erf(x) / x - lead) / w if w else -lead / 3

    basis = [lambda w, j=j: w**j for j in range(ERF_DEGREE)]
    coefs, _ = remez(rest, lambda w: w / lead, mp.mpf(2) ** -40, mp.mpf(1) / 4, basis)
    p = [float(lead)] + [float(c) for c in coefs]
    worst = 0
    for i in range(1, 2001):
        x = 0.5 * i / 2000
        worst = max(worst, abs(x * horner(x * x, p) / mp.erf(mp.mpf(x)) - 1))
    return p, worst * 2**53


def piece_bounds(top):
    """The piece of [1/2, 4) of float32s whose bits' top 12 are `top`: (low, high, middle)."""
    low, high, middle = (mp.mpf(float(_f32(bits))) for bits in
                         (top << 20, (top + 1) << 20, (top << 20) | 0x80000))
    return low, high, middle


def _f32(bits):
    import numpy as np

    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def fit_erf_piece(top):
    low, high, middle = piece_bounds(top)
    basis = [lambda s, j=j: s**j for j in range(ERF_DEGREE + 1)]
    coefs, _ = remez(lambda s: mp.erf(middle + s), lambda s: 1, low - middle, high - middle, basis)
    p = [float(c) for c in coefs]
    step = (high - low) / 2000
    worst = max(abs(horner(float(low + i * step - middle), p) - mp.erf(low + i * step))
                for i in range(2001))
    return p, worst * 2**53


def main():
    q, steps, exp_error = fit_exp()
    small, small_error = fit_erf_small()
    pieces = [fit_erf_piece(top) for top in range(ERF_FIRST_PIECE, ERF_LAST_PIECE)]
    out = [HEADER,
           f"# 2^(u/64) - 1 = u q(u), |u| <= 1/2: {float(exp_error):.1f} x 2^-53 absolute\n",
           "EXP_Q = (" + ", ".join(repr(c) for c in q) + ")\n",
           "EXP_STEPS = (\n" + _rows(steps) + ")\n\n",
           "# erf: one row of coefficients (degree 0 first) a piece; the first is P(w), erf(x) =\n",
           f"# x P(x^2) for |x| < 1/2 ({float(small_error):.1f} x 2^-53 relative), then the pieces of\n",
           "# [1/2, 4) in order, each in s = |x| - its midpoint (absolute errors), then 1 from 4 on\n",
           "ERF_COEFFICIENTS = (\n",
           f"    ({', '.join(repr(c) for c in small)}),\n"]
    for top, (p, error) in zip(range(ERF_FIRST_PIECE, ERF_LAST_PIECE), pieces):
        low, high, _ = piece_bounds(top)
        out.append(f"    # [{float(low)}, {float(high)}): {float(error):.1f} x 2^-53\n")
        out.append(f"    ({', '.join(repr(c) for c in p)}),\n")
    out.append(f"    ({', '.join(['1.0'] + ['0.0'] * ERF_DEGREE)}),\n)\n")
    print("".join(out), end="")


def _rows(values):
    return "".join("    " + ", ".join(repr(v) for v in values[i:i + 4]) + ",\n"
                   for i in range(0, len(values), 4))


HEADER = '''"""Coefficients of exp and erf (portable/exp.py, portable/erf.py), and 2^(j/64).

Generated by tests/numerics/tools/fit_polynomials.py (minimax fits at 160 bits, rounded to
float64); the errors in the comments are measured on a grid. tables.py stores EXP_STEPS and
ERF_COEFFICIENTS in the numerics table, where the kernels read them per element.
"""

'''


if __name__ == "__main__":
    main()
