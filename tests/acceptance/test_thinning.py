"""The exact subsampled test (factorised MH by Poisson thinning): its decisions' law, its counts, its
bound in float32, its fallback, and its chains against exact MH (with negative controls)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats as sps

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.acceptance import PoissonThinning
from tallmh.kernel import make_problem
from tallmh.models.logistic import LogisticCubicBound

sys.path.insert(0, str(Path(__file__).parent))
from thinning_helpers import compare, exact_mh_case, run_chains, setup  # noqa: E402


def unequal_logistic(n, d=6, seed=0):
    """Logistic regression with an intercept and features on scales from 0.1 to 10."""
    rng = np.random.default_rng(seed)
    sc = np.geomspace(0.1, 10, d - 1)
    X = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, d - 1)) * sc], 1)
    beta = rng.normal(size=d) / np.sqrt(d) / np.r_[1.0, sc]
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X.astype(np.float32), "y": y}


def rare_feature(n=50_000, k=30, seed=0):
    """A one-hot feature present in ``k`` of ``n`` rows (its coefficient's posterior is far from Gaussian)."""
    rng = np.random.default_rng(seed)
    r = np.zeros(n)
    r[rng.choice(n, k, replace=False)] = 1
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 4)), r])
    beta = np.array([-0.5, 0.8, -0.4, 0.3, 0.2, 4.0])
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X.astype(np.float32), "y": y}


def heavy_rows(n=50_000, k=5, seed=0):
    """A few rows whose features are 100 times the others'."""
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 4))])
    X[rng.choice(n, k, replace=False), 1:] *= 100
    beta = np.array([-0.5, 0.8, -0.4, 0.3, 0.2])
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X.astype(np.float32), "y": y}


class Shrunk(LogisticCubicBound):
    """A deliberately wrong bound (weights times ``f``): the negative control."""

    def __init__(self, f):
        self.f = f

    def weights_host(self, center, rinv, batch):
        return self.f * super().weights_host(center, rinv, batch)


MODEL = tm.models.LogisticRegression(remainder_bound="global")  # (the local bound: test_local_bound.py)


def _problem(data, unravel, cv, stats, z, zp):
    """The decision between ``c + L z`` and ``c + L z'`` (L the Laplace factor; symmetric proposal)."""
    n = data["y"].shape[0]
    T = stats[fbm.FACTOR_KEY]
    th = T.center + T.chol_cov @ jnp.asarray(z, T.center.dtype)
    thp = T.center + T.chol_cov @ jnp.asarray(zp, T.center.dtype)
    base = MODEL.log_prior(thp) - MODEL.log_prior(th)
    d = jax.tree_util.tree_map(jnp.asarray, data)
    return make_problem(MODEL, d, n, unravel, stats, th, thp, base, None, cv, 2)


def _exact_alpha(problem):
    """SMH's factorised acceptance probability, from every item's remainder (float64 product)."""
    dr = np.asarray(problem.factors.remainder(jnp.arange(problem.n)), np.float64)
    return min(1.0, np.exp(float(problem.log_base))) * np.exp(np.sum(np.minimum(dr, 0.0)))


def _accept_rate(test, problem, k=20_000, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), k)
    dec = jax.jit(jax.vmap(lambda key: test.decide(key, problem)))(keys)
    return np.asarray(dec.accept).mean(), np.asarray(dec.n_data)


@pytest.fixture(scope="module")
def small():
    data = unequal_logistic(20_000)
    unravel, cv, stats, _ = setup(MODEL, data)
    return data, unravel, cv, stats


PAIRS = [([1.5, -1.0, 0.5, 0.0, 0.8, -0.3], [-1.2, 1.5, 0.0, 1.0, -0.5, 0.9]),
         ([3.0, 2.0, -2.5, 1.0, 0.0, 2.0], [-2.5, -2.0, 2.0, -1.5, 1.0, -2.0])]


@pytest.mark.parametrize("pair", PAIRS)
def test_decision_law_is_the_factorised_acceptance(small, pair):
    """The test's acceptance rate over keys equals SMH's factorised acceptance probability at fixed (theta, theta')."""
    data, unravel, cv, stats = small
    problem = _problem(data, unravel, cv, stats, *pair)
    alpha = _exact_alpha(problem)
    rate, nd = _accept_rate(PoissonThinning(), problem)
    k = nd.shape[0]
    assert 0.02 < alpha < 0.98, alpha  # (a pair where the remainders matter)
    assert abs(rate - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / k), (rate, alpha)
    assert nd.mean() < 0.05 * problem.n  # (no full pass)


