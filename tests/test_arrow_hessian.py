"""The arrow-shaped Hessian of a group-level model (fixed effects and scales with everything, each level with
itself) from p + K + 1 Hessian-vector products: equal to the dense Hessian where the structure holds, refused by
its check where it does not (two crossed groupings), and the recentring's pilot fit unchanged by it."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import arrow_hessian as ah
from tallmh import setup_passes as setup
from tallmh.frontends import pymc_model as pmm

pm = pytest.importorskip("pymc")


def _model(n=2000, groups=12, crossed=0, seed=0):
    """``y ~ x + (1|g)`` (Bernoulli, Bambi's names); ``crossed`` > 0 adds ``(1|h)`` over a second grouping."""
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    h = rng.integers(0, max(crossed, 1), n)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-0.3 + 0.8 * x + rng.normal(0, 0.5, groups)[g])))).astype(int)
    with pm.Model(coords={"g__factor_dim": [f"g{j}" for j in range(groups)],
                          "h__factor_dim": [f"h{j}" for j in range(max(crossed, 1))]}) as m:
        b0 = pm.Normal("Intercept", 0, 1.5)
        b1 = pm.Normal("x", 0, 1)
        s = pm.HalfNormal("1|g_sigma", 2.5)
        off = pm.Normal("1|g_offset", 0, 1, dims="g__factor_dim")
        eta = b0 + b1 * x + pm.Deterministic("1|g", off * s, dims="g__factor_dim")[g]
        if crossed:
            s2 = pm.HalfNormal("1|h_sigma", 2.5)
            off2 = pm.Normal("1|h_offset", 0, 1, dims="h__factor_dim")
            eta = eta + pm.Deterministic("1|h", off2 * s2, dims="h__factor_dim")[h]
        pm.Bernoulli("y", logit_p=eta, observed=y)
    model, data = tm.from_pymc(m, centre_groups=False)
    return model, {k: jnp.asarray(v) for k, v in data.items()}, n


def _point(model, seed=1):
    rng = np.random.default_rng(seed)
    th = {k: jnp.asarray(np.asarray(v) + 0.3 * rng.standard_normal(np.shape(v)), np.asarray(v).dtype)
          for k, v in model.init().items()}
    flat, unravel = ravel_pytree(th)
    return flat, unravel


def _spec(model, flat, unravel, keys):
    pos = unravel(jnp.arange(flat.shape[0]))
    return ah.ArrowSpec.of(flat.shape[0], [np.asarray(pos[k]).astype(int) for k in keys])


def test_arrow_hessian_equals_the_dense_one():
    model, data, n = _model()
    flat, unravel = _point(model)
    spec = _spec(model, flat, unravel, ["1|g_offset"])
    assert spec.dense.size == 3 and spec.worth(flat.shape[0])  # Intercept, x, the scale; 12 levels
    dense = setup.lik_hessian(model, data, n, unravel, flat)
    got = ah.ArrowDerivs(setup.full_pass, model, unravel, flat, spec)(data, n, flat, "test")
    assert got is not None
    v, g, h = got
    tol = 1e-4 * np.max(np.abs(dense))
    np.testing.assert_allclose(h, dense, atol=tol)
    assert np.max(np.abs(dense[np.ix_(spec.groups[0], spec.dense)])) > 100 * tol  # (the cross entries are read)
    # the group block's diagonal over all rows by one product a row
    diag = ah.group_diagonal(setup.full_pass, model, data, n, unravel, flat, spec)
    np.testing.assert_allclose(diag[spec.groups[0]], np.diag(dense)[spec.groups[0]], atol=tol)
    assert np.all(diag[spec.dense] == 0.0)


def test_arrow_check_refuses_crossed_groupings():
    """Two crossed groupings couple levels of different terms: the assembled Hessian is wrong, and the check says so
    (negative control of the check); with only the first term declared, the second's levels are dense coordinates
    and the structure holds again."""
    model, data, n = _model(crossed=5)
    flat, unravel = _point(model)
    bad = _spec(model, flat, unravel, ["1|g_offset", "1|h_offset"])
    derivs = ah.ArrowDerivs(setup.full_pass, model, unravel, flat, bad)
    assert derivs(data, n, flat, "test") is None and not derivs.ok and derivs.worst > 0.01
    ok = _spec(model, flat, unravel, ["1|g_offset"])
    assert ok.dense.size == 3 + 1 + 5
    dense = setup.lik_hessian(model, data, n, unravel, flat)
    got = ah.ArrowDerivs(setup.full_pass, model, unravel, flat, ok)(data, n, flat, "test")
    assert got is not None
    np.testing.assert_allclose(got[2], dense, atol=1e-4 * np.max(np.abs(dense)))


