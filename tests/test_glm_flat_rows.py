"""Rows of a group-level logistic GLM whose log-likelihood is flat at the start (tallmh.glm_effects): a zero design
row (a constant: zero bound weight, never drawn by the thinning, yet its order array has N rows like the data), and a
row where Bambi's link saturates (its probability clipped to ``1 - eps`` where ``sigmoid`` rounds to 1): its design is
read at another point, not replaced by the start's constant."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import glm_effects as ge
from tallmh import hierarchical
from tallmh.storage.data import validate_data

pm = pytest.importorskip("pymc")


def _reachable(setup):
    """The positions of the order that some bucket points at (the thinning draws an item only from these)."""
    st = np.asarray(setup.bstart), np.asarray(setup.bcount)
    return np.unique(np.concatenate([np.arange(a, a + c) for a, c in zip(*st)]))


def _slope_model(n=96, zeros=9, seed=0):
    """A logistic regression with a group-level slope and no intercept: rows with ``x = z = 0`` have a constant
    log-likelihood (``log 1/2``)."""
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(4), n // 4)
    x, z = rng.normal(size=n), rng.normal(size=n)
    x[:zeros] = z[:zeros] = 0.0
    y = (rng.random(n) < 1 / (1 + np.exp(-(0.7 * x + np.array([-1.0, 0.0, 0.5, 1.0])[g] * z)))).astype(int)
    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        b = pm.Normal("b", 0, 2)
        s = pm.HalfNormal("s", 1)
        u = pm.Normal("u", 0, s, shape=4)
        pm.Bernoulli("y", logit_p=b * x + u[gi] * z, observed=y)
    model, data = tm.from_pymc(m)
    return model, data, zeros


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_constant_rows_are_never_drawn_and_the_order_has_n_rows():
    model, data, zeros = _slope_model()
    n = int(np.asarray(data["g_idx"]).shape[0])
    bm, program, _ = hierarchical.auto_program(model, data)
    eff = program.blocks[-1]
    eff = getattr(eff, "block", eff)
    assert isinstance(eff, ge.GLMEffects)
    x, c = np.asarray(bm.extra_data["_glm_x"]), np.asarray(bm.extra_data["_glm_c"])
    const = np.nonzero((c == 0) & np.all(x == 0, axis=1))[0]
    assert np.array_equal(const, np.arange(zeros))  # the zero design rows, and only they, read as constants
    order = np.asarray(bm.extra_data["_glm_order"])
    assert np.array_equal(np.sort(order), np.arange(n))  # one position per row, as the data check wants
    # the thinning reaches every row of nonzero design and no constant one (its remainder is zero at every point)
    assert np.array_equal(np.sort(order[_reachable(eff.setup)]), np.arange(zeros, n))
    full = hierarchical.data_for(bm, data)
    validate_data(full)  # refused before: the order had N - zeros rows
    r = tm.sample(bm, full, program=program, num_samples=30, num_warmup=30, num_chains=2, seed=0, progress=False)
    assert np.all(np.isfinite(np.asarray(r.samples["b"])))


def test_a_saturated_bambi_row_keeps_its_design():
    bmb = pytest.importorskip("bambi")
    pd = pytest.importorskip("pandas")
    prev = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", True)  # (as Bambi's Bernoulli needs: see the flights benchmark)
    try:
        rng = np.random.default_rng(1)
        n = 80
        x = rng.normal(size=n)
        x[0] = 40.0  # at the fit, eta_0 = 40 beta is far past the point where float64's sigmoid rounds to 1
        g = np.repeat(["a", "b", "c", "d"], n // 4)
        y = (rng.random(n) < 1 / (1 + np.exp(-(1.5 * x)))).astype(int)
        y[0] = 1
        prior = {"x": bmb.Prior("Normal", mu=0, sigma=5)}  # (Bambi's default scales it by 1 / sd(x): tiny here)
        model, data = tm.from_bambi(bmb.Model("y ~ x + (1|g)", pd.DataFrame({"y": y, "x": x, "g": g}),
                                              family="bernoulli", priors=prior))
        bm, program, _ = hierarchical.auto_program(model, data)
        eff = program.blocks[-1]
        assert isinstance(getattr(eff, "block", eff), ge.GLMEffects)
        h0, e0 = bm.start["hyper"], bm.start["effects"]
        lik = lambda e: bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), data)  # noqa: E731
        # the row is saturated at the start: flat there (its gradient zero), so the start alone reads a constant
        assert float(jnp.abs(jax.jacfwd(lik)(e0)[0]).max()) == 0.0
        xs, gs, cs, bs = (np.asarray(bm.extra_data[k], np.float64) for k in ge.DATA_KEYS[:4])
        assert cs[0] != 0 and np.abs(xs[0]).max() > 1.0
        # the reconstruction against the model's value at a point where the row is not saturated: the effects at
        # zero and half the start (a constant read at the start would be off by log 2 at zero)
        blk = getattr(eff, "block", eff)
        F, Gp = np.asarray(blk.fixed), np.asarray(blk.group)
        for e in (jnp.zeros_like(e0), 0.5 * e0):
            en = np.asarray(e, np.float64)
            m = xs @ en[F] + cs * en[Gp][gs.astype(int)] + bs
            np.testing.assert_allclose(-np.logaddexp(0.0, -m), np.asarray(lik(e)), atol=1e-5)
        assert np.array_equal(np.sort(np.asarray(bm.extra_data["_glm_order"])), np.arange(n))
    finally:
        jax.config.update("jax_enable_x64", prev)
