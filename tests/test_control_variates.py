"""Taylor control variates: exact limits, proxy sums, the logistic remainder bound, posteriors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh import setup_passes as setup

from .acceptance.helpers import decisions, logistic_problem
from .stats_helpers import posterior_check


def _cv_state(model, data, order=2):
    n = data["y"].shape[0]
    flat0, unravel = ravel_pytree(model.init(data))
    state, passes, _ = cvm.prepare(tm.ControlVariates(order=order), model, jax.tree_util.tree_map(jnp.asarray, data), n, unravel, flat0)
    return state, passes


def test_proxy_sums_match_direct_full_data_sums():
    with enable_x64(True):
        model, data, _ = logistic_problem(n=3000, d=3)
        (state, passes) = _cv_state(model, data)
        X, y = data["X"], data["y"]
        c = np.asarray(state.center)
        p = 1 / (1 + np.exp(-X @ c))
        np.testing.assert_allclose(state.grad_sum, X.T @ (y - p), rtol=1e-8, atol=1e-6)
        np.testing.assert_allclose(state.hess_sum, -(X.T * (p * (1 - p))) @ X, rtol=1e-8)
        # the centre is at the posterior mode to the set-up's tolerance: the Newton decrement of the log
        # posterior there (the squared distance to the mode in posterior sds) is below centre_tol(d)
        g = np.asarray(state.grad_sum) - c / 100.0
        prec = -np.asarray(state.hess_sum) + np.eye(4) / 100.0
        assert g @ np.linalg.solve(prec, g) < setup.centre_tol(4)
        assert passes >= 2
        # per-item proxy terms g_i.a + a^T H_i a / 2 by nested jvp, against the closed form
        a = jnp.asarray(np.random.default_rng(0).standard_normal(4) * 0.1)
        _, unravel = ravel_pytree(jnp.zeros(4))
        got = cvm.proxy_terms(model, unravel, state, {"X": jnp.asarray(X[:50]), "y": jnp.asarray(y[:50])}, a)
        xa = X[:50] @ np.asarray(a)
        want = (y[:50] - p[:50]) * xa - 0.5 * p[:50] * (1 - p[:50]) * xa**2
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-12)
        # the O(d^2) proxy-sum difference equals the sum of per-item differences
        th, thp = c + 0.01, c - 0.02
        full = {"X": jnp.asarray(X), "y": jnp.asarray(y)}
        direct = np.sum(cvm.proxy_terms(model, unravel, state, full, jnp.asarray(thp - c))
                        - cvm.proxy_terms(model, unravel, state, full, jnp.asarray(th - c)))
        np.testing.assert_allclose(cvm.proxy_sum_diff(state, jnp.asarray(th), jnp.asarray(thp)), direct, rtol=1e-8)


@pytest.mark.parametrize("order", [1, 2])
def test_logistic_remainder_bound_holds(order):
    with enable_x64(True):
        model, data, _ = logistic_problem(n=3000, d=3)
        state, _ = _cv_state(model, data, order)
        stats = model.setup(data)
        X, y = jnp.asarray(data["X"]), jnp.asarray(data["y"])
        _, unravel = ravel_pytree(jnp.zeros(4))
        rng = np.random.default_rng(1)
        worst = 0.0
        for _ in range(20):
            th = state.center + rng.standard_normal(4) * 0.05
            thp = th + rng.standard_normal(4) * 0.05
            l = model.log_lik(thp, {"X": X, "y": y}) - model.log_lik(th, {"X": X, "y": y})
            pd = (cvm.proxy_terms(model, unravel, state, {"X": X, "y": y}, thp - state.center, order)
                  - cvm.proxy_terms(model, unravel, state, {"X": X, "y": y}, th - state.center, order))
            rem = float(jnp.max(jnp.abs(l - pd)))
            bound = float(model.cv_remainder_bound(th, thp, state.center, stats, order))
            assert rem <= bound
            worst = max(worst, rem / bound)
        assert worst > 1e-3  # the bound is not vacuous by orders of magnitude


@pytest.mark.parametrize("make_test", [
    lambda n: tm.acceptance.Austerity(epsilon=0.05, batch_size=n),
    lambda n: tm.acceptance.Confidence(delta=0.05, initial_batch=n),
    pytest.param(lambda n: tm.acceptance.Barker(batch_size=n), marks=pytest.mark.slow),
], ids=["austerity", "confidence", "barker"])
def test_control_variates_keep_the_exact_limit(make_test):
    with enable_x64(True):
        model, data, _ = logistic_problem(n=1500, d=3)
        state, _ = _cv_state(model, data)
        rng = np.random.default_rng(2)
        th = np.asarray(state.center) + 0.05 * rng.standard_normal((30, 4))
        pairs = (th, th + 0.04 * rng.standard_normal((30, 4)))
        keys = jax.random.split(jax.random.PRNGKey(5), 40)
        test = make_test(1500)
        oracle = tm.acceptance.Exact(kind="barker" if isinstance(test, tm.acceptance.Barker) else "metropolis")
        ref, _ = decisions(oracle, model, data, pairs, keys)
        f = tm.decision_fn(test, model, data, control_variates=(tm.ControlVariates(), state))
        g = jax.vmap(jax.vmap(f, in_axes=(None, None, 0)), in_axes=(0, 0, None))
        acc, _ = g(jnp.asarray(pairs[0]), jnp.asarray(pairs[1]), keys)
        assert 0.1 < ref.mean() < 0.9
        assert np.array_equal(np.asarray(acc), ref)


@pytest.fixture(scope="module")
def linreg():
    data, _ = tm.models.LinearRegression.simulate(20_000, d=3, seed=4)
    model = tm.models.LinearRegression(prior_scale=10.0, noise_sd=1.0)
    mean, cov = model.posterior(data)
    return model, data, mean, np.sqrt(np.diag(cov)), cov


@pytest.mark.slow
@pytest.mark.parametrize("test", [
    tm.acceptance.Austerity(epsilon=0.01, batch_size=100),
    tm.acceptance.Confidence(delta=0.01, initial_batch=100),
    tm.acceptance.Barker(batch_size=100),
], ids=["austerity", "confidence", "barker"])
def test_posterior_with_first_order_control_variates(linreg, test):
    # First-order proxies leave a quadratic remainder on this model, so the tests still have work to do.
    model, data, mean, sd, cov = linreg
    r = tm.sample(model, data, test=test, proposal=tm.proposals.RandomWalk(cov * 2.38**2 / 3),
                  num_samples=3000, num_warmup=300, num_chains=4, seed=8, progress=False,
                  control_variates=tm.ControlVariates(order=1))
    ok, report = posterior_check(r.samples, mean, sd)
    assert ok, report
    if isinstance(test, tm.acceptance.Confidence):
        # the first-order remainder bound (max ||x||^2 ||a||^2 / 2) is loose: it still reads over half
        assert r.data_fraction < 1.0
    else:
        # a constant number of minibatches per step, well below N (Barker's variance condition needs
        # N^2 var(l~)/b < 1, so it reads more than austerity)
        assert r.data_fraction < 0.25
    assert r.setup_items >= 20_000 * 2  # the Newton and sum passes are counted


def test_control_variates_with_exact_and_no_gradient_proposal_is_an_error(linreg):
    # with the exact test, control variates only shape the Langevin proposal's gradient (tests/test_langevin.py)
    model, data, *_ = linreg
    with pytest.raises(tm.ConfigError, match="serve only the Langevin proposal"):
        tm.sample(model, data, test=tm.acceptance.Exact(), proposal=tm.proposals.RandomWalk(0.01), num_samples=5,
                  num_warmup=0, num_chains=1, control_variates=tm.ControlVariates(), progress=False)


@pytest.mark.slow
def test_recenter_after_warmup_makes_one_more_counted_pass(linreg):
    model, data, mean, sd, cov = linreg
    kw = dict(test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100), proposal=tm.proposals.RandomWalk(cov * 2.38**2 / 3),
              num_samples=50, num_warmup=100, num_chains=2, seed=1, progress=False)
    a = tm.sample(model, data, control_variates=tm.ControlVariates(order=1), **kw)
    b = tm.sample(model, data, control_variates=tm.ControlVariates(order=1, recenter=True), **kw)
    assert b.setup_items == a.setup_items + 20_000
    warm = a.flat_warmup[:, 50:].reshape(-1, 3).mean(axis=0)
    np.testing.assert_allclose(np.asarray(b.final_state.cv.center[0]), warm, rtol=1e-5, atol=1e-7)
    assert not np.allclose(np.asarray(a.final_state.cv.center[0]), warm)


def _sorted_logistic(n, seed):
    """A logistic regression (intercept and 3 features) on ``n`` rows sorted by y, the hard case for
    sub-samples: ``(model, data, unravel, flat0)``."""
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((n, 1)), rng.standard_normal((n, 3))], 1).astype(np.float32)
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ np.array([0.3, 1.0, -0.5, 0.2]))))).astype(np.float32)
    order = np.argsort(y, kind="stable")
    data = {"X": jnp.asarray(X[order]), "y": jnp.asarray(y[order])}
    model = tm.models.LogisticRegression(prior_scale=10.0)
    flat0, unravel = ravel_pytree(model.init(data))
    return model, data, unravel, flat0


def test_mode_search_warm_start_and_reused_sums():
    """At N >= WARM_MIN_N the mode search starts Newton from a sub-sample's scaled mode and hands back the
    control-variate sums of its last pass: the same mode (to float32 resolution, far inside one posterior
    sd), fewer full passes, and sums equal to a separate proxy_sums pass. The data is sorted by y, so a
    sub-sample of the first rows only would start Newton far off (the warm rows span the whole data)."""
    n = setup.WARM_MIN_N
    model, data, unravel, flat0 = _sorted_logistic(n, seed=3)
    cold = setup.mode_search(model, data, n, unravel, flat0, warm_start=False)
    warm = setup.mode_search(model, data, n, unravel, flat0)
    assert cold.warm_items == 0 and warm.warm_items > 0
    assert warm.passes < cold.passes
    sd = np.sqrt(np.diag(np.asarray(setup.laplace_cov(model, unravel, cvm.state_at_mode(warm)), np.float64)))
    assert np.max(np.abs(np.asarray(warm.center, np.float64) - np.asarray(cold.center, np.float64)) / sd) < 0.01

    # tm.sample's search stops at the centre tolerance: within 0.1 posterior sd (Laplace metric) of the mode
    # after three full passes (one correction of the sub-sample's mode), the sums made at that centre
    prec = -np.asarray(cold.hess_sum, np.float64) + np.eye(4) / 100.0  # likelihood + prior precision

    def sd_from_mode(th):
        dth = np.asarray(th, np.float64) - np.asarray(cold.center, np.float64)
        return float(np.sqrt(dth @ prec @ dth))

    quick = setup.mode_search(model, data, n, unravel, flat0, tol=setup.CENTRE_TOL)
    assert quick.passes <= 3 and quick.grad_sum is not None, quick.passes
    assert sd_from_mode(quick.center) < 0.1, sd_from_mode(quick.center)
    # negative control: the sub-sample's mode alone (no full pass) is measurably off on this sorted data
    sub = {k: v[jnp.asarray(setup.warm_rows(n))] for k, v in data.items()}
    only_sub, _, _ = setup._newton(model, sub, setup.WARM_ROWS, unravel, flat0, 30, 1e-6, scale=n / setup.WARM_ROWS)
    assert sd_from_mode(only_sub) > 0.3, sd_from_mode(only_sub)
    direct = cvm.proxy_sums(model, data, n, unravel, warm.center, 2)
    np.testing.assert_array_equal(np.asarray(warm.grad_sum), np.asarray(direct.grad_sum))
    np.testing.assert_array_equal(np.asarray(warm.hess_sum), np.asarray(direct.hess_sum))
    rows = setup.warm_rows(n)
    assert rows.min() == 0 and rows.max() == n - 1 and len(np.unique(rows)) == setup.WARM_ROWS
    # every item the set-up read is counted: full passes times N plus the warm start's reads
    res = tm.sample(model, data, test=tm.acceptance.Austerity(error=0.05, batch_size=100),
                    control_variates=tm.ControlVariates(), num_samples=20, num_warmup=0, num_chains=1, seed=0,
                    progress=False)
    from tallmh.storage import datasource

    model_setup = n if datasource.setup_stats(model, data, n) is not None else 0  # the model's own set-up pass
    check = n  # the pass naming degenerate columns of a built-in regression's X (tallmh.run.data_notes)
    assert res.setup_items == model_setup + quick.passes * n + quick.warm_items + check


def test_larger_warm_sub_samples_leave_two_full_passes(monkeypatch):
    """At large N Newton runs on sub-samples WARM_GROWTH times larger in turn before the full data, so that
    the full data's first Newton step lands within the centre's tolerance: two full passes where the first
    sub-sample alone leaves more (here with WARM_ROWS = 256 at N = 2^20; data sorted by y, the hard case for
    sub-samples). The centre is as close to the mode, and every row the sub-samples read is counted."""
    monkeypatch.setattr(setup, "WARM_ROWS", 256)
    monkeypatch.setattr(setup, "WARM_MIN_N", 4 * 256)
    n = 2**20
    assert setup.warm_sizes(n, 4) == [256, 4096, 65536]
    assert setup.warm_sizes(n, 4 * 10**6) == [256, 4096, 65536]  # (the next would exceed n / WARM_GROWTH)
    assert setup.warm_sizes(2**16, 1) == [256, 4096] and setup.warm_sizes(1000, 4) == []
    rows = setup.warm_rows(n, 65536)
    assert rows.min() == 0 and rows.max() == n - 1 and len(np.unique(rows)) == 65536
    model, data, unravel, flat0 = _sorted_logistic(n, seed=4)
    exact = setup.mode_search(model, data, n, unravel, flat0, warm_start=False)
    prec = -np.asarray(exact.hess_sum, np.float64) + np.eye(4) / 100.0

    def sd_from_mode(th):
        dth = np.asarray(th, np.float64) - np.asarray(exact.center, np.float64)
        return float(np.sqrt(dth @ prec @ dth))

    tol = setup.centre_tol(4)
    ladder = setup.mode_search(model, data, n, unravel, flat0, tol=tol)
    monkeypatch.setattr(setup, "WARM_GROWTH", 10**9)  # negative control: the first sub-sample alone
    single = setup.mode_search(model, data, n, unravel, flat0, tol=tol)
    assert ladder.passes == 2 and single.passes > 2, (ladder.passes, single.passes)
    assert sd_from_mode(ladder.center) < 0.1 and ladder.grad_sum is not None
    assert ladder.warm_items > single.warm_items >= 256
    assert ladder.warm_items >= 2 * (256 + 4096 + 65536)  # (each sub-sample's gather and at least one pass)


def test_logistic_closed_form_derivatives_equal_autodiff():
    """LogisticRegression.lik_value_grad_hess (one matrix product each, used by the set-up passes) equals
    autodiff of the masked log-likelihood sum; a subclass with its own log_lik falls back to autodiff."""
    model = tm.models.LogisticRegression()
    rng = np.random.default_rng(3)
    X = rng.standard_normal((257, 5)) * np.array([0.1, 1.0, 3.0, 10.0, 1.0])
    y = (rng.random(257) < 0.4).astype(float)
    mask = rng.random(257) < 0.8
    theta = rng.standard_normal(5) * 0.3
    with enable_x64(True):
        batch = {"X": jnp.asarray(X), "y": jnp.asarray(y)}
        m, th = jnp.asarray(mask), jnp.asarray(theta)

        def total(t):
            return jnp.sum(jnp.where(m, model.log_lik(t, batch), 0.0))

        v, g, h = model.lik_value_grad_hess(th, batch, m)
        np.testing.assert_allclose(v, total(th), rtol=1e-13)
        np.testing.assert_allclose(g, jax.grad(total)(th), rtol=1e-11, atol=1e-11)
        np.testing.assert_allclose(h, jax.hessian(total)(th), rtol=1e-11, atol=1e-11)
        assert not np.allclose(g, jax.grad(lambda t: jnp.sum(model.log_lik(t, batch)))(th))  # the mask counts
    _, unravel = ravel_pytree(jnp.zeros(5))
    assert setup.closed_form_vgh(model, unravel, jnp.zeros(5)) is not None

    class Probit(tm.models.LogisticRegression):
        def log_lik(self, theta, batch):
            return jax.scipy.stats.norm.logcdf(jnp.where(batch["y"] > 0.5, 1.0, -1.0) * (batch["X"] @ theta))

    assert setup.closed_form_vgh(Probit(), unravel, jnp.zeros(5)) is None
