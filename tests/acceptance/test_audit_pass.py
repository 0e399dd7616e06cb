"""The self-audit's exact pass (``Exact.audit_decide``: a loop of fixed length, rows sliced) decides as
``Exact.decide`` does: same decisions, same items counted, for chains side by side, at an N that the chunks do
not divide, for proposals out of the support and for items that are not finite."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh.kernel import make_problem


def _problems(data, n, model, log_base):
    _, unravel = ravel_pytree(jnp.zeros(4))

    def both(key, th, thp, base):
        pr = make_problem(model, data, n, unravel, None, th, thp, base)
        ex = tm.acceptance.Exact()
        a, b = ex.decide(key, pr), ex.audit_decide(key, pr)
        assert pr.lik_ratio_rows is not None
        (hi, lo), _, _, _ = ex.log_ratio(pr)
        s = ex.fixed_pass_sum(pr)
        return (a.accept, a.n_data, a.n_nonfinite, hi + lo), (b.accept, b.n_data, b.n_nonfinite, s.hi + s.lo)

    return jax.jit(jax.vmap(both))


def test_audit_pass_decides_as_the_exact_test():
    n = 10_007
    data, _ = tm.models.LogisticRegression.simulate(n, d=3, seed=4)
    data = {k: jnp.asarray(v) for k, v in data.items()}
    model = tm.models.LogisticRegression()
    rng = np.random.default_rng(0)
    c = 64
    th = jnp.asarray(rng.standard_normal((c, 4)) * 0.3, jnp.float32)
    # steps of every size, so that both decisions occur, some near the boundary
    thp = th + jnp.asarray(rng.standard_normal((c, 4)) * np.geomspace(1e-4, 0.3, c)[:, None], jnp.float32)
    base = jnp.asarray(np.where(np.arange(c) % 16 == 5, -np.inf, 0.0), jnp.float32)
    keys = jax.random.split(jax.random.PRNGKey(1), c)
    (acc, nd, bad, tot), (acc2, nd2, bad2, tot2) = _problems(data, n, model, base)(keys, th, thp, base)
    acc, acc2 = np.asarray(acc), np.asarray(acc2)
    # the same sum up to the order of its compensated additions (an item counted twice would show)
    inside = np.isfinite(np.asarray(base))  # (out of the support the exact test reads nothing and sums 0)
    np.testing.assert_allclose(np.asarray(tot2)[inside], np.asarray(tot)[inside], rtol=1e-6, atol=1e-6)
    assert 5 < acc.sum() < c - 5  # both decisions are exercised
    np.testing.assert_array_equal(acc, acc2)
    np.testing.assert_array_equal(np.asarray(nd2), np.where(np.isinf(np.asarray(base)), 0, n))
    np.testing.assert_array_equal(np.asarray(nd), np.asarray(nd2))
    np.testing.assert_array_equal(np.asarray(bad), np.asarray(bad2))


def test_audit_pass_rejects_on_a_non_finite_item():
    n = 5000
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    x[4321] = np.nan
    data = {"x": jnp.asarray(x)}
    model = tm.Model(log_prior=lambda th: -0.5 * jnp.sum(th**2),
                     log_lik=lambda th, b: -0.5 * (b["x"] - th[0]) ** 2 + 0.0 * th[1:].sum())
    th = jnp.zeros((2, 4), jnp.float32)
    thp = th + 0.01
    keys = jax.random.split(jax.random.PRNGKey(0), 2)
    base = jnp.zeros(2, jnp.float32)
    (acc, nd, bad, _), (acc2, nd2, bad2, _) = _problems(data, n, model, base)(keys, th, thp, base)
    assert not np.asarray(acc2).any() and (np.asarray(bad2) == 1).all()
    assert (np.asarray(nd2) == n).all()  # the audit reads every item; the exact test stops early
    assert not np.asarray(acc).any() and (np.asarray(bad) == 1).all()
