"""NB2 regression's remainder bound for the exact subsampled test: the remainder against a naive float64 one, float32
against float64 at N-sized problems with large counts, the bound against the true remainder differences on random
pairs in its trust region, and the chain against exact MH (with a shrunk bound as the negative control)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.frontends.formula import NegativeBinomialRegression
from tallmh.models.nb2_bound import NB2TrustBound, g3_bound, nb2_remainder_diff

sys.path.insert(0, str(Path(__file__).parent / "acceptance"))
from thinning_helpers import Shrunk, compare, exact_mh_case, run_chains, setup  # noqa: E402


def nb_data(n, seed=0, beta=(1.5, 0.8, -0.3), alpha=0.5, rare=0, rare_coef=-2.0):
    """Overdispersed counts: ``X = (1, x1, x2)`` normal features (and, with ``rare`` > 0, a one-hot column set in
    ``rare`` rows, coefficient ``rare_coef``: few small counts, a skewed posterior), ``y ~ NB2(exp(X beta), alpha)`` (gamma-Poisson); the largest
    counts are a few hundred."""
    rng = np.random.default_rng(seed)
    cols = [np.ones(n), rng.normal(size=n), rng.normal(size=n)]
    if rare:
        r = np.zeros(n)
        r[rng.choice(n, rare, replace=False)] = 1.0
        cols.append(r)
        beta = tuple(beta) + (rare_coef,)
    X = np.column_stack(cols).astype(np.float32)
    mu = np.exp(X.astype(np.float64) @ np.asarray(beta))
    y = rng.poisson(rng.gamma(1.0 / alpha, mu * alpha)).astype(np.float32)
    return {"X": X, "y": y}


def _pairs(rng, d, k, radius):
    """``k`` pairs ``(z, z')`` in the ball: far (independent, norms up to the radius) and near (a small step)."""
    def ball(m):
        u = rng.normal(size=(m, d))
        return u / np.linalg.norm(u, axis=1, keepdims=True) * radius * rng.random((m, 1)) ** (1.0 / d)

    z, zp = ball(k), ball(k)
    near = zp[: k // 2]
    step = rng.normal(size=near.shape) * 10.0 ** rng.uniform(-3, 0, size=(k // 2, 1))
    cand = z[: k // 2] + step
    ok = np.linalg.norm(cand, axis=1) <= radius
    near[ok] = cand[ok]
    return z, zp


_remainder = jax.jit(nb2_remainder_diff)


def _remainder64(X, y, c, th, thp):
    with jax.enable_x64(True):
        return np.asarray(_remainder(*(jnp.asarray(a, jnp.float64) for a in (X, y, c, th, thp))))


def test_remainder_matches_the_naive_float64_remainder():
    """``R_i(theta') - R_i(theta)`` against ``ell - ell(c) - g a - a^T H a / 2`` by autodiff in float64 (at steps where
    float64's cancellation is far below the remainder), for counts 0, 1 and 300."""
    rng = np.random.default_rng(1)
    data = nb_data(40, seed=1)
    X, y = data["X"].astype(np.float64), data["y"].astype(np.float64)
    y[:3] = [0.0, 1.0, 300.0]
    model = NegativeBinomialRegression()
    with jax.enable_x64(True):
        c = jnp.array([1.4, 0.7, -0.2, -0.6])

        def rem(th):
            def one(xi, yi):
                f = lambda t: model.log_lik(t, {"X": xi[None], "y": yi[None]})[0]  # noqa: E731
                a = th - c
                return f(th) - f(c) - jax.grad(f)(c) @ a - 0.5 * a @ jax.hessian(f)(c) @ a
            return jax.vmap(one)(jnp.asarray(X), jnp.asarray(y))

        for _ in range(3):
            th, thp = c + 0.3 * rng.normal(size=4), c + 0.3 * rng.normal(size=4)
            ref = np.asarray(rem(thp) - rem(th))
            got = _remainder64(X, y, c, th, thp)
            np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-12 * np.max(np.abs(ref)))  # (jax gammaln: ~1e-13)


def test_float32_remainder_agrees_with_float64():
    """At N = 20,000 rows with counts up to a few hundred, the float32 remainder differences equal the float64 ones to
    within float32 rounding (relative to the bound's scale of each pair, or to the value itself, and to the rounding
    of the step ``x . (theta' - theta)`` itself)."""
    data = nb_data(20_000, seed=3)
    data["y"][:4] = [250.0, 300.0, 400.0, 600.0]  # (a few large counts: the sum over k < y at its longest)
    model = NegativeBinomialRegression()
    unravel, cv, stats, _ = setup(model, data)
    table = stats["factor_table"]
    c = np.asarray(table.center, np.float64)
    rt = np.asarray(table.rt, np.float64)
    rinv = np.linalg.inv(rt.T)
    bound = NB2TrustBound()
    w = bound.weights_host(c, rinv, data)
    # the compiled weights (rows read from files) in float32 agree with the host's float64 ones
    w32 = np.asarray(bound.weights(jnp.asarray(c, jnp.float32), jnp.asarray(rinv, jnp.float32),
                                   {k: jnp.asarray(v) for k, v in data.items()}), np.float64)
    np.testing.assert_allclose(w32, w, rtol=1e-4)
    rng = np.random.default_rng(4)
    worst = 0.0
    for z, zp in zip(*_pairs(rng, 4, 40, 3.0)):
        # (the same float32 parameters for both: the chain's theta is float32)
        c32, th, thp = (np.float32(v) for v in (c, c + np.linalg.solve(rt, z), c + np.linalg.solve(rt, zp)))
        r64 = _remainder64(data["X"], data["y"], c32, th, thp)
        r32 = np.asarray(_remainder(*(jnp.asarray(v) for v in (data["X"], data["y"], c32, th, thp))), np.float64)
        with jax.enable_x64(True):
            scale = w * float(bound.phi(jnp.asarray(z), jnp.asarray(zp)))
        # the step's own float32 rounding (of x . (theta' - theta)) is relative to |z|, not to |z' - z|
        steps = 1.0 + max(np.linalg.norm(z), np.linalg.norm(zp)) / np.linalg.norm(zp - z)
        err = np.abs(r32 - r64) / (scale + np.abs(r64) + 1e-30) / steps
        worst = max(worst, float(np.max(err)))
    print("largest float32 error / (bound + |R' - R|) / (1 + |z| / |z' - z|):", worst)
    assert worst < 1e-6, worst  # (about 16 float32 ulps)


def test_bound_holds_on_random_pairs_in_the_region():
    """``|R_i(theta') - R_i(theta)| <= w_i phi(z, z')`` (float64 remainders) for every row and many random pairs, far
    and near, in the trust region; the bound is not loose by orders of magnitude at its tightest rows."""
    data = nb_data(3000, seed=2)
    model = NegativeBinomialRegression()
    unravel, cv, stats, _ = setup(model, data)
    table = stats["factor_table"]
    c = np.asarray(table.center, np.float64)
    rt = np.asarray(table.rt, np.float64)
    rinv = np.linalg.inv(rt.T)
    bound = NB2TrustBound()
    radius = bound.radius_for(4)
    w = bound.weights_host(c, rinv, data)
    rng = np.random.default_rng(5)
    tight = 0.0
    for z, zp in zip(*_pairs(rng, 4, 200, radius)):
        th, thp = c + np.linalg.solve(rt, z), c + np.linalg.solve(rt, zp)
        r = _remainder64(data["X"], data["y"], c, th, thp)
        with jax.enable_x64(True):
            assert bool(bound.region(jnp.asarray(z), jnp.asarray(zp)))
            b = w * float(bound.phi(jnp.asarray(z), jnp.asarray(zp)))
        ratio = np.abs(r) / b
        assert np.all(ratio <= 1.0), (np.max(ratio), z, zp)
        tight = max(tight, float(np.max(ratio)))
    print("largest |R' - R| / bound:", tight)
    assert tight > 1e-3, tight


def test_g3_bound_covers_the_sum():
    """:func:`g3_bound` against the sum it bounds, at its worst point (``tau`` at the region's low end)."""
    sp3 = lambda u: jax.nn.sigmoid(u) * jax.nn.sigmoid(-u) * jnp.abs(1 - 2 * jax.nn.sigmoid(u))  # noqa: E731
    for a_max in (1e-3, 0.05, 0.3, 1.0, 7.0, 200.0):
        for y in (0, 1, 2, 5, 50, 400, 5000):
            k = np.arange(1, max(y, 1), dtype=np.float64)
            s = float(np.sum(sp3(np.log(a_max / k)))) if y > 1 else 0.0
            assert s <= g3_bound(np.float64(y), a_max) * (1 + 1e-6) + 1e-12, (a_max, y)


# --- chains against exact MH ---------------------------------------------------------------------------------

STEPS = 3000


@pytest.fixture(scope="module")
def nb_case():
    data = nb_data(5000, seed=6, rare=20, rare_coef=-3.5)
    model = NegativeBinomialRegression()
    unravel, cv, stats, prop, ref = exact_mh_case(model, data, STEPS)
    return model, data, unravel, cv, stats, prop, ref


@pytest.mark.slow
def test_nb2_chain_matches_exact_mh(nb_case):
    model, data, unravel, cv, stats, prop, ref = nb_case
    draws, _, nd = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    print(report, "\nrows per step", nd.mean())
    assert ok, report
    assert nd.mean() < 50, nd.mean()


@pytest.mark.slow
def test_nb2_chain_with_shrunk_bound_fails_the_same_check(nb_case):
    model, data, unravel, cv, stats, prop, ref = nb_case
    table, _ = fbm.prepare(model, data, 5000, unravel, cv, Shrunk(model.factor_bound(), 0.02))
    draws, _, _ = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv,
                             {**stats, fbm.FACTOR_KEY: table}, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    print(report)
    assert not ok, report


@pytest.mark.slow
def test_sample_picks_the_exact_test_for_nb2():
    """``tm.sample`` with defaults takes the exact subsampled test for NB2 regression, reads few rows per step, is
    trusted, and its posterior holds the simulation's parameters (within 4 posterior sds)."""
    data = nb_data(10_000, seed=7)
    res = tm.sample(NegativeBinomialRegression(), data, num_chains=2, seed=0, progress=False)
    assert res.notes[0].startswith("default method: exact-subsampled"), res.notes[0]
    assert res.trusted, res.verdict
    assert float(np.mean(res.stats["n_data"])) < 100
    draws = np.asarray(res.flat_samples, np.float64).reshape(-1, 4)
    truth = np.array([1.5, 0.8, -0.3, np.log(0.5)])
    z = (draws.mean(axis=0) - truth) / draws.std(axis=0)
    assert np.all(np.abs(z) < 4.0), z