def test_newton_falls_back_to_the_dense_hessian_where_the_check_fails():
    """The pilot's Newton with a wrong structure declared reaches the same mode as with the dense Hessian."""
    model, data, n = _model(crossed=5)
    flat, unravel = ravel_pytree(model.init())
    bad = _spec(model, flat, unravel, ["1|g_offset", "1|h_offset"])
    th_a, _, last_a = setup._newton(model, data, n, unravel, flat, 30, 1e-6, arrow=bad)
    th_d, _, last_d = setup._newton(model, data, n, unravel, flat, 30, 1e-6)
    np.testing.assert_allclose(np.asarray(th_a), np.asarray(th_d), atol=1e-4)
    np.testing.assert_allclose(last_a[2], last_d[2], atol=1e-4 * np.max(np.abs(last_d[2])))


def test_recentring_with_the_arrow_hessian_equals_the_dense_one(monkeypatch):
    """The pilot fit and the full information pass by the arrow's products give the weights and the start of the
    dense Hessian's (the same computation up to float rounding)."""
    model, data, n = _model(n=3000, groups=10)
    arrow = pmm.recentre(model, data, pilot_rows=800)
    monkeypatch.setattr(ah.ArrowSpec, "worth", lambda self, d: False)
    dense = pmm.recentre(model, data, pilot_rows=800)
    np.testing.assert_allclose(arrow.weights["1|g_centred__"], dense.weights["1|g_centred__"], atol=1e-4)
    for k in dense._init:
        np.testing.assert_allclose(np.asarray(arrow._init[k]), np.asarray(dense._init[k]), atol=1e-4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_many_effects_record_one_draw_per_several_exact_steps(monkeypatch):
    """The exact GLM block's steps per recorded draw grow with the effects (the stored values per step stay about
    ``RECORD_VALUES``): with 12 levels and RECORD_VALUES 4, four steps a cycle; the run's stats count them."""
    from tallmh import hierarchical

    assert [hierarchical.glm_steps(k) for k in (1, 128, 129, 1003, 10_001)] == [1, 1, 2, 8, 79]
    monkeypatch.setattr(hierarchical, "RECORD_VALUES", 4)
    rng = np.random.default_rng(0)
    n, groups = 3000, 12
    g = rng.integers(0, groups, n)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-0.3 + 0.8 * x + rng.normal(0, 0.5, groups)[g])))).astype(int)
    with pm.Model(coords={"g__factor_dim": [f"g{j}" for j in range(groups)]}) as m:
        s = pm.HalfNormal("1|g_sigma", 2.5)
        off = pm.Normal("1|g_offset", 0, 1, dims="g__factor_dim")
        eta = pm.Normal("Intercept", 0, 1.5) + pm.Normal("x", 0, 1) * x + pm.Deterministic("1|g", off * s)[g]
        pm.Bernoulli("y", logit_p=eta, observed=y)
    model, data = tm.from_pymc(m)
    bm, program, note = hierarchical.default_program(model, data, None, None, None, None, None)
    eff = program.blocks[-1]
    assert type(eff).__name__ == "Repeat" and eff.times == 4 and type(eff.block).__name__ == "GLMEffects"
    assert "4 subsampled MH steps (one draw recorded a cycle)" in note
    r = tm.sample(bm, hierarchical.data_for(bm, data), program=program, seed=0, progress=False, num_samples=50,
                  num_warmup=20, num_chains=2)
    assert r.samples["1|g"].shape == (2, 50, groups)
    assert np.all(np.asarray(r.stats["block1_proposals"]) == 4)  # four exact steps per recorded draw


