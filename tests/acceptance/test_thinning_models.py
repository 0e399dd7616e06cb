"""The remainder bounds of the other built-in models for the exact subsampled test: linear regression
(surrogate exact, no item read) and Poisson regression (a trust region with the exact decision outside it)."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.acceptance import PoissonThinning
from tallmh.frontends.formula import PoissonRegression
from tallmh.kernel import make_problem

sys.path.insert(0, str(Path(__file__).parent))
from thinning_helpers import run_chains, setup  # noqa: E402


def test_linear_regression_reads_nothing_and_matches_its_posterior():
    model = tm.models.LinearRegression(noise_sd=1.0)
    data = tm.models.LinearRegression.simulate(20_000, d=3, seed=0)
    data = data[0] if isinstance(data, tuple) else data
    data = {k: np.asarray(v, np.float32) for k, v in data.items()}
    unravel, cv, stats, _ = setup(model, data)
    T = stats[fbm.FACTOR_KEY]
    assert float(T.total) == 0.0
    prop = tm.proposals.CrankNicolson(np.asarray(T.center), np.asarray(T.chol_cov))
    draws, acc, nd = run_chains(model, data, PoissonThinning(), prop, unravel, cv, stats, 2000)
    assert nd.max() == 0
    mean, cov = model.posterior(data)
    sd = np.sqrt(np.diag(np.asarray(cov)))
    # independence draws from (nearly) the posterior itself: MCSE ~ sd / sqrt(draws)
    se = sd / np.sqrt(draws.shape[0] * draws.shape[1] * acc.mean())
    assert np.all(np.abs(draws.mean(axis=(0, 1)) - np.asarray(mean)) < 5 * se)
    assert np.all(np.abs(draws.std(axis=(0, 1)) / sd - 1) < 0.05)


def test_linear_regression_with_sampled_noise_has_no_bound():
    from tallmh.model import own_method

    assert own_method(tm.models.LinearRegression(noise_sd=None), "factor_bound") is None
    assert own_method(tm.models.LinearRegression(noise_sd=1.0), "factor_bound") is not None


@pytest.fixture(scope="module")
def poisson():
    rng = np.random.default_rng(0)
    n = 20_000
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2)) * [0.5, 1.0]]).astype(np.float32)
    y = rng.poisson(np.exp(X @ np.array([0.3, 0.4, -0.2]))).astype(np.float32)
    data = {"X": X, "y": y}
    model = PoissonRegression()
    unravel, cv, stats, _ = setup(model, data)
    return model, data, unravel, cv, stats


def _problem(model, data, unravel, cv, stats, z, zp):
    T = stats[fbm.FACTOR_KEY]
    th = T.center + T.chol_cov @ jnp.asarray(z, T.center.dtype)
    thp = T.center + T.chol_cov @ jnp.asarray(zp, T.center.dtype)
    base = model.log_prior(thp) - model.log_prior(th)
    d = jax.tree_util.tree_map(jnp.asarray, data)
    return make_problem(model, d, data["y"].shape[0], unravel, stats, th, thp, base, None, cv, 2)


def test_poisson_inside_the_trust_region_is_the_factorised_acceptance(poisson):
    model, data, unravel, cv, stats = poisson
    problem = _problem(model, data, unravel, cv, stats, [3.0, -2.5, 2.0], [-3.0, 2.0, -2.5])
    assert bool(problem.factors.region)
    dr = np.asarray(problem.factors.remainder(jnp.arange(problem.n)), np.float64)
    alpha = min(1.0, np.exp(float(problem.log_base))) * np.exp(np.sum(np.minimum(dr, 0.0)))
    assert 0.02 < alpha < 0.98, alpha
    keys = jax.random.split(jax.random.PRNGKey(0), 20_000)
    dec = jax.jit(jax.vmap(lambda k: PoissonThinning().decide(k, problem)))(keys)
    rate = np.asarray(dec.accept).mean()
    assert abs(rate - alpha) < 4 * np.sqrt(alpha * (1 - alpha) / 20_000), (rate, alpha)
    assert np.asarray(dec.n_data).max() < problem.n


def test_poisson_outside_the_trust_region_takes_the_exact_decision(poisson):
    model, data, unravel, cv, stats = poisson
    problem = _problem(model, data, unravel, cv, stats, [7.0, 0.0, 0.0], [6.5, 0.5, 0.0])
    assert not bool(problem.factors.region)
    keys = jax.random.split(jax.random.PRNGKey(1), 500)
    dec = jax.jit(jax.vmap(lambda k: PoissonThinning().decide(k, problem)))(keys)
    assert np.all(np.asarray(dec.n_data) == problem.n)
    dr = np.asarray(problem.factors.remainder(jnp.arange(problem.n)), np.float64)
    us = np.asarray(jax.vmap(lambda k: tm.acceptance.base.draw_u(k)[0])(keys), np.float64)
    gap = np.log(us) - float(problem.log_base) - dr.sum()
    assert np.all((np.asarray(dec.accept) == (gap < 0)) | (np.abs(gap) < 1e-3))
