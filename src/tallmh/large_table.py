"""The exact test's item sampler for large N: no array of N items and no sort of N, made in the pass that computes
the weights.

The exact subsampled test (:class:`tallmh.acceptance.PoissonThinning`; Cornish, Vanetti, Bouchard-Cote,
Deligiannidis & Doucet, *Scalable Metropolis-Hastings for exact Bayesian inference with large datasets*, ICML 2019,
"SMH", Sec. 3.2 and Alg. 2) superposes one Poisson process per item, of rate ``phi r_i`` with ``r_i >= w_i`` (the
item's remainder-bound weight), and thins each point on item ``i`` with probability ``max(0, -dR_i) / (phi r_i)``.
Any rates ``r_i >= w_i`` give the same law of the test's decision, provided the thinning divides by the rate the
item really gets. :func:`tallmh.factor_bounds.build_table` groups all N items by weight (an int32 order of N and a
counting sort: 4 GB and tens of seconds at N = 10^9). Here instead, with a level ``tau``:

- **group 0, the bulk**: every item at the same rate ``r_0 >= tau`` (an item drawn uniformly among all N: its
  position is the item, no array);
- **the heavy items**, the at most ``K`` items with ``w_i > tau``: their excess ``w_i - tau`` drawn by the grouped
  table of :func:`tallmh.factor_bounds.build_table` over that short list (groups 1, 2, ...), at rates ``r_g >=
  w_i - tau``.

Item ``i``'s rate is ``r_i = r_0`` (light: ``w_i <= tau <= r_0``) or ``r_0 + r_g(i) >= w_i`` (heavy), known exactly
from the table: a drawn item's rate is group 0's, plus its group's where it is one of the heavy items (a search of
the K sorted heavy items, O(log K) per draw, as the group's search is O(log G)). No weight is recomputed in the
chain: the heavy items and ``tau`` come from the pass's own weights, so the rates dominate exactly the weights the
grouped table would use. ``tau`` is the K-th largest weight (a streaming top-K over the pass's blocks), the
smallest level for which the heavy list holds at most K items, which minimises the total rate
``N tau + sum_{w_i > tau} (w_i - tau)`` (its derivative in ``tau`` is ``N - #{w_i > tau} > 0``). The price is
the bulk's extra points: the total rate is ``N tau + ...`` instead of ``sum_i w_i`` (``rate_ratio``), each extra
point one row read and rejected by the thinning, at N >= 10^8 a small fraction of a row per step.

Used where ``N >= BULK_MIN_N`` (:func:`uses_bulk`, decided by N alone so the chain can compile from the table's
shapes before the set-up makes it); below it the grouped table of every item, and its draws, are unchanged.
"""

from __future__ import annotations

import numpy as np

from . import factor_bounds as fbm

__all__ = ["BULK_MIN_N", "HEAVY_MAX", "uses_bulk", "heavy_count", "BulkBuilder", "builder", "table_shapes"]

# N from which the set-up makes the bulk sampler: there the grouped table's counting sort costs seconds (3-8 s at
# 10^8) and 6 bytes per item, while the bulk's extra points are read in a small fraction of a step
BULK_MIN_N = 1 << 25
HEAVY_MAX = 1 << 20  # heavy items kept at most: 12 bytes each in the chain's table, 16 while the pass keeps them
_PAD = np.iinfo(np.int32).max  # heavy_idx's padding: above every item


def uses_bulk(n: int) -> bool:
    """Whether the exact test's table for N items is the bulk sampler (this module) rather than the grouped
    table of every item."""
    return int(n) >= BULK_MIN_N


def heavy_count(n: int) -> int:
    """K, the heavy items' slots in the bulk table of N items (fixed by N: part of the table's shapes)."""
    return max(1, min(int(HEAVY_MAX), int(n)))


def builder(n: int):
    """The table's builder for N items (``add(start, w_block)`` in order, then ``table(...)``): a
    :class:`BulkBuilder` where :func:`uses_bulk`, else :class:`tallmh.factor_bounds.TableBuilder`."""
    return BulkBuilder(n) if uses_bulk(n) else fbm.TableBuilder(n)


def table_shapes(n: int, d: int, dtype):
    """The shapes and dtypes of the table :func:`builder` makes for N items and d parameters."""
    import jax

    base = fbm.table_shapes(n, d, dtype)
    if not uses_bulk(n):
        return base
    k, g = heavy_count(n), fbm.MAX_GROUPS + 1
    i32 = lambda *s: jax.ShapeDtypeStruct(s, np.int32)  # noqa: E731
    return base._replace(order=i32(k), start=i32(g), count=i32(g), cum=i32(g),
                         rate=jax.ShapeDtypeStruct((g,), np.dtype(dtype)), heavy_idx=i32(k),
                         heavy_rate=jax.ShapeDtypeStruct((k,), np.dtype(dtype)))


