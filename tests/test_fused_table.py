"""The exact test's item table made inside the set-up's last Newton pass (weights whitened by the Hessian before
that pass): every item's bound holds at the centre and whitening the table stores, the pairing of the two
matters (negative control), the set-up falls back to a separate pass where it must, and the chain still samples
the exact posterior (against exact MH, with shrunk weights as the negative control)."""

import warnings
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh import fused_table
from tallmh import setup_passes as setup
from tallmh.reporting import diagnostics


class CV(NamedTuple):
    center: jax.Array
    hess_sum: jax.Array


def heavy_rows(n=6000, seed=5):
    """Logistic data, unequal scales, 0.2% of rows with ||x|| 30x typical (items whose weights dominate)."""
    data, _ = tm.models.LogisticRegression.simulate(n, d=3, seed=seed)
    X = np.array(data["X"])
    X[:, 1] *= 3.0
    X[:: n // 12, 1:] *= 30.0
    return {"X": X.astype(np.float32), "y": data["y"]}


def fused_search(monkeypatch, data, scale_prev=1.0):
    """The mode search's compiled passes on ``data`` with the fused table requested: (model, unravel, cv, req)."""
    monkeypatch.setattr(setup, "HOST_MAX_ROWS", 0)  # (the compiled passes, as for data in files at N > 2^23)
    model = tm.models.LogisticRegression()
    jd = jax.tree_util.tree_map(jnp.asarray, data)
    flat0, unravel = ravel_pytree(model.init(jd))
    n = data["y"].shape[0]
    with fused_table.requesting(jd, model.factor_bound()) as req:
        if scale_prev != 1.0:
            saw = req.saw
            req.saw = lambda h: saw(np.asarray(h) * scale_prev)
        found = setup.mode_search(model, jd, n, unravel, flat0, tol=setup.centre_tol(flat0.shape[0]))
    assert found.hess_sum is not None
    req.unravel = unravel
    return model, jd, CV(found.center, found.hess_sum), req


def item_rates(table, n):
    """Each item's dominating rate over phi (its group's), by item index."""
    order = np.asarray(table.order)
    start, count, rate = (np.asarray(a) for a in (table.start, table.count, table.rate))
    out = np.zeros(n)
    for g in range(start.size):
        if rate[g] > 0:
            out[order[start[g]:start[g] + count[g]]] = rate[g]
    return out


def worst_ratio(model, data, table, rt, n, seed=0, pairs=40, rates=None):
    """max over items and random pairs (theta, theta') in the trust region of |R_i(theta') - R_i(theta)| /
    (rate_i phi(z, z')), with z = rt (theta - c); ``rates``: each item's rate (default: the grouped table's)."""
    bound = model.factor_bound()
    c = np.asarray(table.center, np.float64)
    cov_f = np.asarray(table.chol_cov, np.float64)
    rates = item_rates(table, n) if rates is None else rates
    rng = np.random.default_rng(seed)
    rem = jax.jit(bound.remainder)
    worst = 0.0
    for _ in range(pairs):
        a, b = (c + cov_f @ rng.normal(size=c.size) * rng.uniform(0.5, 2.5) for _ in range(2))
        z, zp = jnp.asarray(rt @ (a - c), jnp.float32), jnp.asarray(rt @ (b - c), jnp.float32)
        if not bool(bound.region(z, zp)):
            continue
        dr = np.abs(np.asarray(rem(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), table.center, data),
                               np.float64))
        phi = float(bound.phi(z, zp))
        worst = max(worst, float(np.max(dr / (rates * phi + 1e-30))))
    return worst


def test_fused_weights_bound_every_item_at_the_tables_centre_and_whitening(monkeypatch):
    data = heavy_rows()
    model, jd, cv, req = fused_search(monkeypatch, data)
    assert req.fused_passes >= 1 and req.result is not None
    c, at, neg_prev, _ = req.result
    assert np.array_equal(c, np.asarray(cv.center))  # the search stopped at the fused pass's point
    got = req.table(model, req.unravel, cv)
    assert got is not None and got[1] == 0  # (no extra items read)
    table = got[0]
    rt_final, _, _ = fbm.laplace_factors(model, req.unravel, cv)
    assert not np.allclose(np.asarray(table.rt), rt_final.astype(np.float32))  # the previous Hessian's, not the final
    n = data["y"].shape[0]
    assert worst_ratio(model, jd, table, np.asarray(table.rt, np.float64), n) <= 1.0
    # the same separate-pass table (final whitening) for comparison: both valid, about as sharp
    sep, items = fbm.prepare(model, jd, n, req.unravel, cv)
    assert items == n and 0.8 < float(table.total) / float(sep.total) < 1.25


def test_a_whitening_the_test_does_not_use_breaks_the_bound(monkeypatch):
    """Negative control: weights whitened by A with A A^T = 4 (-H) (each rho halved, each weight / 8) are valid
    with the table's own z = A^T (theta - c), and too small by 8 with z from the final Hessian's factor."""
    data = heavy_rows()
    monkeypatch.setattr(fused_table, "RATIO_MAX", 100.0)
    model, jd, cv, req = fused_search(monkeypatch, data, scale_prev=4.0)
    table, _ = req.table(model, req.unravel, cv)
    n = data["y"].shape[0]
    assert worst_ratio(model, jd, table, np.asarray(table.rt, np.float64), n) <= 1.0
    rt_final, _, _ = fbm.laplace_factors(model, req.unravel, cv)
    assert worst_ratio(model, jd, table, rt_final, n) > 2.0