def test_shrunk_bound_changes_the_decision_law(small):
    """Negative control: a bound 50 times too small thins too little, and the same check fails."""
    data, unravel, cv, stats = small
    table, _ = fbm.prepare(MODEL, data, data["y"].shape[0], unravel, cv, Shrunk(0.02))
    problem = _problem(data, unravel, cv, {**stats, fbm.FACTOR_KEY: table}, *PAIRS[1])
    alpha = _exact_alpha(problem)
    rate, nd = _accept_rate(PoissonThinning(), problem)
    assert abs(rate - alpha) > 4 * np.sqrt(alpha * (1 - alpha) / nd.shape[0]), (rate, alpha)


def test_counts_follow_their_poisson_law(small):
    """With every remainder zero nothing is kept, so the items read are the process's count K ~ Poisson(Lambda)."""
    data, unravel, cv, stats = small
    problem = _problem(data, unravel, cv, stats, *PAIRS[1])
    f = problem.factors
    zero = f._replace(remainder=lambda idx: jnp.zeros(idx.shape, jnp.float32))
    problem = problem._replace(factors=zero, log_base=jnp.float32(10.0))  # the surrogate's factor accepts
    lam = float(f.phi * f.table.total)
    assert 2 < lam < 200
    rate, nd = _accept_rate(PoissonThinning(chunk=1), problem, k=20_000, seed=3)
    assert rate == 1.0
    # chi-square against Poisson(Lambda): one bin per count below hi, one for the rest
    hi = int(sps.poisson.isf(0.002, lam))
    obs = np.array([np.sum(nd == v) for v in range(hi)] + [np.sum(nd >= hi)])
    p = np.r_[sps.poisson.pmf(np.arange(hi), lam), sps.poisson.sf(hi - 1, lam)]
    stat, pval = sps.chisquare(obs, p * nd.shape[0])
    assert pval > 1e-3, (pval, lam, nd.mean())
    # negative control: the same counts against a rate 10% higher are rejected
    p_wrong = np.r_[sps.poisson.pmf(np.arange(hi), 1.1 * lam), sps.poisson.sf(hi - 1, 1.1 * lam)]
    assert sps.chisquare(obs, p_wrong / p_wrong.sum() * nd.shape[0])[1] < 1e-3


def test_items_are_drawn_by_their_rate(small):
    """The grouped sampler draws each item with probability rate_i / total (within binomial error)."""
    _, _, _, stats = small
    T = stats[fbm.FACTOR_KEY]
    m = 400_000
    idx, _ = jax.jit(lambda k: fbm.draw_items(k, T, m))(jax.random.PRNGKey(5))
    idx = np.asarray(idx)
    G = int(np.sum(np.asarray(T.rate) > 0))  # (the groups made; the rest pad the table to its fixed shape)
    assert np.all(np.asarray(T.cum)[G - 1:] == np.asarray(T.cum)[-1])  # (padding: an empty draw range)
    order = np.asarray(T.order)[:int(np.asarray(T.count)[:G].sum())]
    n = int(np.asarray(T.order).max()) + 1
    groups = np.repeat(np.arange(G), np.asarray(T.count)[:G])
    p = np.zeros(n)
    p[order] = (np.asarray(T.rate, np.float64) / float(T.total))[groups]
    assert abs(p.sum() - 1) < 1e-4
    # per group of items of similar rate: observed share against expected
    where = np.full(n, -1)
    where[order] = groups
    assert np.all(where[idx] >= 0)  # (never an item of weight 0)
    obs = np.bincount(where[idx], minlength=G) / m
    exp = np.bincount(groups, weights=p[order], minlength=G)
    se = np.sqrt(exp * (1 - exp) / m)
    assert np.all(np.abs(obs - exp) <= 5 * se + 1e-6)


