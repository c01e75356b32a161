"""erf_fit.py: the coefficients of csrc/kernels/erf_avx512.cpp (erf as a degree-12 polynomial per half unit of |x|), printed as its C++ table, with their largest relative error.

Usage: python tests/erf_fit.py

Each interval's Chebyshev interpolant of math.erf (double; the C library's erf from CPython 3.11 on),
converted to the power basis: on [0, 1/2) of erf(x) / x in u = x^2, on [i/2, (i+1)/2) (i = 1 .. 7) of
erf in t = |x| - (i/2 + 1/4). Not a test module: the kernel's bits are checked against the C
library's by tests/test_onnx_api.py (and, for every float32, as docs/onnx.md records).
"""

import math

import numpy as np
from numpy.polynomial import Chebyshev, Polynomial

DEGREE = 12


def erf_over_x(u):
    return np.array([2 / math.sqrt(math.pi) if v == 0 else math.erf(math.sqrt(v)) / math.sqrt(v) for v in np.ravel(u)])


def coefficients() -> np.ndarray:
    """[8 intervals][DEGREE + 1] power-basis coefficients, lowest degree first."""
    rows = [Chebyshev.interpolate(erf_over_x, DEGREE, domain=[0, 0.25]).convert(kind=Polynomial).coef]
    for i in range(1, 8):
        center = 0.25 + 0.5 * i

        def f(t, center=center):
            return np.array([math.erf(center + v) for v in np.ravel(t)])

        rows.append(Chebyshev.interpolate(f, DEGREE, domain=[-0.25, 0.25]).convert(kind=Polynomial).coef)
    return np.array(rows)


def evaluate(c: np.ndarray, x: float) -> float:
    ax = abs(x)
    i = min(int(ax * 2), 7)
    v = ax * ax if i == 0 else ax - (0.25 + 0.5 * i)
    p = 0.0
    for k in range(DEGREE, -1, -1):
        p = p * v + c[i][k]
    return math.copysign(p * ax if i == 0 else p, x)


def main() -> None:
    c = coefficients()
    xs = np.concatenate([np.linspace(1e-6, 3.92, 100001), np.geomspace(1e-6, 0.5, 10000)])
    worst = max(abs(evaluate(c, x) - math.erf(x)) / math.erf(x) for x in xs)
    print(f"// largest relative error on {xs.size} points: {worst:.3g} (2^{math.log2(worst):.1f})")
    print("alignas(64) constexpr double kCoefficients[13][8] = {")
    for k in range(DEGREE + 1):
        print("    {" + ", ".join(float(c[i][k]).hex() for i in range(8)) + "},")
    print("};")


if __name__ == "__main__":
    main()
