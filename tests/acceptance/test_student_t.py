"""The t quantile of the austerity test's stopping rule (``student_t_isf``: Cornish-Fisher in 1/nu) against
SciPy, and the test's decisions with it against those with the incomplete beta p-value."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy import stats
from scipy.special import ndtri

import tallmh as tm
from tallmh.acceptance import austerity
from tallmh.kernel import make_problem

P = np.geomspace(3e-7, 0.25, 40)


@pytest.mark.parametrize("nu", [29, 50, 99, 299, 301, 1000, 10**4, 10**6])
def test_quantile_matches_scipy(nu):
    x = -ndtri(P)
    got = np.asarray(austerity.student_t_isf(jnp.asarray(x, jnp.float32), jnp.float32(nu)), float)
    want = stats.t.isf(P, nu)
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # float64 evaluation: the expansion's own error
    np.testing.assert_allclose(austerity.student_t_isf(x, float(nu)), want, rtol=1e-4 if nu < 99 else 1e-6)


def test_the_normal_quantile_alone_fails_the_same_check():
    """Negative control: without the 1/nu terms the quantile is off by more than the tolerance at nu = 29."""
    with pytest.raises(AssertionError):
        np.testing.assert_allclose(-ndtri(P), stats.t.isf(P, 29), rtol=1e-4)


def test_decisions_match_the_incomplete_beta_form(monkeypatch):
    n = 20_000
    data, _ = tm.models.LogisticRegression.simulate(n, d=3, seed=9)
    data = {k: jnp.asarray(v) for k, v in data.items()}
    model = tm.models.LogisticRegression()
    _, unravel = ravel_pytree(jnp.zeros(4))
    rng = np.random.default_rng(1)
    c = 300
    th = jnp.asarray(rng.standard_normal((c, 4)) * 0.2, jnp.float32)
    thp = th + jnp.asarray(rng.standard_normal((c, 4)) * np.geomspace(1e-3, 0.05, c)[:, None], jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(2), c)
    test = tm.acceptance.Austerity(error=0.05, batch_size=100)

    def decide(key, t, tp):
        d = test.decide(key, make_problem(model, data, n, unravel, None, t, tp, jnp.zeros(())))
        return d.accept, d.n_data

    a1, n1 = jax.jit(jax.vmap(decide))(keys, th, thp)
    monkeypatch.setattr(austerity, "T_EXPANSION_MIN", 10**9)  # every look by the incomplete beta p-value
    a2, n2 = jax.jit(jax.vmap(decide))(keys, th, thp)
    assert 0.2 < float(np.mean(a1)) < 0.8 and float(np.mean(np.asarray(n1) < n)) > 0.5
    np.testing.assert_array_equal(np.asarray(a1), np.asarray(a2))
    np.testing.assert_array_equal(np.asarray(n1), np.asarray(n2))
