"""Austerity's per-step error target: the designed boundary, measured whole-step error, support.

``Austerity(error=e)`` designs Alg. 1's per-look level so that the worst case (over the standardised gap)
of the probability that the step's decision differs from exact MH is e (``acceptance/_sequential.py``).
Checks, all with fixed seeds and one-sided binomial margins (z = 3.29) from ``helpers.binomial_margin``:

* the recursion that computes the worst-case error agrees with a direct simulation of every look;
* on a synthetic worst-case problem (gap ~ 0 for every u) the measured error of the error form matches
  the design (two-sided), and the per-look form at the same nominal value (the negative control) errs
  several times more often, as the same computation predicts;
* on logistic-regression pairs near the posterior, including two pairs on the decision boundary
  (exact acceptance probability 1/2 with a wide spread of l_i), the error form stays within the target
  on every pair and the per-look form exceeds it;
* non-finite l_i and a -inf prior ratio reject; the Decision carries n_nonfinite and excess_error.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.acceptance import _sequential as seq
from tallmh.acceptance.base import Problem

from .helpers import binomial_margin, decisions, exact_log_ratio, logistic_problem


@functools.lru_cache(maxsize=None)
def _decider(test):
    """A jitted ``(values, log_base, keys) -> Decision`` for the problem whose l_i are ``values``."""

    def run(values, log_base, keys):
        problem = Problem(values.shape[0], log_base, lambda idx: values[idx], None, None)
        return jax.vmap(lambda k: test.decide(k, problem))(keys)

    return jax.jit(run)


def _decide(test, values, keys, log_base=0.0):
    values = jnp.asarray(values, jnp.result_type(float))
    return _decider(test)(values, jnp.asarray(log_base, values.dtype), keys)


# ---------------------------------------------------------------- the boundary computation


@pytest.mark.parametrize("n,m,c", [(5000, 500, 2.5), (12214, 500, 2.0), (100_000, 100, 3.0)])
def test_recursion_matches_simulation_of_every_look(n, m, c):
    # (100000, 100): 999 looks, grouped by the recursion (Brownian-bridge crossing between groups)
    p = seq.exit_probability(c, n, m)
    paths = 20000
    q = seq.simulate_exit_probability(c, n, m, paths=paths, seed=1)
    se = np.sqrt(q * (1 - q) / paths)
    assert abs(p - q) <= 3.29 * se + 0.002, (p, q, se)


def test_root_finder_brackets_and_converges():
    calls = []

    def counted(g):
        def f(x):
            calls.append(x)
            return g(x)
        return f

    for g, a, b, root in ((lambda x: x**3 - 2.0, 0.0, 3.0, 2.0 ** (1 / 3)),
                          (lambda x: np.exp(-x) - 0.01, 0.0, 20.0, np.log(100.0)),
                          (lambda x: np.arctan(x - 1.3), 50.0, -10.0, 1.3),  # decreasing end first
                          (lambda x: 1e-9 * (0.5 - x), 0.0, 1.0, 0.5)):
        calls.clear()
        got = seq._root(counted(g), a, b, g(a), g(b), xtol=1e-10)
        assert abs(got - root) <= 1e-9
        assert all(min(a, b) <= x <= max(a, b) for x in calls) and len(calls) <= 40
    with pytest.raises(ValueError):
        seq._root(lambda x: x, 1.0, 2.0, 1.0, 2.0)


def test_gauss_legendre_nodes_converged():
    # the recursion's quadrature (seq._NODES nodes) agrees with 200 nodes far below any level that matters
    for n, m, c in ((10**4, 50, 2.9), (10**6, 100, 3.17), (10**9, 300, 3.37)):
        ref = seq.exit_probability(c, n, m, nodes=200)
        assert abs(seq.exit_probability(c, n, m) / ref - 1) < 1e-8
        assert abs(seq.exit_probability(c, n, m, nodes=24) / ref - 1) > 1e-6  # too few nodes do show


@pytest.mark.slow
def test_per_look_level_gives_the_target():
    for target in (0.05, 0.01, 0.001):
        for n, m in ((5000, 500), (12214, 500), (10**6, 100)):
            alpha = seq.per_look_level(target, n, m)
            assert alpha < target
            assert abs(seq.worst_case_error(alpha, n, m) - target) < 1e-3 * target
    # more looks need a stricter per-look level; a single look (m = N) makes the test exact
    assert seq.per_look_level(0.05, 10**6, 100) < seq.per_look_level(0.05, 10**4, 100)
    assert seq.worst_case_error(0.3, 500, 500) == 0.0
    # one look before N: the per-look level is the target itself
    assert abs(seq.per_look_level(0.05, 501, 500) - 0.05) < 1e-6


def test_api_forms_and_labels():
    A = tm.acceptance.Austerity
    a = A()
    assert (a.error, a.epsilon, a.error_target, a.label) == (0.05, None, 0.05, "austerity(error=0.05)")
    assert A(0.01, 300) == A(error=0.01, batch_size=300)  # positional: the per-step target
    b = A(epsilon=0.05, batch_size=500)
    assert (b.error_target, b.label, b.name, a.name) == (None, "austerity(eps=0.05)", "austerity", "austerity")
    assert b.per_look_epsilon(5000) == 0.05
    # batch_size="auto" (the default): 100 items per look
    assert a.batch_auto and a.batch_size == 100 and "batch_size='auto'" in repr(a)
    assert a.per_look_epsilon(5000) == pytest.approx(seq.per_look_level(0.05, 5000, 100))
    assert not A(0.05, 500).batch_auto
    with pytest.raises(tm.ConfigError, match="'auto'"):
        A(batch_size="big")
    with pytest.raises(tm.ConfigError, match="not both"):
        A(0.05, epsilon=0.05)
    for bad in (0.0, 0.5, 1.0, -0.1):
        with pytest.raises(tm.ConfigError, match="error must be in"):
            A(error=bad)


# ---------------------------------------------------------------- measured whole-step error

KEYS = 4000


@pytest.fixture(scope="module")
def worst_case():
    # N = 5000 items with sd 10 and sum 0, log_base = log(1/2): exact MH accepts iff u < 1/2, and for
    # (almost) every u the standardised gap stays ~0 at every look: the worst case of the design
    rng = np.random.default_rng(0)
    values = rng.standard_normal(5000) * 10.0
    values = values - values.mean()
    keys = jax.random.split(jax.random.PRNGKey(0), KEYS)
    ref = np.asarray(_decide(tm.acceptance.Exact(), values, keys, np.log(0.5)).accept)
    return values, keys, ref


@pytest.mark.slow
def test_error_form_meets_its_target_in_the_worst_case(worst_case):
    values, keys, ref = worst_case
    target = 0.05
    test = tm.acceptance.Austerity(error=target, batch_size=500)
    dec = _decide(test, values, keys, np.log(0.5))
    err = float((np.asarray(dec.accept) != ref).mean())
    margin = binomial_margin(target, KEYS)
    assert err <= target + margin, err
    # not merely conservative: in the worst case the error is the target
    assert err >= target - margin, err
    assert np.asarray(dec.n_data).mean() < len(values)  # it still subsamples


@pytest.mark.slow
def test_negative_control_per_look_form_exceeds_the_target(worst_case):
    values, keys, ref = worst_case
    test = tm.acceptance.Austerity(epsilon=0.05, batch_size=500)
    err = float((np.asarray(_decide(test, values, keys, np.log(0.5)).accept) != ref).mean())
    assert err > 0.05 + binomial_margin(0.05, KEYS), err
    predicted = test.worst_case_error(len(values))  # ~0.21 with 9 looks before N
    assert abs(err - predicted) <= binomial_margin(predicted, KEYS), (err, predicted)


PAIR_KEYS = 1000
N = 5000


@pytest.fixture(scope="module")
def logistic_pairs():
    model, data, _ = logistic_problem(n=N, d=3, seed=3)
    X, y = data["X"].astype(float), data["y"].astype(float)
    th = np.zeros(X.shape[1])
    for _ in range(25):  # posterior mode (Newton, float64, test set-up only)
        p = 1 / (1 + np.exp(-X @ th))
        g = X.T @ (y - p) - th / 100
        H = -(X.T * (p * (1 - p))) @ X - np.eye(len(th)) / 100
        th = th - np.linalg.solve(H, g)
    chol = np.linalg.cholesky(np.linalg.inv(-H))
    rng = np.random.default_rng(0)
    a_list, b_list = [], []
    while len(a_list) < 3:  # pairs as a converged random walk sees them, moderate acceptance
        a = th + chol @ rng.standard_normal(len(th))
        b = a + 1.2 * chol @ rng.standard_normal(len(th))
        if 0.2 < min(1.0, np.exp(exact_log_ratio(model, data, a, b))) < 0.8:
            a_list.append(a)
            b_list.append(b)
    # pairs on the decision boundary: symmetric about the mode along a posterior direction (a wide spread
    # of l_i), shifted along it until the exact log ratio is log(1/2)
    for s, v in ((2.0, np.array([1.0, 0, 0, 0])), (4.0, np.array([0, 1.0, 1.0, 0]) / np.sqrt(2))):
        v = chol @ v
        gap = lambda o: exact_log_ratio(model, data, th + (o - s) * v, th + (o + s) * v) - np.log(0.5)
        lo, hi = -1.0, 1.0
        assert gap(lo) * gap(hi) < 0
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            lo, hi = (lo, mid) if gap(lo) * gap(mid) <= 0 else (mid, hi)
        o = 0.5 * (lo + hi)
        a_list.append(th + (o - s) * v)
        b_list.append(th + (o + s) * v)
    pairs = (np.array(a_list, np.float32), np.array(b_list, np.float32))
    keys = jax.random.split(jax.random.PRNGKey(11), PAIR_KEYS)
    ref, _ = decisions(tm.acceptance.Exact(), model, data, pairs, keys)
    return model, data, pairs, keys, ref


@pytest.mark.slow
def test_error_form_within_target_on_pairs_near_the_posterior(logistic_pairs):
    model, data, pairs, keys, ref = logistic_pairs
    target = 0.05
    acc, nd = decisions(tm.acceptance.Austerity(error=target, batch_size=500), model, data, pairs, keys)
    err = (acc != ref).mean(axis=1)
    assert np.all(err <= target + binomial_margin(target, PAIR_KEYS)), err
    assert nd.mean() < N


@pytest.mark.slow
def test_negative_control_per_look_form_exceeds_target_on_the_same_pairs(logistic_pairs):
    model, data, pairs, keys, ref = logistic_pairs
    acc, _ = decisions(tm.acceptance.Austerity(epsilon=0.05, batch_size=500), model, data, pairs, keys)
    err = (acc != ref).mean(axis=1)
    # both decision-boundary pairs (the last two) exceed the nominal value
    assert np.all(err[-2:] > 0.05 + binomial_margin(0.05, PAIR_KEYS)), err


# ---------------------------------------------------------------- support and the CLT check


@pytest.mark.slow
@pytest.mark.parametrize("form", [dict(error=0.05), dict(epsilon=0.05)])
def test_a_nonfinite_item_read_rejects_at_once(form):
    # strong evidence for accepting, one bad item among 2000: the test stops on the first batch of 100,
    # so the bad item is read for ~5% of the keys; exactly those reject, and n_nonfinite says so
    test = tm.acceptance.Austerity(batch_size=100, **form)
    keys = jax.random.split(jax.random.PRNGKey(3), 1000)
    for bad in (np.nan, np.inf, -np.inf):
        values = np.full(2000, 0.01) + 0.001 * np.random.default_rng(0).standard_normal(2000)
        values[1234] = bad
        dec = _decide(test, values, keys)
        acc, nnf, nd = (np.asarray(x) for x in (dec.accept, dec.n_nonfinite, dec.n_data))
        assert 10 < (nnf > 0).sum() < 120, (bad, (nnf > 0).sum())
        np.testing.assert_array_equal(acc, nnf == 0)
        assert np.all(nnf <= 1) and np.all(nd == 100)
        # many bad items (10%): every decision rejects after the first batch
        values[::10] = bad
        dec = _decide(test, values, keys)
        assert not np.asarray(dec.accept).any()
        assert np.all(np.asarray(dec.n_data) == 100) and np.all(np.asarray(dec.n_nonfinite) >= 1)


@pytest.mark.parametrize("log_base", [-np.inf, np.nan])
def test_impossible_proposal_rejected_without_reading_data(log_base):
    test = tm.acceptance.Austerity(batch_size=100)
    dec = _decide(test, np.ones(1000), jax.random.split(jax.random.PRNGKey(0), 8), log_base)
    assert not np.asarray(dec.accept).any()
    assert np.all(np.asarray(dec.n_data) == 0) and np.all(np.asarray(dec.rounds) == 0)


@pytest.mark.slow
def test_nan_support_through_a_model():
    # a model whose support depends on the data (log-lik NaN where x > theta): a proposal that puts some
    # items outside the support must never be accepted once such an item is read
    rng = np.random.default_rng(0)
    data = {"x": rng.uniform(0.0, 1.0, 3000)}

    def log_lik(th, b):
        return jnp.where(b["x"] <= th[0], -jnp.log(th[0]), jnp.nan)

    model = tm.Model(log_prior=lambda th: 0.0 * th[0], log_lik=log_lik)
    f = tm.decision_fn(tm.acceptance.Austerity(batch_size=100), model, data)
    keys = jax.random.split(jax.random.PRNGKey(0), 200)
    # theta' = 0.9 leaves 10% of the items outside the support: every decision reads one at once
    acc, nd = jax.vmap(lambda k: f(jnp.array([1.2]), jnp.array([0.9]), k))(keys)
    assert not np.asarray(acc).any() and np.all(np.asarray(nd) == 100)


@pytest.mark.slow
def test_excess_error_in_the_decision():
    rng = np.random.default_rng(0)
    keys = jax.random.split(jax.random.PRNGKey(1), 100)
    test = tm.acceptance.Austerity(batch_size=100)
    out = {}
    for name, v in (("normal", 0.01 * rng.standard_normal(5000)), ("lognormal", 0.01 * np.exp(2 * rng.standard_normal(5000)))):
        dec = _decide(test, v - v.mean() + 1e-4, keys)
        clt, nd = np.asarray(dec.excess_error), np.asarray(dec.n_data)
        # decisions that read all N items are exact ones: no CLT error (also after many looks, where
        # rounding can leave the finite-population-corrected sd a hair above 0)
        assert np.all(clt[nd == 5000] == 0.0), clt[nd == 5000]
        out[name] = float(np.mean(clt[nd < 5000]))  # over the decisions that leaned on the CLT
    # the estimated error inflation: negligible on normal items, larger on skewed ones
    assert out["normal"] < 0.05 and out["lognormal"] > 5 * out["normal"], out
    # a decision made on all N items does not lean on the CLT: 0
    dec = _decide(tm.acceptance.Austerity(batch_size=500), rng.standard_normal(500), keys[:4])
    assert np.all(np.asarray(dec.excess_error) == 0.0) and np.all(np.asarray(dec.n_data) == 500)
