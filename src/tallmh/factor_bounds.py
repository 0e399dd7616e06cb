"""Per-item bounds on the Taylor remainders, and the table that draws items by their bound's weight.

The exact subsampled test (:class:`tallmh.acceptance.PoissonThinning`; Cornish, Vanetti, Bouchard-Cote,
Deligiannidis & Doucet, *Scalable Metropolis-Hastings for exact Bayesian inference with large datasets*,
ICML 2019, "SMH") needs, for the remainder ``R_i(theta) = ell_i(theta) - ell_i(c) - g_i . a - (1/2) a^T H_i a``
(``a = theta - c``, second-order Taylor control variates at the centre ``c``), a bound of product form

    |R_i(theta') - R_i(theta)| <= w_i phi(theta, theta')           (SMH, eq. 8 and Sec. 3.2)

with item weights ``w_i >= 0`` computed once (a set-up pass) and a data-free ``phi`` symmetric in
``theta, theta'``. A model states it through one method, ``factor_bound()``, which returns an object with

``weights(center, Rinv, batch) -> (b,)``
    the ``w_i`` of a batch of rows (``Rinv`` the inverse of the lower Cholesky factor ``R`` of the Laplace
    precision ``H = R R^T`` at the centre);
``phi(z, z') -> scalar``
    the data-free factor, in whitened coordinates ``z = R^T (theta - c)``;
``region(z, z') -> bool``
    where the bound holds (a trust region; ``True`` for a global bound); outside it the test takes the
    full exact decision. Symmetric in ``z, z'``;
``remainder(theta, theta', center, batch) -> (b,)``
    the per-item ``R_i(theta') - R_i(theta)`` computed without cancellation;
``any_whitening`` (optional, default False)
    True where the bound holds with ``Rinv`` the inverse of any invertible ``A`` and ``z = A^T (theta - c)`` (the
    built-in bounds: their argument is Cauchy-Schwarz, ``|x . a| <= ||A^-1 x|| ||A^T a||``): the set-up may then
    make the weights in its last Newton pass, whitened by the Hessian before it (:mod:`tallmh.fused_table`).

Whitening: ``x . a = (R^-1 x) . (R^T a)``, so a GLM item whose log-likelihood is ``f(s_i x_i . theta)``
with ``|f'''| <= M`` has ``delta_i = s_i x_i . a = rho_i <e_i, z>`` with ``rho_i = ||R^-1 x_i||`` and a unit
vector ``e_i``; and, from ``|R_i'(t)| <= M t^2 / 2`` along the item's margin,

    |R_i(theta') - R_i(theta)| <= (M / 6) |delta_i'^3 - delta_i^3| <= rho_i^3 (M / 6) S(z, z'),
    S(z, z') = sup_{||e|| = 1} |<e, z'>^3 - <e, z>^3|

(the supremum is over the plane of ``z, z'``). :func:`cubic_sup` bounds ``S`` from above to within about 1%.

:func:`build_table` makes, from the ``w_i``, a grouped sampler (items with weights within a factor
``2^(1/8)`` share a group; a group is drawn by an integer threshold table, an item uniformly within it):
O(log G) work per draw for G groups, none of it O(N). The rate each item gets from the table is known
exactly, so the thinning divides by that rate, not by ``w_i``.

**From** :data:`BULK_MIN_N` **items** that table's int32 order of N and counting sort (4 GB and tens of seconds at
N = 10^9) give way to :class:`BulkBuilder`'s sampler, with no array of N and no sort. Any rates ``r_i >= w_i`` give
the test's decision the same law, provided the thinning divides each point by the rate its item really gets
(SMH, Sec. 3.2 and Alg. 2). With a level ``tau``: **group 0, the bulk**, gives every item the same rate ``r_0 >=
tau`` (a point on it is an item drawn uniformly among all N: its position is the item, nothing stored); **the
heavy items**, the at most ``K`` with ``w_i > tau``, get in addition the rate of their excess ``w_i - tau`` from the
grouped table above made over that short list (groups 1, 2, ...). Item ``i``'s rate is ``r_0`` (light: ``w_i <=
tau <= r_0``) or ``r_0 + r_g(i) >= w_i`` (heavy), known exactly: a drawn item's rate is group 0's, plus its
group's where it is in the heavy list (a search of the K sorted heavy items, O(log K) per draw). No weight is
recomputed in the chain: ``tau`` and the heavy list come from the pass's own weights. ``tau`` is the K-th largest
weight (a streaming top-K over the pass's blocks), the smallest level with at most K heavy items, which minimises
the total rate ``N tau + sum_{w_i > tau} (w_i - tau)`` (its derivative in ``tau`` is ``N - #{w_i > tau} > 0``). The
price is the bulk's extra points, each a row read and rejected by the thinning: the total rate over ``sum_i w_i``
(``rate_ratio``) was 3.4 at N = 10^8 and 5.0 at 10^9 with K = 2^20 (a small fraction of a row per step there).
The switch (:func:`uses_bulk`) depends on N alone, so that the chain can compile from the table's shapes
(:func:`table_shapes`) before the set-up makes it; below it the grouped table and its draws are unchanged.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ConfigError
from .storage import datasource as ds
from .storage.memory import available_memory

__all__ = ["FactorTable", "FactorView", "ZeroRemainder", "PoissonTrustBound", "cubic_sup", "build_table", "draw_items",
           "items_of_bits", "TableBuilder", "BulkBuilder", "builder", "uses_bulk", "table_shapes", "prepare",
           "FACTOR_KEY", "SAFETY", "BULK_MIN_N", "HEAVY_MAX"]

FACTOR_KEY = "factor_table"  # where the table lies in the step's statistics (``stats``)

SAFETY = 1.0 + 1e-3  # on phi: covers the float rounding of z, z' and of the supremum's grid
_GROUP_RATIO = 2.0 ** (1.0 / 8.0)
_DRAW_TOTAL = 2**30
# groups at most: weights more than 2^64 below the largest share the lowest group (its rate still dominates
# them), so the table's shapes depend on N and d only and the chain can compile before the set-up makes it
MAX_GROUPS = 8 * 64 + 1


class FactorTable(NamedTuple):
    """The set-up pass's result, handed to every step (in ``stats[FACTOR_KEY]``)."""

    center: jax.Array  # (d,) the Taylor centre c
    rt: jax.Array  # (d, d) R^T: z = R^T (theta - c)
    chol_cov: jax.Array  # (d, d) R^-T: the Laplace covariance H^-1 = R^-T R^-1 (for proposals)
    order: jax.Array  # (N',) int32: the items with w_i > 0, grouped
    start: jax.Array  # (G,) int32: each group's first position in ``order``
    count: jax.Array  # (G,) int32: group sizes
    cum: jax.Array  # (G,) int32: upper ends of the groups' integer draw ranges (total cum[-1])
    rate: jax.Array  # (G,) float: per-item rate of group g divided by phi (>= every w_i of the group)
    total: jax.Array  # float: Lambda / phi (the sum of the per-item rates divided by phi)
    # the large-N table (:class:`BulkBuilder`): group 0 is every item (drawn uniformly over N, no array of
    # N), the other groups the heavy items' excess; None in the grouped table of every item
    heavy_idx: Any = None  # (K,) int32: the heavy items, ascending (padded with 2^31 - 1)
    heavy_rate: Any = None  # (K,) float: each heavy item's whole rate divided by phi (group 0's and its group's)


