"""The stratum of exact rows: items whose Taylor remainder can dominate the sum, read at every step.

With control variates (:mod:`tallmh.control_variates`) austerity's t-test sees the remainders
``l~_i = l_i - (p_i(theta') - p_i(theta))`` of a second-order Taylor expansion at the mode ``theta_hat``. For a
generalised linear model ``ell_i(theta) = f(x_i . theta)`` the remainder is ``f'''(xi) (x_i . (t - theta_hat))^3 / 6``
for some ``xi``, and in the Laplace metric (``Sigma = L L^T`` the Laplace covariance, ``v = L^-1 (t - theta_hat)``,
of order one under the posterior) ``|x_i . (t - theta_hat)| <= rho_i ||v||`` with ``rho_i^2 = x_i^T Sigma x_i``. So
``rho_i^3`` weighs how much item i's remainder can move the sum; on data with a rare one-hot feature the few
rows that hold it carry most of ``sum_i rho_i^3`` (their feature's coefficient is known to the posterior only
from them, so ``rho_i`` is large there), and a subsample of a few hundred items seldom reads any of them: the
t-test then decides from the quadratic proxy alone, wrongly in one direction, and no estimate of its error
made from the items read can see it.

:func:`choose` makes one counted pass over the data that scores every item by its weight and keeps the
``k`` largest (the stratum); :func:`tallmh.acceptance.austerity.stratified_decide` sums those exactly at
every step and subsamples only the rest. The weight of an item is the model's ``remainder_weight(center,
chol, batch)`` where it has one (the built-in logistic regression: ``rho_i^3``), and otherwise the mean
absolute third directional derivative of ``ell_i`` at the centre along ``R`` fixed directions ``L e_j``
(``e_j`` standard normal), by nested forward-mode ``jax.jvp``: a GLM's ``|f'''(x_i . theta_hat)| E|x_i . L e|^3``,
zero for an item whose log-likelihood is quadratic (its remainder is zero).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .control_variates import AUTO_RATIO
from .model import own_method
from .setup_passes import full_pass, pass_chunk

__all__ = ["Stratum", "choose", "item_weights_fn", "DIRECTIONS"]

DIRECTIONS = 8  # random whitened directions of the generic weight


class Stratum(NamedTuple):
    rows: np.ndarray  # int32 (k,): the items read exactly at every step, sorted
    share: float  # their share of the sum of all items' weights
    total: float  # sum of all items' weights
    top: float  # the largest item's share


def item_weights_fn(model, unravel, center, chol):
    """``weights(batch) -> (b,)``: each item's remainder weight (module docstring)."""
    own = own_method(model, "remainder_weight")
    if callable(own):
        return lambda batch: own(center, chol, batch)
    d = center.shape[0]
    dirs = jnp.asarray(np.random.default_rng(0).standard_normal((DIRECTIONS, d)), center.dtype) @ chol.T

    def weights(batch):
        def f(th):
            return model.log_lik(unravel(th), batch)

        def third(v):
            d1 = lambda th: jax.jvp(f, (th,), (v,))[1]  # noqa: E731
            d2 = lambda th: jax.jvp(d1, (th,), (v,))[1]  # noqa: E731
            return jnp.abs(jax.jvp(d2, (center,), (v,))[1])

        return jnp.mean(jax.vmap(third)(dirs), axis=0)

    return weights


def choose(model, data, n: int, unravel, center, cov, k: int, min_share: float = 0.0) -> Stratum:
    """The ``k`` items of largest remainder weight, less those holding under ``min_share`` of the weights' sum
    (one pass over the data, to be counted by the caller)."""
    k = int(min(k, n))
    chol = jnp.asarray(np.linalg.cholesky(np.asarray(cov, np.float64)), center.dtype)
    weights = item_weights_fn(model, unravel, center, chol)
    size = pass_chunk(n)
    top = min(k, size)

    def chunk_top(center, chol, batch, mask):
        w = weights(batch)
        total = jnp.sum(jnp.where(mask & jnp.isfinite(w), w, 0.0))
        # an item whose weight is not finite is read exactly (first of all)
        w = jnp.where(mask, jnp.where(jnp.isfinite(w), w, jnp.finfo(w.dtype).max), -1.0)
        val, idx = jax.lax.top_k(w, top)
        return val, idx, total

    vals, idxs, total = [], [], 0.0
    for c, (val, idx, tot) in enumerate(full_pass(chunk_top, data, n, (center, chol), "tallmh: exact rows")):
        vals.append(np.asarray(val, np.float64))
        idxs.append(np.asarray(idx, np.int64) + c * size)
        total += float(tot)
    val, idx = np.concatenate(vals), np.concatenate(idxs)
    keep = (idx < n) & (val >= 0)
    val, idx = val[keep], idx[keep]
    order = np.argsort(-val, kind="stable")[:k]
    if min_share > 0.0:
        order = order[val[order] >= min_share * total]
    rows = np.sort(idx[order]).astype(np.int32)
    share = float(np.sum(val[order]) / total) if total > 0 else 0.0
    top = float(np.max(val) / total) if total > 0 and val.size else 0.0
    return Stratum(rows, share, total, top)


def attach(cvopt, model, data, n: int, unravel, cv, cov, notes):
    """``cv`` with the stratum ``cvopt`` asks for (``ControlVariates(exact_rows=...)``) and the passes it took
    (0 or 1); a note says how many rows are read exactly and their share of the remainders' weight."""
    k = cvopt.exact_row_cap(n) if cvopt is not None else 0
    if not k:
        return cv, 0
    auto = cvopt.exact_rows == "auto"
    if cov is None:  # no Laplace covariance: the weights in the parameters' own coordinates
        cov = np.eye(cv.center.shape[0])
        notes.append("exact rows chosen without a Laplace covariance (its Hessian is not negative definite): "
                     "weights in the parameters' own coordinates")
    st = choose(model, data, n, unravel, cv.center, cov, k, AUTO_RATIO / n if auto else 0.0)
    if not len(st.rows):
        notes.append(f"stratified austerity: no row's Taylor-remainder weight is {AUTO_RATIO:g} times the mean, so "
                     f"none is read exactly (the largest is {st.top * n:.3g} times the mean)")
        return cv, 1
    notes.append(f"stratified austerity: {len(st.rows)} rows read exactly at every step (those of largest "
                 f"Taylor-remainder weight, {100 * st.share:.1f}% of its sum); the rest subsampled")
    return cv._replace(exact_rows=jax.device_put(st.rows)), 1
