"""The exact subsampled test's remainder bound for NB2 regression (:class:`NB2TrustBound`).

For ``theta = (beta, tau)``, ``tau = log alpha``, ``r = e^-tau``, write ``s = x . beta + tau`` (a row's design
``(x, 1)`` times ``theta``). Then ``log(r / (r + mu)) = -softplus(s)``, ``log(mu / (r + mu)) = s - softplus(s)``
and ``lgamma(y + r) - lgamma(r) = -tau [y >= 1] + sum_{k=1}^{y-1} (log k + softplus(-tau - log k))``, so

    ell = y s - tau [y >= 1] - (y + e^-tau) softplus(s) + sum_{k=1}^{y-1} softplus(-tau - log k) + const:

a function ``h(s, tau)`` of two linear maps of ``theta`` plus linear terms (which have no Taylor remainder).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ..factor_bounds import SAFETY, exp3
from .logistic import M3_LOGISTIC, m3_local, logistic_remainder_diff, softplus_diff

__all__ = ["NB2TrustBound", "nb2_remainder_diff", "g3_bound"]

_K_BLOCK = 64  # values of k per block of the sum over k < y


def g3_bound(y, a_max, xp=np):
    """An upper bound on ``sum_{k=1}^{y-1} |softplus'''(u_k)|`` for ``u_k <= log(a_max / k)``: each term is at most
    ``min(M, e^{u_k}) <= min(M, a_max / k)`` (``|softplus'''| = p q |1 - 2p| <= p <= e^u``, ``M = sqrt(3)/18``).
    With ``n = y - 1`` and ``m = min(floor(a_max / M), n)`` the first ``m`` terms take ``M`` and the rest
    ``a_max sum_{k=m+1}^{n} 1/k <= a_max (1/(m+1) + log(n/(m+1)))``."""
    n = xp.maximum(y - 1.0, 0.0)
    m = xp.minimum(xp.floor(a_max / M3_LOGISTIC), n)
    tail = a_max * (1.0 / (m + 1.0) + xp.log(xp.maximum(n, m + 1.0) / (m + 1.0)))
    return M3_LOGISTIC * m + xp.where(n > m, tail, 0.0)


def _sup_sp2(s, half, xp):
    """``sup softplus''`` (= ``p q``, even and decreasing in ``|s|``) over ``|u - s| <= half``."""
    u = xp.maximum(xp.abs(s) - half, 0.0)
    e = xp.exp(-u)
    return e / (1.0 + e) ** 2


def _softplus(v, xp):
    return xp.logaddexp(0.0, v)


def _weights(xp, X, y, center, rinv, radius):
    """``w_i`` of :class:`NB2TrustBound` (``xp`` numpy or jax.numpy)."""
    beta_c, tau_c = center[:-1], center[-1]
    rho_s = xp.sqrt(xp.sum((X @ rinv[:, :-1].T + rinv[:, -1]) ** 2, axis=-1))  # ||R^-1 (x, 1)||
    rho_t = xp.sqrt(xp.sum(rinv[:, -1] ** 2))  # ||R^-1 e_tau||
    s_c = X @ beta_c + tau_c
    hs, ht = rho_s * radius, rho_t * radius
    big_r = xp.exp(-tau_c + ht)  # sup e^-tau on the region
    k3 = m3_local(s_c, hs, xp)  # sup |softplus'''| (= sup |(log sigmoid)'''| on the mirrored interval)
    k2 = _sup_sp2(s_c, hs, xp)
    k1 = 1.0 / (1.0 + xp.exp(-(s_c + hs)))  # sup softplus' = sigmoid at the interval's top
    k0 = _softplus(s_c + hs, xp)
    h_sss = (y + big_r) * k3
    h_sst = big_r * k2
    h_stt = big_r * k1
    h_ttt = big_r * k0 + g3_bound(y, big_r, xp)
    return (rho_s**3 * h_sss + 3.0 * rho_s**2 * rho_t * h_sst + 3.0 * rho_s * rho_t**2 * h_stt + rho_t**3 * h_ttt)


def _exp3_diff(x, xp):
    """``exp3(x') - exp3(x)`` as a multiple of ``x' - x``: the series ``(x' - x) sum_{k>=3} h_{k-1}(x', x) / k!``
    (complete symmetric polynomials, to ``k = 12``) where both lie within 1/2 of 0, else
    ``e^x expm1(x' - x) - (x' - x)(1 + (x' + x)/2)``."""
    small = jnp.maximum(jnp.abs(x), jnp.abs(xp)) <= 0.5
    a, b = jnp.where(small, xp, 0.0), jnp.where(small, x, 0.0)
    e1, e2 = a + b, a * b
    h_prev, h = jnp.ones_like(a), e1
    acc = jnp.zeros_like(a)
    for k in range(3, 13):
        h_prev, h = h, e1 * h - e2 * h_prev  # h_{k-1}
        acc = acc + h / math.factorial(k)
    a, b = jnp.where(small, 0.0, xp), jnp.where(small, 0.0, x)
    step = a - b
    far = jnp.exp(b) * jnp.expm1(step) - step * (1.0 + 0.5 * (a + b))
    return jnp.where(small, (xp - x) * acc, far)


def _product_remainder_diff(s_c, d, t, dp, tp):
    """``q(d', t') - q(d, t)`` for ``q(d, t) = S3(d) P(t) + T(d, t) + E3(t) softplus(s_c + d)`` (see
    :class:`NB2TrustBound`; ``P = 1 - t + t^2/2``, ``T = -b2 t d^2/2 + b1 t^2 d/2 + b2 t^2 d^2/4``), each product's
    difference split as ``u'v' - uv = (u' - u) v' + u (v' - v)``."""
    b1 = jax.nn.sigmoid(s_c)
    b2 = b1 * jax.nn.sigmoid(-s_c)
    dd, dtt = dp - d, tp - t
    s3 = -logistic_remainder_diff(-s_c, jnp.zeros_like(d), -d)  # S3(d) (softplus(v) = -log sigmoid(-v))
    s3_diff = -logistic_remainder_diff(-s_c, -d, -dp)
    pp = 1.0 - tp + 0.5 * tp * tp
    p_diff = dtt * (0.5 * (tp + t) - 1.0)
    td_diff = dtt * dp + t * dd  # t'd' - t d
    t_diff = (-0.5 * b2 * (dtt * dp * dp + t * dd * (dp + d)) + 0.5 * b1 * (dtt * (tp + t) * dp + t * t * dd)
              + 0.25 * b2 * td_diff * (tp * dp + t * d))
    e3, e3_diff = exp3(-t), _exp3_diff(-t, -tp)
    sp_p = jax.nn.softplus(s_c + dp)
    sp_diff = softplus_diff(s_c + d, dd)
    return s3_diff * pp + s3 * p_diff + t_diff + e3_diff * sp_p + e3 * sp_diff


def nb2_remainder_diff(X, y, center, theta, theta_p):
    """``R_i(theta') - R_i(theta)`` of the NB2 log-likelihood's second-order Taylor expansion at ``center``, without
    cancellation (see :class:`NB2TrustBound`)."""
    beta_c, tau_c = center[:-1], center[-1]
    md = X @ jnp.stack([beta_c, theta[:-1] - beta_c, theta_p[:-1] - beta_c], axis=-1)
    dt, dtp = theta[-1] - tau_c, theta_p[-1] - tau_c
    s_c = md[..., 0] + tau_c
    ds, dsp = md[..., 1] + dt, md[..., 2] + dtp
    dt, dtp = jnp.broadcast_to(dt, ds.shape), jnp.broadcast_to(dtp, ds.shape)
    # - y softplus(s): softplus(v) = -log sigmoid(-v), so its remainder at s_c with step d is -R_f(-s_c; -d)
    out = y * logistic_remainder_diff(-s_c, -ds, -dsp)
    zero = jnp.zeros_like(ds)
    # - e^-tau softplus(s): e^-tau_c times the difference of the product's remainder q(ds, dt), every term a
    # multiple of a step difference (so that small steps keep their relative accuracy)
    out = out - jnp.exp(-tau_c) * _product_remainder_diff(s_c, ds, dt, dsp, dtp)
    # + sum_{k=1}^{y-1} softplus(-tau - log k): each term's remainder difference is -R_f(tau_c + log k; dt -> dt'),
    # the same for every row; in blocks of _K_BLOCK values of k (each block's prefix sums, read by each row at its
    # own count), the blocks' sums compensated, up to the batch's largest count
    ymax = jnp.max(jnp.where(jnp.isfinite(y), y, 0.0)).astype(jnp.int32)
    nblocks = (jnp.maximum(ymax - 1, 0) + _K_BLOCK - 1) // _K_BLOCK
    t0, t1 = dt.reshape(-1)[:1], dtp.reshape(-1)[:1]
    ks = jnp.arange(1, _K_BLOCK + 1, dtype=ds.dtype)
    n_terms = jnp.maximum(jnp.where(jnp.isfinite(y), y, 0.0) - 1.0, 0.0)

    def body(b, acc):
        hi, lo = acc
        k0 = (b * _K_BLOCK).astype(ds.dtype)
        k = k0 + ks
        g = jnp.where(k <= ymax - 1, -logistic_remainder_diff(tau_c + jnp.log(k), t0, t1), 0.0)
        prefix = jnp.concatenate([jnp.zeros((1,), g.dtype), jnp.cumsum(g)])
        part = prefix[jnp.clip(n_terms - k0, 0, _K_BLOCK).astype(jnp.int32)]
        s = hi + part  # (two-sum: hi + lo holds the sum to about one rounding)
        bb = s - hi
        return s, lo + ((hi - (s - bb)) + (part - bb))

    hi, lo = jax.lax.fori_loop(0, nblocks, body, (zero, zero))
    return out + (hi + lo)


class NB2TrustBound:
    """``|R_i(theta') - R_i(theta)| <= w_i phi(z, z')`` for NB2 regression on the trust region
    ``||z||, ||z'|| <= radius`` (whitened ``z = R^T (theta - c)``, ``H = R R^T``), the exact decision outside it.

    **Remainder.** ``ell_i = h(s, tau) + linear`` (module docstring) with ``s = (x_i, 1) . theta``, so the Taylor
    remainder at ``c`` is that of ``h`` in ``(s, tau)``. With ``ds, dt`` the steps from ``(s_c, tau_c)``,
    ``b1 = sigmoid(s_c)``, ``b2 = b1 (1 - b1)``, ``S3(d)`` the remainder of softplus at ``s_c`` beyond order 2 and
    ``E3(dt) = e^-dt - 1 + dt - dt^2/2``, expanding ``e^-tau softplus(s) = e^-tau_c (1 - dt + dt^2/2 + E3)
    (b0 + b1 ds + b2 ds^2/2 + S3)`` and dropping the terms of degree <= 2 leaves

        e^-tau_c [S3 (1 - dt + dt^2/2) - b2 dt ds^2/2 + b1 dt^2 ds/2 + b2 dt^2 ds^2/4 + E3 softplus(s_c + ds)],

    every term of degree >= 3 and formed without cancellation (``S3`` by the series of
    :func:`~tallmh.models.logistic.logistic_remainder_diff`, ``E3`` by ``exp3``); ``-y softplus(s)`` contributes
    ``-y S3`` and each ``softplus(-tau - log k)`` its own remainder in ``-dt`` (:func:`nb2_remainder_diff`). The
    sum over ``k < y_i`` costs ``O(y_i)`` per row read (one scalar series per ``k`` shared by all rows of a
    batch, a loop up to the batch's largest count): cheap for counts up to thousands, slow for very large ones.

    **Bound.** Along ``theta_t = theta + t (theta' - theta)``, ``a_t = theta_t - c``, ``v = theta' - theta``:
    ``R(theta') - R(theta) = int_0^1 grad R(theta_t) . v dt`` and, by Taylor's theorem with integral remainder
    applied to ``u -> grad ell(c + u a_t) . v``, ``grad R(theta_t) . v = int_0^1 (1 - u) D^3 ell(c + u a_t)[a_t,
    a_t, v] du``. The trilinear form of ``h`` is ``sum_{p+q=3} h_{p,q}`` times ``binom(3, p)`` products of ``p``
    s-components and ``q`` tau-components of ``a_t, a_t, v``, and ``|ds(a)| <= rho_s ||z_a||``, ``|dtau(a)| <=
    rho_t ||z_a||`` (``rho_s = ||R^-1 (x_i, 1)||``, ``rho_t = ||R^-1 e_tau||``), so ``|D^3 ell[a, a, v]| <= w_i
    ||z_a||^2 ||z_v||`` with

        w_i = rho_s^3 sup|h_sss| + 3 rho_s^2 rho_t sup|h_sst| + 3 rho_s rho_t^2 sup|h_stt| + rho_t^3 sup|h_ttt|,

    the suprema over the region (every ``c + u a_t`` lies in the ball ``||z|| <= radius``). Hence
    ``|R(theta') - R(theta)| <= (w_i / 2) int_0^1 ||z_t||^2 dt ||z' - z|| <= (w_i / 2) (|z|^2 + |z||z'| + |z'|^2) / 3
    ||z' - z||`` (``||z_t|| <= (1 - t)|z| + t|z'|``): ``phi = (SAFETY / 6) (|z|^2 + |z||z'| + |z'|^2) ||z' - z||``,
    symmetric. The partials: ``h_sss = -(y + e^-tau) sp'''(s)``, ``h_sst = e^-tau sp''(s)``, ``h_stt = -e^-tau
    sp'(s)``, ``h_ttt = e^-tau sp(s) - sum_{k<y} sp'''(-tau - log k)``; on the region ``e^-tau <= A = e^{-tau_c +
    rho_t radius}``, ``s`` within ``rho_s radius`` of ``s_c`` (``sp'''`` by its local supremum, ``sp'' = pq`` at the
    interval's point nearest 0, ``sp' <= sigmoid`` and ``sp`` at its top), and the sum over ``k`` by
    :func:`g3_bound`.

    ``radius=None``: ``sqrt(d) + 6.5`` (as the logistic local bound), which a near-Gaussian posterior in whitened
    coordinates leaves with probability below 1e-9.
    """

    any_whitening = True  # valid for weights and z whitened by any invertible A (tallmh.fused_table)

    def __init__(self, radius=None):
        if radius is not None and not radius > 0:
            raise ConfigError(f"the trust region's radius must be positive; got {radius}")
        self.radius = None if radius is None else float(radius)

    def radius_for(self, d: int) -> float:
        return self.radius if self.radius is not None else math.sqrt(d) + 6.5

    def weights(self, center, rinv, batch):
        y = batch["y"].astype(center.dtype)
        return _weights(jnp, batch["X"], y, center, rinv, self.radius_for(center.shape[0]))

    def weights_host(self, center, rinv, batch):
        X = np.asarray(batch["X"], np.float64)
        y = np.asarray(batch["y"], np.float64)
        center = np.asarray(center, np.float64)
        rinv = np.asarray(rinv, np.float64)
        with np.errstate(over="ignore"):
            return _weights(np, X, y, center, rinv, self.radius_for(center.shape[0])) * (1 + 1e-9)

    def phi(self, z, zp):
        a, b = jnp.linalg.norm(z), jnp.linalg.norm(zp)
        return (SAFETY / 6.0) * (a * a + a * b + b * b) * jnp.linalg.norm(zp - z)

    def region(self, z, zp):
        return jnp.maximum(jnp.linalg.norm(z), jnp.linalg.norm(zp)) <= self.radius_for(z.shape[0])

    def remainder(self, theta, theta_p, center, batch):
        y = batch["y"].astype(theta.dtype)
        return nb2_remainder_diff(batch["X"].astype(theta.dtype), y, center.astype(theta.dtype), theta, theta_p)
