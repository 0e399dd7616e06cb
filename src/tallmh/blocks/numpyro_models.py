"""The inference-program models of :mod:`tallmh.blocks.models` written as NumPyro models, for
:func:`tallmh.blocks.from_numpyro` (tests and the probabilistic-programs paper's experiments, Sec. 4.2-4.3).

- :func:`mixture`: the two-component mixture of :class:`~tallmh.blocks.models.TwoComponentMixture` (same
  sites, same unconstrained scales: ``pi`` on the logit scale, ``mu`` real, ``z`` kept in the state).
- :func:`stochastic_volatility`: the paper's SV model (Sec. 4.3) in the *non-centred* form: per series,
  ``eps_t ~ N(0, 1)`` and ``h_t = phi h_{t-1} + sigma eps_t`` (``h_0 = 0``), ``x_t ~ N(0, exp(h_t / 2)^2)``.
  A reparametrisation of the latent path of the centred :class:`~tallmh.blocks.models.StochasticVolatility`
  (eps -> h is a bijection given phi and sigma), so the posterior of (phi, sigma^2, h) is the same. Non-centring is the standard fix for a weakly identified latent path (Papaspiliopoulos,
  Roberts & Skold 2007): phi and sigma are then updated given eps, not given h, which pins them.
- :func:`linear_gaussian_ssm`: a linear-Gaussian state-space model in the same non-centred form (tests:
  particle Gibbs against the Kalman smoother).
- :func:`joint_dpm`: a finite (truncated) version of the paper's JointDPM (Sec. 4.2, eq. 8-9): K clusters
  with weights ``pi ~ Dirichlet(alpha / K)`` (the finite Dirichlet approximation of a DP(alpha), Ishwaran &
  Zarepour 2002), diagonal-Gaussian features per cluster and one logistic regression per cluster; ``z``
  kept in the state. The hand-written :class:`~tallmh.blocks.models.JointDPM` instead collapses a CRP and
  normal-inverse-Wishart features, which is not a program with conditionally independent items.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["mixture", "stochastic_volatility", "linear_gaussian_ssm", "joint_dpm", "ar1", "joint_dpm_predict"]


def _np():
    import numpyro
    import numpyro.distributions as dist

    return numpyro, dist


def mixture(x, a=2.0, b=5.0, m=0.0, s=2.0):
    numpyro, dist = _np()
    pi = numpyro.sample("pi", dist.Beta(a, b))
    with numpyro.plate("components", 2):
        mu = numpyro.sample("mu", dist.Normal(m, s))
    with numpyro.plate("data", x.shape[0]):
        z = numpyro.sample("z", dist.Bernoulli(pi))
        numpyro.sample("x", dist.Normal(mu[z], 1.0), obs=x)


def ar1(eps, phi, scale, init_scale=None):
    """``h_t = phi h_{t-1} + scale eps_t`` along the last axis, ``h_{-1} = 0`` (``h_0 = init_scale eps_0`` if
    given): a (T, T) lower-triangular matrix of powers of phi, O(T^2) per series (T is small here)."""
    t_len = eps.shape[-1]
    i = jnp.arange(t_len)
    lag = i[:, None] - i[None, :]
    powers = jnp.where(lag >= 0, phi ** jnp.maximum(lag, 0), 0.0)  # (T, T): h_t = sum_s phi^(t-s) e_s
    e = eps * scale
    if init_scale is not None:
        e = e.at[..., 0].set(eps[..., 0] * init_scale)
    return e @ powers.T


def stochastic_volatility(x, a_phi=5.0, b_phi=1.0, a_s2=5.0, b_s2=0.05):
    numpyro, dist = _np()
    s_len, t_len = x.shape
    phi = numpyro.sample("phi", dist.Beta(a_phi, b_phi))
    sigma2 = numpyro.sample("sigma2", dist.InverseGamma(a_s2, b_s2))
    numpyro.deterministic("sigma", jnp.sqrt(sigma2))
    with numpyro.plate("series", s_len, dim=-2):
        with numpyro.plate("time", t_len, dim=-1):
            eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
        h = ar1(eps, phi, jnp.sqrt(sigma2))
        with numpyro.plate("time", t_len, dim=-1):
            numpyro.sample("x", dist.Normal(0.0, jnp.exp(h / 2)), obs=x)


def linear_gaussian_ssm(y, a=0.9, q=0.5, r=1.0, q0=1.0):
    """``h_1 ~ N(0, q0)``, ``h_t = a h_{t-1} + N(0, q)``, ``y_t = h_t + N(0, r)``, non-centred; one global
    ``c`` (``y_t`` has mean ``h_t + c``, ``c ~ N(0, 1)``) so the model has a global site."""
    numpyro, dist = _np()
    s_len, t_len = y.shape
    c = numpyro.sample("c", dist.Normal(0.0, 1.0))
    with numpyro.plate("series", s_len, dim=-2):
        with numpyro.plate("time", t_len, dim=-1):
            eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
        h = ar1(eps, a, np.sqrt(q), init_scale=np.sqrt(q0))
        with numpyro.plate("time", t_len, dim=-1):
            numpyro.sample("y", dist.Normal(h + c, np.sqrt(r)), obs=y)


def joint_dpm(X, y, K=10, mu_sd=3.0, sd_loc=-0.5, sd_sd=0.75, sig_w=2.0):
    numpyro, dist = _np()
    n, d = X.shape
    alpha = numpyro.sample("alpha", dist.Gamma(1.0, 1.0))
    pi = numpyro.sample("pi", dist.Dirichlet(jnp.full((K,), alpha / K)))
    with numpyro.plate("clusters", K):
        mu = numpyro.sample("mu", dist.Normal(0.0, mu_sd).expand([d]).to_event(1))
        sd = numpyro.sample("sd", dist.LogNormal(sd_loc, sd_sd).expand([d]).to_event(1))
        w = numpyro.sample("w", dist.Normal(0.0, sig_w).expand([d + 1]).to_event(1))
    with numpyro.plate("data", n):
        z = numpyro.sample("z", dist.Categorical(probs=pi))
        numpyro.sample("X", dist.Normal(mu[z], sd[z]).to_event(1), obs=X)
        logit = jnp.sum(X * w[z, :d], -1) + w[z, d]
        numpyro.sample("y", dist.Bernoulli(logits=logit), obs=y)


def joint_dpm_predict(draw, x_test):
    """p(y = 1 | x) under one draw (constrained globals by name) of :func:`joint_dpm`: the clusters'
    responsibilities for x (weights times feature densities) times their logistic outputs."""
    pi, mu, sd, w = draw["pi"], draw["mu"], draw["sd"], draw["w"]
    d = x_test.shape[1]
    lf = jnp.sum(-0.5 * ((x_test[:, None, :] - mu[None]) / sd[None]) ** 2 - jnp.log(sd[None]), -1)  # (n, K)
    resp = jax.nn.softmax(jnp.log(jnp.maximum(pi, 1e-30))[None] + lf, axis=-1)
    py = jax.nn.sigmoid(x_test @ w[:, :d].T + w[:, d][None])
    return jnp.sum(resp * py, -1)