class FactorView(NamedTuple):
    """What the test sees at one step (built by :func:`tallmh.kernel.make_problem`)."""

    phi: jax.Array  # data-free factor at (theta, theta'), symmetric
    region: jax.Array  # bool: the bound holds (symmetric)
    table: FactorTable
    remainder: Callable  # idx -> R_i(theta') - R_i(theta)


def cubic_sup(z, zp):
    """An upper bound on ``S(z, z') = sup_{||e||=1} |<e, z'>^3 - <e, z>^3|``, within about 1% of it.

    In the plane of ``z, z'`` write ``w, w'`` for their complex coordinates; ``<e, z>^3`` at angle ``psi`` is
    ``Re(|w|^2 w e^{-i psi}) 3/4 + Re(w^3 e^{-3 i psi}) / 4``, so the difference is
    ``g(psi) = Re(P1 e^{-i psi}) + Re(P3 e^{-3 i psi})`` with ``P1 = 3/4 (|w'|^2 w' - |w|^2 w)`` and
    ``P3 = (w'^3 - w^3) / 4``. Its maximum is at most ``|P1| + |P3|``, and at most the largest ``|g|`` on a grid
    of 32 angles in ``[0, pi)`` (``|g(psi + pi)| = |g(psi)|``) plus ``(|P1| + 9 |P3|) h^2 / 8`` (``h = pi / 32``;
    ``|g''| <= |P1| + 9 |P3|``). The smaller of the two is returned. Symmetric in ``z, z'`` up to rounding.
    """
    nz = jnp.linalg.norm(z)
    nzp = jnp.linalg.norm(zp)
    # basis of the plane: e1 along the longer of the two (the shorter's components are then well formed)
    swap = nzp > nz
    a, b = jnp.where(swap, zp, z), jnp.where(swap, z, zp)
    na = jnp.maximum(jnp.linalg.norm(a), jnp.finfo(a.dtype).tiny)
    e1 = a / na
    b1 = b @ e1
    b2 = jnp.linalg.norm(b - b1 * e1)
    # w = na (real), w' = b1 + i b2 (swapping z and z' flips the sign of g: |g| unchanged)
    wr, wi = jnp.linalg.norm(a), jnp.zeros_like(na)
    vr, vi = b1, b2
    n2w, n2v = wr * wr, vr * vr + vi * vi
    p1r, p1i = 0.75 * (n2v * vr - n2w * wr), 0.75 * (n2v * vi - n2w * wi)
    # cubes: (x + i y)^3 = x^3 - 3 x y^2 + i (3 x^2 y - y^3)
    p3r = 0.25 * ((vr**3 - 3 * vr * vi**2) - (wr**3 - 3 * wr * wi**2))
    p3i = 0.25 * ((3 * vr**2 * vi - vi**3) - (3 * wr**2 * wi - wi**3))
    m1, m3 = jnp.hypot(p1r, p1i), jnp.hypot(p3r, p3i)
    k = 32
    h = math.pi / k
    psi = jnp.arange(k, dtype=z.dtype) * h
    g = p1r * jnp.cos(psi) + p1i * jnp.sin(psi) + p3r * jnp.cos(3 * psi) + p3i * jnp.sin(3 * psi)
    grid = jnp.max(jnp.abs(g)) + (m1 + 9.0 * m3) * (h * h / 8.0)
    return jnp.minimum(m1 + m3, grid)


