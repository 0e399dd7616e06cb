"""The likelihood families of the exact effects block (:mod:`tallmh.glm_effects`): logistic, Poisson-log and
Gaussian with a known noise sd, each as a function ``f`` of the row's margin ``m_i = a_i . e + b_i`` and response
``y_i``, ``l_i = f(m_i; y_i) + k_i`` (``k_i`` a constant of the row):

- ``"logistic"``: ``f = log sigmoid(m)`` (the response's sign folded into ``a_i, b_i``);
- ``"poisson"``: ``f = y m - exp(m)`` (``-log y!`` in ``k_i``);
- ``"gaussian"``: ``f = -(y - m)^2 / 2`` (the noise sd folded into ``a_i`` and ``y_i``; ``-log sd - log(2 pi)/2``
  in ``k_i``).

**Recognition of the Poisson and Gaussian forms** (:func:`tallmh.glm_rows.second_order_rows`), from the model's
per-row log-likelihood alone, as the logistic one is read: the first three derivatives along each fixed effect and
along the group key's ``1``, ``j``, ``j^2`` (forward mode, ``O(p)`` a row whatever the number of groups) give
``f''`` and ``a_i`` (Poisson: ``f''' = f'' = -exp(m)``; Gaussian: ``f'' = -1``, ``f''' = 0``, taken where every row's
``|d3|`` is below ``1e-3 |d2|^(3/2)``), then ``f'`` and ``y_i``. The reconstruction is then checked against the
model on every row at two points (:func:`tallmh.glm_effects.recognise`), so a family read wrongly (a probit link, a
Student-t or a Gaussian whose sd is a parameter) is refused there and keeps the approximate block.

**The remainder and its bound**: ``R_i(t) = f(m_i + t) - f(m_i) - f'(m_i) t - f''(m_i) t^2 / 2`` (no ``y`` in it
for these canonical links), ``|R_i(d') - R_i(d)| <= (M_i / 6) |d'^3 - d^3|`` with ``M_i`` the largest ``|f'''|``
over ``[m_i - K, m_i + K]``, ``K >= max(|d|, |d'|)``. Logistic: ``M = sqrt(3)/18`` everywhere. Gaussian: ``M =
0``, the surrogate is the likelihood itself and the step reads no row. Poisson: ``f''' = -exp`` is unbounded, so,
as :class:`tallmh.factor_bounds.PoissonTrustBound` does for the flat model, bounded on a trust region: where
every group's ``t_j, t_j' <= radius`` (the block's per-group coordinates), ``|d_i| <= kappa_i radius`` and ``M_i <=
exp(m_i + kappa_i radius)``; outside the region the step takes the exact decision from every row (a condition on
both points: symmetric, still exact).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .factor_bounds import exp3
from .models.logistic import M3_LOGISTIC, logistic_remainder_diff

__all__ = ["FAMILIES", "WORDS", "host_terms", "remainder_diff", "item_rates", "row_loglik"]

FAMILIES = ("logistic", "poisson", "gaussian")
WORDS = {"logistic": "logistic", "poisson": "Poisson-log", "gaussian": "Gaussian (known noise sd)"}
POISSON_RADIUS = 6.0  # the Poisson bound's trust region, in the block's per-group coordinates


def host_terms(family, m, y):
    """``(sum_i f(m_i), f'(m_i), -f''(m_i))`` (float64, host)."""
    if family == "logistic":
        e = np.exp(-np.abs(m))
        val = float(np.sum(np.minimum(m, 0.0) - np.log1p(e)))
        return val, np.where(m >= 0, e / (1 + e), 1 / (1 + e)), e / (1 + e) ** 2
    if family == "poisson":
        mu = np.exp(m)
        return float(np.sum(y * m - mu)), y - mu, mu
    if family == "gaussian":
        r = y - m
        return float(-0.5 * np.sum(r * r)), r, np.ones_like(m)
    raise ValueError(f"unknown family {family!r}")


def remainder_diff(family, m, d, dp):
    """``R(d') - R(d)`` of rows with margin ``m`` at the centre (the module's ``R``), accurate for small steps."""
    if family == "logistic":
        return logistic_remainder_diff(m, d, dp)
    if family == "poisson":
        return -jnp.exp(m) * (exp3(dp) - exp3(d))
    return jnp.zeros_like(m)


def item_rates(family, m, kappa, radius=POISSON_RADIUS):
    """Per-row ``M_i kappa_i^3`` (float64, host): the row's rate in the block's thinning is ``phi_j`` (the group's
    data-free factor, without ``M``) times this."""
    k3 = kappa**3
    if family == "logistic":
        return M3_LOGISTIC * k3
    if family == "poisson":
        with np.errstate(over="ignore"):
            return k3 * np.exp(m + kappa * radius)
    return np.zeros_like(k3)


def row_loglik(family, m, y, k):
    """The reconstruction ``f(m; y) + k`` (device), and the scale its comparison with the model's value uses."""
    if family == "logistic":
        v = -jax.nn.softplus(-m)
        return v, jnp.abs(v)
    if family == "poisson":
        mu = jnp.exp(m)
        v = y * m - mu + k
        return v, jnp.maximum(jnp.abs(v), jnp.maximum(jnp.abs(y * m), mu))
    r = y - m
    v = -0.5 * r * r + k
    return v, jnp.maximum(jnp.abs(v), 0.5 * r * r)
