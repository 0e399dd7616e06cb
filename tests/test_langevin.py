"""Langevin proposal: the MH proposal ratio against a direct density, gradient estimates, posteriors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64
from jax.flatten_util import ravel_pytree
from scipy import stats

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh.proposals.langevin import minibatch
from tallmh.kernel import build_kernel

from .stats_helpers import posterior_check


@pytest.fixture(scope="module")
def linreg():
    data, _ = tm.models.LinearRegression.simulate(10_000, d=2, seed=3)
    model = tm.models.LinearRegression(prior_scale=10.0, noise_sd=1.0)
    mean, cov = model.posterior(data)
    return model, data, mean, cov


def _direct_grad(model, data, theta, idx):
    X, y = np.asarray(data["X"], float)[idx], np.asarray(data["y"], float)[idx]
    n = data["y"].shape[0]
    return -theta / model.prior_scale**2 + n / len(idx) * X.T @ (y - X @ theta) / model.noise_sd**2


@pytest.mark.parametrize("b", [50, 500])  # 64 b <= N = 10^4: with replacement; 64 b > N: without
def test_proposal_ratio_matches_direct_density(linreg, b):
    with enable_x64(True):
        model, data, mean, cov = linreg
        n = data["y"].shape[0]
        prop = tm.proposals.Langevin(step_size=1e-4, batch_size=b)
        theta = jnp.asarray(mean) + 0.01
        _, unravel = ravel_pytree(theta)
        jdata = jax.tree_util.tree_map(jnp.asarray, data)
        kernel = build_kernel(model, prop, tm.acceptance.Austerity(), n, unravel)
        grad_fn = kernel.grad_estimate(jdata, None)
        for s in range(5):
            key = jax.random.PRNGKey(s)
            theta_p, log_q = prop.propose_with_data(key, theta, prop.init(theta, n), grad_fn, n)
            k_b, _ = jax.random.split(key)
            idx = np.asarray(minibatch(k_b, b, n))
            assert idx.shape == (b,) and (b == 50 or len(set(idx)) == b)
            h = 1e-4
            g = _direct_grad(model, data, np.asarray(theta), idx)
            gp = _direct_grad(model, data, np.asarray(theta_p), idx)
            fwd = stats.multivariate_normal(np.asarray(theta) + h / 2 * g, h * np.eye(2)).logpdf(np.asarray(theta_p))
            bwd = stats.multivariate_normal(np.asarray(theta_p) + h / 2 * gp, h * np.eye(2)).logpdf(np.asarray(theta))
            np.testing.assert_allclose(float(log_q), bwd - fwd, rtol=1e-9, atol=1e-9)


def test_minibatch_is_uniform_with_replacement_on_tall_data_and_without_on_small():
    # b = 100 from N = 6,400 = 64 b: independent uniform draws, so each minibatch repeats C(100, 2) / N = 0.773
    # pairs on average; from N = 6,399 the keyed permutation's first b positions, which never repeat (a
    # with-replacement draw there would fail the same count).
    keys = jax.random.split(jax.random.PRNGKey(0), 2000)
    for n, pairs in ((6400, 100 * 99 / 2 / 6400), (6399, 0.0)):
        idx = np.asarray(jax.vmap(lambda k: minibatch(k, 100, n))(keys))
        assert idx.min() >= 0 and idx.max() < n
        dup = sum(int(np.sum(np.bincount(r) * (np.bincount(r) - 1) // 2)) for r in idx)
        mean = pairs * len(keys)
        assert abs(dup - mean) <= 5 * np.sqrt(mean) if pairs else dup == 0, (n, dup, mean)
        counts = np.bincount(idx.ravel() * 50 // n, minlength=50)  # 50 equal bins of the items
        assert stats.chisquare(counts).pvalue > 1e-4, (n, counts)
    # a draw that is not uniform fails the same bin check: the first half of the items twice as likely
    bad = np.where(idx.ravel() % 3 == 0, idx.ravel() // 2, idx.ravel())
    assert stats.chisquare(np.bincount(bad * 50 // 6399, minlength=50)).pvalue < 1e-4


def test_control_variate_gradient_is_exact_with_the_full_batch(linreg):
    # With the whole data as the minibatch, the control-variate gradient estimate is the exact gradient.
    with enable_x64(True):
        model, data, mean, cov = linreg
        n = data["y"].shape[0]
        jdata = jax.tree_util.tree_map(jnp.asarray, data)
        flat0, unravel = ravel_pytree(jnp.zeros(2))
        cv, _, _ = cvm.prepare(tm.ControlVariates(order=2), model, jdata, n, unravel, flat0)
        kernel = build_kernel(model, tm.proposals.Langevin(1e-4, 10), tm.acceptance.Austerity(), n, unravel,
                              cv_order=2)
        theta = jnp.asarray(mean) + jnp.array([0.03, -0.02])
        want = _direct_grad(model, data, np.asarray(theta), np.arange(n))
        np.testing.assert_allclose(kernel.grad_estimate(jdata, cv)(theta, jnp.arange(n)), want, rtol=1e-8)
        # a minibatch estimate is unbiased: average over many minibatches
        idxs = jnp.asarray(np.stack([np.random.default_rng(i).choice(n, 20, replace=False) for i in range(400)]))
        ests = np.asarray(jax.jit(jax.vmap(kernel.grad_estimate(jdata, None), in_axes=(None, 0)))(theta, idxs))
        est, sd = ests.mean(axis=0), ests.std(axis=0) / 20
        assert np.all(np.abs(est - want) < 4 * sd)


class _WeightedLogistic(tm.models.LogisticRegression):
    """A subclass with its own likelihood (each item counted twice): it must not get the parent's closed form."""

    def log_lik(self, theta, batch):
        return 2.0 * super().log_lik(theta, batch)


