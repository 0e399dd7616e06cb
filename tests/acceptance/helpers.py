"""Shared set-up for decision-level tests: a logistic-regression problem and many (theta, theta') pairs."""

import jax
import jax.numpy as jnp
import numpy as np

import tallmh as tm


def logistic_problem(n=2000, d=3, seed=0):
    data, theta = tm.models.LogisticRegression.simulate(n, d=d, seed=seed, dtype=np.float64)
    return tm.models.LogisticRegression(prior_scale=10.0), data, theta


def decisions(test, model, data, pairs, keys):
    """Decisions and items used for each (pair, key): arrays shaped (pairs, keys)."""
    f = tm.decision_fn(test, model, data)
    th, thp = pairs
    g = jax.vmap(jax.vmap(f, in_axes=(None, None, 0)), in_axes=(0, 0, None))
    acc, nd = g(jnp.asarray(th), jnp.asarray(thp), keys)
    return np.asarray(acc), np.asarray(nd)


def exact_log_ratio(model, data, theta, theta_p):
    """Full log acceptance ratio ``Delta`` (float64, numpy) for a symmetric proposal."""
    ll = lambda t: float(np.sum(np.asarray(model.log_lik(jnp.asarray(t), data))))
    lp = lambda t: float(model.log_prior(jnp.asarray(t)))
    return ll(theta_p) - ll(theta) + lp(theta_p) - lp(theta)


def binomial_margin(p, k, z=3.29):
    """One-sided upper margin (z = 3.29: p = 0.0005) on a rate estimated from k Bernoulli trials."""
    return z * np.sqrt(max(p, 1.0 / k) * (1 - p) / k) + 1.0 / k