@pytest.mark.parametrize("span", [1, 3, 1_000_003, 2**30 + 12_345, 2**31 - 1])
def test_integers_below_a_span_are_the_multiply_high_of_64_bits(span):
    """``below(hi, lo, s) = floor((hi 2^32 + lo) s / 2^64)`` exactly (Python integers as the reference), so every
    value in ``[0, s)`` has floor or ceil of ``2^64 / s`` of the words; a plain ``lo % s`` is not that."""
    rng = np.random.default_rng(span % 1000)
    hi, lo = (rng.integers(0, 2**32, 5000, dtype=np.uint64) for _ in range(2))
    got = np.asarray(jax.jit(fbm.below)(jnp.asarray(hi.astype(np.uint32)), jnp.asarray(lo.astype(np.uint32)), span))
    want = np.array([((int(h) << 32 | int(v)) * span) >> 64 for h, v in zip(hi, lo)])
    assert np.array_equal(got, want)
    assert got.min() >= 0 and got.max() < span
    if span > 1:  # (negative control: the low word's remainder is another integer)
        assert not np.array_equal(lo.astype(np.int64) % span, want)


def test_fallback_is_exact_mh_with_the_same_u(small):
    """With a rate limit below the bound's rate, the decision is plain MH's (same u) after a full pass."""
    data, unravel, cv, stats = small
    problem = _problem(data, unravel, cv, stats, *PAIRS[0])
    keys = jax.random.split(jax.random.PRNGKey(7), 2000)
    dec = jax.jit(jax.vmap(lambda k: PoissonThinning(max_rate=1e-6).decide(k, problem)))(keys)
    dr = np.asarray(problem.factors.remainder(jnp.arange(problem.n)), np.float64)
    us = np.asarray(jax.vmap(lambda k: tm.acceptance.base.draw_u(k)[0])(keys), np.float64)
    expect = np.log(us) < float(problem.log_base) + dr.sum()
    near = np.abs(np.log(us) - float(problem.log_base) - dr.sum()) < 1e-4  # (float32 sums at the boundary)
    assert np.all((np.asarray(dec.accept) == expect) | near)
    assert np.all(np.asarray(dec.n_data) == problem.n)


def _bound_ratio(data, unravel, cv, stats, pairs):
    """Largest ``|R_i(theta') - R_i(theta)| / (w_i phi)`` over every item and the given whitened pairs, with the
    remainders in the working precision (float32) and the weights in float64."""
    T = stats[fbm.FACTOR_KEY]
    rinv = np.asarray(T.chol_cov, np.float64).T  # (R^-1: chol_cov is R^-T)
    w = LogisticCubicBound().weights_host(None, rinv, data)
    worst = 0.0
    for z, zp in pairs:
        problem = _problem(data, unravel, cv, stats, z, zp)
        f = problem.factors
        dr = np.concatenate([np.asarray(f.remainder(jnp.arange(s, min(s + 2**20, problem.n))), np.float64)
                             for s in range(0, problem.n, 2**20)])
        b = w * float(f.phi)
        worst = max(worst, float(np.max(np.abs(dr)[b > 0] / b[b > 0])))
        assert np.all(dr[b == 0] == 0)
    return worst


def _pairs(d, k, seed):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(k):
        z = rng.normal(size=d) * rng.uniform(0.1, 4)
        zp = z + rng.normal(size=d) * 10 ** rng.uniform(-4, 0.5)  # from nearly equal to far apart
        out.append((z, zp))
    return out


def test_float32_remainder_within_its_bound(small):
    data, unravel, cv, stats = small
    assert _bound_ratio(data, unravel, cv, stats, _pairs(6, 20, 0)) <= 1.0


@pytest.mark.slow
def test_float32_remainder_within_its_bound_at_1e7():
    """At N = 10^7 the steps per item are ~1/sqrt(N) of the Laplace scale: the regime where the remainder's
    naive float32 form loses every digit."""
    data = unequal_logistic(10_000_000, d=6, seed=1)
    unravel, cv, stats, _ = setup(MODEL, data)
    assert _bound_ratio(data, unravel, cv, stats, _pairs(6, 6, 1)) <= 1.0


# --- chains against exact MH ------------------------------------------------------------------------------

STEPS = 3000


def _case(make):
    data = make()
    unravel, cv, stats, prop, ref = exact_mh_case(MODEL, data, STEPS)
    return data, unravel, cv, stats, prop, ref


@pytest.fixture(scope="module")
def rare():
    return _case(rare_feature)


@pytest.fixture(scope="module")
def heavy():
    return _case(heavy_rows)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rare", "heavy"])
