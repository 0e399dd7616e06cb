"""Chains of the exact subsampled test (and of exact MH) run directly on the kernel, for the tests."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh import factor_bounds as fbm
from tallmh.kernel import build_kernel


def setup(model, data, bound=None):
    """``(unravel, cv state at the mode, statistics with the factor table, set-up items)``."""
    n = int(np.shape(jax.tree_util.tree_leaves(data)[0])[0])
    flat0, unravel = ravel_pytree(model.init(data))
    cv, passes, extra = cvm.prepare(tm.ControlVariates(order=2), model, data, n, unravel, flat0)
    table, items = fbm.prepare(model, data, n, unravel, cv, bound)
    stats = model.setup(data) if callable(getattr(model, "setup", None)) else None
    stats = dict(stats or {})
    stats[fbm.FACTOR_KEY] = table
    return unravel, cv, stats, n * passes + extra + items


def run_chains(model, data, test, proposal, unravel, cv, stats, steps, chains=4, seed=0, cv_order=2, init=None):
    """``(draws (chains, steps, d), accepted, n_data)`` from ``chains`` chains started at the centre (or ``init``)."""
    n = int(np.shape(jax.tree_util.tree_leaves(data)[0])[0])
    kernel = build_kernel(model, proposal, test, n, unravel, stats, cv_order)
    data = jax.tree_util.tree_map(jnp.asarray, data)
    start = cv.center if init is None else init
    th0 = jnp.broadcast_to(start, (chains,) + start.shape)
    states = jax.vmap(kernel.init, in_axes=(0, None, None))(th0, data, cv if cv_order else None)

    def one(key, state):
        def body(st, k_i):
            k, i = k_i
            st, info = kernel.step(k, st, data, i, False, stats)
            return st, (st.theta, info.accepted, info.n_data)

        keys = jax.random.split(key, steps)
        _, out = jax.lax.scan(body, state, (keys, jnp.arange(steps)))
        return out

    keys = jax.random.split(jax.random.PRNGKey(seed), chains)
    draws, acc, nd = jax.jit(jax.vmap(one))(keys, states)
    return np.asarray(draws, np.float64), np.asarray(acc), np.asarray(nd)


def compare(draws, ref, z=4.0):
    """Every coordinate's mean within ``z`` MCSE (both samplers' errors combined) of the reference's, and its sd
    ratio within ``z`` of its own MCSE of 1. Returns ``(ok, worst z of the means, worst z of the sds, report)``."""
    import arviz as az

    def ess(x):
        return float(np.ravel(az.ess(x))[0])

    def se_mean(x):
        return x.std() / np.sqrt(ess(x))

    def se_sd(x):  # delta method: sd = sqrt(mean of the squared deviations)
        v = (x - x.mean()) ** 2
        return se_mean(v) / (2.0 * x.std())

    lines, zm_max, zs_max = [], 0.0, 0.0
    for j in range(draws.shape[-1]):
        a, b = draws[..., j], ref[..., j]
        se_m = np.hypot(se_mean(a), se_mean(b))
        se_s = np.hypot(se_sd(a), se_sd(b))
        zm = (a.mean() - b.mean()) / se_m
        zs = (a.std() - b.std()) / se_s
        zm_max, zs_max = max(zm_max, abs(zm)), max(zs_max, abs(zs))
        lines.append(f"[{j}] mean {a.mean():.4g} vs {b.mean():.4g} (z {zm:+.2f}); sd ratio {a.std() / b.std():.3f} (z {zs:+.2f})")
    return zm_max < z and zs_max < z, zm_max, zs_max, "\n".join(lines)


def exact_mh_case(model, data, steps, seed=101):
    """``(unravel, cv, stats, proposal, reference draws)``: the set-up (:func:`setup`), the independence proposal
    from the table's Laplace approximation (Crank-Nicolson at rho 0) and exact MH's chains with it, the reference
    the exact subsampled test's chains are compared with (:func:`compare`)."""
    unravel, cv, stats, _ = setup(model, data)
    T = stats[fbm.FACTOR_KEY]
    prop = tm.proposals.CrankNicolson(np.asarray(T.center), np.asarray(T.chol_cov), rho=0.0)
    ref, _, _ = run_chains(model, data, tm.acceptance.Exact(), prop, unravel, cv, stats, steps, seed=seed,
                           cv_order=None)
    return unravel, cv, stats, prop, ref


class Shrunk:
    """A deliberately wrong bound: the weights of ``inner`` times ``f`` (the negative control)."""

    def __init__(self, inner, f):
        self.inner, self.f = inner, f

    def weights_host(self, center, rinv, batch):
        return self.f * self.inner.weights_host(center, rinv, batch)

    def __getattr__(self, name):
        return getattr(self.inner, name)
