"""What every acceptance test sees, and the shared machinery for reading data in chunks.

Following DESIGN.md, an MH step hands its acceptance test a :class:`Problem`: the data-free part of the
log acceptance ratio (prior ratio and proposal ratio), N, and a function that returns the per-item
log-likelihood ratios ``l_i = log p(x_i|theta') - log p(x_i|theta)`` for a vector of item indices. The test
draws u (or the logistic variable) from its key, reads as many items as its rule needs, and returns a
:class:`Decision`.

Keys: every test splits its key as ``k_u, k_perm, k_extra = split(key, 3)`` and draws
``u = uniform(k_u)``; the Barker tests use the logistic variable ``logit(u)`` of the same u. So for the
same key an approximate test and its :class:`~tallmh.acceptance.Exact` oracle see the same u.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..storage.data import permute

__all__ = ["Problem", "Decision", "Moments", "draw_u", "StreamReader", "berry_esseen_bound", "two_sum", "df_add",
           "df_sum", "df_reduce", "CompSum", "MomentsSum"]


class Problem(NamedTuple):
    """One accept/reject decision to make.

    ``log_base`` is ``log p0(theta') - log p0(theta) + log q(theta|theta') - log q(theta'|theta)``;
    ``lik_ratio(idx)`` returns ``l_i`` for the items ``idx``; ``log_lik_prop(idx)`` returns
    ``log p(x_i|theta')`` (used by the exact test, which keeps the current full log-likelihood);
    ``bound()`` returns an upper bound on ``max_i |l_i|`` from the model, or None when the model has none.
    ``log_lik_current`` is the current full-data log-likelihood when the kernel tracks it, else None.
    ``lik_ratio_rows(start, size)``, where the items are rows of arrays in memory, returns ``l_i`` for the
    contiguous items ``[start, start + size)`` by slicing them (no gather); None otherwise.
    ``factors``: with control variates and the table of :func:`tallmh.factor_bounds.prepare` in the step's
    statistics, the per-item remainder bound and remainders the exact subsampled test thins with.
    ``exact_rows``: items that :class:`~tallmh.acceptance.Austerity` sums exactly at every step (the stratum of
    large remainders, :mod:`tallmh.strata`) while it subsamples the rest; other tests ignore it.
    """

    n: int
    log_base: jax.Array
    lik_ratio: Callable
    log_lik_prop: Callable
    bound: Optional[Callable]
    log_lik_current: Optional[jax.Array] = None
    lik_ratio_rows: Optional[Callable] = None
    # the remainders' bound at (theta, theta') and its sampling table, for the exact subsampled test
    # (:class:`tallmh.factor_bounds.FactorView`); None where there are no control variates or no table
    factors: Optional[object] = None
    # sorted, distinct int32 item indices that a stratified test sums exactly at every step (None: none)
    exact_rows: Optional[jax.Array] = None


class Decision(NamedTuple):
    accept: jax.Array  # bool
    n_data: jax.Array  # int32: data items read to decide (including any full pass for a bound)
    rounds: jax.Array  # int32: number of looks / minibatch rounds
    log_lik_prop: Optional[jax.Array] = None  # full log-lik at theta' (exact test only)
    # int32: items read whose l_i was NaN or infinite (the test then rejects at once); None = 0
    n_nonfinite: Optional[jax.Array] = None
    # float: the test's estimate of how much its normal approximation inflates the error of the look at
    # which it stopped, relative to the look's design level (0: none; see Austerity); None for tests whose
    # decisions do not lean on the CLT (exact, confidence) or that bound their own error (minibatch Barker)
    excess_error: Optional[jax.Array] = None


def draw_u(key):
    k_u, k_perm, k_extra = jax.random.split(key, 3)
    return u_of(k_u), k_perm, k_extra


def u_of(k_u):
    """The decision's uniform on ``(0, 1]`` from its key (the first of :func:`draw_u`'s three)."""
    return jax.random.uniform(k_u, (), minval=jnp.finfo(jnp.result_type(float)).tiny, maxval=1.0)


class Moments(NamedTuple):
    """Running count, mean and sum of squared deviations (merged chunk by chunk, Chan et al. 1979).

    ``abs1`` and ``abs3`` accumulate ``|l - mean|`` and ``|l - mean|**3`` about the running mean at the
    time each chunk is merged (used by the minibatch Barker test's CLT error estimate); ``m3`` is the exact
    running sum of cubed deviations from the mean (Chan, Golub & LeVeque's pairwise update extended to the
    third moment; Pebay 2008, eq. 2.2), for the skewness the austerity boundary corrects for.
    ``nonfinite`` counts items whose value was NaN or +-inf: they are left out of every other field (and
    of ``t``), and a test that sees ``nonfinite > 0`` should stop and reject (DESIGN: support).
    """

    t: jax.Array
    mean: jax.Array
    m2: jax.Array
    abs1: jax.Array
    abs3: jax.Array
    absmax: jax.Array
    nonfinite: jax.Array = None  # int32
    m3: jax.Array = None  # sum of (l - mean)^3 over the finite items read

    @staticmethod
    def zero(dtype):
        z = jnp.zeros((), dtype)
        return Moments(jnp.zeros((), jnp.int32), z, z, z, z, z, jnp.zeros((), jnp.int32), z)

    @property
    def read(self):
        """Items read so far, finite or not (``t + nonfinite``)."""
        return self.t + self.nonfinite

    def merge(self, l, mask):
        bad = mask & ~jnp.isfinite(l)
        mask = mask & ~bad
        l = jnp.where(mask, l, 0.0)
        w = mask.astype(l.dtype)
        nb = jnp.sum(w)
        mean_b = jnp.sum(w * l) / jnp.maximum(nb, 1.0)
        db = l - mean_b
        m2_b = jnp.sum(w * db**2)
        m3_b = jnp.sum(w * db**3)
        na = self.t.astype(l.dtype)
        ntot = na + nb
        nt = jnp.maximum(ntot, 1.0)
        delta = mean_b - self.mean
        mean = self.mean + delta * nb / nt
        m2 = self.m2 + m2_b + delta**2 * na * nb / nt
        m3a = self.m3 if self.m3 is not None else jnp.zeros((), l.dtype)
        m3 = (m3a + m3_b + delta**3 * na * nb * (na - nb) / nt**2
              + 3.0 * delta * (na * m2_b - nb * self.m2) / nt)
        dev = jnp.abs(l - mean)
        return Moments(
            self.t + nb.astype(jnp.int32),
            mean,
            m2,
            self.abs1 + jnp.sum(w * dev),
            self.abs3 + jnp.sum(w * dev**3),
            jnp.maximum(self.absmax, jnp.max(jnp.where(mask, jnp.abs(l), 0.0))),
            self.nonfinite + jnp.sum(bad).astype(jnp.int32),
            m3,
        )

    def skewness(self):
        """Sample skewness ``(m3 / t) / (m2 / t)^(3/2)`` of the finite items read (0 with fewer than 3 or no spread)."""
        tf = jnp.maximum(self.t.astype(self.mean.dtype), 1.0)
        var = self.m2 / tf
        ok = (self.t > 2) & (var > 0)
        return jnp.where(ok, (self.m3 / tf) / jnp.where(ok, var, 1.0) ** 1.5, 0.0)

    def var(self):
        """Unbiased sample variance (0 when fewer than two items)."""
        tf = self.t.astype(self.mean.dtype)
        return jnp.where(self.t > 1, self.m2 / jnp.maximum(tf - 1.0, 1.0), 0.0)


# The largest chunk a reader gathers at once (items): 2**20 rows of 11 float32 features are 46 MB, plus the
# chunk's per-item temporaries. A ladder is unchanged unless it would have had a rung above 2**20 (the exact
# test's 4096-item ladder: never for N < 2**24; the austerity test's 100-item ladder: a rung of 6,553,600
# items, used only by a step that reads that many). With 2**24 (an earlier version) an exact or audit
# pass at N >= 2**24 gathered 0.74 GB chunks of X and about 0.9 GB in all per chunk (measured at N = 3e7),
# the largest memory cost of a whole tm.sample call once the data is read in place (an exact pass at
# N = 5e7 now makes 48 loop iterations instead of 3).
MAX_CHUNK = 2**20


class StreamReader:
    """Reads the items at permuted positions ``[t, target)`` in chunks of static sizes.

    The sizes form a ladder ``m, 16 m, 256 m, ...`` (all at most N): the reader takes as many chunks of
    the largest size as fit, then smaller ones, and finishes with masked chunks of size m. So moving from
    t to target costs O(target - t) item evaluations plus O(log(N/m)) loop iterations, with static
    shapes that ``jit`` needs. ``positions -> items`` goes through the keyed permutation (or the
    identity, for the exact test, which reads everything anyway). ``ladder_base=None``: chunks of size m
    only (for a caller that never asks for more than m items at a time).
    """

    def __init__(self, n, m: int, fn: Callable, permuted: bool = True, ladder_base: int = 16,
                 stop_on_nonfinite: bool = False, max_ladder: int = 2):
        # stop reading (at the end of the current chunk) once a non-finite value has been seen
        self.stop_on_nonfinite = bool(stop_on_nonfinite)
        if isinstance(n, (int, np.integer)):
            self.n = int(n)
            self.m = int(max(1, min(m, n)))
            self.dynamic = False
        else:
            # A traced population size (e.g. a mixture component's current members, in
            # :mod:`tallmh.blocks`): the ladder has ``max_ladder`` static sizes and reads stop at n.
            self.n = jnp.asarray(n, jnp.int32)
            self.m = int(max(1, m))
            self.dynamic = True
        sizes = [self.m]
        while ladder_base is not None and (
                (not self.dynamic and sizes[-1] * ladder_base <= min(self.n, MAX_CHUNK)) or
                (self.dynamic and len(sizes) < max_ladder)):
            sizes.append(sizes[-1] * ladder_base)
        self.sizes = sizes
        self.fn = fn  # idx -> per-item values
        self.permuted = permuted

    def _indices(self, perm, start, size):
        pos = start + jnp.arange(size, dtype=jnp.int32)
        if self.permuted:
            return pos, permute(perm, pos, self.n)
        return pos, jnp.clip(pos, 0, self.n - 1)

    def _go(self, a):
        if self.stop_on_nonfinite:
            return a.nonfinite == 0
        return jnp.bool_(True)

    def advance(self, perm, acc: Moments, target):
        """Merge the items at positions ``[acc.read, target)`` into ``acc``. ``target <= N``.

        Positions count every item read, finite or not (``acc.read``); non-finite items are counted
        in ``acc.nonfinite`` and left out of the moments. With ``stop_on_nonfinite`` the reader stops at
        the end of the chunk in which the first non-finite value was seen. ``acc`` is any accumulator
        with ``read``, ``nonfinite`` and ``merge(values, mask)``: :class:`Moments`, :class:`CompSum`,
        :class:`MomentsSum`. With a traced n, ``target`` is capped at n.
        """
        if self.dynamic:
            target = jnp.minimum(target, self.n)
        for size in reversed(self.sizes[1:]):

            def cond(a, size=size):
                return (target - a.read >= size) & self._go(a)

            def body(a, size=size):
                _, idx = self._indices(perm, a.read, size)
                l = self.fn(idx)
                return a.merge(l, jnp.ones((size,), bool))

            acc = jax.lax.while_loop(cond, body, acc)

        m = self.m

        def cond0(a):
            return (a.read < target) & self._go(a)

        def body0(a):
            pos, idx = self._indices(perm, a.read, m)
            l = self.fn(idx)
            return a.merge(l, pos < target)

        return jax.lax.while_loop(cond0, body0, acc)



def berry_esseen_bound(acc: Moments):
    """Berry-Esseen-type distance of the standardised mean of the ``l_i`` read so far from N(0, 1).

    ``C rho3 / (sigma^3 sqrt(t))`` with ``rho3 = E|l - mean|^3`` and ``sigma`` the sd, both estimated from
    the items read (``C = 0.4748``, Shevtsova 2011, the i.i.d. Berry-Esseen constant; the minibatch Barker
    paper, Cor. 1, uses the same moment ratio). Returns +inf when fewer than two distinct values were
    read. A value above ~0.05-0.1 says the CLT that the austerity and Barker tests lean on is doubtful at
    this batch size (heavy-tailed ``l_i``: log-normal data, outliers).
    """
    tf = jnp.maximum(acc.t.astype(acc.mean.dtype), 1.0)
    sd = jnp.sqrt(acc.m2 / tf)
    rho3 = acc.abs3 / tf
    safe = jnp.where(sd > 0, sd, 1.0)
    return jnp.where((sd > 0) & (acc.t > 1), 0.4748 * rho3 / safe**3 / jnp.sqrt(tf), jnp.inf)


# --- Sums that keep their digits -------------------------------------------------------------------------
#
# In float32 (JAX's default) a plain running sum of N log-likelihood terms loses about log2(N) bits: at
# N = 10^7 the full log-likelihood is near -1.4e7, whose ulp is 1, so ``ll(theta') - ll(theta)`` is
# meaningless. The helpers below keep a sum as an unevaluated pair ``hi + lo`` of floats ("double-float",
# Dekker 1971; Knuth TAOCP vol. 2, 4.2.2, TwoSum): within a chunk by a pairwise tree whose every addition
# keeps its rounding error in ``lo`` (df_sum), or by one reduction whose every addition is a renormalised
# double-float addition (df_reduce: the exact test's chunks), across chunks by double-float addition. The
# error of the result is a few ulps of ``|sum|`` in the working precision squared (about 1e-14 relative in
# float32) plus a few ulps of ``lo``; what remains is the rounding of the items themselves (see
# benchmarks/precision.py).
# These rely on IEEE round-to-nearest without re-association, which XLA guarantees (no fast-math).


def two_sum(a, b):
    """``(s, e)`` with ``s = fl(a + b)`` and ``a + b = s + e`` exactly (Knuth's TwoSum, 6 flops)."""
    s = a + b
    bb = s - a
    e = (a - (s - bb)) + (b - bb)
    return s, e


def _renorm(hi, lo):
    s = hi + lo
    return s, lo - (s - hi)


def df_add(x, y):
    """Sum of two double-floats ``x = (hi, lo)`` and ``y = (hi, lo)``, as a normalised pair."""
    s, e = two_sum(x[0], y[0])
    return _renorm(s, x[1] + y[1] + e)


def df_sum(v, axis: int = 0):
    """Compensated sum of ``v`` along ``axis`` as a double-float pair ``(hi, lo)`` (pairwise TwoSum tree).

    Static shapes: ``ceil(log2(len))`` levels of elementwise work, about 8 flops per item in all.
    """
    hi = jnp.moveaxis(jnp.asarray(v), axis, 0)
    lo = jnp.zeros_like(hi)
    while hi.shape[0] > 1:
        k = hi.shape[0]
        if k % 2:
            pad = jnp.zeros((1,) + hi.shape[1:], hi.dtype)
            hi = jnp.concatenate([hi, pad])
            lo = jnp.concatenate([lo, pad])
            k += 1
        h = k // 2
        s, e = two_sum(hi[:h], hi[h:])
        lo = lo[:h] + lo[h:] + e
        hi = s
    if hi.shape[0] == 0:
        z = jnp.zeros(hi.shape[1:], hi.dtype)
        return z, z
    return _renorm(hi[0], lo[0])


_DF_BLOCK = 8  # items summed by a TwoSum tree of elementwise operations before the sequential reduction


def df_reduce(v, ok, bad):
    """``(hi, lo, sum(ok), sum(bad))`` of a 1-d ``v`` (zero where not ``ok``): its compensated sum as a
    double-float pair and the two counts.

    Every addition is a renormalised double-float addition (TwoSum, Knuth TAOCP vol. 2, 4.2.2; Dekker 1971),
    so each errs by about ``eps**2`` of the partial sum: the result is within a few ``k eps**2`` of ``sum |v|``
    for k items in the worst case and far closer in practice (tests/acceptance/test_precision.py: within
    1e-12 of ``sum |v|`` against float64 on vectors spread over seven decades). Blocks of ``_DF_BLOCK``
    items are first summed by :func:`df_sum`'s pairwise tree, which is elementwise work that the compiler
    vectorises; one reduction whose every step is a double-float addition then folds the blocks' pairs.
    (The reduction alone, item by item, is a chain of dependent scalar operations: ~40 ns per item on a
    2-core x86 CPU at 10^6 items, ~5 with the blocks first; ``benchmarks/exact_pass.py``.)
    """
    z = jnp.zeros((), v.dtype)
    t, nb = jnp.sum(ok, dtype=jnp.int32), jnp.sum(bad, dtype=jnp.int32)
    k = v.shape[0]
    if k >= 2 * _DF_BLOCK:
        r = -(-k // _DF_BLOCK)
        if r * _DF_BLOCK > k:
            v = jnp.concatenate([v, jnp.zeros((r * _DF_BLOCK - k,), v.dtype)])
        hi, lo = df_sum(v.reshape(r, _DF_BLOCK), axis=1)
    else:
        hi, lo = v, jnp.zeros_like(v)
    hi, lo = jax.lax.reduce((hi, lo), (z, z), df_add, (0,))
    return hi, lo, t, nb


class CompSum(NamedTuple):
    """A compensated running sum of the finite values read, as ``hi + lo`` (see :func:`df_sum`).

    Same reading interface as :class:`Moments` (``read``, ``nonfinite``, ``merge``), so a
    :class:`StreamReader` can fill it. ``value()`` is ``hi + lo`` rounded to one float.
    """

    t: jax.Array  # int32: finite items summed
    hi: jax.Array
    lo: jax.Array
    nonfinite: jax.Array  # int32

    @staticmethod
    def zero(dtype):
        z = jnp.zeros((), dtype)
        i = jnp.zeros((), jnp.int32)
        return CompSum(i, z, z, i)

    @property
    def read(self):
        return self.t + self.nonfinite

    def merge(self, l, mask):
        bad = mask & ~jnp.isfinite(l)
        ok = mask & ~bad
        h, lo, t, nb = df_reduce(jnp.where(ok, l, jnp.zeros_like(l)), ok, bad)
        hi, lo = df_add((self.hi, self.lo), (h, lo))
        return CompSum(self.t + t, hi, lo, self.nonfinite + nb)

    def value(self):
        return self.hi + self.lo


class MomentsSum(NamedTuple):
    """:class:`Moments` (for the sequential statistics) and a :class:`CompSum` of the same items (for the
    exact decision once every item has been read), filled together by one :class:`StreamReader`."""

    m: Moments
    s: CompSum

    @staticmethod
    def zero(dtype):
        return MomentsSum(Moments.zero(dtype), CompSum.zero(dtype))

    @property
    def read(self):
        return self.m.read

    @property
    def nonfinite(self):
        return self.m.nonfinite

    def merge(self, l, mask):
        return MomentsSum(self.m.merge(l, mask), self.s.merge(l, mask))