class ZeroRemainder:
    """A likelihood whose second-order Taylor expansion is exact (Gaussian with known variance): every
    ``w_i = 0``; the test then reads no item and is plain MH on the (exact) quadratic."""

    any_whitening = True  # valid for weights and z whitened by any invertible A (tallmh.fused_table)

    def weights(self, center, rinv, batch):
        return jnp.zeros(jax.tree_util.tree_leaves(batch)[0].shape[:1], center.dtype)

    def weights_host(self, center, rinv, batch):
        return np.zeros(np.shape(jax.tree_util.tree_leaves(batch)[0])[:1])

    def phi(self, z, zp):
        return jnp.zeros((), z.dtype)

    def region(self, z, zp):
        return jnp.bool_(True)

    def remainder(self, theta, theta_p, center, batch):
        return jnp.zeros(jax.tree_util.tree_leaves(batch)[0].shape[:1], theta.dtype)


class PoissonTrustBound:
    """Poisson regression with log link, ``ell_i = y_i eta_i - exp(eta_i)`` (``-log y_i!`` cancels), whose third
    derivative ``-exp(eta)`` is unbounded: bounded on the trust region ``||z||, ||z'|| <= radius``, where
    ``|delta_i| <= rho_i radius`` and so ``|f'''| <= exp(eta_i(c) + rho_i radius)``:
    ``w_i = rho_i^3 exp(eta_i(c) + rho_i radius)``, ``phi = S(z, z') / 6``. Outside the region the test
    takes the full exact decision (symmetric: the region is a condition on both points).

    ``offset``: the batch key of a log-exposure offset, if any.
    """

    any_whitening = True  # valid for weights and z whitened by any invertible A (tallmh.fused_table)

    def __init__(self, radius: float = 6.0, offset=None):
        if not radius > 0:
            raise ConfigError(f"the trust region's radius must be positive; got {radius}")
        self.radius = float(radius)
        self.offset = offset

    def _eta_c(self, center, batch, xp):
        eta = batch["X"] @ center
        if self.offset is not None:
            eta = eta + batch[self.offset]
        return eta

    def weights(self, center, rinv, batch):
        v = batch["X"] @ rinv.T
        rho = jnp.sqrt(jnp.sum(v * v, axis=-1))
        return rho**3 * jnp.exp(self._eta_c(center, batch, jnp) + rho * self.radius)

    def weights_host(self, center, rinv, batch):
        X = np.asarray(batch["X"], np.float64)
        v = X @ rinv.T
        rho = np.sqrt(np.einsum("ij,ij->i", v, v))
        eta = X @ np.asarray(center, np.float64)
        if self.offset is not None:
            eta = eta + np.asarray(batch[self.offset], np.float64)
        with np.errstate(over="ignore"):
            return rho**3 * np.exp(eta + rho * self.radius)

    def phi(self, z, zp):
        return (SAFETY / 6.0) * cubic_sup(z, zp)

    def region(self, z, zp):
        return jnp.maximum(jnp.linalg.norm(z), jnp.linalg.norm(zp)) <= self.radius

    def remainder(self, theta, theta_p, center, batch):
        md = batch["X"] @ jnp.stack([center, theta - center, theta_p - center], axis=-1)
        eta, d, dp = md[..., 0], md[..., 1], md[..., 2]
        if self.offset is not None:
            eta = eta + batch[self.offset]
        mu = jnp.exp(eta)
        # R(t) = -(exp(eta + t) - exp(eta) - exp(eta) t - exp(eta) t^2/2) = -mu (expm1(t) - t - t^2/2)
        # (the y t terms cancel); R(d') - R(d), with the small-|t| series to avoid cancellation
        return -mu * (exp3(dp) - exp3(d))


