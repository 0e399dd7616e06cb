"""A logistic GLM's per-row design read from a model's likelihood by directional derivatives, in ``O(p)`` work a row
whatever the number of groups (:mod:`tallmh.glm_effects` recognises the effects' GLM from it).

The effects ``e`` reach row ``i``'s log-likelihood ``l_i = log sigmoid(eta_i)`` through ``eta_i = x_i . e[fixed] + c_i
e[group][g_i] + b_i``. Per-row gradients over all ``p + G`` effects cost ``O(N (p + G))`` (hours at 10^7 rows x 1,000
groups); forward-mode derivatives along ``p + 3`` directions cost ``O(N p)``: along each fixed effect they give ``x_i``
(times ``d l_i / d eta_i = 1 - exp(l_i)``), and along the group key's ``1``, ``j`` and ``j^2`` (``j`` the key's flat
index) a row that reads one group effect gives ``c_i``, ``c_i g_i`` and ``c_i g_i^2``, hence ``g_i``: an integer in
range, with the third derivative consistent. A row of any other form is refused here, or (two group effects that
happen to fit) by the caller's check of the reconstruction on every row at two points.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["tangents", "logistic_rows"]


def tangents(fixed, group, d, dtype):
    """``(p + 3, d)``: one direction per fixed effect, then on the group key ``1``, its flat index ``j`` and ``j^2``."""
    t = np.zeros((len(fixed) + 3, d))
    t[np.arange(len(fixed)), fixed] = 1.0
    j = np.arange(len(group), dtype=np.float64)
    p = len(fixed)
    t[p, group], t[p + 1, group], t[p + 2, group] = 1.0, j, j * j
    return jnp.asarray(t, dtype)


def logistic_rows(lik, e0, tang, p, fj, gj):
    """``(x (b, p), g (b,), c (b,), b (b,), ok)`` of the rows whose log-likelihoods are ``lik(e) -> (b,)`` at the
    effects ``e0`` (traced; see the module): ``ok`` is False where a row is not of the form or a value is not finite."""
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
    return xf, gi, s1, b, jnp.all(ok)
