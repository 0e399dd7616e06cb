"""LinearRegression with the noise sd sampled: its exact posterior and its mode."""

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm


def _grid_moments(model, data, mean, cov, k=70):
    """Mean and covariance of (beta_0, beta_1, log sigma) by brute force on a 3-D grid of +-8 sd."""
    axes = [np.linspace(mean[j] - 8 * np.sqrt(cov[j, j]), mean[j] + 8 * np.sqrt(cov[j, j]), k) for j in range(3)]
    th = np.stack([g.ravel() for g in np.meshgrid(*axes, indexing="ij")], axis=1)
    X, y = np.asarray(data["X"], float), np.asarray(data["y"], float)
    b, u = th[:, :2], th[:, 2]
    rss = (y @ y) - 2 * b @ (X.T @ y) + np.einsum("ij,jk,ik->i", b, X.T @ X, b)
    lp = (-len(y) * u - 0.5 * rss * np.exp(-2 * u) - 0.5 * np.sum(b**2, axis=1) / model.prior_scale**2
          - 0.5 * u**2 / model.noise_prior_scale**2)
    w = np.exp(lp - lp.max())
    w /= w.sum()
    m = w @ th
    c = (th - m).T @ ((th - m) * w[:, None])
    return m, c


def test_exact_posterior_with_the_noise_sd_sampled_matches_brute_force():
    data, _ = tm.models.LinearRegression.simulate(40, d=2, noise_sd=2.0, seed=1)
    model = tm.models.LinearRegression(prior_scale=3.0, noise_sd=None, noise_prior_scale=2.0)
    mean, cov = model.posterior(data)
    m, c = _grid_moments(model, data, mean, cov)
    np.testing.assert_allclose(mean, m, atol=1e-3 * np.sqrt(np.diag(cov)).max())
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), np.sqrt(np.diag(c)), rtol=2e-3)
    np.testing.assert_allclose(cov[0, 2], c[0, 2], atol=2e-3 * np.sqrt(cov[0, 0] * cov[2, 2]))


def test_sampled_noise_model_log_density_and_shapes():
    data, _ = tm.models.LinearRegression.simulate(50, d=2, noise_sd=2.0, seed=3)
    model = tm.models.LinearRegression(prior_scale=3.0, noise_sd=None, noise_prior_scale=2.0)
    theta0 = model.init(data)
    assert theta0.shape == (3,) and abs(float(theta0[2]) - np.log(np.std(data["y"]))) < 1e-5
    # log_lik at sigma = e^u equals the fixed-sigma model's
    fixed = tm.models.LinearRegression(prior_scale=3.0, noise_sd=1.7)
    th = jnp.array([0.3, -0.2, np.log(1.7)])
    batch = {k: jnp.asarray(v) for k, v in data.items()}
    np.testing.assert_allclose(model.log_lik(th, batch), fixed.log_lik(th[:2], batch), rtol=1e-5)
    # no range bound when sigma is a parameter; the fixed model keeps its bounds
    assert not model.has_bound and model.cv_remainder_bound is None
    assert fixed.has_bound and callable(fixed.cv_remainder_bound)
    assert "log sigma ~ N(0, 2^2)" in model.describe_prior()


def test_posterior_mode_with_the_noise_sd_sampled_is_a_stationary_point():
    data, _ = tm.models.LinearRegression.simulate(300, d=2, noise_sd=0.5, seed=4)
    model = tm.models.LinearRegression(noise_sd=None)
    mode, cov, passes = model.posterior_mode(data)
    import jax

    batch = {k: jnp.asarray(v, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32) for k, v in data.items()}
    g = jax.grad(lambda t: model.log_prior(t) + jnp.sum(model.log_lik(t, batch)))(jnp.asarray(mode, batch["X"].dtype))
    assert np.max(np.abs(np.asarray(g))) < 1e-2 * np.max(1 / np.sqrt(np.diag(cov)))
    assert passes == 1 and abs(np.exp(mode[2]) - 0.5) < 0.06


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), "2"])
def test_bad_noise_settings_are_config_errors(bad):
    with pytest.raises(tm.ConfigError):
        tm.models.LinearRegression(noise_sd=bad)
    with pytest.raises(tm.ConfigError):
        tm.models.LinearRegression(noise_sd=None, noise_prior_scale=bad)