def exp3(t):
    """``expm1(t) - t - t^2/2`` without cancellation for small ``|t|`` (series to t^9 below 1/2)."""
    small = jnp.abs(t) <= 0.5
    ts = jnp.where(small, t, 0.0)
    series = ts**3 / 6.0 * (1 + ts / 4 * (1 + ts / 5 * (1 + ts / 6 * (1 + ts / 7 * (1 + ts / 8 * (1 + ts / 9))))))
    tf = jnp.where(small, 1.0, t)
    return jnp.where(small, series, jnp.expm1(tf) - tf - 0.5 * tf * tf)


# --- the set-up pass ------------------------------------------------------------------------------------

_KEY_MIN, _KEY_ZERO = -8600, 8200  # floor(8 log2 w) of a positive finite float64 lies in [-8592, 8191]
_KEY_SPAN = _KEY_ZERO - _KEY_MIN + 1


def _group_keys(w):
    """``(floor(8 log2 w_i)`` (``_KEY_ZERO`` for ``w_i = 0``) minus ``_KEY_MIN``, int16; the weights as float64)
    of a block of weights, checked finite and non-negative."""
    w = np.asarray(w, np.float64)
    if not np.isfinite(np.sum(w)) or np.any(w < 0):  # (a sum is finite iff every term is, for w >= 0)
        bad = int(np.sum(~np.isfinite(w) | (w < 0)))
        raise ConfigError(f"the remainder bound's item weights must be finite and non-negative; {bad} are not "
                          "(the trust region's weights overflow: use a smaller radius)")
    with np.errstate(divide="ignore"):
        key = np.floor(np.log2(w) / np.log2(_GROUP_RATIO))  # (-inf for w = 0)
    key = np.where(w > 0, key, _KEY_ZERO) - _KEY_MIN
    return key.astype(np.int16), w


