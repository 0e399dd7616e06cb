"""The exact subsampled test: factorised Metropolis-Hastings with the remainders' factors simulated by
Poisson thinning (Cornish, Vanetti, Bouchard-Cote, Deligiannidis & Doucet, *Scalable Metropolis-Hastings for
exact Bayesian inference with large datasets*, ICML 2019, "SMH", Sec. 3 and Alg. 2).

The target's log density is split as ``log p0(theta) + Q(theta) + sum_i R_i(theta)`` with ``Q`` the second-order
Taylor surrogate of the full log-likelihood at a centre ``c`` (the control variates' sums) and ``R_i`` the
items' remainders. The factorised acceptance probability (SMH eq. 4)

    alpha(theta, theta') = min(1, exp(log_base)) prod_i min(1, exp(R_i(theta') - R_i(theta))),
    log_base = log p0(theta') - log p0(theta) + Q(theta') - Q(theta) + log q(theta|theta') - log q(theta'|theta),

satisfies detailed balance for the exact posterior factor by factor, so the chain is exact. Each remainder
factor accepts with probability ``exp(-max(0, -(R_i(theta') - R_i(theta))))``: the probability that a Poisson
process of rate ``lambda_i >= |R_i(theta') - R_i(theta)|`` has no point kept when each is kept with
probability ``max(0, -(R_i(theta') - R_i(theta))) / lambda_i``. With ``lambda_i = phi(theta, theta') rate_i``
(:mod:`tallmh.factor_bounds`) the superposed process has ``K ~ Poisson(Lambda)``, ``Lambda = phi total``,
points, each on item ``i`` with probability ``rate_i / total`` (SMH Alg. 2). So a step reads ``K`` items at most
(fewer: it stops at the first kept point), ``Lambda`` falls like ``N^(-1/2)`` near the mode, and no item is
read when the surrogate's factor already rejects.

Fixed shapes: the points are met in chunks of ``chunk`` (default 1) inside a ``lax.while_loop``, by their arrival
times on ``[0, Lambda)`` in a unit-rate process (exponential gaps: ``K`` is never drawn in advance), until the
next arrival is past ``Lambda`` or a point is kept: exact for any ``K``, and no Poisson sampler to compile.
Fallback: where the bound fails (outside a model's trust region) or its rate
is large (``Lambda > max_rate``), the test takes plain MH's decision from the full sum of the remainders (a
full pass, counted). Which of the two decides is a function of ``Lambda(theta, theta')`` and the region, both
symmetric in ``theta, theta'``, so the kernel is a mixture of two reversible rules chosen by a symmetric
condition: still exact. (A switch on the drawn count ``K`` would not be: ``K`` is correlated with rejection.)
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .base import CompSum, Decision, Problem, StreamReader, df_add, u_of
from .exact import exact_accept
from ..factor_bounds import items_of_bits

__all__ = ["PoissonThinning"]

NEEDS_FULL_PASS = -1  # a step's ``rounds`` where it needed the fallback's full pass in a program traced without it
_LOCAL = threading.local()


@contextlib.contextmanager
def without_full_pass():
    """Within the block, what this thread traces of :meth:`PoissonThinning.decide` leaves the fallback's full pass
    out: a step that needs it reports ``rounds == NEEDS_FULL_PASS`` and its outcome must not be used (the runner
    makes such a chunk again with the whole program, :mod:`tallmh.run.programs`). Every other step is decided as
    the whole program decides it, bit for bit. The full pass is rarely taken (the bound's rate is O(1) near the
    mode against a limit of N/4) and is about a quarter of the chain's compile."""
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1


