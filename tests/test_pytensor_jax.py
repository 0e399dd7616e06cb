"""PyTensor graphs compiled to JAX with ``arange`` nodes over more than 127 rows (tallmh.frontends.pytensor_jax):
PyTensor types the constants of ``pt.arange(n)`` as int8, and its JAX translation overflowed once ``n`` > 127. A Bambi
categorical model (PyMC's Categorical indexes its probabilities by such an ``arange``) converts at N = 300 and its
per-row log-likelihood, on a batch of 200 rows and on all rows, is PyMC's."""

import numpy as np
import pytest

import tallmh as tm

pm = pytest.importorskip("pymc")


def test_an_arange_over_a_batch_past_127_rows():
    import pytensor.tensor as pt

    from tallmh.frontends.pytensor_jax import jaxified_graph

    x = pt.vector("x")
    f = jaxified_graph([x], [x * pt.arange(x.shape[0])])
    np.testing.assert_array_equal(np.asarray(f(np.ones(300, np.float32))[0]), np.arange(300))


def test_a_categorical_bambi_model_converts_at_300_rows():
    bmb = pytest.importorskip("bambi")
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    n = 300
    x = rng.normal(size=n)
    logits = np.column_stack([np.zeros(n), 0.5 + x, -0.5 - x])
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = (rng.random(n)[:, None] > np.cumsum(p, 1)).sum(1)
    df = pd.DataFrame({"y": pd.Categorical(np.array(["a", "b", "c"])[y]), "x": x})
    bm = bmb.Model("y ~ x", df, family="categorical")
    model, data = tm.from_bambi(bm)  # (its own checks: additive on a few rows, the full sum against PyMC's)
    th = {k: v + 0.3 * rng.standard_normal(np.shape(v)).astype(np.asarray(v).dtype) for k, v in model.init().items()}
    ll = np.asarray(model.log_lik(th, data), np.float64)
    assert ll.shape == (n,) and np.all(np.isfinite(ll))
    rows = np.arange(50, 250)  # a batch of 200 rows
    part = np.asarray(model.log_lik(th, {k: np.asarray(v)[rows] for k, v in data.items()}), np.float64)
    np.testing.assert_allclose(part, ll[rows], rtol=1e-5, atol=1e-5)
    # PyMC's own log density of the model at the same point
    logp = bm.backend.model.compile_logp()
    ref = float(logp({k: np.asarray(v, np.float64) for k, v in th.items()}))
    ours = float(model.log_prior(th)) + float(ll.sum())
    assert ours == pytest.approx(ref, rel=1e-4, abs=1e-3)
