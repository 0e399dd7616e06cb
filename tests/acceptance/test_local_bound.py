"""The local logistic bound (a trust region around the centre, the exact decision outside it) on very unbalanced
data: never below the true remainder differences inside its region, far fewer items per step than the global
bound, and its chain against exact MH, with a shrunk bound as the negative control."""

import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.acceptance import PoissonThinning
from tallmh.models.logistic import LogisticLocalBound

sys.path.insert(0, str(Path(__file__).parent))
from thinning_helpers import compare, exact_mh_case, run_chains, setup  # noqa: E402

LOCAL = tm.models.LogisticRegression(remainder_bound="local")


def unbalanced(n, d=6, seed=0, rate=0.01):
    """About ``rate`` positives: an intercept at logit(rate), features on scales 0.3 to 3."""
    rng = np.random.default_rng(seed)
    sc = np.geomspace(0.3, 3, d - 1)
    X = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, d - 1)) * sc], 1)
    beta = np.r_[np.log(rate / (1 - rate)), rng.normal(size=d - 1) * 0.3 / sc]
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X.astype(np.float32), "y": y}


class Shrunk(LogisticLocalBound):
    def __init__(self, f):
        super().__init__()
        self.f = f

    def weights_host(self, center, rinv, batch):
        return self.f * super().weights_host(center, rinv, batch)


def _true_r(X, y, c, th):
    """``R_i(theta)`` in float64."""
    s = np.where(y > 0.5, 1.0, -1.0)
    m, t = s * (X @ c), s * (X @ (th - c))
    p = 1 / (1 + np.exp(-m))
    f = lambda u: -np.logaddexp(0.0, -u)  # noqa: E731 - log sigmoid
    return f(m + t) - f(m) - (1 - p) * t + 0.5 * p * (1 - p) * t * t


@pytest.fixture(scope="module")
def small():
    data = unbalanced(20_000)
    return (data,) + setup(LOCAL, data)


def test_local_bound_holds_inside_its_region_and_is_far_below_the_global_one(small):
    data, unravel, cv, stats, _ = small
    T = stats[fbm.FACTOR_KEY]
    bound = LOCAL.factor_bound()
    X, y = np.asarray(data["X"], np.float64), np.asarray(data["y"], np.float64)
    c, L = np.asarray(T.center, np.float64), np.asarray(T.chol_cov, np.float64)
    rinv = L.T  # (R^-1: chol_cov is R^-T)
    w = bound.weights_host(c, rinv, data)
    w_global = tm.models.logistic.LogisticCubicBound().weights_host(c, rinv, data) * bound.m3
    assert np.all(w <= w_global * (1 + 1e-6))
    assert w.sum() < 0.5 * w_global.sum()  # (the point of it: here most margins are large)
    rng = np.random.default_rng(0)
    d, r = c.shape[0], bound.radius_for(c.shape[0])
    checked = 0
    for i in range(80):
        z = rng.normal(size=d)
        z *= rng.uniform(0.05, 1.0) * r / np.linalg.norm(z)  # up to the region's edge
        zp = rng.normal(size=d)
        zp *= rng.uniform(0.05, 1.0) * r / np.linalg.norm(zp)
        if i % 2:
            zp = z + (zp - z) * 10 ** rng.uniform(-3, 0)  # near pairs too
        th, thp = c + L @ z, c + L @ zp
        zz, zzp = jnp.asarray(T.rt @ (th - c), jnp.float32), jnp.asarray(T.rt @ (thp - c), jnp.float32)
        if not bool(bound.region(zz, zzp)):
            continue
        checked += 1
        true = _true_r(X, y, c, thp) - _true_r(X, y, c, th)
        b = w * float(bound.phi(zz, zzp))
        assert np.all(np.abs(true) <= b * (1 + 1e-6) + 1e-13), float(np.max(np.abs(true) / np.maximum(b, 1e-300)))
    assert checked >= 60
    outside = jnp.asarray(np.r_[r * 1.01, np.zeros(d - 1)], jnp.float32)
    assert not bool(bound.region(outside, jnp.zeros(d, jnp.float32)))
    assert not bool(bound.region(jnp.zeros(d, jnp.float32), outside))  # (symmetric)


STEPS = 3000


@pytest.fixture(scope="module")
def chains_case():
    data = unbalanced(20_000, seed=1)
    unravel, cv, stats, prop, ref = exact_mh_case(LOCAL, data, STEPS)
    return data, unravel, cv, stats, prop, ref


@pytest.mark.slow
def test_local_bound_chain_matches_exact_mh_with_fewer_reads(chains_case):
    data, unravel, cv, stats, prop, ref = chains_case
    draws, _, nd = run_chains(LOCAL, data, PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert ok, report
    glob = tm.models.LogisticRegression(remainder_bound="global")
    g_unravel, g_cv, g_stats, _ = setup(glob, data)
    _, _, nd_g = run_chains(glob, data, PoissonThinning(), prop, g_unravel, g_cv, g_stats, 500, seed=1)
    assert nd.mean() < 0.5 * nd_g.mean(), (nd.mean(), nd_g.mean())


@pytest.mark.slow
def test_local_bound_chain_with_shrunk_bound_fails_the_same_check(chains_case):
    data, unravel, cv, stats, prop, ref = chains_case
    table, _ = fbm.prepare(LOCAL, data, data["y"].shape[0], unravel, cv, Shrunk(0.02))
    draws, _, _ = run_chains(LOCAL, data, PoissonThinning(), prop, unravel, cv, {**stats, fbm.FACTOR_KEY: table},
                             STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert not ok, report