def test_chain_matches_exact_mh(case, request):
    """Every coordinate's mean within 4 MCSE of exact MH's and its sd ratio within 4 of its MCSE; O(1) reads."""
    data, unravel, cv, stats, prop, ref = request.getfixturevalue(case)
    draws, acc, nd = run_chains(MODEL, data, PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert ok, report
    assert nd.mean() < 50, nd.mean()


@pytest.mark.slow
def test_chain_with_shrunk_bound_fails_the_same_check(rare):
    """Negative control: weights 50 times too small bias the rare coefficient, and the check sees it."""
    data, unravel, cv, stats, prop, ref = rare
    table, _ = fbm.prepare(MODEL, data, data["y"].shape[0], unravel, cv, Shrunk(0.02))
    draws, _, _ = run_chains(MODEL, data, PoissonThinning(), prop, unravel, cv, {**stats, fbm.FACTOR_KEY: table},
                             STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert not ok, report


@pytest.mark.slow
def test_chain_with_fallback_taken_is_exact(rare):
    """A rate limit that sends part of the steps to the full exact decision (chosen by the symmetric rate
    Lambda(theta, theta')): still exact."""
    data, unravel, cv, stats, prop, ref = rare
    draws, _, nd = run_chains(MODEL, data, PoissonThinning(max_rate=22.0), prop, unravel, cv, stats, STEPS, seed=2)
    full = np.mean(nd >= data["y"].shape[0])
    assert 0.01 < full < 0.95, full
    ok, zm, zs, report = compare(draws, ref)
    assert ok, report


def test_a_table_of_another_centre_falls_back_to_exact_mh(small):
    """Control variates recentred away from the table's centre: the bound is not used (full exact pass)."""
    data, unravel, cv, stats = small
    moved = cv._replace(center=cv.center + 1e-3)
    T = stats[fbm.FACTOR_KEY]
    th, thp = T.center + 1e-3, T.center - 1e-3
    d = jax.tree_util.tree_map(jnp.asarray, data)
    problem = make_problem(MODEL, d, data["y"].shape[0], unravel, stats, th, thp, jnp.float32(0.0), None, moved, 2)
    assert not bool(problem.factors.region)
    dec = PoissonThinning().decide(jax.random.PRNGKey(0), problem)
    assert int(dec.n_data) == problem.n


@pytest.mark.slow
def test_default_method_passes_where_the_approximate_default_fails_on_the_rare_feature(rare):
    """tm.sample's default for this model (the exact subsampled test, from the run's own set-up) passes the check
    on the rare-feature case; the approximate default of models without a bound (austerity with control variates
    and Langevin) misses exact MH's posterior by more than the check allows: the check has the power to see
    that bias."""
    data, unravel, cv, stats, prop, ref = rare
    res = tm.sample(MODEL, data, seed=0, progress=False, num_samples=6000)
    assert res.label.startswith("exact-subsampled")
    ok, zm, zs, report = compare(np.asarray(res.flat_samples, np.float64), ref)
    assert ok, report
    res = tm.sample(MODEL, data, seed=0, progress=False, test=tm.acceptance.Austerity(error=0.05),
                    control_variates=tm.ControlVariates())
    ok, zm, zs, report = compare(np.asarray(res.flat_samples, np.float64), ref)
    assert not ok, report


def test_table_from_device_arrays_matches_the_host_ones(small):
    """The set-up pass on device arrays (working precision, weights inflated by 1e-3) gives the host's table."""
    data, unravel, cv, stats = small
    n = data["y"].shape[0]
    t_dev, items = fbm.prepare(MODEL, {k: jnp.asarray(v) for k, v in data.items()}, n, unravel, cv)
    t_host = stats[fbm.FACTOR_KEY]
    assert items == n
    assert 1.0 <= float(t_dev.total) / float(t_host.total) < 1.002
    assert np.array_equal(np.sort(np.asarray(t_dev.order)), np.sort(np.asarray(t_host.order)))


def test_spare_lanes_of_a_chunk_are_counted(small):
    """With chunk > 1 every lane's row is counted: items read are a multiple of the chunk."""
    data, unravel, cv, stats = small
    problem = _problem(data, unravel, cv, stats, *PAIRS[1])
    _, nd = _accept_rate(PoissonThinning(chunk=4), problem, k=2000)
    assert np.all(nd % 4 == 0) and nd.max() > 0
