"""A GLM's per-row design read from a model's likelihood by directional derivatives, in ``O(p)`` work a row whatever
the number of groups (:mod:`tallmh.glm_effects` recognises the effects' GLM from it): the logistic form
(:func:`logistic_rows`), and the Poisson-log and known-sd Gaussian forms (:func:`second_order_rows`).

The effects ``e`` reach row ``i``'s log-likelihood ``l_i = log sigmoid(eta_i)`` through ``eta_i = x_i . e[fixed] + c_i
e[group][g_i] + b_i``. Per-row gradients over all ``p + G`` effects cost ``O(N (p + G))`` (hours at 10^7 rows x 1,000
groups); forward-mode derivatives along ``p + 3`` directions cost ``O(N p)``: along each fixed effect they give ``x_i``
(times ``d l_i / d eta_i = 1 - exp(l_i)``), and along the group key's ``1``, ``j`` and ``j^2`` (``j`` the key's flat
index) a row that reads one group effect gives ``c_i``, ``c_i g_i`` and ``c_i g_i^2``, hence ``g_i``: an integer in
range, with the third derivative consistent. A row of any other form is refused here, or (two group effects that
happen to fit) by the caller's check of the reconstruction on every row at two points.

**Poisson and Gaussian** (``l_i = f(m_i; y_i) + k_i``, :mod:`tallmh.glm_families`): ``f'`` depends on the unknown
``y_i``, so each direction ``t`` gives the first three derivatives ``D1 = f' s``, ``D2 = f'' s^2``, ``D3 = f''' s^3``
of ``s = a_i . t`` (exact in forward mode: ``t`` is a unit vector or the group key's ``1``, ``j``, ``j^2``, so ``s``
is one product, with no cancellation). Poisson (``f''' = f'' = -exp(m)``): ``s = D3 / D2``, ``exp(m) = -D2 / s^2``.
Gaussian (``f'' = -1``, ``f''' = 0``): ``|s| = sqrt(-D2)``, its sign from the mixed derivative along ``t`` and a
random direction ``w``, ``f'' (a_i . w) s`` (one factor common to the row, so its signs agree; the row's overall
sign is free: ``(a_i, y_i) -> (-a_i, -y_i)`` leaves ``f`` unchanged). ``y_i`` then from ``D1 / s = f'`` along the
direction of largest ``|D2|``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["tangents", "logistic_rows", "second_order_rows"]

GAUSS_D3 = 1e-3  # |D3| / |D2|^(3/2) below which every row is read as Gaussian


def tangents(fixed, group, d, dtype):
    """``(p + 3, d)``: one direction per fixed effect, then on the group key ``1``, its flat index ``j`` and ``j^2``."""
    t = np.zeros((len(fixed) + 3, d))
    t[np.arange(len(fixed)), fixed] = 1.0
    j = np.arange(len(group), dtype=np.float64)
    p = len(fixed)
    t[p, group], t[p + 1, group], t[p + 2, group] = 1.0, j, j * j
    return jnp.asarray(t, dtype)


def logistic_rows(lik, e0, tang, p, fj, gj):
    """``(x (b, p), g (b,), c (b,), b (b,), ok (b,))`` of the rows whose log-likelihoods are ``lik(e) -> (b,)`` at the
    effects ``e0`` (traced; see the module): ``ok`` is False for a row not of the form or with a value not finite. A row
    whose derivatives all vanish at ``e0`` reads as a constant (``x = 0``, ``c = 0``): a saturated link (a probability
    clipped to ``1 - eps``, as Bambi's is) reads so too, so the caller reads such rows again at another point."""
    G = gj.shape[0]
    val, lin = jax.linearize(lik, e0)
    a = jax.vmap(lin)(tang) / (-jnp.expm1(val))[None, :]  # (p + 3, b): d eta_i along each direction
    v = -jnp.log(jnp.expm1(-val))
    xf = a[:p].T
    s1, s2, s3 = a[p], a[p + 1], a[p + 2]
    touched = s1 != 0
    safe = jnp.where(touched, s1, 1.0)
    ratio = jnp.where(touched, s2 / safe, 0.0)
    third = jnp.where(touched, s3 / safe, 0.0)
    gr = jnp.rint(ratio)
    one_group = (jnp.abs(ratio - gr) < 1e-2) & (gr >= 0) & (gr <= G - 1) & \
        (jnp.abs(third - ratio * ratio) <= 1e-3 * jnp.maximum(1.0, ratio * ratio))
    gi = jnp.where(touched, gr, 0).astype(jnp.int32)
    b = v - xf @ e0[fj] - s1 * e0[gj][gi]
    ok = (~touched | one_group) & jnp.all(jnp.isfinite(a), axis=0) & jnp.isfinite(b)
    return xf, gi, s1, b, ok


def _derivatives(lik, e0, v, w):
    """``(D1, D2, D3, M)`` (each ``(b,)``): the first three derivatives of ``lik`` along ``v`` at ``e0`` and the mixed
    second derivative along ``v`` and ``w``."""
    one = jnp.ones((), e0.dtype)
    zero = jnp.zeros((), e0.dtype)

    def d1(t):
        return jax.jvp(lambda u: lik(e0 + u * v), (t,), (one,))[1]

    def d2(t):
        return jax.jvp(d1, (t,), (one,))[1]

    dd2, dd3 = jax.jvp(d2, (zero,), (one,))
    mix = jax.jvp(lambda e: jax.jvp(lik, (e,), (v,))[1], (e0,), (w,))[1]
    return d1(zero), dd2, dd3, mix


def second_order_rows(lik, e0, tang, w, p, fj, gj):
    """For a chunk of rows whose log-likelihoods are ``lik(e) -> (b,)``: ``(family guess, x (b, p), group index,
    coefficient, offset, y, k, ok)`` read by the Poisson/Gaussian recognition (see the module; ``family`` 2, Gaussian,
    where every row's third derivatives vanish, else 1, Poisson; ``ok`` false where a row is not of the form:
    non-finite, convex, or not one group entry). ``tang`` from :func:`tangents`, ``w`` a random direction."""
    G = gj.shape[0]
    val = lik(e0)
    d1, d2, d3, mix = jax.vmap(lambda v: _derivatives(lik, e0, v, w))(tang)  # (p + 3, b) each
    neg = d2 < 0
    live = jnp.any(neg[: p + 1], axis=0)
    sd2 = jnp.where(neg, d2, -1.0)
    gauss = jnp.all(~neg | (jnp.abs(d3) <= GAUSS_D3 * (-sd2) ** 1.5))
    s = jnp.where(neg, jnp.where(gauss, jnp.sign(mix) * jnp.sqrt(-sd2), d3 / sd2), 0.0)  # a_i . t along each t
    kb = jnp.argmax(jnp.where(neg[: p + 1], -d2[: p + 1], -jnp.inf), axis=0)[None]  # the direction of largest |D2|
    sk = jnp.where(live, jnp.take_along_axis(s[: p + 1], kb, axis=0)[0], 1.0)
    dk = jnp.take_along_axis(d2[: p + 1], kb, axis=0)[0]
    fprime = jnp.take_along_axis(d1[: p + 1], kb, axis=0)[0] / sk
    xf, c = s[:p].T, s[p]
    touched = c != 0
    safe = jnp.where(touched, c, 1.0)
    ratio, third = jnp.where(touched, s[p + 1] / safe, 0.0), jnp.where(touched, s[p + 2] / safe, 0.0)
    gr = jnp.rint(ratio)
    one_group = (jnp.abs(ratio - gr) < 1e-2) & (gr >= 0) & (gr <= G - 1) & \
        (jnp.abs(third - ratio * ratio) <= 1e-3 * jnp.maximum(1.0, ratio * ratio))
    gi = jnp.where(touched, gr, 0).astype(jnp.int32)
    m0 = xf @ e0[fj] + c * e0[gj][gi]
    mu = jnp.where(live, -dk / (sk * sk), 1.0)  # Poisson: exp(m)
    eta = jnp.where(live, jnp.where(gauss, m0, jnp.log(mu)), 0.0)
    y = jnp.where(live, jnp.where(gauss, m0, mu) + fprime, jnp.where(gauss, 0.0, 1.0))
    b = jnp.where(gauss, 0.0, eta - m0)
    fval = jnp.where(gauss, -0.5 * (y - eta) ** 2, y * eta - jnp.exp(eta))
    k = val - fval
    signed = ~gauss | jnp.all(~neg | (mix != 0), axis=0)  # the Gaussian's signs were read
    ok = (~touched | one_group) & (live | jnp.all(d1 == 0, axis=0)) & jnp.all(d2 <= 0, axis=0) & signed \
        & jnp.all(jnp.isfinite(s), axis=0) & jnp.isfinite(b) & jnp.isfinite(y) & jnp.isfinite(k)
    return jnp.where(gauss, 2, 1), xf, gi, c, b, y, k, jnp.all(ok)