@pytest.mark.parametrize("order", [0, 1, 2])
def test_logistic_closed_form_drift_equals_autodiff(order):
    # the logistic model's closed-form minibatch sums (lik_grad_remainder) against autodiff of its log_lik, at
    # steps from the centre both small (the expm1 form) and large (|x . (theta - c)| > 1: the plain difference)
    with enable_x64(True):
        data, _ = tm.models.LogisticRegression.simulate(500, d=4, seed=2, dtype=np.float64)
        batch = jax.tree_util.tree_map(jnp.asarray, data)
        model = tm.models.LogisticRegression()
        rng = np.random.default_rng(0)
        for scale in (1e-3, 0.3, 3.0):
            c = jnp.asarray(rng.normal(size=5))
            theta = c + scale * jnp.asarray(rng.normal(size=5))

            def gsum(t):
                return jax.grad(lambda u: jnp.sum(model.log_lik(u, batch)))(t)

            want = gsum(theta)
            if order >= 1:
                want = want - gsum(c)
            if order == 2:
                want = want - jax.jvp(gsum, (c,), (theta - c,))[1]
            got = model.lik_grad_remainder(theta, None if order == 0 else c, batch, order)
            np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9 * float(jnp.max(jnp.abs(gsum(theta)))))
        # over the rows of a mask only (how a row-sharded view sums each device's rows)
        mask = jnp.asarray(rng.random(500) < 0.3)
        part = jax.tree_util.tree_map(lambda a: a[np.asarray(mask)], batch)
        sub = model.lik_grad_remainder(theta, None if order == 0 else c, part, order)
        np.testing.assert_allclose(model.lik_grad_remainder(theta, None if order == 0 else c, batch, order, mask=mask),
                                   sub, rtol=1e-9, atol=1e-12)
        # the kernel's drift uses it for this model (with control variates: on the whole data, the exact gradient)
        # and autodiff for a subclass with its own likelihood (twice the parent's gradient)
        n = 500
        flat0, unravel = ravel_pytree(jnp.zeros(5))
        exact = jax.grad(lambda u: model.log_prior(u) + jnp.sum(model.log_lik(u, batch)))(theta)
        cv, _, _ = cvm.prepare(tm.ControlVariates(order=max(order, 1)), model, batch, n, unravel, flat0)
        for m, k, state in ((model, 1.0, cv if order else None), (_WeightedLogistic(), 2.0, None)):
            kernel = build_kernel(m, tm.proposals.Langevin(1e-4, 10), tm.acceptance.Austerity(), n, unravel,
                                  cv_order=order if state is not None else None)
            got = kernel.grad_estimate(batch, state)(theta, jnp.arange(n))
            want = exact + (k - 1.0) * (exact + theta / model.prior_scale**2)
            np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-8)


@pytest.mark.slow
def test_mh_corrected_langevin_matches_posterior_and_sgld_does_not(linreg):
    model, data, mean, cov = linreg
    h = 2.0 * float(np.min(np.diag(cov)))  # large enough that uncorrected SGLD is visibly biased
    kw = dict(num_samples=3000, num_warmup=200, num_chains=4, seed=2, init=jnp.asarray(mean), progress=False)
    prop = tm.proposals.Langevin(step_size=h, batch_size=100)
    good = tm.sample(model, data, test=tm.acceptance.Austerity(epsilon=0.01, batch_size=500), proposal=prop, **kw)
    ok, report = posterior_check(good.samples, mean, np.sqrt(np.diag(cov)))
    assert ok, report
    sgld = tm.sample(model, data, test=tm.acceptance.AlwaysAccept(), proposal=prop, **kw)
    ok, report = posterior_check(sgld.samples, mean, np.sqrt(np.diag(cov)))
    assert not ok, report


