"""Enumeration of discrete per-item latents that sit in further plates inside the data plate.

A latent ``z`` in the data plate *and* a time plate has one value per (item, time): its marginal is
``sum_t log sum_z`` per item, not ``log sum_z prod_t`` (one z per item for all its times). Checked against
the closed form and against the construction's brute-force sum over every joint value of an item's cells;
the old collapsed formula is the negative control (it differs, and the construction check catches it).
Structures whose marginal tallmh does not compute are refused with the site named.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

import tallmh as tm
from tallmh.errors import ModelError
from tallmh.frontends.numpyro_checks import _check_enum_brute_force
from tallmh.frontends.numpyro_model import NumPyroModel

numpyro = pytest.importorskip("numpyro")
dist = numpyro.distributions

T = 3


def _x(n=6, t=T, seed=0):
    return (np.random.default_rng(seed).normal(size=(n, t)) + 1.0).astype(np.float32)


def per_time_mixture(x):
    mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 3.0).to_event(1))
    with numpyro.plate("data", x.shape[0], dim=-2):
        with numpyro.plate("time", x.shape[1], dim=-1):
            z = numpyro.sample("z", dist.Bernoulli(0.5))
            numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=x)


def per_item_mixture(x):  # one z per item shared by its times: log sum_z prod_t is right here
    mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 3.0).to_event(1))
    with numpyro.plate("data", x.shape[0], dim=-2):
        z = numpyro.sample("z", dist.Bernoulli(0.3))
        with numpyro.plate("time", x.shape[1], dim=-1):
            numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=x)


def per_time_features(x):  # z per (item, time), observed features in a further plate
    mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 3.0).to_event(1))
    s = numpyro.sample("s", dist.HalfNormal(2.0))
    with numpyro.plate("data", x.shape[0], dim=-3):
        with numpyro.plate("time", x.shape[1], dim=-2):
            z = numpyro.sample("z", dist.Categorical(jnp.array([0.2, 0.8])))
            with numpyro.plate("feat", x.shape[2], dim=-1):
                numpyro.sample("x", dist.Normal(mu[z], s), obs=x)


def _mu(model, theta):
    return np.asarray(model.constrain(theta)["mu"], float)


def _exact_per_time(x, mu, p=0.5):
    comp = np.log([1 - p, p]) + norm.logpdf(x[..., None].astype(float), mu, 1.0)  # (n, T, 2)
    return logsumexp(comp, axis=-1).sum(axis=-1)


def _collapsed(x, mu, p=0.5):
    comp = np.log([1 - p, p]) + norm.logpdf(x[..., None].astype(float), mu, 1.0).sum(axis=1)  # (n, 2)
    return logsumexp(comp, axis=-1)


def test_inner_plate_enumeration_is_per_cell():
    x = _x()
    model, data = tm.from_numpyro(per_time_mixture, x)
    assert model.enumerated_sites == ["z"]
    for shift in (0.0, 0.7):
        theta = {"mu": model.init()["mu"] + jnp.array([-shift, shift])}
        mu = _mu(model, theta)
        ll = np.asarray(model.log_lik(theta, data), float)
        exact = _exact_per_time(x, mu)
        np.testing.assert_allclose(ll, exact, rtol=1e-5, atol=1e-4)
        # negative control: the collapsed formula is a different number (the original report: -6.40 vs -4.34)
        assert np.sum(np.abs(_collapsed(x, mu) - exact)) > 1.0


def test_negative_control_collapsed_enumeration_is_caught(monkeypatch):
    monkeypatch.setattr(NumPyroModel, "_collapse_plates", True)
    with pytest.raises(ModelError, match="differs from the sum over all 8 joint values"):
        tm.from_numpyro(per_time_mixture, _x())


def test_brute_force_check_agrees_and_is_sensitive(monkeypatch):
    x = _x()
    model, data = tm.from_numpyro(per_time_mixture, x)
    theta = {"mu": jnp.array([-1.0, 1.5])}
    assert _check_enum_brute_force(model, data, model.n, [theta], [0, 5]) < 1e-5
    monkeypatch.setattr(NumPyroModel, "_collapse_plates", True)
    wrong, _ = tm.from_numpyro(per_time_mixture, x, check=False)
    with pytest.raises(ModelError, match="differs"):
        _check_enum_brute_force(wrong, data, wrong.n, [theta], [0])


def test_item_level_latent_with_time_plate_observations():
    x = _x(seed=1)
    model, data = tm.from_numpyro(per_item_mixture, x)
    theta = {"mu": jnp.array([-0.5, 1.2])}
    ll = np.asarray(model.log_lik(theta, data), float)
    np.testing.assert_allclose(ll, _collapsed(x, _mu(model, theta), p=0.3), rtol=1e-5, atol=1e-4)


def test_inner_plate_enumeration_with_a_further_observed_plate():
    x = (np.random.default_rng(2).normal(size=(5, T, 2)) + 1.0).astype(np.float32)
    model, data = tm.from_numpyro(per_time_features, x)
    theta = {"mu": jnp.array([-0.5, 1.2]), "s": jnp.asarray(np.log(1.3), jnp.float32)}
    c = model.constrain(theta)
    mu, s = np.asarray(c["mu"], float), float(c["s"])
    comp = np.log([0.2, 0.8]) + norm.logpdf(x[..., None].astype(float), mu, s).sum(axis=2)  # (n, T, 2)
    exact = logsumexp(comp, axis=-1).sum(axis=-1)
    np.testing.assert_allclose(np.asarray(model.log_lik(theta, data), float), exact, rtol=1e-5, atol=1e-4)


def test_refuses_item_site_coupling_the_cells():
    def coupled(x, y):
        mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 3.0).to_event(1))
        with numpyro.plate("data", x.shape[0], dim=-2):
            with numpyro.plate("time", x.shape[1], dim=-1):
                z = numpyro.sample("z", dist.Bernoulli(0.5))
                numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=x)
            numpyro.sample("y", dist.Normal(jnp.sum(z, axis=-1, keepdims=True).astype(jnp.float32), 1.0),
                           obs=y)

    x = _x()
    with pytest.raises(ModelError, match="site 'y'.*depends on them"):
        tm.from_numpyro(coupled, x, x[:, :1])


def test_refuses_enumerated_sites_in_different_plates():
    def two_levels(x):
        mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 3.0).to_event(1))
        with numpyro.plate("data", x.shape[0], dim=-2):
            c = numpyro.sample("c", dist.Bernoulli(0.5))
            with numpyro.plate("time", x.shape[1], dim=-1):
                z = numpyro.sample("z", dist.Bernoulli(0.5))
                numpyro.sample("x", dist.Normal(mu[z] + c, 1.0), obs=x)

    with pytest.raises(ModelError, match="'c'.*'z'.*different plates|different plates"):
        tm.from_numpyro(two_levels, _x())


def test_refuses_enumerated_site_with_unplated_axis():
    def unplated(x):
        mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 3.0).to_event(1))
        with numpyro.plate("data", x.shape[0], dim=-2):
            z = numpyro.sample("z", dist.Bernoulli(0.5 * jnp.ones(x.shape[1])))
            numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=x)

    with pytest.raises(ModelError, match="site 'z'.*not plates"):
        tm.from_numpyro(unplated, _x())


def test_full_log_density_check_runs_for_enumerated_models(monkeypatch):
    # the log_prior + sum(log_lik) cross-check against NumPyro's potential energy (enumerated sites fixed on
    # both sides) now runs with enumerated sites too: a log prior off by 1 is caught
    import tallmh.frontends.numpyro_model as nm

    orig = nm.NumPyroModel._log_prior
    monkeypatch.setattr(nm.NumPyroModel, "_log_prior", lambda self, theta: orig(self, theta) + 1.0)
    with pytest.raises(ModelError, match="differs from NumPyro's log density"):
        tm.from_numpyro(per_time_mixture, _x())