class TableBuilder:
    """:func:`build_table` in blocks of rows, in memory of order 6 bytes per item (an int16 group key, then the
    int32 order), never N weights nor a sort of N: ``add(start, w_block)`` for consecutive blocks, then
    ``table(...)``. Per block it keeps the items' keys, the count and the largest weight of each key; the
    table's grouping is then a counting sort over the at most :data:`MAX_GROUPS` groups (each block's items
    placed stably at their group's running offset), so items lie in ascending index within a group and the
    table is the same, array for array, as from the whole weight vector."""

    def __init__(self, n: int):
        self.n = int(n)
        self.keys = np.empty(self.n, np.int16)
        self.count = np.zeros(_KEY_SPAN, np.int64)
        self.maxw = np.zeros(_KEY_SPAN, np.float64)
        self.filled = 0

    def add(self, start: int, w) -> None:
        if start != self.filled:
            raise ValueError(f"TableBuilder.add: blocks must come in order (expected row {self.filled}, got {start})")
        key, w = _group_keys(w)
        self.keys[start:start + key.size] = key
        self.count += np.bincount(key, minlength=_KEY_SPAN)
        np.maximum.at(self.maxw, key, w)  # (the zero weights' entry stays 0)
        self.filled += key.size

    def rate_total(self) -> float:
        """``Lambda / phi`` of the weights added so far, to within the grouping (each key's count times its largest
        weight)."""
        return float(np.sum(self.count[:-1] * self.maxw[:-1]))

    def table(self, center, rt, chol_cov, dtype=np.float32, block: int = 1 << 20) -> FactorTable:
        dt = np.dtype(dtype)
        grouped = self.groups(block)
        if grouped is None:  # no remainder anywhere: dummy groups, never drawn (total 0)
            G0 = MAX_GROUPS
            return FactorTable(*(jnp.asarray(a, dt) for a in (center, rt, chol_cov)),
                               jnp.zeros(self.n, jnp.int32), jnp.zeros(G0, jnp.int32), jnp.ones(G0, jnp.int32),
                               jnp.ones(G0, jnp.int32), jnp.ones(G0, dt), jnp.zeros((), dt))
        return _finish_table(*grouped, center, rt, chol_cov, dt)

    def groups(self, block: int = 1 << 20):
        """``(order, starts, counts, largest weights)`` of the groups (None where every weight is 0): the items
        with ``w_i > 0`` grouped, in ascending index within a group, then those of weight 0."""
        if self.filled != self.n:
            raise ValueError(f"TableBuilder.table: {self.filled} of {self.n} items added")
        present = np.nonzero(self.count[:-1])[0]  # (keys less _KEY_MIN; the last is the zero weights')
        if present.size == 0:
            return None
        # keys more than MAX_GROUPS - 1 below the largest share the lowest group
        low = max(int(present[0]), int(present[-1]) - (MAX_GROUPS - 1))
        merged = present[present <= low]
        groups = np.concatenate([[low], present[present > low]])
        counts = np.concatenate([[self.count[merged].sum()], self.count[groups[1:]]])
        b = np.concatenate([[self.maxw[merged].max()], self.maxw[groups[1:]]])
        G = groups.size
        gid = np.full(_KEY_SPAN, G, np.int16)  # key -> group (G: the zero weights, placed after the drawn items)
        gid[:low + 1] = 0
        gid[groups[1:]] = np.arange(1, G, dtype=np.int16)
        gid[-1] = G
        n_zero = self.n - int(counts.sum())
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        offset = np.concatenate([starts, [self.n - n_zero]]).astype(np.int64)
        order = _aligned_int32(self.n)
        for s in range(0, self.n, block):  # the counting sort, stable: blocks in order, rows stably within one
            g = gid[self.keys[s:s + block]]
            o = np.argsort(g, kind="stable").astype(np.int32) + np.int32(s)  # (a radix sort of int16)
            c = np.bincount(g, minlength=G + 1)
            a = 0
            for j in np.nonzero(c)[0]:  # each group's rows of the block: one run, at the group's offset
                order[offset[j]:offset[j] + c[j]] = o[a:a + c[j]]
                a += c[j]
            offset += c
        self.keys = None
        return order, starts, counts, b