def test_preconditioned_proposal_ratio_matches_direct_density(linreg):
    # Langevin() with a Laplace preconditioner M = L L^T: log q against scipy's multivariate normal.
    with enable_x64(True):
        model, data, mean, cov = linreg
        n = data["y"].shape[0]
        prop = tm.proposals.Langevin(batch_size=50)
        theta = jnp.asarray(mean) + 0.01
        _, unravel = ravel_pytree(theta)
        jdata = jax.tree_util.tree_map(jnp.asarray, data)
        kernel = build_kernel(model, prop, tm.acceptance.Austerity(), n, unravel)
        grad_fn = kernel.grad_estimate(jdata, None)
        M = np.array([[2.0, 0.6], [0.6, 1.0]]) * np.min(np.diag(cov))
        state = prop.init(theta, n, jnp.asarray(M))
        h = float(state.step_size)
        assert h == pytest.approx(1.65**2 * 2 ** (-1 / 3))
        for s in range(5):
            key = jax.random.PRNGKey(s)
            theta_p, log_q = prop.propose_with_data(key, theta, state, grad_fn, n)
            k_b, _ = jax.random.split(key)
            idx = np.asarray(minibatch(k_b, 50, n))
            g = _direct_grad(model, data, np.asarray(theta), idx)
            gp = _direct_grad(model, data, np.asarray(theta_p), idx)
            fwd = stats.multivariate_normal(np.asarray(theta) + h / 2 * M @ g, h * M).logpdf(np.asarray(theta_p))
            bwd = stats.multivariate_normal(np.asarray(theta_p) + h / 2 * M @ gp, h * M).logpdf(np.asarray(theta))
            np.testing.assert_allclose(float(log_q), bwd - fwd, rtol=1e-8, atol=1e-8)


def test_step_size_adapts_in_warmup_only():
    prop = tm.proposals.Langevin()
    theta = jnp.zeros(3)
    st = prop.init(theta, 100)
    up = prop.update(st, theta, jnp.bool_(True), 0)
    down = prop.update(st, theta, jnp.bool_(False), 0)
    assert float(up.step_size) > float(st.step_size) > float(down.step_size)
    fixed = tm.proposals.Langevin(step_size=0.1)
    st = fixed.init(theta, 100)
    assert float(fixed.update(st, theta, jnp.bool_(True), 0).step_size) == pytest.approx(0.1)
    with pytest.raises(tm.errors.ConfigError):
        tm.proposals.Langevin(target_accept=1.5)


@pytest.mark.slow
def test_adaptive_langevin_with_control_variates_matches_the_posterior(linreg):
    # The default: preconditioned adaptive MALA with the control-variate gradient,
    # decided by austerity with control variates; closed-form posterior. Negative control: the same
    # proposal without an MH test (SGLD-like, preconditioned) with a step far above the adapted one.
    model, data, mean, cov = linreg
    kw = dict(num_samples=1500, num_warmup=300, num_chains=2, seed=4, progress=False,
              control_variates=tm.ControlVariates())
    good = tm.sample(model, data, test=tm.acceptance.Austerity(), proposal=tm.proposals.Langevin(), **kw)
    ok, report = posterior_check(good.samples, mean, np.sqrt(np.diag(cov)))
    assert ok, report
    assert 0.4 < float(np.mean(good.stats["accepted"])) < 0.8
    ess = min(tm.diagnostics.ess(good.flat_output[:, :, j]) for j in range(good.flat_output.shape[-1]))
    assert ess > 0.2 * 1500 * 2, ess  # MALA near a Gaussian mode: ESS per draw of order 0.5 (a random walk: ~0.15)
    bad = tm.sample(model, data, test=tm.acceptance.AlwaysAccept(),
                    proposal=tm.proposals.Langevin(step_size=3.0, precondition=True, adapt=False), **kw)
    ok, report = posterior_check(bad.samples, mean, np.sqrt(np.diag(cov)))
    assert not ok, report


def test_exact_test_with_control_variate_gradient_matches_the_posterior(linreg):
    # Exact MH whose Langevin drift is the control-variate gradient (how the comparison's reference is made):
    # the control variates shape only the proposal, the test reads all N items, so the chain targets the
    # posterior exactly; closed-form posterior, MCSE-based tolerances. Negative control: the same proposal
    # with no MH test and a step far above the adapted one.
    model, data, mean, cov = linreg
    kw = dict(num_samples=800, num_warmup=200, num_chains=2, seed=5, progress=False,
              control_variates=tm.ControlVariates())
    good = tm.sample(model, data, test=tm.acceptance.Exact(), proposal=tm.proposals.Langevin(), **kw)
    ok, report = posterior_check(good.samples, mean, np.sqrt(np.diag(cov)))
    assert ok, report
    assert np.all(good.stats["n_data"] >= 10_000)  # every step read all N items
    ess = min(tm.diagnostics.ess(good.flat_output[:, :, j]) for j in range(good.flat_output.shape[-1]))
    assert ess > 0.2 * 800 * 2, ess
    bad = tm.sample(model, data, test=tm.acceptance.AlwaysAccept(),
                    proposal=tm.proposals.Langevin(step_size=3.0, precondition=True, adapt=False), **kw)
    ok, report = posterior_check(bad.samples, mean, np.sqrt(np.diag(cov)))
    assert not ok, report

