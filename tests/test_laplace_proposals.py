"""The proposals around the Laplace approximation: their proposal ratios."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.errors import ConfigError


def _gauss(d=3, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d))
    cov = A @ A.T + d * np.eye(d)
    return rng.normal(size=d), np.linalg.cholesky(cov), cov


def _log_normal(x, c, cov):
    r = np.asarray(x, np.float64) - c
    return -0.5 * r @ np.linalg.solve(cov, r)


@pytest.mark.parametrize("rho,scale", [(0.0, 1.0), (0.6, 1.0), (0.3, 1.5)])
def test_crank_nicolson_ratio_makes_its_reference_invariant(rho, scale):
    """pCN is reversible for N(c, s^2 Sigma): its ratio plus that density's ratio is 0 (acceptance 1)."""
    c, L, cov = _gauss()
    p = tm.proposals.CrankNicolson(c, L, rho=rho, scale=scale)
    th = jnp.asarray(c + 0.7, jnp.float32)
    st = p.init(th, 10)
    for k in range(5):
        thp, lq = p.propose(jax.random.PRNGKey(k), th, st)
        lr = _log_normal(thp, c, scale**2 * cov) - _log_normal(th, c, scale**2 * cov)
        assert abs(float(lq) + lr) < 1e-3 * (1 + abs(lr))


def test_surrogate_langevin_ratio_is_the_gaussian_proposals():
    c, L, cov = _gauss(seed=1)
    e = 0.8
    p = tm.proposals.SurrogateLangevin(c, L, step=e)
    th = jnp.asarray(c - 0.4, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
    st = p.init(th, 10)
    thp, lq = p.propose(jax.random.PRNGKey(0), th, st)
    # q(to | from) = N(to; from - e^2/2 (from - c), e^2 Sigma)
    def log_q(to, frm):
        m = np.asarray(frm, np.float64) - 0.5 * e * e * (np.asarray(frm, np.float64) - c)
        return _log_normal(to, m, e * e * cov)
    assert abs(float(lq) - (log_q(th, thp) - log_q(thp, th))) < 1e-3


def test_bad_settings_are_refused():
    c, L, _ = _gauss()
    with pytest.raises(ConfigError):
        tm.proposals.CrankNicolson(c, L, rho=1.0)
    with pytest.raises(ConfigError):
        tm.proposals.SurrogateLangevin(c, L, step=0.0)
    with pytest.raises(ConfigError):
        tm.proposals.CrankNicolson(c, L[:2])
