"""Memory and scale of the set-up for group-level models: the full pass that estimates each level's information
when there are many parameters (gradient squares instead of the dense Hessian), and the exact GLM block's host sums
in blocks of rows, each against the computation it replaced."""

import numpy as np
import pytest

import tallmh as tm
from tallmh import glm_effects as ge
from tallmh.frontends import pymc_model as pmm

pm = pytest.importorskip("pymc")


def _bambi_like(n=3000, groups=8, seed=0, link="logit"):
    """``y ~ x + (1|g)`` (Bernoulli) written in PyMC with Bambi's names, so that the offsets are recentred."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    x = rng.normal(size=n)
    a = rng.normal(0, 0.5, groups)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-0.3 + 0.8 * x + a[g])))).astype(int)
    with pm.Model(coords={"g__factor_dim": [f"g{j}" for j in range(groups)]}) as m:
        b0 = pm.Normal("Intercept", 0, 1.5)
        b1 = pm.Normal("x", 0, 1)
        s = pm.HalfNormal("1|g_sigma", 2.5)
        off = pm.Normal("1|g_offset", 0, 1, dims="g__factor_dim")
        eff = pm.Deterministic("1|g", off * s, dims="g__factor_dim")
        eta = b0 + b1 * x + eff[g]
        if link == "logit":
            pm.Bernoulli("y", logit_p=eta, observed=y)
        else:
            pm.Bernoulli("y", p=0.5 * (1 + pm.math.erf(eta / np.sqrt(2))), observed=y)
    return m, g, x, y


def test_gradient_square_sums_are_the_logistic_score_squares():
    """On a logistic regression the per-row gradient is ``(y - p) (1, x)``: the pass's sums equal those, summed in NumPy."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=5000)
    y = (rng.random(5000) < 1 / (1 + np.exp(-(0.2 + x)))).astype(int)
    with pm.Model() as m:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        pm.Bernoulli("y", logit_p=a + b * x, observed=y)
    model, data = tm.from_pymc(m)
    from jax.flatten_util import ravel_pytree
    import jax.numpy as jnp

    theta = {"a": jnp.asarray(0.1, jnp.float32), "b": jnp.asarray(0.7, jnp.float32)}
    flat, unravel = ravel_pytree(theta)
    got = pmm.gradient_square_sums(model, {k: jnp.asarray(v) for k, v in data.items()}, 5000, unravel, flat)
    r = y - 1 / (1 + np.exp(-(0.1 + 0.7 * x)))
    want = np.array([np.sum(r ** 2), np.sum((r * x) ** 2)])
    order = [list(theta).index(k) for k in sorted(theta)]  # ravel_pytree orders keys
    np.testing.assert_allclose(got, want[order], rtol=1e-4)
    assert not np.allclose(got, want[order] * 1.01, rtol=1e-4)  # (the check can fail)


def test_many_parameter_recentring_agrees_with_the_dense_hessian(monkeypatch):
    """With the gradient-square estimate of each level's information (used above ``FULL_HESSIAN_MAX`` parameters
    where the arrow-shaped Hessian's check fails),
    the centring weights are close to those from the dense Hessian's diagonal (the same pilot; a level's information
    from some 375 rows: its estimates differ by sampling noise only), and the start is the same."""
    m, *_ = _bambi_like()
    model, data = tm.from_pymc(m, centre_groups=False)
    dense = pmm.recentre(model, data, pilot_rows=600)
    monkeypatch.setattr(pmm, "FULL_HESSIAN_MAX", 0)
    monkeypatch.setattr(pmm.ArrowSpec, "worth", lambda self, d: False)  # (the exact arrow pass comes first)
    outer = pmm.recentre(model, data, pilot_rows=600)
    wd, wo = dense.weights["1|g_centred__"], outer.weights["1|g_centred__"]
    assert wd.shape == (8,) and np.all((wd > 0.5) & (wd < 1.0))
    np.testing.assert_allclose(wo, wd, atol=0.03)
    np.testing.assert_allclose(np.asarray(outer._init["1|g_sigma_log__"]), np.asarray(dense._init["1|g_sigma_log__"]),
                               atol=1e-6)