def test_diagnostics_in_column_blocks_equal_the_whole_array(monkeypatch):
    """ESS and R-hat of many parameters computed on blocks of columns (bounded temporaries) equal those of the whole
    array, column for column."""
    from tallmh.reporting import diagnostics as dg

    rng = np.random.default_rng(0)
    x = np.cumsum(rng.standard_normal((4, 300, 37)), axis=1) * 0.05 + rng.standard_normal((4, 300, 37))
    whole = [dg.ess_all(x), dg.ess_all(x, "tail"), dg.rhat_all(x)]
    monkeypatch.setattr(dg, "DIAG_BLOCK_VALUES", 4 * 300 * 5)  # five columns a block: eight blocks, the last of two
    blocked = [dg.ess_all(x), dg.ess_all(x, "tail"), dg.rhat_all(x)]
    for a, b in zip(whole, blocked):
        assert a.shape == b.shape == (37,)
        np.testing.assert_allclose(b, a, rtol=1e-12)


def test_arrow_newton_step_equals_the_dense_solve():
    """Concave: the Schur-complement step is the dense Newton step. Not concave (a dense direction of negative
    curvature, the group block positive): an ascent direction, the solve of ``[[S_+ + B D^-1 B^T, B], [B^T, D]]``."""
    rng = np.random.default_rng(0)
    p, groups = 3, 40
    spec = ah.ArrowSpec.of(p + groups, [np.arange(p, p + groups)])
    b = rng.normal(size=(p, groups)) * 0.3
    dd = rng.uniform(1.0, 3.0, groups)
    a = np.eye(p) * 20.0 + 0.0
    neg = np.block([[a, b], [b.T, np.diag(dd)]])
    g = rng.normal(size=p + groups)
    step, dec, concave = setup._newton_step(g, -neg, arrow=spec)
    assert concave
    np.testing.assert_allclose(step, np.linalg.solve(neg, g), rtol=1e-10)
    np.testing.assert_allclose(dec, g @ np.linalg.solve(neg, g), rtol=1e-10)
    a_bad = a.copy()
    a_bad[0, 0] = -5.0  # a dense direction of negative curvature
    neg_bad = np.block([[a_bad, b], [b.T, np.diag(dd)]])
    step, dec, concave = setup._newton_step(g, -neg_bad, arrow=spec)
    assert not concave and dec > 0
    s = a_bad - (b / dd) @ b.T
    m = np.block([[setup.positive_part(s) + (b / dd) @ b.T, b], [b.T, np.diag(dd)]])
    np.testing.assert_allclose(step, np.linalg.solve(m, g), rtol=1e-8)
    # with coordinates held (the scales in the second pilot fit): they do not move
    keep = np.ones(p + groups, bool)
    keep[1] = False
    step, _, _ = setup._newton_step(g, -neg, keep=keep, arrow=spec)
    assert step[1] == 0.0
    free = np.flatnonzero(keep)
    np.testing.assert_allclose(step[free], np.linalg.solve(neg[np.ix_(free, free)], g[free]), rtol=1e-10)


def test_convergence_check_in_column_blocks_equals_the_whole_array(monkeypatch):
    """``bulk_ess_and_rhat`` in blocks of columns: the same ESS and R-hat; R-hat None when any block's ESS misses
    ``min_ess`` (a low-ESS column in the first block, and in the last)."""
    from tallmh.reporting import diagnostics as dg

    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 400, 23))
    ess0, rh0 = dg.bulk_ess_and_rhat(x, 100)
    monkeypatch.setattr(dg, "DIAG_BLOCK_VALUES", 4 * 400 * 4)
    ess1, rh1 = dg.bulk_ess_and_rhat(x, 100)
    np.testing.assert_allclose(ess1, ess0, rtol=1e-12)
    np.testing.assert_allclose(rh1, rh0, rtol=1e-12)
    for col in (0, 22):
        y = x.copy()
        y[:, :, col] = np.cumsum(y[:, :, col], axis=1)  # a random walk: ESS far below 100
        e, r = dg.bulk_ess_and_rhat(y, 100)
        assert r is None and e[col] < 100 and e.shape == (23,)
        np.testing.assert_allclose(np.delete(e, col), np.delete(ess0, col), rtol=1e-12)


def test_convergence_checks_are_spaced_by_their_cost():
    """num_samples='auto' looks again after 25% more draws, or after as many steps as take five times the last
    check's time when a check costs more than that."""
    from tallmh.run.chunks import next_check

    assert next_check(1000, 0.01, 1e-3) == 1251  # a cheap check: 25% more draws
    assert next_check(10_000, 4.0, 1e-4) == 10_000 + 200_000  # 4 s a check, 0.1 ms a step: 20 s of steps
    assert next_check(1000, 4.0, 0.0) == 1251  # (no step time known: as before)