class BulkBuilder:
    """The bulk sampler's builder: ``add(start, w)`` for consecutive blocks of weights, then ``table(...)``.

    Keeps the largest weights seen (at most ``2 K`` with their items, compacted to those above the ``K``-th
    largest when full), the level ``thr`` at or below which a weight is dropped (the ``K``-th largest at the last
    compaction: every dropped weight is at most ``thr``), and the weights' sum. Memory of order ``K``, never of N; per block a comparison with
    ``thr``."""

    def __init__(self, n: int, k: int = None):
        self.n = int(n)
        self.k = heavy_count(n) if k is None else int(k)
        self.thr = 0.0
        self.w, self.i = [np.empty(0)], [np.empty(0, np.int64)]
        self.kept = 0
        self.filled = 0
        self.wsum = 0.0

    def add(self, start: int, w) -> None:
        if start != self.filled:
            raise ValueError(f"BulkBuilder.add: blocks must come in order (expected row {self.filled}, got {start})")
        w = np.asarray(w, np.float64).reshape(-1)
        total = float(np.sum(w))
        if not np.isfinite(total) or np.any(w < 0):
            fbm._group_keys(w)  # (raises the grouped table's error, naming how many)
        sel = np.flatnonzero(w > self.thr)
        self.w.append(w[sel])
        self.i.append(sel + start)
        self.kept += sel.size
        self.filled += w.size
        self.wsum += total
        if self.kept > 2 * self.k:
            self._compact()

    def _compact(self) -> None:
        """Keep the weights above the K-th largest (and their items, still in ascending order), which becomes
        ``thr``: every weight dropped, now or before, is at most ``thr``."""
        w, i = np.concatenate(self.w), np.concatenate(self.i)
        if w.size > self.k:
            self.thr = max(self.thr, float(np.partition(w, w.size - self.k)[w.size - self.k]))
            keep = w > self.thr
            w, i = w[keep], i[keep]
        self.w, self.i, self.kept = [w], [i], w.size

    def table(self, center, rt, chol_cov, dtype=np.float32) -> fbm.FactorTable:
        """The bulk table (module docstring): group 0 every item at rate ``>= tau``, groups 1.. the heavy items'
        excess over ``tau`` (:func:`tallmh.factor_bounds.build_table`'s grouping of that list)."""
        if self.filled != self.n:
            raise ValueError(f"BulkBuilder.table: {self.filled} of {self.n} items added")
        self._compact()
        tau = self.thr
        w, i = self.w[0], self.i[0]
        heavy = w > tau  # (the items, ascending: blocks come in order and every compaction keeps the order)
        w, i = w[heavy], i[heavy]
        self.tau, self.heavy = tau, i.size
        self.rate_ratio = (self.n * tau + float(np.sum(w - tau))) / self.wsum if self.wsum > 0 else 1.0
        self.w = self.i = None
        return _bulk_table(self.n, self.k, tau, i, w - tau, center, rt, chol_cov, np.dtype(dtype))


def _bulk_table(n, k, tau, idx, excess, center, rt, chol_cov, dt) -> fbm.FactorTable:
    """The bulk table of N items (``idx``: the heavy items, ascending, with their excess weights over ``tau``)."""
    import jax

    h = idx.size
    g0 = fbm.MAX_GROUPS + 1
    if tau <= 0 and h == 0:  # no remainder anywhere: every rate 0, never drawn (total 0)
        f, i32 = (lambda a: jax.device_put(np.asarray(a, dt))), (lambda a: jax.device_put(np.asarray(a, np.int32)))
        return fbm.FactorTable(f(center), f(rt), f(chol_cov), i32(np.zeros(k)), i32(np.zeros(g0)), i32(np.ones(g0)),
                               i32(np.ones(g0)), f(np.ones(g0)), f(0.0), i32(np.full(k, _PAD)), f(np.zeros(k)))
    pos, starts, counts, b = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    if h:
        tb = fbm.TableBuilder(h)
        tb.add(0, excess)
        pos, starts, counts, b = tb.groups()  # (positions in idx, grouped; at most MAX_GROUPS groups)
    starts = np.concatenate([[0], starts]).astype(np.int64)
    counts = np.concatenate([[n], counts]).astype(np.int64)
    b = np.concatenate([[tau], b])
    order = np.full(k, 0, np.int32)
    order[:h] = idx[pos[:h]]
    t = fbm._finish_table(order, starts, counts, b, center, rt, chol_cov, dt, groups=g0)
    rate = np.asarray(t.rate, np.float64)
    gpos = np.repeat(np.arange(1, starts.size), counts[1:])  # each grouped position's group
    hrate = np.zeros(k, np.float64)
    hrate[pos[:h]] = rate[0] + rate[gpos]  # (by position in idx: ascending items)
    hrate32 = np.nextafter(hrate.astype(dt), np.inf).astype(dt)  # (rounded up, as the groups' rates are)
    hidx = np.full(k, _PAD, np.int32)
    hidx[:h] = idx
    return t._replace(heavy_idx=jax.device_put(hidx), heavy_rate=jax.device_put(hrate32))
