"""The Poisson/Gaussian recognition by forward derivatives (tallmh.glm_rows.second_order_rows, O(p) a row) gives what
the former per-row gradient and Hessian-vector reading (O(p + G) a row, kept below as the reference) gave."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import glm_effects as ge
from tallmh import hierarchical
from tallmh.glm_rows import second_order_rows, tangents
from tallmh.storage.data import take

pm = pytest.importorskip("pymc")


def _reference_rows(ell, e0, w, rows, fj, gj):
    """The former reading: per-row gradients and Hessian-vector products over all effects (O(p + G) a row)."""

    def per_row(row):
        val, g = jax.value_and_grad(ell)(e0, row)
        hvp = lambda v: jax.jvp(lambda x: jax.grad(ell)(x, row), (e0,), (v,))[1]  # noqa: E731
        h = hvp(w)
        nh, ng = jnp.linalg.norm(h), jnp.linalg.norm(g)
        u = jnp.where(nh > 0, h / jnp.where(nh > 0, nh, 1.0), jnp.where(ng > 0, g / jnp.where(ng > 0, ng, 1.0), 0.0))
        hu = hvp(u)
        f = lambda s: ell(e0 + s * u, row)  # noqa: E731
        d3 = jax.grad(jax.grad(jax.grad(f)))(jnp.zeros((), e0.dtype))
        return val, g, hu, hu @ u, d3, g @ u

    val, g, h, d2, d3, d1 = jax.vmap(per_row)(rows)
    live = d2 < 0
    sd2 = jnp.where(live, d2, -1.0)
    gauss = jnp.all(~live | (jnp.abs(d3) <= 1e-3 * (-sd2) ** 1.5))
    tp = jnp.where(live, d3 / sd2, 1.0)
    mu = -sd2 / (tp * tp)
    t = jnp.where(gauss, jnp.sqrt(-sd2), tp)
    scale = jnp.where(gauss, 1.0, mu) * t
    a = jnp.where(live[:, None], -h / scale[:, None], 0.0)
    m0 = a @ e0
    eta = jnp.where(live, jnp.where(gauss, m0, jnp.log(mu)), 0.0)
    y = jnp.where(live, jnp.where(gauss, m0, mu) + d1 / t, jnp.where(gauss, 0.0, 1.0))
    b = jnp.where(gauss, 0.0, eta - m0)
    fval = jnp.where(gauss, -0.5 * (y - eta) ** 2, y * eta - jnp.exp(eta))
    ag = a[:, gj]
    gi = jnp.argmax(jnp.abs(ag), axis=1).astype(jnp.int32)
    ci = jnp.take_along_axis(ag, gi[:, None], axis=1)[:, 0]
    ok = jnp.all((jnp.sum(ag != 0, axis=1) <= 1) & jnp.all(jnp.isfinite(a), axis=1) & jnp.isfinite(b)
                 & jnp.isfinite(y) & jnp.isfinite(val - fval) & (live | (jnp.abs(d1) == 0)))
    return jnp.where(gauss, 2, 1), a[:, fj], gi, ci, b, y, val - fval, ok


def _model(family, seed=2, groups=7):
    rng = np.random.default_rng(seed)
    n_j = rng.integers(3, 12, groups)
    g = np.repeat(np.arange(groups), n_j)
    x = rng.normal(size=(g.size, 2))
    eta = 0.3 + x @ np.array([0.6, -0.4]) + rng.normal(0, 0.5, groups)[g]
    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        xd = pm.Data("x", x)
        mu = pm.Normal("mu", 0, 2)
        b = pm.Normal("b", 0, 2, shape=2)
        s = pm.HalfNormal("s", 1)
        u = pm.Normal("u", 0, s, shape=groups)
        e = mu + xd @ b + u[gi]
        if family == "poisson":
            pm.Poisson("y", pm.math.exp(e), observed=rng.poisson(np.exp(eta)))
        else:
            pm.Normal("y", e, 0.7, observed=eta + 0.7 * rng.normal(size=g.size))
    return tm.from_pymc(m)


_BUILT = {}


def _built(family):
    """``(BlockedModel, data)`` of :func:`_model`, made once per family."""
    if family not in _BUILT:
        model, data = _model(family)
        _BUILT[family] = (hierarchical.auto_program(model, data)[0], data)
    return _BUILT[family]


@pytest.mark.parametrize("family,kind", [("poisson", 1), ("gaussian", 2)])
def test_forward_reading_equals_the_former_one(family, kind):
    bm, data = _built(family)
    data = jax.tree_util.tree_map(jnp.asarray, data)
    n = int(jax.tree_util.tree_leaves(data)[0].shape[0])
    pos = ge._positions(bm)
    gkey = max(pos, key=lambda k: pos[k].size)
    group, fixed = pos[gkey], np.sort(np.concatenate([pos[k] for k in pos if k != gkey]))
    rng = np.random.default_rng(5)
    e0 = bm.start["effects"] + jnp.asarray(0.3 * rng.standard_normal(bm.start["effects"].shape), bm.start["effects"].dtype)
    d = int(e0.shape[0])
    w = jnp.asarray(np.random.default_rng(4).standard_normal(d), e0.dtype)
    fj, gj = jnp.asarray(fixed), jnp.asarray(group)
    h0 = bm.start["hyper"]
    flat = take(data, jnp.arange(n))

    def ell(e, row):
        return bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), row)[0]

    ref = _reference_rows(ell, e0, w, jax.tree_util.tree_map(lambda a: a[:, None], flat), fj, gj)
    new = second_order_rows(lambda e: bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), flat), e0,
                            tangents(fixed, group, d, e0.dtype), w, int(fixed.size), fj, gj)
    assert int(new[0]) == int(ref[0]) == kind and bool(new[7]) and bool(ref[7])
    assert np.array_equal(np.asarray(new[2]), np.asarray(ref[2]))  # the group index
    assert np.array_equal(np.asarray(new[2]), np.asarray(data["g_idx"]))
    for i in (1, 3, 4, 5, 6):  # x, coefficient, offset, y, the rows' constants
        a, b = np.asarray(new[i], np.float64), np.asarray(ref[i], np.float64)
        assert np.allclose(a, b, rtol=2e-4, atol=2e-4 * max(1.0, np.abs(b).max())), i
    # and the view read this way is the one recognise() keeps (checked against the model on every row)
    view = ge.recognise(bm, data, n)
    assert view is not None and view.family == family


def test_two_group_entries_are_refused():
    """A row reading two group effects (u[g] + u[g2]) is not of the form: not ok."""
    bm, _ = _built("poisson")
    pos = ge._positions(bm)
    gkey = max(pos, key=lambda k: pos[k].size)
    group, fixed = pos[gkey], np.sort(np.concatenate([pos[k] for k in pos if k != gkey]))
    e0 = bm.start["effects"]
    d = int(e0.shape[0])
    gj = jnp.asarray(group)
    gidx = jnp.asarray(np.arange(20) % group.size)

    def lik(e):  # Poisson rows with margin u[g] + u[g + 1]
        m = e[gj][gidx] + e[gj][(gidx + 1) % group.size]
        return 2.0 * m - jnp.exp(m)

    out = second_order_rows(lik, e0, tangents(fixed, group, d, e0.dtype),
                            jnp.asarray(np.random.default_rng(4).standard_normal(d), e0.dtype), int(fixed.size),
                            jnp.asarray(fixed), gj)
    assert not bool(out[7])
