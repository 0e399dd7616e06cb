"""ParticleGibbs on NumPyro sites: which latent paths it can update, and how.

Its conditional SMC draws each time step of the site from the site's own law and leaves the site's density
out of the weights: right when the steps are conditionally independent given the globals (a time plate, or
``to_event`` of a univariate law). A ``GaussianRandomWalk`` or ``MultivariateNormal`` path (dependent steps)
runs on its innovations ``z = L^-1 (h - loc)`` instead; other dependent laws are refused with the site
named. Slow tests: particle Gibbs on a random-walk path against the Kalman smoother (means and variances
within MCSE) and, as negative control, the old proposals (independent draws of h's steps) missing it.
"""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import tallmh as tm
from tallmh.blocks.models import kalman_smoother
from tallmh.errors import ModelError

numpyro = pytest.importorskip("numpyro")
dist = numpyro.distributions

S, T = 3, 6
Z_CRIT = 4.0  # |estimate - exact| / MCSE over S * T quantities


def _y(seed=3):
    rng = np.random.default_rng(seed)
    return (np.cumsum(rng.normal(size=(S, T)), axis=1) + rng.normal(size=(S, T))).astype(np.float32)


def grw(y):  # the refused form: h ~ GaussianRandomWalk(1, T) per series
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    with numpyro.plate("series", y.shape[0]):
        h = numpyro.sample("h", dist.GaussianRandomWalk(1.0, y.shape[1]))
        numpyro.sample("y", dist.Normal(h + c, 1.0).to_event(1), obs=y)


def mvn(y):
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    t = y.shape[1]
    cov = jnp.minimum(jnp.arange(1, t + 1)[:, None], jnp.arange(1, t + 1)[None, :]).astype(jnp.float32)
    with numpyro.plate("series", y.shape[0]):
        h = numpyro.sample("h", dist.MultivariateNormal(jnp.zeros(t), cov))
        numpyro.sample("y", dist.Normal(h + c, 1.0).to_event(1), obs=y)


def noncentred_event(y):  # innovations as one to_event site: independent steps
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    with numpyro.plate("series", y.shape[0]):
        eps = numpyro.sample("eps", dist.Normal(0.0, 1.0).expand([y.shape[1]]).to_event(1))
        numpyro.sample("y", dist.Normal(jnp.cumsum(eps, axis=-1) + c, 1.0).to_event(1), obs=y)


def noncentred_plate(y):  # innovations in a time plate, h = cumsum(eps)
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    with numpyro.plate("series", y.shape[0], dim=-2):
        with numpyro.plate("time", y.shape[1], dim=-1):
            eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
        h = jnp.cumsum(eps, axis=-1)
        with numpyro.plate("time", y.shape[1], dim=-1):
            numpyro.sample("y", dist.Normal(h + c, 1.0), obs=y)


def student_path(y):  # dependent steps, not Gaussian: refused
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    t = y.shape[1]
    with numpyro.plate("series", y.shape[0]):
        h = numpyro.sample("h", dist.MultivariateStudentT(4.0, jnp.zeros(t), jnp.tril(jnp.ones((t, t)))))
        numpyro.sample("y", dist.Normal(h + c, 1.0).to_event(1), obs=y)


def test_dependent_non_gaussian_path_is_refused():
    model, data = tm.blocks.from_numpyro(student_path, _y(), check=False)
    with pytest.raises(ModelError,
                       match="ParticleGibbs\\('h'\\): site 'h' is a MultivariateStudentT path.*non-centred"):
        model.pg_check("h")


def test_gaussian_paths_run_on_their_innovations():
    # a random walk of scale 1 has innovations diff(h); a MultivariateNormal with the same covariance
    # min(s, t) has the same ones; pg_path inverts pg_innovations
    y = _y()
    h = np.cumsum(np.random.default_rng(5).normal(size=(S, T)), axis=1).astype(np.float32)
    rows = jnp.arange(S, dtype=jnp.int32)
    for fn in (grw, mvn):
        model, data = tm.blocks.from_numpyro(fn, y, check=False)
        assert model.pg_check("h") == T
        values, _ = model.init(jax.random.PRNGKey(0), data)
        z = np.asarray(model.pg_innovations("h", values, data, rows, jnp.asarray(h)))
        np.testing.assert_allclose(z, np.diff(h, axis=1, prepend=0.0), atol=1e-5)
        back = model.pg_path("h", values, data, rows, jnp.asarray(z))
        np.testing.assert_allclose(np.asarray(back), h, atol=1e-5)


@pytest.mark.parametrize("fn", [noncentred_event, noncentred_plate])
def test_independent_steps_are_accepted(fn):
    model, data = tm.blocks.from_numpyro(fn, _y(), check=False)
    assert model.pg_check("eps") == T


def _mcse(draws):
    import arviz as az

    draws = np.asarray(draws, float)
    return float(np.std(draws) / np.sqrt(max(float(az.ess(draws)), 1.0)))


def _z_vs_kalman(fn, site, num_samples):
    """|estimate - exact| / MCSE of the posterior means and variances of h (S * T each) given c."""
    y = _y()
    model, data = tm.blocks.from_numpyro(fn, y, record=(site,), init_globals="median")
    block = tm.blocks.ParticleGibbs(site, particles=8, window=3)
    res = tm.sample_program(tm.Cycle([block]), model, data, num_samples=num_samples, num_chains=4, seed=0)
    c = res.samples["c"]
    assert np.all(c == c.flat[0])  # c stays at its prior median: the target is the smoothing law of y - c
    h = np.asarray(res.samples[site], float)
    z_mean, z_var = [], []
    for i in range(S):
        m, v = kalman_smoother(y[i] - float(c.flat[0]), 1.0, 1.0, 1.0, 1.0)
        for j in range(T):
            hij = h[:, :, i, j]
            z_mean.append(abs(hij.mean() - m[j]) / _mcse(hij))
            sq = (hij - m[j]) ** 2  # its mean estimates the variance (the exact mean is known)
            z_var.append(abs(sq.mean() - v[j]) / _mcse(sq))
    return np.array(z_mean), np.array(z_var)


@pytest.mark.slow  # ~25 s on the loaded 2-core CPU
def test_random_walk_path_matches_kalman_smoother():
    z_mean, z_var = _z_vs_kalman(grw, "h", 2000)
    assert z_mean.max() < Z_CRIT and z_var.max() < Z_CRIT, (z_mean, z_var)


@pytest.mark.slow  # ~25 s on the loaded 2-core CPU
def test_negative_control_independent_step_proposals_miss_kalman_smoother(monkeypatch):
    # the old behaviour: each step of h drawn from the path's prior independently, h's density left out
    import tallmh.blocks.numpyro as bnp

    monkeypatch.setattr(bnp, "_dependent_components", lambda fn: None)
    z_mean, z_var = _z_vs_kalman(grw, "h", 2000)
    assert z_mean.max() > 2 * Z_CRIT, z_mean


def test_sample_program_refuses_dependent_path_at_set_up():
    model, data = tm.blocks.from_numpyro(student_path, _y(), check=False)
    with pytest.raises(ModelError, match="site 'h' is a MultivariateStudentT path"):
        tm.sample_program(tm.Cycle([tm.blocks.ParticleGibbs("h")]), model, data, num_samples=2)
