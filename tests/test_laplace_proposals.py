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


def test_rho_adapts_towards_local_moves_only_where_independent_ones_are_rejected():
    """Warmup's Robbins-Monro on log(1 - rho): rejections move rho towards 1, acceptances back to its start
    (0, the independence sampler), never past it; without adapt the state does not move."""
    c, L, _ = _gauss()
    p = tm.proposals.CrankNicolson(c, L)
    th = jnp.asarray(c, jnp.float32)
    st = p.init(th, 10)
    assert float(st.log_gap) == 0.0
    rej = st
    for k in range(200):
        rej = p.update(rej, th, jnp.asarray(False), jnp.asarray(k))
    rho = -float(jnp.expm1(rej.log_gap))
    assert 0.9 < rho < 1.0
    acc = rej
    for k in range(200, 2000):
        acc = p.update(acc, th, jnp.asarray(True), jnp.asarray(k))
    assert float(acc.log_gap) == 0.0  # back to the independence sampler
    fixed = tm.proposals.CrankNicolson(c, L, adapt=False)
    s0 = fixed.init(th, 10)
    assert float(fixed.update(s0, th, jnp.asarray(False), jnp.asarray(0)).log_gap) == float(s0.log_gap)


def test_without_a_centre_the_proposal_takes_the_runs_laplace_approximation():
    """CrankNicolson() / SurrogateLangevin() take the control variates' centre and the Laplace covariance from
    the kernel's init; without them (no second-order control variates) the run is refused in one line."""
    data, _ = tm.models.LogisticRegression.simulate(5000, d=3, seed=4)
    for prop in (tm.proposals.CrankNicolson(), tm.proposals.SurrogateLangevin(step=0.9)):
        r = tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.PoissonThinning(), proposal=prop,
                      num_samples=50, num_warmup=50, num_chains=2, seed=0, progress=False)
        st = r.final_state
        np.testing.assert_allclose(np.asarray(st.proposal.center), np.asarray(st.cv.center), rtol=0, atol=0)
        L = np.asarray(st.proposal.chol[0], np.float64)
        d = L.shape[0]
        H = -np.asarray(st.cv.hess_sum[0], np.float64) + np.eye(d) / 10.0**2  # (the model's N(0, 10^2) prior)
        np.testing.assert_allclose(L @ L.T @ H, np.eye(d), atol=2e-3)
    with pytest.raises(ConfigError, match="Laplace approximation"):
        tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Exact(), proposal=tm.proposals.CrankNicolson(),
                  num_samples=10, num_warmup=10, num_chains=1, progress=False)
    with pytest.raises(ConfigError, match="together"):
        tm.proposals.CrankNicolson(center=np.zeros(3))
