"""ParticleGibbs on NumPyro sites: which latent paths it can update.

Its conditional SMC draws each time step of the site from the site's own law, independently of the other
steps, and leaves the site's density out of the weights: right when the steps are conditionally
independent given the globals (a time plate, or ``to_event`` of a univariate law), wrong for a
``GaussianRandomWalk`` or ``MultivariateNormal`` path, which is refused with the site named. The slow
tests check the suggested non-centred rewrite of a random walk against the Kalman smoother, and (negative
control) that the refused site, with the refusal bypassed, misses it.
"""

import numpy as np
import pytest

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


def noncentred_plate(y):  # the suggested rewrite of grw: innovations in a time plate, h = cumsum(eps)
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    with numpyro.plate("series", y.shape[0], dim=-2):
        with numpyro.plate("time", y.shape[1], dim=-1):
            eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
        h = jnp.cumsum(eps, axis=-1)
        with numpyro.plate("time", y.shape[1], dim=-1):
            numpyro.sample("y", dist.Normal(h + c, 1.0), obs=y)


@pytest.mark.parametrize("fn,name", [(grw, "GaussianRandomWalk"), (mvn, "MultivariateNormal")])
def test_dependent_path_is_refused(fn, name):
    model, data = tm.blocks.from_numpyro(fn, _y())
    with pytest.raises(ModelError, match=f"ParticleGibbs\\('h'\\): site 'h' is a {name} path.*non-centred"):
        model.pg_check("h")


@pytest.mark.parametrize("fn", [noncentred_event, noncentred_plate])
def test_independent_steps_are_accepted(fn):
    model, data = tm.blocks.from_numpyro(fn, _y())
    assert model.pg_check("eps") == T


def _mcse(draws):
    import arviz as az

    draws = np.asarray(draws, float)
    return float(np.std(draws) / np.sqrt(max(float(az.ess(draws)), 1.0)))


def _z_vs_kalman(fn, site, num_samples, monkeypatch=None):
    y = _y()
    model, data = tm.blocks.from_numpyro(fn, y, record=(site,), init_globals="median")
    block = tm.blocks.ParticleGibbs(site, particles=8, window=3)
    res = tm.sample_program(tm.Cycle([block]), model, data, num_samples=num_samples, num_chains=4, seed=0)
    c = res.samples["c"]
    assert np.all(c == c.flat[0])  # c stays at its prior median: the target is the smoothing law of y - c
    h = np.asarray(res.samples[site], float)
    if site == "eps":
        h = np.cumsum(h, axis=-1)
    zs = []
    for i in range(S):
        m, _ = kalman_smoother(y[i] - float(c.flat[0]), 1.0, 1.0, 1.0, 1.0)
        zs += [abs(h[:, :, i, j].mean() - m[j]) / _mcse(h[:, :, i, j]) for j in range(T)]
    return np.array(zs)


@pytest.mark.slow
def test_noncentred_random_walk_matches_kalman_smoother():
    zs = _z_vs_kalman(noncentred_plate, "eps", 2000)
    assert zs.max() < Z_CRIT, zs


@pytest.mark.slow
def test_negative_control_refused_path_misses_kalman_smoother(monkeypatch):
    # with the refusal bypassed, particle Gibbs on the GaussianRandomWalk site targets the wrong law
    import tallmh.blocks.numpyro as bnp

    monkeypatch.setattr(bnp, "_dependent_components", lambda fn: None)
    zs = _z_vs_kalman(grw, "h", 2000)
    assert zs.max() > 2 * Z_CRIT, zs


def test_sample_program_refuses_dependent_path_at_set_up():
    model, data = tm.blocks.from_numpyro(grw, _y())
    with pytest.raises(ModelError, match="site 'h' is a GaussianRandomWalk path"):
        tm.sample_program(tm.Cycle([tm.blocks.ParticleGibbs("h")]), model, data, num_samples=2)
