"""The exact test's item sampler for large N (tallmh.factor_bounds.BulkBuilder): every item's rate dominates its weight and is the
rate the table really draws it at (item frequencies against the rates, with a wrong rate failing), no array of N
items, and the chain using it samples the exact posterior (against exact MH, a shrunk bound failing)."""

import jax
import numpy as np
import pytest
import scipy.stats as sps

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh import factor_bounds as lt  # (its large-N sampler)
from tallmh import setup_passes as setup
from tests.test_fused_table import exact_and_shrunk, rare_feature, worst_ratio

D = 3
ARGS = (np.zeros(D), np.eye(D), np.eye(D))


def weights(n, seed):
    rng = np.random.default_rng(seed)
    w = np.exp(rng.normal(0, 1.5, n)) * rng.gamma(0.5, 1.0, n)
    w[rng.random(n) < 0.1] = 0.0
    w[rng.choice(n, 20, replace=False)] *= 1e4  # (a few rows whose weights dominate)
    return w


def bulk(w, k, block=997):
    b = lt.BulkBuilder(w.size, k)
    for s in range(0, w.size, block):
        b.add(s, w[s:s + block])
    return b, b.table(*ARGS)


def rates_of(t, n):
    """Each item's rate over phi from the table's arrays: group 0's, or a heavy item's own."""
    r = np.full(n, float(np.asarray(t.rate)[0]))
    hidx, hrate = np.asarray(t.heavy_idx), np.asarray(t.heavy_rate, np.float64)
    live = hidx < n
    r[hidx[live]] = hrate[live]
    return r


def test_rates_dominate_the_weights_and_sum_to_the_total():
    n, k = 50_000, 500
    w = weights(n, 1)
    pre = lt.BulkBuilder(n, k)
    pre.add(0, w)
    tb = lt.TableBuilder(n)
    tb.add(0, w)
    assert pre.rate_total() >= tb.rate_total() >= w.sum()  # (the bulk's total rate, the grouped table's, the weights')
    b, t = bulk(w, k)
    r = rates_of(t, n)
    assert np.all(r >= w)
    assert abs(r.sum() / float(t.total) - 1) < 1e-5
    # the heavy items are the k largest weights (ties aside), tau the k-th largest
    assert b.heavy <= k and b.tau == np.sort(w)[-k]
    assert set(np.asarray(t.heavy_idx)[:b.heavy]) == set(np.nonzero(w > b.tau)[0])
    assert 1.0 <= float(np.asarray(t.total)) / (b.rate_ratio * w.sum()) <= 2 ** (1 / 8)  # (the heavy groups' rounding)
    assert b.rate_ratio == pytest.approx((n * b.tau + np.sum(np.maximum(w - b.tau, 0))) / w.sum())
    # no array of N: the table's arrays have K or MAX_GROUPS + 1 entries, whatever N
    sizes = {name: np.size(a) for name, a in t._asdict().items() if name not in ("center", "rt", "chol_cov")}
    assert max(sizes.values()) == max(k, fbm.MAX_GROUPS + 1) and sizes["order"] == sizes["heavy_idx"] == k, sizes


def test_items_are_drawn_at_their_rates():
    """Item frequencies of 2^21 draws against rate_i / total: each heavy item a bin, the light ones in 40 bins of
    consecutive items; chi-square. The drawn rate is the item's. Negative control: the same counts against the
    heavy items' excess alone (group 0's share of them forgotten) are rejected."""
    n, k, m = 20_000, 200, 1 << 21
    w = weights(n, 2)
    b, t = bulk(w, k)
    r = rates_of(t, n)
    idx, rate = jax.jit(lambda key: fbm.draw_items(key, t, m))(jax.random.PRNGKey(3))
    idx, rate = np.asarray(idx), np.asarray(rate)
    np.testing.assert_array_equal(rate, r[idx].astype(np.float32))
    hidx = np.asarray(t.heavy_idx)[:b.heavy]
    light = np.ones(n, bool)
    light[hidx] = False
    bins = np.full(n, -1)
    bins[hidx] = np.arange(hidx.size)
    lb = np.nonzero(light)[0]
    bins[lb] = hidx.size + np.arange(lb.size) * 40 // lb.size
    nb = hidx.size + 40

    def pvalue(rates):
        p = np.bincount(bins, weights=rates, minlength=nb) / rates.sum()
        obs = np.bincount(bins[idx], minlength=nb)
        return sps.chisquare(obs, p * m)[1]

    assert pvalue(r) > 1e-3
    wrong = r.copy()
    wrong[hidx] -= float(np.asarray(t.rate)[0])  # the heavy items' rate without group 0's
    assert pvalue(wrong) < 1e-6


def test_edge_cases():
    # fewer positive weights than K: tau 0, every positive item heavy, the rest drawn at a tiny rate only
    w = np.zeros(1000)
    w[[3, 500]] = [2.0, 5.0]
    b, t = bulk(w, 16)
    assert b.tau == 0.0 and b.heavy == 2
    r = rates_of(t, 1000)
    assert np.all(r >= w) and r[3] >= 2 and r[500] >= 5
    # every weight 0: never drawn
    _, t0 = bulk(np.zeros(100), 8)
    assert float(t0.total) == 0.0
    # bad weights: the grouped table's error
    with pytest.raises(tm.ConfigError, match="finite and non-negative"):
        bulk(np.array([1.0, np.nan, 2.0]), 2)
    bb = lt.BulkBuilder(10, 2)
    with pytest.raises(ValueError, match="in order"):
        bb.add(3, np.ones(2))