@dataclass(frozen=True)
class PoissonThinning:
    """Exact subsampled MH (SMH's factorised test by Poisson thinning). Needs Taylor control variates and a
    model that bounds its remainders (``factor_bound()``, :mod:`tallmh.factor_bounds`), with the table of
    :func:`tallmh.factor_bounds.prepare` in the step's statistics.

    ``chunk``: points drawn per loop iteration (default 1: every row read is a point of the process; with
    more, the last iteration's lanes beyond the count read rows too, and are counted). ``max_rate``: the
    bound's rate above which the step takes the full exact decision instead (default ``N / 4``). ``n_data``
    counts every row read (one per lane of each iteration: an item drawn twice is counted twice) plus any full
    pass.
    """

    chunk: int = 1
    max_rate: Optional[float] = None

    name = "exact-subsampled"
    # the kernel decides chain by chain under vmap over chains (kernel._one_chain_at_a_time): the loops below are
    # then traced for one chain, not batched (their batching took most of the chain's tracing; same draws)
    per_chain = True
    tracks_log_lik = False
    needs_factor_table = True  # (tm.sample refuses it until its runner builds the table)

    def __post_init__(self):
        if int(self.chunk) < 1:
            raise ConfigError(f"PoissonThinning chunk must be at least 1; got {self.chunk}")
        if self.max_rate is not None and not self.max_rate > 0:
            raise ConfigError(f"PoissonThinning max_rate must be positive; got {self.max_rate}")

    def check(self, n: int):
        return None

    def rate_limit(self, n: int) -> float:
        return float(self.max_rate) if self.max_rate is not None else max(64.0, n / 4.0)

    def decide(self, key, problem: Problem) -> Decision:
        f = getattr(problem, "factors", None)
        if f is None:
            raise ConfigError("the exact subsampled test needs Taylor control variates and a model with a remainder "
                              "bound (factor_bound), with its table in the statistics (tallmh.factor_bounds.prepare)")
        n = problem.n
        t = f.table
        dtype = problem.log_base.dtype
        valid = t.total >= 0  # (true for every table: a predicate the compiler cannot fold, shared by the chains)

        def hashed(fn, other, key):
            # fn(key) (random draws: integer hashes, and the floats made from them) computed in a branch of its own,
            # so that its results are stored once: XLA otherwise re-emits a hash into every fusion that reads one of
            # its values (a key split went into each of the draws made from its keys, the loop's into five fusions)
            return jax.lax.cond(valid, fn, other, key)

        def split3(k):
            return jax.random.split(k, 3)

        # draw_u(key), and the first arrival from its second key
        k_u, k_first, k_points = hashed(split3, lambda k: jnp.stack([k, k, k]), key)
        u, t1 = hashed(lambda ks: (u_of(ks[0]), jax.random.exponential(ks[1], (), dtype)),
                       lambda ks: (jnp.ones((), jnp.result_type(float)), jnp.zeros((), dtype)), jnp.stack([k_u, k_first]))
        lam = f.phi * t.total
        fallback = ~f.region | ~(lam <= self.rate_limit(n))  # (a NaN rate falls back too)
        surrogate_ok = jnp.log(u) < problem.log_base
        go = surrogate_ok & ~fallback
        lam_go = jnp.where(go, lam, jnp.zeros((), dtype))  # (no point unless the thinning decides)
        m = int(self.chunk)

        def once(fn, idx):
            # fn(idx) computed in a branch of its own, so that its result is stored once and read by each use (XLA
            # otherwise re-emits the remainder's series into every consumer: 2 to 4 copies to compile per loop)
            return hashed(jax.jit(fn), lambda i: jnp.full(i.shape, jnp.nan, dtype), idx)

        # the superposed process on [0, Lambda) by its unit-rate arrival times T_1 < T_2 < ... (exponential
        # gaps; T_1 drawn above): the points are those with T_j < Lambda, K ~ Poisson(Lambda) of them, met one by
        # one and never counted in advance; the arrival time is summed as a double-float pair (no drift over many
        # points)

        def draws(ks):  # each lane's four words for its item, its thinning uniform and next gap's
            return jax.random.bits(ks[0], (4, m), jnp.uint32), jax.random.uniform(ks[1], (2, m), dtype)

        def cond(s):
            hi, lo, rejected, bad, _, _, _ = s
            return ((hi - lam_go) + lo < 0) & ~rejected & (bad == 0)

        def body(s):
            hi, lo, rejected, bad, k, touched, rounds = s
            k, k1, k3 = hashed(split3, lambda k: jnp.stack([k, k, k]), k)
            w, u2 = hashed(draws, lambda ks: (jnp.zeros((4, m), jnp.uint32), jnp.zeros((2, m), dtype)), jnp.stack([k1, k3]))
            idx, rate = items_of_bits(w, t)  # (draw_items(k1, t, m), from the same words)
            gaps = -jnp.log1p(-u2[1])
            # lane j's arrival: T + gaps[0] + ... + gaps[j-1] (lane 0 at T, the loop's condition)
            ahead = jnp.cumsum(gaps) - gaps
            live = (hi - lam_go) + (lo + ahead) < 0
            dr = once(f.remainder, idx)
            nonfinite = live & ~jnp.isfinite(dr)
            p = jnp.where(live & ~nonfinite, jnp.maximum(-dr, 0.0) / (f.phi * rate), 0.0)
            kept = u2[0] < p
            hi, lo = df_add((hi, lo), (jnp.sum(gaps), jnp.zeros((), dtype)))
            return (hi, lo, rejected | jnp.any(kept), bad + jnp.sum(nonfinite).astype(jnp.int32), k, touched + m,
                    rounds + 1)

        z = jnp.zeros((), jnp.int32)
        _, _, rejected, bad, _, touched, rounds = jax.lax.while_loop(
            cond, body, (t1, jnp.zeros((), dtype), jnp.bool_(False), z, k_points, z, z))
        thin_accept = go & ~rejected & (bad == 0)

        # the fallback: plain MH from the full compensated sum of the remainders (a while loop with target 0 when
        # not taken, so that under vmap it costs nothing at the steps that do not take it); chunks of one size
        # (one loop, the remainder materialised once per chunk: the chain's program compiles in about half the
        # time of a ladder of sizes whose every loop re-emitted the remainder for each of its uses)
        full = fallback & jnp.isfinite(problem.log_base)
        if getattr(_LOCAL, "depth", 0) > 0:  # (traced without the full pass: such a step is marked, not decided)
            accept = jnp.where(fallback, False, thin_accept)
            return Decision(accept, touched, jnp.where(full, NEEDS_FULL_PASS, rounds).astype(jnp.int32), bad)
        reader = StreamReader(n, 4096, lambda idx: once(f.remainder, idx), permuted=False,
                              ladder_base=None, stop_on_nonfinite=True)
        acc = reader.advance(None, CompSum.zero(dtype), jnp.where(full, n, 0))
        full_accept = full & (acc.nonfinite == 0) & exact_accept("metropolis", u, problem.log_base, (acc.hi, acc.lo))

        accept = jnp.where(fallback, full_accept, thin_accept)
        rounds = rounds + jnp.where(full, 1, 0)
        return Decision(accept, touched + acc.read, rounds.astype(jnp.int32), bad + acc.nonfinite)