def test_glm_host_sums_in_blocks_equal_one_block(monkeypatch):
    """The exact block's float64 host sums over blocks of rows equal those over all rows at once."""
    rng = np.random.default_rng(2)
    n, G = 1001, 7
    view = ge.GLMView(rng.normal(size=(n, 3)).astype(np.float32), rng.integers(0, G, n).astype(np.int32),
                      rng.choice([-1.0, 1.0], n).astype(np.float32), rng.normal(size=n).astype(np.float32),
                      np.arange(3), np.arange(3, 3 + G))
    ef, eg = rng.normal(size=3), rng.normal(size=G)
    one = ge._glm_sums(view, ef, eg)
    monkeypatch.setattr(ge, "_HOST_BLOCK", 100)
    many = ge._glm_sums(view, ef, eg)
    assert one[0] == pytest.approx(many[0], rel=1e-12)
    # the line search's value alone (no gradient or precision sums) is the same sum
    assert ge._glm_value(view, ef, eg) == pytest.approx(one[0], rel=1e-12)
    assert ge._glm_value(view, ef, eg + 0.1) != pytest.approx(one[0], rel=1e-6)
    for a, b in zip((one[1], one[2], *one[3]), (many[1], many[2], *many[3])):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def _blocked(link):
    import jax.numpy as jnp

    from tallmh import hierarchical

    m, g, x, y = _bambi_like(n=2000, groups=12, link=link)
    model, data = tm.from_pymc(m)
    cm = hierarchical.centred_view(model)
    hyper, effects, _ = hierarchical.split_sites(cm, data)
    bm = hierarchical.BlockedModel(cm, hyper, effects, cm.init(), {"hyper": 0.0, "effects": 0.0})
    return bm, {k: jnp.asarray(v) for k, v in data.items()}, g, x


def test_design_read_by_directions_equals_the_per_row_gradients():
    """The GLM recognition's design (``p + 3`` forward derivatives a row) equals the one read from each row's full
    gradient over all effects (the computation it replaced: ``O(N G)``), and the true group index of each row; a
    probit likelihood is not recognised."""
    import jax
    import jax.numpy as jnp

    bm, data, g, x = _blocked("logit")
    view = ge.recognise(bm, data, 2000)
    assert view is not None
    e0, h0 = bm.start["effects"], bm.start["hyper"]

    def ell(e, row):
        return bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), row)[0]

    rows = jax.tree_util.tree_map(lambda a: a[:, None], data)
    val, grad = jax.vmap(jax.value_and_grad(ell), in_axes=(None, 0))(e0, rows)
    a = np.asarray(grad / (-jnp.expm1(val))[:, None], np.float64)
    ag = a[:, view.group]
    gi = np.argmax(np.abs(ag), axis=1)
    ci = ag[np.arange(2000), gi]
    e = np.asarray(e0, np.float64)
    b = -np.log(np.expm1(-np.asarray(val, np.float64))) - a[:, view.fixed] @ e[view.fixed] - ci * e[view.group][gi]
    np.testing.assert_array_equal(view.g, gi)
    np.testing.assert_array_equal(view.g, g)  # (Bambi's level order is the codes' order here)
    np.testing.assert_allclose(view.x, a[:, view.fixed], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(view.c, ci, rtol=1e-4)
    np.testing.assert_allclose(view.b, b, atol=1e-3)
    bm_p, data_p, _, _ = _blocked("probit")
    assert ge.recognise(bm_p, data_p, 2000) is None


def test_auto_check_reads_evenly_thinned_draws(monkeypatch):
    """The num_samples='auto' check over chunks equals the check on all draws joined (up to AUTO_CHECK_DRAWS a chain)
    and, beyond, on every s-th draw of the joined run; a long run's check does not read every draw."""
    from tallmh.reporting import diagnostics
    from tallmh.run import configure

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 1000, 5))
    parts = [(x[:, a:b],) for a, b in ((0, 137), (137, 600), (600, 1000))]
    ess = float(np.min(diagnostics.ess_all(x)))
    got = configure.auto_reached(parts, min_ess=10)
    assert got is not None and got[0] == ess
    monkeypatch.setattr(configure, "AUTO_CHECK_DRAWS", 300)  # step 4: draws 0, 4, 8, ... of the joined run
    thin = float(np.min(diagnostics.ess_all(x[:, ::4])))
    got = configure.auto_reached(parts, min_ess=10)
    assert got is not None and got[0] == thin and thin != ess


def test_auto_check_confirms_the_thinned_r_hat_on_all_draws(monkeypatch):
    """A run whose thinned draws pass but whose draws on all rows fail R-hat (the verdict's) is not stopped: a
    column whose even draws mix and whose odd draws sit apart by chain passes on every 2nd draw only. Negative
    control: without the confirmation (no columns confirmed) the thinned check stops it."""
    from tallmh.reporting import diagnostics
    from tallmh.run import configure

    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 2000, 40))
    x[:, 1::2, 7] += np.array([-0.6, -0.2, 0.2, 0.6])[:, None]
    parts = [(x[:, :900],), (x[:, 900:],)]
    monkeypatch.setattr(configure, "AUTO_CHECK_DRAWS", 1000)  # step 2: the even draws
    assert np.max(diagnostics.rhat_all(x[:, ::2])) <= configure.AUTO_RHAT < np.max(diagnostics.rhat_all(x))
    assert configure.auto_reached(parts, min_ess=10) is None
    monkeypatch.setattr(configure, "AUTO_CONFIRM_COLUMNS", 0)
    monkeypatch.setattr(configure, "AUTO_CONFIRM_MARGIN", -1.0)
    assert configure.auto_reached(parts, min_ess=10) is not None
