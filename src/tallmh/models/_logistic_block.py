"""The logistic bounds' per-item weights of a block of rows in host memory, in NumPy, in the rows' precision.

The same numbers as the compiled :meth:`tallmh.models.LogisticLocalBound.weights` (``rho_i^3 K_i``, ``rho_i =
||A^-1 x_i||``, ``K_i = sup |f'''|`` over ``|u - m_i| <= rho_i r``, ``m_i = x_i . c``) and
:meth:`~tallmh.models.LogisticCubicBound.weights` (``rho_i^3``), up to the last bits of the working precision
(the caller inflates them for that rounding, as it does the compiled ones: :mod:`tallmh.fused_table`). The set-up's
fused pass makes them here on another core while its compiled call makes the value, gradient and Hessian of the
same block (the CPU backend runs one compiled call at a time, on one core).

Cost, per block of 2^20 rows of d = 11 in float32, one core: ~15 CPU ms, against ~25 ms that the weights added
to the compiled pass. The rows go through in slices of ``SLICE`` rows with their temporaries reused (whole-block
temporaries of 50 MB each cost more in page faults than in arithmetic).
"""

from __future__ import annotations

import math

import numpy as np

M3_LOGISTIC = math.sqrt(3.0) / 18.0  # sup |(d/du)^3 log sigmoid(u)|
U_PEAK = math.log(2.0 + math.sqrt(3.0))  # |f'''(u)| = p q tanh(|u|/2) (f = log sigmoid) is largest at |u| = U_PEAK
SLICE = 32768  # rows per slice: the temporaries (d + 1 columns, 1.5 MB at d = 11) stay in the cache (measured per
# block of 2^20 rows of d = 11 on one core: 15.7 ms against 17.6 ms with slices of 8,192 rows; the same numbers)


def weights_block(X, center, rinv, radius=None, offset=None):
    """``rho_i^3 K_i`` (``radius`` given: the local bound, :func:`tallmh.models.logistic.m3_local`) or ``rho_i^3``
    (``radius`` None: the global bound's weights, its constant in ``phi``) for the rows of ``X`` (NumPy, float32
    or float64: the arithmetic's precision), ``rinv = A^-1``, ``center`` the centre ``c`` and ``offset`` (or
    None) added to the margins ``x_i . c``."""
    X = np.asarray(X)
    dt = np.result_type(X.dtype, np.float32)
    X = np.asarray(X, dt)
    n, d = X.shape
    W = np.zeros((d, d + 1), dt)  # [A^-T | c]: the whitened rows and the margin in one product
    W[:, :d] = np.asarray(rinv, dt).T
    W[:, d] = np.asarray(center, dt)
    ones = np.ones(d + 1, dt)
    ones[d] = 0  # (the margin's column is left out of rho^2)
    out = np.empty(n, dt)
    k = min(SLICE, n)
    V, a, t, lo = np.empty((k, d + 1), dt), np.empty(k, dt), np.empty(k, dt), np.empty(k, dt)
    u_peak, m3, r = dt.type(U_PEAK), dt.type(M3_LOGISTIC), dt.type(0.0 if radius is None else radius)
    off = None if offset is None else np.asarray(offset, dt)
    for s in range(0, n, SLICE):
        e = min(n, s + SLICE)
        if e - s < k:
            V, a, t, lo = V[:e - s], a[:e - s], t[:e - s], lo[:e - s]
        np.matmul(X[s:e], W, out=V)
        if off is not None:
            np.add(V[:, d], off[s:e], out=V[:, d])
        np.abs(V[:, d], out=a)  # |m| (the supremum is even in m)
        V *= V
        o = out[s:e]
        np.matmul(V, ones, out=lo)  # rho^2
        np.sqrt(lo, out=t)
        np.multiply(lo, t, out=o)  # rho^3
        if radius is None:
            continue
        t *= r  # the margin's half-width rho r
        # the point of [max(|m| - rho r, 0), |m| + rho r] nearest to U_PEAK, where k(u) = p q tanh(u / 2) is largest
        np.subtract(a, t, out=lo)
        np.maximum(lo, u_peak, out=lo)
        a += t
        np.minimum(lo, a, out=lo)
        np.negative(lo, out=lo)
        np.exp(lo, out=lo)  # e = exp(-u): k = e (1 - e) / (1 + e)^3
        np.subtract(1, lo, out=t)
        t *= lo
        lo += 1
        np.multiply(lo, lo, out=a)
        a *= lo
        t /= a
        np.minimum(t, m3, out=t)
        o *= t
    return out