def test_a_whitening_far_from_the_final_hessian_takes_a_separate_pass(monkeypatch):
    data = heavy_rows()
    model, jd, cv, req = fused_search(monkeypatch, data, scale_prev=2.0)
    assert req.result is not None and req.table(model, req.unravel, cv) is None  # (RATIO_MAX: the caller makes a pass)
    model, jd, cv, req = fused_search(monkeypatch, data)
    moved = CV(cv.center + 1e-3, cv.hess_sum)
    assert req.table(model, req.unravel, moved) is None  # another centre than the pass's


def _sample(data, **kw):
    args = dict(num_samples=4000, num_warmup=500, num_chains=4, progress=False)
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tm.TrustWarning)
        return tm.sample(tm.models.LogisticRegression(), data, **args)


def exact_and_shrunk(monkeypatch, data, note):
    """The default on ``data`` against exact MH (every mean within 4 combined MCSE, every sd within 4 of its MCSE),
    its notes holding ``note``; then the negative control, the same run with the fused weights shrunk 50x (too
    small a bound), failing that check. Returns both runs."""
    ref = _sample(data, test=tm.acceptance.Exact(), seed=1)
    got = _sample(data, seed=0)
    assert any(note in m for m in got.notes), got.notes
    assert _worst_z(got.flat_samples, ref.flat_samples) < 4.0
    monkeypatch.setattr(fused_table, "_INFLATE", 0.02)
    bad = _sample(data, seed=0)
    assert any(note in m for m in bad.notes), bad.notes
    assert _worst_z(bad.flat_samples, ref.flat_samples) > 4.0
    return got, bad


def _worst_z(a, b):
    zs = []
    for j in range(a.shape[-1]):
        x, y = a[..., j], b[..., j]
        se = np.hypot(float(diagnostics.mcse_mean(x)), float(diagnostics.mcse_mean(y)))
        zs.append(abs(x.mean() - y.mean()) / se)
        vx, vy = (x - x.mean()) ** 2, (y - y.mean()) ** 2
        se_sd = np.hypot(float(diagnostics.mcse_mean(vx)) / (2 * x.std()),
                         float(diagnostics.mcse_mean(vy)) / (2 * y.std()))
        zs.append(abs(x.std() - y.std()) / se_sd)
    return max(zs)


def rare_feature(n=4000, rows=12, seed=7):
    """Logistic data with a one-hot feature present in ``rows`` rows, all but one of them positive: its
    coefficient's posterior is far from the Laplace approximation, so the remainders decide the answer."""
    data, _ = tm.models.LogisticRegression.simulate(n, d=2, seed=seed)
    rare = np.zeros((n, 1), np.float32)
    at = np.random.default_rng(seed).choice(n, rows, replace=False)
    rare[at] = 1.0
    y = np.array(data["y"])
    y[at] = 1
    y[at[0]] = 0
    return {"X": np.concatenate([np.asarray(data["X"]), rare], axis=1).astype(np.float32), "y": y.astype(data["y"].dtype)}


@pytest.mark.slow
def test_chain_with_the_fused_table_matches_exact_mh(monkeypatch):
    """The default (exact subsampled, its table from the last Newton pass) against exact MH on a rare feature: every
    mean within 4 combined MCSE, every sd within 4 of its MCSE; negative control: the fused weights shrunk 50x
    (too small a bound) fail the same check."""
    monkeypatch.setattr(setup, "HOST_MAX_ROWS", 0)
    exact_and_shrunk(monkeypatch, rare_feature(), "made in the set-up's last Newton pass")


class _NoClaim:
    """A bound that does not say it holds for any whitening (a user's own): its table gets a pass of its own."""

    def __init__(self, bound):
        self.bound = bound

    def __getattr__(self, name):
        if name == "any_whitening":
            raise AttributeError(name)
        return getattr(self.bound, name)


class _OwnBound(tm.models.LogisticRegression):
    def factor_bound(self):
        return _NoClaim(super().factor_bound())


def test_the_default_makes_no_table_pass_where_the_bound_allows_it(monkeypatch):
    data = heavy_rows(n=4000)
    monkeypatch.setattr(setup, "HOST_MAX_ROWS", 0)
    kw = dict(num_samples=200, num_warmup=100, num_chains=2, seed=0, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fused = tm.sample(tm.models.LogisticRegression(), data, **kw)
        own = tm.sample(_OwnBound(), data, **kw)
    assert any("made in the set-up's last Newton pass" in m for m in fused.notes), fused.notes
    assert any("made in one pass of N = 4,000 items" in m for m in own.notes), own.notes
    assert fused.setup_items == own.setup_items - 4000  # the same Newton passes, one table pass fewer
    assert np.mean(fused.stats["n_data"]) < 20
