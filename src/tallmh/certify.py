"""Certified Taylor bounds: exact MH decisions settled without reading the data.

The self-audit (:func:`tallmh.sample`'s ``audit``) takes the exact test's decision at some steps by a full
pass over the N items. For the built-in logistic regression most of those decisions can be certified without
one. Each item's log-likelihood is ``ell_i(theta) = f(s_i z_i)`` with ``z_i = x_i . theta``, ``s_i = 2 y_i - 1``
and ``f = log sigmoid``, whose third derivative is bounded: ``|f'''| <= M3 = 1 / (6 sqrt 3)``. So the
second-order Taylor expansion at a centre ``c`` leaves each item a remainder of at most
``M3 / 6 |x_i . (theta - c)|^3`` (Taylor's theorem with the Lagrange remainder), and the whole-data log ratio
``Lambda = sum_i ell_i(theta') - ell_i(theta)`` lies within ``B`` of the quadratic's difference
``P = G . (a' - a) + (1/2) (a' - a)^T H (a' + a)`` (``a = theta - c``; ``G, H`` the sums of the items' gradients
and Hessians at ``c``), where, for any invertible ``L`` (here the Cholesky factor of the Laplace precision)
and ``v = L^T a``,

    sum_i |x_i . a|^3 <= min( S3 ||v||^3,  m ||v|| a^T X^T X a ),   S3 = sum_i ||L^-1 x_i||^3,  m = max_i ||L^-1 x_i||

(Cauchy-Schwarz, ``x . a = (L^-1 x) . (L^T a)``; and Hoelder, ``sum |t_i|^3 <= max |t_i| sum t_i^2``), so
``B = M3 / 6 (that bound at a + the same at a')``. One pass over the data (:func:`build`) gives ``G``, ``H``,
``S3``, ``m``, ``X^T X`` in float64 and the absolute sums that bound the rounding below. Wherever the exact
test's threshold ``t`` (``log u - log_base`` for Metropolis, the logistic variable's for Barker, with the
step's own u) lies farther than ``B + R`` from ``P``, the exact decision is ``Lambda > t``'s answer without
reading an item (:func:`settle`). ``B`` shrinks like N^(-1/2) (``S3`` falls like N^(-1/2) while the
posterior's distances in the Laplace metric stay of order one), so the share of decisions settled grows with N
(``benchmarks/certified_bound.py`` measured the first bound alone: 0.44, 0.83 and 0.94 of decisions at
N = 10^5, 10^6 and 10^7).

``R`` makes the certified decision the one the exact test's float pass takes, not only the exact real one:
it bounds the difference between the computed and the real ``Lambda``. With ``u = eps / 2`` the unit roundoff
of the working precision and ``gamma_d = d u / (1 - d u)``: the model's ``log_lik_ratio`` forms ``z_i`` and
``d_i = x_i . (theta' - theta)`` by one product (errors at most ``gamma_d sum_j |x_ij theta_j|`` and
``(gamma_d (1 + u) + u) sum_j |x_ij delta_j|``, for any order of summation), then the ratio by
:func:`~tallmh.models.logistic.softplus_diff`, which is 1-Lipschitz in ``d``, has slope at most ``|d| / 4`` in
``z``, and whose own error was measured below ``4.3 eps |d|`` for ``|d| <= 4`` (``SP_EPS = 8`` allowed; a step
whose largest item step could exceed ``MAX_STEP = 4`` is not certified); the exact test sums the ratios with a
compensated sum (error below ``8 N u^2`` of their absolute sum). With ``S1 = sum_i |x_i|`` and
``Mabs = sum_i |x_i| |x_i|^T`` (absolute values elementwise),
``R = e1 |delta|^T S1 + (8 eps + 8 N u^2) L1 + gamma_d / 4 |delta|^T Mabs |theta|`` with ``e1 = gamma_d (1 + u) + u``
and ``L1 = min(|delta|^T S1, sqrt(N delta^T X^T X delta)) + e1 |delta|^T S1 >= sum_i |l~_i|``, plus the
float64 rounding of ``G, H``, ``X^T X`` and ``P`` (``(N + 64 + 8 d) eps64`` of the absolute sums), inflated by 1%;
the comparison's own rounding (8 ulps of ``|log u|``, ``|log_base|`` and ``|Lambda|``) is added to the margin.
Measured in default runs (d = 11, float32): ``B`` about 0.15 and ``R`` 0.04 at N = 10^6, 0.05 and
0.13 at 10^7, against thresholds whose median distance from ``P`` is about 1; 0.92 and 0.93 of the audited
decisions settled. ``R``, made of worst-case rounding bounds, grows like N^(1/2) where ``B`` falls like
N^(-1/2), so beyond about 10^7 items it sets the share settled.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

__all__ = ["Certificate", "bounds", "build", "eligible", "settle", "thresholds"]

M3 = 1.0 / (6.0 * math.sqrt(3.0))  # sup_z |(d/dz)^3 log sigmoid(z)| = sup |s (1 - s) (1 - 2 s)|, s = sigmoid(z)
# softplus_diff's error allowed, in machine epsilons of |d|, for item steps |d| <= MAX_STEP: its float32 error was
# measured at most 4.23 eps |d| over 3 * 10^7 random pairs with |d| <= 4 and |z| up to ~1,500 (56 eps at |d| ~ 50)
SP_EPS = 8.0
MAX_STEP = 4.0
CMP_ULPS = 8.0  # the exact test's comparison: ulps of |log u|, |log_base| and |Lambda| allowed


class Certificate(NamedTuple):
    """What :func:`settle` needs, all float64 on the host (``d`` parameters, ``n`` items)."""

    center: np.ndarray  # c: the Taylor expansion's centre
    grad_sum: np.ndarray  # G = sum_i grad ell_i(c)
    hess_sum: np.ndarray  # H = sum_i hess ell_i(c)
    chol: np.ndarray  # L: the whitening (L L^T the precision at c)
    s3: float  # sum_i ||L^-1 x_i||^3
    max_norm: float  # max_i ||L^-1 x_i||
    gram: np.ndarray  # X^T X
    abs_sum: np.ndarray  # S1 = sum_i |x_i|
    abs_gram: np.ndarray  # Mabs = sum_i |x_i| |x_i|^T
    n: int
    eps: float  # the working precision's machine epsilon (of the chain's parameters)


def eligible(model, oracle) -> bool:
    """Whether decisions of ``oracle`` on ``model`` can be certified: the built-in logistic regression (its
    log-likelihood, ratio and host closed forms not overridden: the bound and the rounding analysis are
    theirs) and the exact test (Metropolis or Barker) as oracle."""
    from .acceptance import Exact
    from .models import LogisticRegression

    if not isinstance(oracle, Exact) or not isinstance(model, LogisticRegression):
        return False
    cls = type(model)
    return all(getattr(cls, m) is getattr(LogisticRegression, m)
               for m in ("log_lik", "log_lik_ratio", "lik_value_grad_hess_host"))


def build(model, read, n: int, center, hess_sum, prior_hess, dtype, block: int = 1 << 14):
    """The certificate at ``center`` from one pass over the rows ``read(a, b)`` (NumPy arrays ``X`` and ``y`` as the
    chain sees them: :func:`tallmh.storage.datasource.host_reader`), the gradient and Hessian sums by the model's own
    float64 closed form (``lik_value_grad_hess_host``). ``hess_sum + prior_hess`` (any estimate of the log
    posterior's Hessian, e.g. the control variates') gives the whitening ``L``; it needs only be negative definite.
    Returns ``(certificate, rows read)``: the certificate is None where the Hessian is not definite (nothing read)
    or where the data hold a non-finite value. Blocks of 2^14 rows (their float64 copies stay in the CPU's cache):
    0.69-0.71 s per 10^7 rows of d = 11 against 0.82 s with 2^16."""
    c = np.asarray(center, np.float64)
    d = c.shape[0]
    prec = -(np.asarray(hess_sum, np.float64) + np.asarray(prior_hess, np.float64))
    try:
        chol = np.linalg.cholesky(0.5 * (prec + prec.T))
    except np.linalg.LinAlgError:
        return None, 0
    linv_t = np.linalg.inv(chol).T  # x^T L^-T = (L^-1 x)^T
    g, h = np.zeros(d), np.zeros((d, d))
    gram, abs_gram, abs_sum = np.zeros((d, d)), np.zeros((d, d)), np.zeros(d)
    s3, mx = 0.0, 0.0
    for a in range(0, n, block):
        rows = read(a, min(n, a + block))
        X = np.asarray(rows["X"], np.float64)
        _, bg, bh = model.lik_value_grad_hess_host(c, {"X": X, "y": rows["y"]})  # (X already float64: no copy)
        g += bg
        h += bh
        gram += X.T @ X
        ax = np.abs(X)
        abs_gram += ax.T @ ax
        abs_sum += np.ones(ax.shape[0]) @ ax
        W = X @ linv_t
        w = np.sqrt(np.einsum("ij,ij->i", W, W))
        s3 += float(w @ (w * w))
        mx = max(mx, float(w.max(initial=0.0)))
    if not (np.isfinite(s3) and np.all(np.isfinite(abs_gram)) and np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
        return None, n
    return Certificate(c, g, 0.5 * (h + h.T), chol, s3, mx, gram, abs_sum, abs_gram, int(n),
                       float(np.finfo(np.dtype(dtype)).eps)), n


def thresholds(u, log_base, kind: str, temperature: float):
    """``(t, size)`` per step: the exact test accepts iff ``Lambda > t`` (``Lambda = sum_i l_i``) given the step's
    uniform ``u`` (the one every test draws from the step's key, :func:`tallmh.acceptance.base.draw_u`) and
    ``log_base``; ``size`` is the sum of the magnitudes the test's comparison rounds (for the margin). float64
    arrays shaped like ``log_base``."""
    u = np.asarray(u, np.float64)
    lb = np.asarray(log_base, np.float64)
    lu = np.log(u)
    T = float(temperature)
    if kind == "metropolis":  # log u < log_base + Lambda / T
        return T * (lu - lb), T * (np.abs(lu) + np.abs(lb))
    lq = np.log1p(-u)  # barker: log_base + Lambda / T + log u - log(1 - u) > 0
    return -T * (lb + lu - lq), T * (np.abs(lb) + np.abs(lu) + np.abs(lq))


def bounds(cert: Certificate, theta, theta_p):
    """``(P, B, R, small)`` for steps from ``theta`` to ``theta_p`` (float arrays ``(..., d)``): the quadratic's
    difference ``P``, the bound ``B`` on ``|Lambda - P|`` (Taylor's remainder) and ``R`` on the rounding of the
    exact test's computed ``Lambda`` and of ``P`` (module docstring), all float64; ``small`` where every item's
    step ``|x_i . (theta' - theta)|`` is at most ``MAX_STEP`` (where ``R``'s allowance for the ratio was measured)."""
    th = np.asarray(theta, np.float64)
    thp = np.asarray(theta_p, np.float64)
    d = th.shape[-1]
    a, ap, dl = th - cert.center, thp - cert.center, thp - th
    P = dl @ cert.grad_sum + 0.5 * np.einsum("...i,ij,...j->...", dl, cert.hess_sum, a + ap)

    u, n = 0.5 * cert.eps, cert.n  # (the unit roundoff: round to nearest)
    e64 = (n + 64 + 8 * d) * np.finfo(np.float64).eps  # (float64 sums of N items, relative to their |terms|)

    def squares(v):  # >= sum_i (x_i . v)^2 (v^T X^T X v, with X^T X's float64 rounding)
        av = np.abs(v)
        return np.maximum(np.einsum("...i,ij,...j->...", v, cert.gram, v), 0.0) \
            + e64 * np.einsum("...i,ij,...j->...", av, cert.abs_gram, av)

    def cubes(v):  # >= sum_i |x_i . v|^3
        w = np.linalg.norm(v @ cert.chol, axis=-1)  # ||L^T v||
        return np.minimum(cert.s3 * w**3, cert.max_norm * w * squares(v))

    B = M3 / 6.0 * (cubes(a) + cubes(ap)) * (1.0 + 1e-9)
    gam = d * u / (1.0 - d * u)
    adl = np.abs(dl)
    s1 = adl @ cert.abs_sum  # sum_i sum_j |x_ij delta_j| (>= sum_i |d_i|)
    # sum_i |l_i| <= sum_i |d_i| <= sqrt(N sum_i d_i^2) (Cauchy-Schwarz), and with the dot products' rounding
    l1 = np.minimum(s1, np.sqrt(n * squares(dl))) + (gam * (1.0 + u) + u) * s1
    zt = np.einsum("...i,ij,...j->...", adl, cert.abs_gram, np.abs(th))  # >= sum_i |d_i| sum_j |x_ij theta_j|
    R = (gam * (1.0 + u) + u) * s1 + (SP_EPS * cert.eps + 8.0 * n * u * u) * l1 + 0.25 * gam * zt
    # the float64 sums G, H (|g_ij| <= |x_ij|, |H_i,jk| <= |x_ij x_ik| / 4) and P itself
    R = (R + e64 * (s1 + 0.125 * np.einsum("...i,ij,...j->...", adl, cert.abs_gram, np.abs(a + ap)))) * 1.01
    small = cert.max_norm * np.linalg.norm(dl @ cert.chol, axis=-1) <= MAX_STEP  # max_i |d_i| <= this
    return P, B, R, small


def settle(cert: Certificate, theta, theta_p, t, size):
    """``(settled, accept)`` for steps from ``theta`` to ``theta_p`` (float arrays ``(..., d)``) with thresholds
    ``t`` and comparison magnitudes ``size`` (:func:`thresholds`): ``settled`` where ``|t - P|`` exceeds the
    certified bound on ``|Lambda - P|`` with every rounding margin (:func:`bounds`), and there
    ``accept = Lambda > t``, the exact test's decision."""
    P, B, R, small = bounds(cert, theta, theta_p)
    lam = np.abs(P) + B + R
    margin = B + R + CMP_ULPS * cert.eps * (np.asarray(size, np.float64) + 2.0 * lam + 1.0)
    t = np.asarray(t, np.float64)
    ok = np.isfinite(P) & np.isfinite(margin) & np.isfinite(t) & small
    settled = ok & (np.abs(t - P) > margin)
    return settled, settled & (P > t)