def test_the_builders_memory_does_not_grow_with_n():
    """2^24 items in blocks of 2^20: the builder keeps at most 2 K weights between blocks."""
    n, k = 1 << 24, 1 << 12
    b = lt.BulkBuilder(n, k)
    rng = np.random.default_rng(0)
    most = 0
    for s in range(0, n, 1 << 20):
        b.add(s, rng.exponential(size=1 << 20))
        most = max(most, b.kept)
    assert most <= 2 * k + (1 << 20) and b.kept <= 2 * k + (1 << 20)
    t = b.table(*ARGS)
    assert np.asarray(t.order).size == k and np.asarray(t.heavy_idx).size == k


def test_the_switch_and_the_shapes(monkeypatch):
    assert not lt.uses_bulk(10**7) and lt.uses_bulk(10**8)
    assert isinstance(lt.builder(1000), fbm.TableBuilder)
    s = lt.table_shapes(10**8, 4, np.float32)
    assert s.order.shape == (lt.HEAVY_MAX,) and s.heavy_idx.shape == (lt.HEAVY_MAX,) and s.count.shape == (fbm.MAX_GROUPS + 1,)
    assert lt.table_shapes(1000, 4, np.float32).heavy_idx is None  # (below the switch: the grouped table)
    monkeypatch.setattr(lt, "BULK_MIN_N", 0)
    monkeypatch.setattr(lt, "HEAVY_MAX", 64)
    assert isinstance(lt.builder(1000), lt.BulkBuilder)
    w = weights(1000, 4)
    b = lt.builder(1000)
    b.add(0, w)
    t = b.table(*ARGS, dtype=np.float32)
    got = jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), t)
    want = jax.tree_util.tree_map(lambda a: (a.shape, a.dtype), lt.table_shapes(1000, D, np.float32))
    assert got == want


def _forced(monkeypatch, k=32):
    """The bulk sampler forced on small data, K = k; returns the list of the tables made (tau, heavy items)."""
    monkeypatch.setattr(setup, "HOST_MAX_ROWS", 0)  # (the compiled passes, as for data in files at N > 2^23)
    monkeypatch.setattr(lt, "BULK_MIN_N", 0)
    monkeypatch.setattr(lt, "HEAVY_MAX", k)
    made, table = [], lt.BulkBuilder.table

    def spy(self, *a, **kw):
        t = table(self, *a, **kw)
        made.append((self.tau, self.heavy, self.rate_ratio))
        return t

    monkeypatch.setattr(lt.BulkBuilder, "table", spy)
    return made


@pytest.mark.slow
def test_chain_with_the_bulk_table_matches_exact_mh(monkeypatch):
    """The default with the bulk sampler forced on 4,000 rows (32 heavy items) against exact MH on a rare feature:
    every mean within 4 combined MCSE and sd within 4 of its MCSE; negative control: the weights shrunk 50x fail."""
    made = _forced(monkeypatch)
    exact_and_shrunk(monkeypatch, rare_feature(), "made in the set-up's last Newton pass")
    assert len(made) == 2 and made[0][0] > 0 and 0 < made[0][1] <= 32, made  # (a bulk level and heavy items)


def _worst(model, data, table, rates):
    """max over items and random pairs in the trust region of |R_i(theta') - R_i(theta)| / (rate_i phi(z, z'))."""
    return worst_ratio(model, data, table, np.asarray(table.rt, np.float64), len(rates), rates=rates)


@pytest.mark.parametrize("fused", [True, False])
def test_every_items_remainder_within_its_bulk_rate(monkeypatch, fused):
    """The bulk table made in the set-up's last Newton pass (weights in float32, whitened by the Hessian before it)
    and in a pass of its own (prepare): on heavy rows, every item's |R_i(theta') - R_i(theta)| within its rate
    times phi at the table's centre and whitening (float32 remainders against the pass's float32 weights)."""
    from tests.test_fused_table import fused_search, heavy_rows

    _forced(monkeypatch, k=16)
    data = heavy_rows()
    n = data["y"].shape[0]
    model, jd, cv, req = fused_search(monkeypatch, data)
    table = req.table(model, req.unravel, cv)[0] if fused else \
        fbm.prepare(model, jd, n, req.unravel, cv)[0]
    assert table.heavy_idx.shape == (16,) and int(np.sum(np.asarray(table.heavy_idx) < n)) > 0
    assert _worst(model, jd, table, rates_of(table, n)) <= 1.0
    # negative control: the bulk rate alone (the heavy items' excess forgotten) does not bound the heavy rows
    assert _worst(model, jd, table, np.full(n, float(np.asarray(table.rate)[0]))) > 1.0


@pytest.mark.slow
def test_chain_with_a_one_pass_centre_and_the_bulk_table_matches_exact_mh(monkeypatch):
    """The one-pass set-up (forced: the centre left at a sub-sample's mode, its region widened) with the bulk
    sampler forced (K = 32), against exact MH on a rare feature; the weights shrunk 50x fail the same check."""
    from tests.test_one_pass import small_ladder

    made = _forced(monkeypatch)
    small_ladder(monkeypatch, "always")
    exact_and_shrunk(monkeypatch, rare_feature(), "set-up in one full pass (forced)")
    assert len(made) == 2 and made[0][1] > 0, made
