"""The built-in logistic model's per-item log-likelihood ratios against a float64 reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.errors import DataError

GRID = np.concatenate([np.linspace(-50, 50, 201), [-1e-6, 1e-6, -1e-3, 1e-3, 3e-8, -30.5]]).astype(np.float32)


def _reference(z, d):
    """softplus(z + d) - softplus(z) in float64 (z + d is exact in float64 for float32 z and d)."""
    z = z.astype(np.float64)
    d = d.astype(np.float64)
    return np.logaddexp(0.0, z + d) - np.logaddexp(0.0, z)


def _grid():
    z, d = np.meshgrid(GRID, GRID, indexing="ij")
    return z.ravel(), d.ravel()


def _ratios(z, d, y):
    # theta = (1, 0), theta' = (1, 1): the margin x . theta is z and the step x . (theta' - theta) is d, exactly
    X = np.stack([z, d], axis=1).astype(np.float32)
    batch = {"X": X, "y": np.full(len(z), y, np.float32)}
    model = tm.models.LogisticRegression()
    return np.asarray(model.log_lik_ratio(jnp.array([1.0, 0.0], jnp.float32), jnp.array([1.0, 1.0], jnp.float32),
                                          batch), np.float64)


def _max_rel_err(got, want):
    err = np.abs(got - want)
    return float(np.max(np.where(want == 0, err, err / np.maximum(np.abs(want), 1e-300))))


@pytest.mark.parametrize("y", [0.0, 1.0])
def test_logistic_ratio_matches_float64_over_margins_and_steps_to_50(y):
    z, d = _grid()
    got = _ratios(z, d, y)
    # y = 0: log sigmoid(-z') - log sigmoid(-z) = -(softplus(z') - softplus(z)); y = 1 mirrors it
    want = -_reference(z, d) if y == 0 else -_reference(-z, -d)
    assert np.all(np.isfinite(got))
    assert _max_rel_err(got, want) < 1e-5


def test_large_margin_and_large_step_back():
    # margin 20, step -25: the log-likelihood ratio is +19.99 for y = 0 and -5.0 for y = 1 (was +inf)
    z, d = np.float32([20.0]), np.float32([-25.0])
    assert _ratios(z, d, 0.0)[0] == pytest.approx(19.993284, rel=1e-6)
    assert _ratios(z, d, 1.0)[0] == pytest.approx(-5.0067153, rel=1e-6)


def test_negative_control_plain_log1p_form_fails_the_same_check():
    # log1p(sigmoid(z) expm1(d)) alone rounds to log1p(-1) = -inf at large margins with large steps back
    z, d = _grid()
    plain = np.asarray(jnp.log1p(jax.nn.sigmoid(jnp.asarray(z)) * jnp.expm1(jnp.asarray(d))), np.float64)
    assert not np.all(np.isfinite(plain)) or _max_rel_err(plain, _reference(z, d)) > 1e-5


def test_feature_beyond_float32_range_is_one_clear_error():
    data, _ = tm.models.LogisticRegression.simulate(200, d=2, seed=0)
    data["X"][3, 1] = 1e30
    with pytest.raises(DataError, match="rescale the features"):
        tm.sample(tm.models.LogisticRegression(), data, num_samples=5, num_warmup=0, num_chains=1, progress=False)


def test_feature_statistics_on_the_host_match_the_compiled_ones():
    from tallmh.models import logistic

    rng = np.random.default_rng(3)
    X = (rng.standard_normal((5000, 7)) * np.geomspace(1e-3, 1e3, 7)).astype(np.float32)
    biggest, max_norm = logistic._feature_stats_host(X)
    b2, n2 = logistic._feature_stats(jnp.asarray(X))
    # (below half the range limit the host's "biggest" is the largest row norm, a bound of the largest entry)
    assert float(b2) <= biggest * (1 + 1e-6) and biggest == max_norm
    np.testing.assert_allclose(max_norm, float(n2), rtol=1e-6)
    X[17, 3] = np.nan  # a non-finite entry (the finiteness check waived): the compiled path decides
    assert logistic._feature_stats_host(X) is None
