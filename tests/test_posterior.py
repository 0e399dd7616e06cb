"""Posterior tests on targets with known answers, for every acceptance test, plus negative controls.

Tolerances are z-tests with Monte Carlo standard errors from ESS (tests/stats_helpers.py). The settings
keep each approximate test's bias small next to the MCSE (small epsilon/delta), so a pass means "no bias
detectable at this MCSE", and a deliberately wrong sampler must fail the same check.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# Posterior- and decision-level statistical checks, ~10 s each: run with the slow tests (CI runs both).
pytestmark = pytest.mark.slow

import tallmh as tm

from .stats_helpers import posterior_check

TESTS = {
    "exact": tm.acceptance.Exact(),
    "austerity": tm.acceptance.Austerity(epsilon=0.01, batch_size=500),
    "confidence": tm.acceptance.Confidence(delta=0.01, initial_batch=500),
    "barker": tm.acceptance.Barker(batch_size=200, delta=0.5),
}


@pytest.fixture(scope="module")
def gauss():
    rng = np.random.default_rng(1)
    n = 5_000
    data = {"x": 0.3 + rng.standard_normal(n)}
    model = tm.models.GaussianMean(sigma=1.0)
    mean, sd = model.posterior(data)
    return model, data, mean, sd


@pytest.fixture(scope="module")
def linreg():
    data, _ = tm.models.LinearRegression.simulate(5000, d=3, seed=2)
    model = tm.models.LinearRegression(prior_scale=10.0, noise_sd=1.0)
    mean, cov = model.posterior(data)
    return model, data, mean, np.sqrt(np.diag(cov)), cov


@pytest.mark.parametrize("name", list(TESTS))
def test_gaussian_mean_posterior(gauss, name):
    model, data, mean, sd = gauss
    r = tm.sample(model, data, test=TESTS[name], proposal=tm.proposals.RandomWalk(2.4 * sd),
                  num_samples=3000, num_warmup=300, num_chains=4, seed=5, init=jnp.array([mean]), progress=False)
    ok, report = posterior_check(r.samples, mean, sd)
    assert ok, report
    if name != "exact":
        assert r.data_fraction < 0.9 or name == "confidence"


@pytest.mark.parametrize("name", list(TESTS))
def test_linear_regression_posterior(linreg, name):
    model, data, mean, sd, cov = linreg
    r = tm.sample(model, data, test=TESTS[name],
                  proposal=tm.proposals.RandomWalk(cov * 2.38**2 / 3),
                  num_samples=3000, num_warmup=300, num_chains=4, seed=6, init=jnp.asarray(mean), progress=False)
    ok, report = posterior_check(r.samples, mean, sd)
    assert ok, report


class DriftingWalk(tm.proposals.RandomWalk):
    """Negative control: a random walk with a drift that still claims to be symmetric."""

    def propose(self, key, theta, state):
        th, lq = super().propose(key, theta, state)
        return th + 0.3 * jnp.diag(state.chol), lq


@pytest.mark.parametrize("name", ["exact", "austerity"])
def test_negative_control_wrong_proposal_ratio_fails(gauss, name):
    model, data, mean, sd = gauss
    r = tm.sample(model, data, test=TESTS[name], proposal=DriftingWalk(2.4 * sd),
                  num_samples=3000, num_warmup=300, num_chains=4, seed=5, init=jnp.array([mean]), progress=False)
    ok, report = posterior_check(r.samples, mean, sd)
    assert not ok, report


def test_negative_control_wrong_likelihood_scale_fails(linreg):
    # A sampler that reads the data as if the noise sd were 1.3 has a wider posterior: the sd check fails.
    model, data, mean, sd, cov = linreg
    wrong = tm.models.LinearRegression(prior_scale=10.0, noise_sd=1.3)
    r = tm.sample(wrong, data, test=TESTS["austerity"], proposal=tm.proposals.RandomWalk(cov * 2.38**2 / 3 * 1.69),
                  num_samples=3000, num_warmup=300, num_chains=4, seed=6, init=jnp.asarray(mean), progress=False)
    ok, report = posterior_check(r.samples, mean, sd)
    assert not ok, report
