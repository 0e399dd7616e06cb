"""The likelihood families of the exact effects block (:mod:`tallmh.glm_effects`): logistic, Poisson-log and
Gaussian with a known noise sd, each as a function ``f`` of the row's margin ``m_i = a_i . e + b_i`` and response
``y_i``, ``l_i = f(m_i; y_i) + k_i`` (``k_i`` a constant of the row):

- ``"logistic"``: ``f = log sigmoid(m)`` (the response's sign folded into ``a_i, b_i``);
- ``"poisson"``: ``f = y m - exp(m)`` (``-log y!`` in ``k_i``);
- ``"gaussian"``: ``f = -(y - m)^2 / 2`` (the noise sd folded into ``a_i`` and ``y_i``; ``-log sd - log(2 pi)/2``
  in ``k_i``).

**Recognition of the Poisson and Gaussian forms** (:func:`second_order_rows`), from the model's per-row
log-likelihood alone, as the logistic one is read: for a random direction ``w`` the row's gradient ``g_i = f'
a_i``, its Hessian along ``w``, ``h_i = f'' t_i a_i`` (``t_i = a_i . w``), and the second and third derivatives
along ``w``, ``d2 = f'' t^2`` and ``d3 = f''' t^3``. Poisson: ``f''' = f'' = -exp(m)``, so ``t = d3 / d2``, ``exp(m) =
-d2 / t^2``, ``a = -h / (exp(m) t)``, ``y = exp(m) + (g . w) / t``. Gaussian: ``f'' = -1``, ``f''' = 0``, so ``t =
sqrt(-d2)``, ``a = -h / t`` and ``y - m = (g . w) / t`` (``b = 0``). The Gaussian form is taken where every row's
``|d3|`` is below ``1e-3 |d2|^(3/2)``. (``w`` only gives the direction of ``a_i``, ``h_i / |h_i|``; every derivative
is then taken along that unit direction, so ``t_i = +-|a_i|`` has no cancellation where ``a_i`` is nearly orthogonal
to ``w``.) The reconstruction is then checked against the model on every row at two
points (:func:`tallmh.glm_effects.recognise`), so a family read wrongly (a probit link, a Student-t or a Gaussian
whose sd is a parameter) is refused there and keeps the approximate block.

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

__all__ = ["FAMILIES", "WORDS", "host_terms", "remainder_diff", "item_rates", "row_loglik", "second_order_rows"]

FAMILIES = ("logistic", "poisson", "gaussian")
WORDS = {"logistic": "logistic", "poisson": "Poisson-log", "gaussian": "Gaussian (known noise sd)"}
POISSON_RADIUS = 6.0  # the Poisson bound's trust region, in the block's per-group coordinates
GAUSS_D3 = 1e-3  # |d3| / |d2|^(3/2) below which every row is read as Gaussian


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


def second_order_rows(ell, e0, w, rows, fj, gj):
    """For a chunk of rows: ``(family guess, x, group index, coefficient, offset, y, k, ok)`` read by the module's
    second-order recognition (``family`` ``"gaussian"`` where every row's third derivative vanishes, else
    ``"poisson"``; ``ok`` false where a row is not of the form: non-finite, convex, or two group entries)."""

    def per_row(row):
        val, g = jax.value_and_grad(ell)(e0, row)
        hvp = lambda v: jax.jvp(lambda x: jax.grad(ell)(x, row), (e0,), (v,))[1]  # noqa: E731
        # the direction of a_i from the Hessian along w (exact up to rounding whatever t_i), then every derivative
        # along that unit direction u: t = a . u = +-|a|, free of the cancellation in a . w where a is nearly
        # orthogonal to w (which cost 2e-3 of the log-likelihood on one row in 10^5)
        h = hvp(w)
        nh, ng = jnp.linalg.norm(h), jnp.linalg.norm(g)
        u = jnp.where(nh > 0, h / jnp.where(nh > 0, nh, 1.0), jnp.where(ng > 0, g / jnp.where(ng > 0, ng, 1.0), 0.0))
        hu = hvp(u)
        f = lambda s: ell(e0 + s * u, row)  # noqa: E731 - the row along u
        d3 = jax.grad(jax.grad(jax.grad(f)))(jnp.zeros((), e0.dtype))
        return val, g, hu, hu @ u, d3, g @ u

    val, g, h, d2, d3, d1 = jax.vmap(per_row)(rows)
    live = d2 < 0
    sd2 = jnp.where(live, d2, -1.0)
    gauss = jnp.all(~live | (jnp.abs(d3) <= GAUSS_D3 * (-sd2) ** 1.5))
    # Poisson: t = d3 / d2, exp(m) = -d2 / t^2; Gaussian: t = sqrt(-d2), f'' = -1
    tp = jnp.where(live, d3 / sd2, 1.0)
    mu = -sd2 / (tp * tp)
    tg = jnp.sqrt(-sd2)
    t = jnp.where(gauss, tg, tp)
    scale = jnp.where(gauss, 1.0, mu) * t
    a = jnp.where(live[:, None], -h / scale[:, None], 0.0)
    m0 = a @ e0
    eta = jnp.where(gauss, m0, jnp.log(mu))
    y = jnp.where(live, jnp.where(gauss, m0, mu) + d1 / t, jnp.where(gauss, 0.0, 1.0))
    eta = jnp.where(live, eta, 0.0)
    b = jnp.where(gauss, 0.0, eta - m0)
    fval = jnp.where(gauss, -0.5 * (y - eta) ** 2, y * eta - jnp.exp(eta))
    k = val - fval
    ag = a[:, gj]
    gi = jnp.argmax(jnp.abs(ag), axis=1).astype(jnp.int32)
    ci = jnp.take_along_axis(ag, gi[:, None], axis=1)[:, 0]
    ok = jnp.all((jnp.sum(ag != 0, axis=1) <= 1) & jnp.all(jnp.isfinite(a), axis=1) & jnp.isfinite(b)
                 & jnp.isfinite(y) & jnp.isfinite(k) & (live | (jnp.abs(d1) == 0)))
    return jnp.where(gauss, 2, 1), a[:, fj], gi, ci, b, y, k, ok