def _aligned_int32(n: int) -> np.ndarray:
    """An int32 array of n entries in page-aligned memory of its own, which ``jax.device_put`` on the CPU takes
    without a copy (the JAX array then keeps it alive): the item order is never in memory twice."""
    import mmap

    if n < 1 << 16:
        return np.empty(n, np.int32)
    return np.frombuffer(mmap.mmap(-1, 4 * n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.int32)


def _finish_table(order, starts, counts, b, center, rt, chol_cov, dt, groups: int = MAX_GROUPS) -> FactorTable:
    """The draw ranges and rates of the groups (sizes ``counts``, largest weights ``b``): :func:`build_table`;
    padded to ``groups`` groups."""
    G = starts.size
    mass = b * counts
    p = mass / mass.sum()
    k = np.maximum(np.ceil(p * (_DRAW_TOTAL - G)), 1).astype(np.int64)
    K = int(k.sum())
    total = float(np.max(mass * K / k)) * (1 + 1e-6)
    rate = total * k / (K * counts)
    assert np.all(rate >= b)
    # float32 rounding up, so that the stored rate still dominates every weight of its group
    rate32 = np.nextafter(rate.astype(dt), np.inf).astype(dt)
    # fixed shapes: N positions (items of weight 0 after the drawn ones, never drawn) and MAX_GROUPS groups
    # (the padding groups: size 1, rate 0 and an empty draw range at the end, so never drawn)
    pad = groups - G
    cum = np.cumsum(k)
    def put(x, t):  # (device_put of a host array: no compiled copy or conversion, as jnp.asarray makes)
        return jax.device_put(np.asarray(x, t))

    return FactorTable(put(center, dt), put(rt, dt), put(chol_cov, dt), jax.device_put(order),
                       put(np.pad(starts, (0, pad)), np.int32), put(np.pad(counts, (0, pad), constant_values=1), np.int32),
                       put(np.pad(cum, (0, pad), constant_values=K), np.int32), put(np.pad(rate32, (0, pad)), dt),
                       put(np.float32(total) * np.float32(1 + 1e-6), dt))


def build_table(w, center, rt, chol_cov, dtype=np.float32) -> FactorTable:
    """The grouped sampler of items by weight ``w`` (float64, length N; zeros never drawn).

    Items with ``w_i > 0`` are grouped by ``floor(8 log2 w_i)``; group ``g`` of ``n_g`` items and largest weight
    ``b_g`` gets ``k_g = ceil(p_g (2^30 - G))`` of the integer draw range, ``p_g = n_g b_g / sum_h n_h b_h``.
    A draw picks an integer below ``K = sum k_g``, its group by the cumulative ``k``, and an item uniformly in
    the group: item ``i`` of group ``g`` is drawn with probability ``k_g / (K n_g)``. With ``total =
    max_g n_g b_g K / k_g`` (>= sum_h n_h b_h) the rate of item ``i`` is ``phi total k_g / (K n_g) =: phi
    rate_g >= phi b_g >= phi w_i``: a valid dominating rate, used as such by the thinning. Items lie in
    ascending index within a group. Made in blocks by :class:`TableBuilder` (which :func:`prepare` feeds as it
    computes the weights, never holding N of them).
    """
    w = np.asarray(w, np.float64).reshape(-1)
    tb = TableBuilder(w.size)
    block = 1 << 20
    for s in range(0, w.size, block):
        tb.add(s, w[s:s + block])
    return tb.table(center, rt, chol_cov, dtype)


TABLE_BYTES_PER_ITEM = 6  # the set-up's int16 key and int32 order per item (the chain's order: the same memory)


def table_fits(n: int, fraction: float = 0.5) -> bool:
    """Whether the item table of N items (at most :data:`TABLE_BYTES_PER_ITEM` bytes each while it is made)
    takes at most ``fraction`` of the memory available now: the default's test for data read from files."""
    return TABLE_BYTES_PER_ITEM * int(n) <= fraction * available_memory()


def _grouped_shapes(n: int, d: int, dtype) -> FactorTable:
    """The shapes and dtypes of :func:`build_table`'s result for N items and d parameters."""
    f, i = (lambda *s: jax.ShapeDtypeStruct(s, np.dtype(dtype))), (lambda *s: jax.ShapeDtypeStruct(s, jnp.int32))
    return FactorTable(f(d), f(d, d), f(d, d), i(n), i(MAX_GROUPS), i(MAX_GROUPS), i(MAX_GROUPS), f(MAX_GROUPS),
                       f())


def draw_items(key, table: FactorTable, m: int):
    """``m`` items drawn independently, item ``i`` of group ``g`` with probability ``k_g / (K n_g)``
    (:func:`build_table`): ``(items, the rate each drawn item gets, divided by phi)``. O(log G) per item (a
    search of the G thresholds). The two integers of a draw come from 64 random bits each, all four words from
    one hash of the key. The large-N table (``heavy_idx`` set, :class:`BulkBuilder`): group 0 draws an
    item uniformly among all N (its position is the item), a heavy group one of its heavy items; the rate of an
    item is group 0's plus, for a heavy item (found by a search of the K sorted heavy items), its group's."""
    return items_of_bits(jax.random.bits(key, (4, m), jnp.uint32), table)


def items_of_bits(w, table: FactorTable):
    """:func:`draw_items` from its four words per item ``w`` (``(4, m)`` uint32, one hash of the key): the caller
    may hash them where it likes (the exact test hashes them once per loop iteration, beside its uniforms)."""
    r = below(w[0], w[1], table.cum[-1])
    g = jnp.searchsorted(table.cum, r, side="right")
    j = below(w[2], w[3], table.count[g])
    if table.heavy_idx is None:
        return table.order[table.start[g] + j], table.rate[g]
    item = jnp.where(g == 0, j, table.order[jnp.where(g == 0, 0, table.start[g] + j)])
    k = table.heavy_idx.shape[0]
    p = jnp.minimum(jnp.searchsorted(table.heavy_idx, item, side="left"), k - 1)
    return item, jnp.where(table.heavy_idx[p] == item, table.heavy_rate[p], table.rate[0])


def _mul32(a, b):
    """``a * b`` of two uint32 arrays as the 64-bit pair ``(high word, low word)`` (16-bit halves: no overflow)."""
    a1, a0, b1, b0 = a >> 16, a & 0xFFFF, b >> 16, b & 0xFFFF
    lo = a0 * b0
    mid1, mid2 = a1 * b0, a0 * b1
    mid = (lo >> 16) + (mid1 & 0xFFFF) + (mid2 & 0xFFFF)  # (< 3 * 2^16: no overflow)
    hi = a1 * b1 + (mid1 >> 16) + (mid2 >> 16) + (mid >> 16)
    return hi, (mid << 16) | (lo & 0xFFFF)


def below(hi, lo, span):
    """``floor(x span / 2^64)`` for the 64-bit ``x = hi 2^32 + lo`` (uint32 words) and ``0 < span < 2^31``: an
    integer in ``[0, span)`` whose every value has ``floor`` or ``ceil`` of ``2^64 / span`` of the ``x``, so uniform
    to within ``span / 2^64`` relative (multiply-high, without the rejection step; Lemire, *Fast random integer
    generation in an interval*, ACM TOMACS 2019)."""
    s = jnp.asarray(span).astype(jnp.uint32)
    h1, l1 = _mul32(hi, s)  # hi * s
    h0, _ = _mul32(lo, s)  # floor(lo * s / 2^32)
    carry = (l1 + h0 < l1).astype(jnp.uint32)  # (the low word's sum wrapped)
    return (h1 + carry).astype(jnp.int32)


def laplace_factors(model, unravel, cv):
    """``(R^T, R^-T)`` for the Laplace precision ``H = -(sum_i hess ell_i(c) + hess log p0(c)) = R R^T`` (float64).
    A precision that is not positive definite gets a ridge of 1e-8 of its largest diagonal entry."""
    from .setup_passes import prior_hessian  # (the model's NumPy form where it has one: no program compiled)

    c = cv.center
    hp = prior_hessian(model, unravel, c)
    H = -(np.asarray(cv.hess_sum, np.float64) + np.asarray(hp, np.float64))
    H = 0.5 * (H + H.T)
    try:
        R = np.linalg.cholesky(H)
    except np.linalg.LinAlgError:
        R = np.linalg.cholesky(H + 1e-8 * np.max(np.abs(np.diag(H))) * np.eye(H.shape[0]))
    rinv = np.linalg.inv(R)
    return R.T, rinv.T, rinv


def prepare(model, data, n, unravel, cv, bound=None):
    """The set-up pass of the exact subsampled test: ``(FactorTable, items read)``.

    ``cv`` is the control variates' state at the centre (its Hessian sum gives the whitening); one pass over
    the N items makes the weights (on the host in float64 when the data are NumPy arrays, else in compiled
    code in the working precision, inflated by 1e-3 for its rounding, for rows in memory and in files alike),
    block by block into :func:`builder`'s (the grouped table of every item, or from :data:`BULK_MIN_N` items the
    large-N sampler).
    """
    from .model import own_method

    if bound is None:
        fb = own_method(model, "factor_bound")
        if fb is None:
            raise ConfigError(f"the model {getattr(model, 'name', type(model).__name__)!r} states no bound on its "
                              "Taylor remainders (a factor_bound() method): the exact subsampled test needs one")
        bound = fb()
    rt, chol_cov, rinv = laplace_factors(model, unravel, cv)
    center64 = np.asarray(cv.center, np.float64)
    leaves = jax.tree_util.tree_leaves(data)
    tb = builder(n)  # (the weights go to it block by block: never N of them in memory)
    block, reread = 1 << 18, 0
    if all(isinstance(a, np.ndarray) for a in leaves):
        for s in range(0, n, block):
            tb.add(s, bound.weights_host(center64, rinv, jax.tree_util.tree_map(lambda a: a[s:s + block], data)))
    else:  # (rows read from files in blocks get the same weights as the same rows in memory)
        reader = ds.host_reader(data) if ds.is_out_of_core(data) else None
        c = jax.device_put(np.asarray(cv.center))  # (not jnp.asarray: it compiles a program of its own)
        ri = jax.device_put(np.asarray(rinv, cv.center.dtype))
        fn = jax.jit(bound.weights)
        pending = None
        for s in range(0, n + block, block):  # (the next block's weights computed while this one is grouped)
            nxt = None
            if s < n:
                # the last block is the last `block` rows (overlapping the one before), so that every block has
                # one shape and the weights program compiles once; only its rows from s on are kept
                lo = min(s, max(n - block, 0))
                reread += s - lo
                batch = reader(lo, min(n, lo + block)) if reader is not None else \
                    jax.tree_util.tree_map(lambda a: jnp.asarray(a[lo:lo + block]), data)
                nxt = (s, s - lo, fn(c, ri, batch))  # (dispatched: runs while the host groups the previous block)
            if pending is not None:
                tb.add(pending[0], np.asarray(pending[2], np.float64)[pending[1]:] * (1 + 1e-3))
            pending = nxt
    table = tb.table(cv.center, rt, chol_cov, np.dtype(cv.center.dtype))
    return table, n + reread



# --- the large-N sampler: no array of N, no sort (module docstring) -------------------------------------

# N from which the set-up makes the bulk sampler: there the grouped table's counting sort costs seconds (3-8 s at
# 10^8) and 6 bytes per item, while the bulk's extra points are read in a small fraction of a step
BULK_MIN_N = 1 << 25
HEAVY_MAX = 1 << 20  # heavy items kept at most: 12 bytes each in the chain's table, 16 while the pass keeps them
_PAD = np.iinfo(np.int32).max  # heavy_idx's padding: above every item


def uses_bulk(n: int) -> bool:
    """Whether the exact test's table for N items is the bulk sampler (:class:`BulkBuilder`) rather than the grouped
    table of every item."""
    return int(n) >= BULK_MIN_N


def heavy_count(n: int) -> int:
    """K, the heavy items' slots in the bulk table of N items (fixed by N: part of the table's shapes)."""
    return max(1, min(int(HEAVY_MAX), int(n)))


def builder(n: int):
    """The table's builder for N items (``add(start, w_block)`` in order, then ``table(...)``): a
    :class:`BulkBuilder` where :func:`uses_bulk`, else a :class:`TableBuilder`."""
    return BulkBuilder(n) if uses_bulk(n) else TableBuilder(n)


def table_shapes(n: int, d: int, dtype) -> FactorTable:
    """The shapes and dtypes of the table :func:`builder` makes for N items and d parameters (its values unknown:
    the chain compiles from these before the set-up makes the table)."""
    base = _grouped_shapes(n, d, dtype)
    if not uses_bulk(n):
        return base
    k, g = heavy_count(n), MAX_GROUPS + 1
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
            _group_keys(w)  # (raises the grouped table's error, naming how many)
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

    def rate_total(self) -> float:
        """``Lambda / phi`` of the bulk table of the weights added so far (its rates before rounding): ``N tau`` plus the
        heavy items' excess, at the level kept now."""
        w = np.concatenate(self.w)
        return self.n * self.thr + float(np.sum(np.maximum(w - self.thr, 0.0)))

    def table(self, center, rt, chol_cov, dtype=np.float32) -> FactorTable:
        """The bulk table (module docstring): group 0 every item at rate ``>= tau``, groups 1.. the heavy items'
        excess over ``tau`` (:func:`build_table`'s grouping of that list)."""
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


def _bulk_table(n, k, tau, idx, excess, center, rt, chol_cov, dt) -> FactorTable:
    """The bulk table of N items (``idx``: the heavy items, ascending, with their excess weights over ``tau``)."""
    h = idx.size
    g0 = MAX_GROUPS + 1
    if tau <= 0 and h == 0:  # no remainder anywhere: every rate 0, never drawn (total 0)
        f, i32 = (lambda a: jax.device_put(np.asarray(a, dt))), (lambda a: jax.device_put(np.asarray(a, np.int32)))
        return FactorTable(f(center), f(rt), f(chol_cov), i32(np.zeros(k)), i32(np.zeros(g0)), i32(np.ones(g0)),
                               i32(np.ones(g0)), f(np.ones(g0)), f(0.0), i32(np.full(k, _PAD)), f(np.zeros(k)))
    pos, starts, counts, b = np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    if h:
        tb = TableBuilder(h)
        tb.add(0, excess)
        pos, starts, counts, b = tb.groups()  # (positions in idx, grouped; at most MAX_GROUPS groups)
    starts = np.concatenate([[0], starts]).astype(np.int64)
    counts = np.concatenate([[n], counts]).astype(np.int64)
    b = np.concatenate([[tau], b])
    order = np.full(k, 0, np.int32)
    order[:h] = idx[pos[:h]]
    t = _finish_table(order, starts, counts, b, center, rt, chol_cov, dt, groups=g0)
    rate = np.asarray(t.rate, np.float64)
    gpos = np.repeat(np.arange(1, starts.size), counts[1:])  # each grouped position's group
    hrate = np.zeros(k, np.float64)
    hrate[pos[:h]] = rate[0] + rate[gpos]  # (by position in idx: ascending items)
    hrate32 = np.nextafter(hrate.astype(dt), np.inf).astype(dt)  # (rounded up, as the groups' rates are)
    hidx = np.full(k, _PAD, np.int32)
    hidx[:h] = idx
    return t._replace(heavy_idx=jax.device_put(hidx), heavy_rate=jax.device_put(hrate32))


def view(bound, table: FactorTable, theta, theta_p, remainder: Callable) -> FactorView:
    """The step's :class:`FactorView` at flat ``theta, theta'``."""
    z = table.rt @ (theta - table.center)
    zp = table.rt @ (theta_p - table.center)
    phi = bound.phi(z, zp)
    return FactorView(phi, jnp.asarray(bound.region(z, zp), bool), table, remainder)
