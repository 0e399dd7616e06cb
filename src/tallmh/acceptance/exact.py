"""The full-data acceptance tests: the oracle each approximate test is compared with."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from .base import MAX_CHUNK, CompSum, Decision, Problem, StreamReader, draw_u

__all__ = ["Exact", "exact_accept", "as_scalar_log_lik"]

_EXACT_CHUNK = 4096


def exact_accept(kind: str, u, log_base, total, temperature: float = 1.0):
    """The exact decision from the full sum ``total = sum_i l_i`` (a float, or a double-float pair).

    ``kind="metropolis"``: ``log u < log_base + total / T``; ``kind="barker"``: ``log_base + total / T +
    logit(u) > 0``. One function, so that an approximate test that has read all N items decides exactly
    as :class:`Exact` does, bit for bit.
    """
    if isinstance(total, tuple):
        hi, lo = total
        lam = hi / temperature + lo / temperature
    else:
        lam = total / temperature
    if kind == "metropolis":
        return jnp.log(u) < log_base + lam
    return log_base + lam + (jnp.log(u) - jnp.log1p(-u)) > 0


def as_scalar_log_lik(ll):
    """A tracked full log-likelihood as one float (``hi + lo`` of the pair that :class:`Exact` keeps)."""
    ll = jnp.asarray(ll)
    return ll[..., 0] + ll[..., 1] if ll.ndim and ll.shape[-1] == 2 else ll


@dataclass(frozen=True)
class Exact:
    """Exact MH test on all N items.

    ``kind="metropolis"``: accept iff ``log u < log_base + sum_i l_i`` (Metropolis et al. 1953; Hastings
    1970; austerity paper eq. 1-2). ``kind="barker"``: accept iff ``log_base + sum_i l_i + X > 0`` with the
    logistic variable ``X = log u - log(1 - u)`` (Barker 1965; minibatch Barker paper eq. 9-10). Both draw
    u from the key exactly as the approximate tests do.

    ``temperature`` T divides the log-likelihood (target ``p0 prod_i p(x_i|theta)^(1/T)``), as in
    :class:`~tallmh.acceptance.Barker`, whose oracle is ``Exact(kind="barker", temperature=T)``.

    Precision. Every full-data sum is compensated (:func:`~tallmh.acceptance.base.df_reduce`: renormalised
    TwoSum additions within a chunk, double-float addition across chunks), so float32 data and parameters keep
    their digits at any N. Inside :func:`tallmh.sample` the kernel keeps the current full log-likelihood
    as a double-float pair ``[hi, lo]`` (a float array of shape (2,), made by :meth:`initial_log_lik` and
    returned in ``Decision.log_lik_prop``); ``Delta = (hi' - hi) + (lo' - lo)`` whose first difference is
    exact (Sterbenz), so a step reads N items and ``Delta`` is as good as a float64 sum of the float32
    per-item values. Without a tracked log-likelihood (``problem.log_lik_current is None``) the test sums
    the per-item differences ``l_i`` the same way (N items, each evaluated at theta and theta'). What
    remains is the float32 rounding of each item's own ``log p(x_i|theta)`` (random, about
    ``sqrt(N) eps |log p|`` in all: see benchmarks/precision.py). A scalar ``log_lik_current`` (the
    older kernel) is also accepted, and then a scalar is returned.

    Support. A non-finite ``log p(x_i|theta')`` or ``l_i`` (NaN, +-inf) rejects at once: reading stops
    at the end of the chunk after the one where it was seen (the pass is pipelined: :meth:`_pipelined_sum`),
    ``Decision.n_nonfinite`` counts such items and ``n_data`` the items read. A proposal with
    ``log_base = -inf`` (prior or proposal ratio) is rejected without reading data (``n_data = 0``).
    """

    kind: str = "metropolis"
    chunk: int = _EXACT_CHUNK
    temperature: float = 1.0

    def __post_init__(self):
        if self.kind not in ("metropolis", "barker"):
            raise ConfigError(f"Exact(kind=...) must be 'metropolis' or 'barker', not {self.kind!r}")
        if not float(self.temperature) > 0.0:
            raise ConfigError(f"Exact temperature must be positive; got {self.temperature}")

    @property
    def name(self) -> str:
        return "exact" if self.kind == "metropolis" else "exact-barker"

    tracks_log_lik = True

    def check(self, n: int):
        return None

    def _chunks(self, n: int):
        """``(k, size)``: N items in k equal chunks of ``size`` (one compiled chunk size, at most one item per
        chunk left over). k: at least 16 (or N / chunk if fewer), so that a non-finite item still stops the
        pass early, and chunks of at most 16 * chunk items."""
        most = max(1, min(16 * int(self.chunk), MAX_CHUNK))
        k = max(-(-n // most), min(16, -(-n // max(1, int(self.chunk)))))
        return k, -(-n // k)

    def _sum(self, n, fn, dtype, target=None) -> CompSum:
        if isinstance(n, (int, np.integer)):
            return self._pipelined_sum(int(n), fn, dtype, n if target is None else target)
        # a traced population size (tallmh.blocks): the reader's ladder
        reader = StreamReader(n, self.chunk, fn, permuted=False, stop_on_nonfinite=True)
        return reader.advance(None, CompSum.zero(dtype), n if target is None else target)

    def _pipelined_sum(self, n: int, fn, dtype, target) -> CompSum:
        """The compensated sum of ``fn`` over the items ``[0, target)`` in :meth:`_chunks`'s chunks, by
        :func:`_pipelined`. Reading stops once a non-finite value has been added: at the end of the chunk after
        the one holding it, both counted in ``read``."""
        k, size = self._chunks(n)

        def chunk(j):
            pos = j * size + jnp.arange(size, dtype=jnp.int32)
            return fn(jnp.minimum(pos, n - 1)), pos < target

        return _pipelined(chunk, k, dtype, lambda j, acc: (j * size < target) & (acc.nonfinite == 0))

    def initial_log_lik(self, n: int, log_lik_fn, dtype=None):
        """Full log-likelihood ``sum_i log p(x_i|theta)`` as the pair ``[hi, lo]`` (shape (2,)).

        ``log_lik_fn(idx)`` returns ``log p(x_i|theta)`` for the items ``idx``. If an item is not finite
        the result is ``[-inf, 0]``: theta is outside the support, and the first proposal with a finite
        log-likelihood is accepted.
        """
        dtype = jnp.result_type(float) if dtype is None else dtype
        acc = self._sum(n, log_lik_fn, dtype)
        hi = jnp.where(acc.nonfinite > 0, -jnp.inf, acc.hi)
        lo = jnp.where(acc.nonfinite > 0, 0.0, acc.lo).astype(dtype)
        return jnp.stack([hi, lo])

    def log_ratio(self, problem: Problem):
        """``(Delta, log_lik_prop, n_read, n_nonfinite)`` with ``Delta = sum_i l_i`` (before tempering).

        ``Delta`` is a double-float pair ``(hi, lo)``; ``log_lik_prop`` is the tracked representation at
        theta' (None without a tracked log-likelihood).
        """
        n = problem.n
        dtype = problem.log_base.dtype
        cur = problem.log_lik_current
        # a proposal with log_base = -inf (prior or proposal ratio) is rejected without reading data
        target = jnp.where(problem.log_base == -jnp.inf, 0, n)
        if cur is not None:
            acc = self._sum(n, problem.log_lik_prop, dtype, target)
            cur = jnp.asarray(cur, dtype)
            if cur.ndim == 0:  # a plain float: the kernel before double-float tracking
                c_hi, c_lo = cur, jnp.zeros((), dtype)
                ll_prop = acc.value()
            else:
                c_hi, c_lo = cur[0], cur[1]
                ll_prop = jnp.stack([acc.hi, acc.lo])
            d_hi, d_lo = acc.hi - c_hi, acc.lo - c_lo  # hi - c_hi is exact when they are within 2x
            s = d_hi + d_lo
            delta = (s, jnp.where(jnp.isfinite(s), d_lo - (s - d_hi), jnp.zeros((), dtype)))
        else:
            acc = self._sum(n, problem.lik_ratio, dtype, target)
            delta = (acc.hi, acc.lo)
            ll_prop = None
        return delta, ll_prop, acc.read, acc.nonfinite

    def decide(self, key, problem: Problem) -> Decision:
        u, _, _ = draw_u(key)
        delta, ll_prop, read, bad = self.log_ratio(problem)
        accept = exact_accept(self.kind, u, problem.log_base, delta, self.temperature) & (bad == 0)
        return Decision(accept, read.astype(jnp.int32), jnp.int32(1), ll_prop, bad.astype(jnp.int32))

    def audit_decide(self, key, problem: Problem) -> Decision:
        """:meth:`decide` without a tracked log-likelihood, by one pass of fixed length: the self-audit's
        exact decision (:func:`tallmh.kernel.build_kernel`).

        The same chunks and compensated sum as :meth:`decide`, but the loop's length does not depend on the
        chain: chains run side by side (``vmap``) then read each chunk of rows once between them, sliced
        rather than gathered where the problem offers ``lik_ratio_rows``, and every item is read (a
        non-finite item is counted and rejects, but does not end the pass early). The last chunk, where
        the chunks overrun N, is the last ``size`` rows with those already read masked out: the same items,
        so the same decision up to the rounding of the compensated sum (~eps^2 of it). A traced population
        size (inference programs) takes :meth:`decide`.
        """
        n = problem.n
        if not isinstance(n, (int, np.integer)) or problem.log_lik_current is not None:
            return self.decide(key, problem)
        u, _, _ = draw_u(key)
        acc = self.fixed_pass_sum(problem)
        # a proposal with log_base = -inf (prior or proposal ratio) is rejected and reads nothing, as in decide
        out = problem.log_base == -jnp.inf
        bad = jnp.where(out, 0, acc.nonfinite)
        accept = exact_accept(self.kind, u, problem.log_base, (acc.hi, acc.lo), self.temperature) & (bad == 0)
        read = jnp.where(out, 0, n)
        return Decision(accept, read.astype(jnp.int32), jnp.int32(1), None, bad.astype(jnp.int32))

    def fixed_pass_sum(self, problem: Problem) -> CompSum:
        """The compensated sum of every ``l_i`` (N static) by :meth:`audit_decide`'s pass of fixed length (its
        loop's condition depends on the iteration alone, so chains side by side share it), pipelined
        (:func:`_pipelined`)."""
        n = int(problem.n)
        k, size = self._chunks(n)
        rows = problem.lik_ratio_rows

        def chunk(i):
            start = jnp.minimum(i * size, n - size)  # the last chunk ends at N; its rows read already are masked
            pos = start + jnp.arange(size, dtype=jnp.int32)
            l = rows(start, size) if rows is not None else problem.lik_ratio(pos)
            return l, pos >= i * size

        return _pipelined(chunk, k, problem.log_base.dtype)


def _pipelined(chunk, k, dtype, go=None) -> CompSum:
    """The compensated sum (:class:`CompSum`) of the values of chunks ``0 .. k - 1`` (``chunk(j) -> (values,
    mask)``), while ``go(j, acc)`` (default: always): iteration j computes chunk j and adds chunk j - 1's
    values, carried from the iteration before. Added in the iteration that computes them, the compiler fused
    their computation (the model's exponentials and logarithms) into the compensated reduction, a loop of
    dependent scalar steps, so they ran one item at a time: the self-audit's pass at N = 10^6, 4 chains, took
    ~150 ms against ~30 ms pipelined (``benchmarks/exact_pass.py`` times the passes as they are)."""
    shape = jax.eval_shape(lambda: chunk(0)[0])  # (the values' dtype, which may not be the sum's)
    size = shape.shape[0]

    def cond(c):
        j, acc, _, _ = c
        return (j < k) & (go(j, acc) if go is not None else True)

    def body(c):
        j, acc, prev, prev_mask = c
        values, mask = chunk(j)
        return j + 1, acc.merge(prev, prev_mask), values, mask

    init = (jnp.int32(0), CompSum.zero(dtype), jnp.zeros(shape.shape, shape.dtype), jnp.zeros((size,), bool))
    _, acc, last, last_mask = jax.lax.while_loop(cond, body, init)
    return acc.merge(last, last_mask)
