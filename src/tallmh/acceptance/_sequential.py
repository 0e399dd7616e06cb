"""Whole-test error of the austerity sequential test, and the per-look level that sets it.

Alg. 1 of Korattikara, Chen & Welling (2014) stops at the first look whose p-value ``1 - phi(|t|)`` is
below epsilon. That bounds the error of *one* look; the step's decision errs whenever *any* look before
the last (n = N, exact) stops on the wrong side, so with tens of looks the whole test errs far more often
than epsilon. This module computes the whole test's worst-case error for given N and batch size m (the
number and spacing of the looks) and inverts it: the constant per-look level (a Pocock-type boundary,
Pocock 1977, constant nominal significance at every look) whose whole-test worst-case error equals a
target.

Model. The austerity authors' later versions (Korattikara, Chen & Welling, ICML 2014, "Austerity in MCMC
land", and Korattikara, Chen & Welling, "Sequential tests for large-scale learning", Neural Computation
2016) analyse the whole sequential test by approximating the standardised running mean with a Brownian
motion under the finite-population correction; the derivation below is ours, in that spirit:

* Look k reads ``n_k = min(k m, N)`` items without replacement; ``f_k = n_k / N``.
* The partial sums of a sample drawn without replacement from a finite population of size N, centred at
  the population mean ``mu`` and scaled by ``sigma sqrt(N)``, converge to a Brownian bridge B on [0, 1]
  (the finite-population functional CLT). So ``lbar_k - mu ~ sigma sqrt(N) B(f_k) / n_k`` whose variance
  ``sigma^2 (1 - f_k) / n_k`` is the finite-population-corrected one of eq. 3.
* With the sd known (the t-statistic with n - 1 >= m - 1 degrees of freedom is close to normal), eq. 4's
  statistic is ``t_k = Z_k + d sqrt(n_k / (1 - f_k))`` with ``d = (mu - mu0) / sigma`` the standardised
  gap and ``Z_k = B(f_k) / sqrt(f_k (1 - f_k))``. Writing ``B(f) = (1 - f) W(f / (1 - f))`` for a
  Brownian motion W, ``Z_k = W(tau_k) / sqrt(tau_k)`` with the "odds time" ``tau_k = n_k / (N - n_k)``:
  a standardised Brownian motion observed at the looks, i.e. a stationary Ornstein-Uhlenbeck process
  ``U(s) = W(e^s) e^(-s/2)`` at ``s_k = log tau_k`` (``corr(Z_j, Z_k) = exp(-|s_k - s_j| / 2)``).
* The test stops at the first look with ``|t_k| > c`` (per-look level ``alpha = 1 - Phi(c)``) and decides
  by the sign of ``t_k``; at n = N it is exact.

Worst case over the gap. Every ``t_k`` increases with d on every path, so the event "the first exit is
through the lower boundary" shrinks as d grows: for d > 0 (exact MH accepts) the error probability
decreases in d, and its supremum is the limit d -> 0+, which by symmetry is half the probability that
the driftless process exits before the last look:

    worst-case step error = P(max_{k < K} |Z_k| > c) / 2.                                   (*)

(The same holds for d <= 0.) The error of a real step, averaged over u, is at most this.

Computing (*). A recursion over the looks (Armitage, McPherson & Rowe 1969) for the sub-density of U
on (-c, c) that has not exited, on Gauss-Legendre nodes; the transition between looks is the OU kernel
``U' | U ~ N(rho U, 1 - rho^2)``, ``rho = exp(-ds / 2)``. Where looks are dense (many looks within
``ds < 0.1``, the middle of the data when N/m is large), consecutive looks are grouped and the looks
inside a group are accounted for by the probability that the Brownian bridge between the group's ends
crosses the boundary, ``exp(-(c' - x)(c' - y) / sinh(ds / 2))`` per side (the chord of the boundary
``c sqrt(tau)`` in W; crossing the chord is slightly more likely than crossing the curve), with the
continuity correction for discrete monitoring ``c' = c + 0.5826 sqrt(delta)`` (Broadie, Glasserman &
Kou 1997; Siegmund 1985), ``delta`` the smallest spacing of the grouped looks in s. Cost: about
``20 log(N / m)`` recursion steps of a ``G x G`` kernel (G = 64 Gauss-Legendre nodes: within ~1e-11
relative of 200 nodes for N/m from 30 to 2*10^7) per evaluation and ~10 evaluations to solve for c:
0.03-0.15 s for N/m up to 10^4 (2-core CPU), once per (N, m, target) (cached).
``tests/acceptance/test_austerity_error.py`` checks (*) against a direct
simulation of all looks.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from numpy.polynomial.legendre import leggauss
from statistics import NormalDist

_STD_NORMAL = NormalDist()


def ndtr(x: float) -> float:
    """The standard normal CDF at a scalar (the standard library: importing scipy.special took ~0.2 s of every
    fresh process)."""
    return 0.5 * math.erfc(-float(x) / math.sqrt(2.0))


def ndtri(p: float) -> float:
    """The standard normal quantile of a scalar ``0 < p < 1`` (Wichura's AS 241, ~1e-16 relative)."""
    return _STD_NORMAL.inv_cdf(float(p))

__all__ = ["look_sizes", "exit_probability", "worst_case_error", "per_look_level", "simulate_exit_probability"]

_BGK = 0.5826  # zeta(1/2) / sqrt(2 pi), continuity correction for discretely monitored boundaries
_GROUP_DS = 0.1  # group looks closer than this (in s = log tau)
_NODES = 64  # Gauss-Legendre nodes: the exit probability agrees with 200 nodes to ~1e-11 relative at 48 or more


def look_sizes(n: int, m: int) -> np.ndarray:
    """Items read at each look of Alg. 1: ``min(k m, N)``, k = 1, ..., ceil(N / m)."""
    n, m = int(n), int(m)
    k = np.arange(1, -(-n // m) + 1, dtype=np.int64)
    return np.minimum(k * m, n)


def _log_odds_times(n: int, m: int) -> np.ndarray:
    """``s_k = log(n_k / (N - n_k))`` of the looks that can err (all but the last, n_k < N)."""
    nk = look_sizes(n, m)
    nk = nk[nk < n].astype(np.float64)
    return np.log(nk) - np.log(n - nk)


@lru_cache(maxsize=64)
def _plan(n: int, m: int):
    """Looks the recursion visits (in s), with, per step, the smallest spacing of the looks it skips (0: none)."""
    s = _log_odds_times(n, m)
    if len(s) == 0:
        return None, None
    keep, skipped = [0], []
    i, last = 0, len(s) - 1
    while i < last:
        j = max(int(np.searchsorted(s, s[i] + _GROUP_DS, side="left")), i + 1)
        if j < last and s[last] - s[j] < _GROUP_DS:
            j = last  # no short last step (the kernel would be too narrow for the nodes)
        gaps = np.diff(s[i:j + 1])
        skipped.append(float(gaps.min()) if j > i + 1 else 0.0)
        keep.append(j)
        i = j
    return np.asarray(s[keep]), np.asarray(skipped)


@lru_cache(maxsize=8)
def _nodes(nodes: int):
    return leggauss(nodes)


def exit_probability(c: float, n: int, m: int, nodes: int = _NODES) -> float:
    """``P(max_{k<K} |Z_k| > c)`` for the looks of N = n items in batches of m (module docstring)."""
    sv, skipped = _plan(int(n), int(m))
    if sv is None:
        return 0.0
    c = float(c)
    x, w = _nodes(int(nodes))
    x = c * x
    w = c * w
    p = np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)  # sub-density of U at the first look
    for ds, dmin in zip(np.diff(sv), skipped):
        rho = math.exp(-0.5 * ds)
        sig = math.sqrt(-math.expm1(-ds))
        diff = (x[None, :] - rho * x[:, None]) / sig  # [from, to]
        ker = np.exp(-0.5 * diff * diff) / (sig * math.sqrt(2 * math.pi))
        if dmin > 0.0:
            cc = c + _BGK * math.sqrt(dmin)
            sh = math.sinh(0.5 * ds)
            up = np.exp(-np.outer(cc - x, cc - x) / sh)
            lo = np.exp(-np.outer(cc + x, cc + x) / sh)
            ker = ker * np.clip(1.0 - up - lo, 0.0, 1.0)
        p = (w * p) @ ker
    surv = float(np.sum(w * p))
    return min(max(1.0 - surv, 0.0), 1.0)


def worst_case_error(alpha: float, n: int, m: int) -> float:
    """Worst-case (over the gap) probability that Alg. 1 with per-look level alpha errs, eq. (*)."""
    return 0.5 * exit_probability(float(-ndtri(alpha)), n, m)


@lru_cache(maxsize=256)
def per_look_level(target: float, n: int, m: int) -> float:
    """The per-look level alpha (Alg. 1's epsilon) whose worst-case whole-test error is ``target``.

    Returns 0.5 when there is no look before n = N (``m >= N``: the test is exact).
    """
    n, m, target = int(n), int(m), float(target)
    if n <= m:
        return 0.5
    f = lambda c: math.log(0.5 * exit_probability(c, n, m)) - math.log(target)
    lo, hi = float(-ndtri(target)), float(-ndtri(target / (4.0 * (n // m + 1))))  # one look .. Bonferroni
    f_hi = f(hi)
    while f_hi > 0:  # pragma: no cover - Bonferroni always suffices; guard against numerical error
        hi += 0.5
        f_hi = f(hi)
    f_lo = f(lo)
    # (f_lo <= 0: a single look before N, where the one-look level is the target, up to rounding)
    c = lo if f_lo <= 0 else _root(f, lo, hi, f_lo, f_hi)
    return float(ndtr(-c))


def _root(f, a, b, fa, fb, xtol=1e-7, max_iter=200):
    """The root of ``f`` between ``a`` and ``b``, where ``fa = f(a)`` and ``fb = f(b)`` differ in sign, to within
    ``xtol``: regula falsi with the Anderson-Bjoerck step (superlinear on smooth functions; the root stays
    bracketed), and a bisection after three steps in a row that each failed to halve the bracket. (Here
    rather than scipy's ``brentq``: importing scipy.optimize took ~0.4 s of a fresh process's first chain.)"""
    if fa == 0.0 or fb == 0.0:
        return a if fa == 0.0 else b
    if (fa > 0) == (fb > 0):
        raise ValueError("the root is not bracketed")
    slow = 0
    for _ in range(max_iter):
        width = abs(b - a)
        if width <= xtol:
            break
        c = (a * fb - b * fa) / (fb - fa)
        fc = f(c)
        if fc == 0.0:
            return c
        if (fc > 0) != (fb > 0):  # the root lies between b and c: b becomes the other end
            a, fa = b, fb
        else:  # between a and c: a stays, its value scaled so that it moves next time
            m = 1.0 - fc / fb
            fa = fa * (m if m > 0 else 0.5)
        b, fb = c, fc
        slow = slow + 1 if abs(b - a) > 0.5 * width else 0
        if slow >= 3:  # three steps in a row that did not halve the bracket: bisect
            slow = 0
            mid = 0.5 * (a + b)
            fm = f(mid)
            if fm == 0.0:
                return mid
            if (fm > 0) != (fb > 0):
                a, fa = b, fb
            b, fb = mid, fm
    return b


def simulate_exit_probability(c: float, n: int, m: int, paths: int = 20000, seed: int = 0,
                              chunk: int = 2000) -> float:
    """Monte Carlo estimate of ``P(max_{k<K} |Z_k| > c)`` with every look simulated (for checking)."""
    tau = np.exp(_log_odds_times(n, m))
    if len(tau) == 0:
        return 0.0
    rng = np.random.default_rng(seed)
    dt = np.diff(np.concatenate([[0.0], tau]))
    hits = 0
    for start in range(0, paths, chunk):
        r = min(chunk, paths - start)
        wpath = np.zeros(r)
        hit = np.zeros(r, bool)
        for a in range(0, len(tau), 512):
            b = min(a + 512, len(tau))
            inc = rng.standard_normal((r, b - a)) * np.sqrt(dt[a:b])
            wk = wpath[:, None] + np.cumsum(inc, axis=1)
            hit |= np.any(np.abs(wk) > c * np.sqrt(tau[a:b]), axis=1)
            wpath = wk[:, -1]
        hits += int(hit.sum())
    return hits / paths
