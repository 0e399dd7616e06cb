"""The concentration-bound test MHSubLhd (Bardenet, Doucet & Holmes 2014, Fig. 3 and Sec. 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from ..storage.data import make_permutation
from ..errors import ConfigError
from .base import Decision, MomentsSum, Problem, StreamReader, draw_u
from .exact import exact_accept

__all__ = ["Confidence", "BOUNDS", "concentration_bound"]

BOUNDS = ("hoeffding", "empirical-bernstein", "bernstein-serfling")

# kappa of the empirical Bernstein-Serfling inequality (Bardenet & Maillard 2015, Theorem 3).
_KAPPA = 7.0 / 3.0 + 3.0 / math.sqrt(2.0)


def concentration_bound(bound: str, t, n, sd, c_range, delta_k):
    """Half-width ``c_t`` with ``P(|Lambda*_t - Lambda_n| <= c_t) >= 1 - delta_k`` (paper eq. 6).

    ``t`` items drawn without replacement from ``n``; ``sd`` is the empirical standard deviation
    (normalised by t) of the drawn ``l_i``; ``c_range = C_{theta,theta'} >= max_i |l_i|`` (eq. 8), so the
    ``l_i`` lie in an interval of length ``2 C``.

    - ``"hoeffding"``: Hoeffding-Serfling, eq. (7): ``C sqrt(2 (1 - f_t) log(2/delta) / t)``,
      ``f_t = (t - 1)/n``.
    - ``"empirical-bernstein"``: eq. (9) (Audibert et al. 2009):
      ``sd sqrt(2 log(3/delta) / t) + 6 C log(3/delta) / t``.
    - ``"bernstein-serfling"``: Bardenet & Maillard (2015), Theorem 3, two-sided by a union bound over
      both tails (``5 delta`` per tail, hence ``log(10/delta)``):
      ``sd sqrt(2 rho_t log(10/delta) / t) + kappa 2C log(10/delta) / t`` with
      ``rho_t = 1 - (t-1)/n`` for ``t <= n/2`` and ``(1 - t/n)(1 + 1/t)`` above, ``kappa = 7/3 + 3/sqrt 2``.
    """
    tf = jnp.asarray(t, sd.dtype)
    nf = jnp.asarray(n, sd.dtype)
    if bound == "hoeffding":
        f = (tf - 1.0) / nf
        return c_range * jnp.sqrt(2.0 * (1.0 - f) * jnp.log(2.0 / delta_k) / tf)
    if bound == "empirical-bernstein":
        lg = jnp.log(3.0 / delta_k)
        return sd * jnp.sqrt(2.0 * lg / tf) + 6.0 * c_range * lg / tf
    if bound == "bernstein-serfling":
        lg = jnp.log(10.0 / delta_k)
        rho = jnp.where(tf <= nf / 2.0, 1.0 - (tf - 1.0) / nf, (1.0 - tf / nf) * (1.0 + 1.0 / tf))
        return sd * jnp.sqrt(2.0 * rho * lg / tf) + _KAPPA * 2.0 * c_range * lg / tf
    raise ConfigError(f"unknown bound {bound!r}; choose one of {', '.join(BOUNDS)}")


@dataclass(frozen=True)
class Confidence:
    """Approximate MH test with concentration bounds: MHSubLhd (adaptive subsampling paper, Fig. 3).

    Accept iff ``Lambda_n = mean_i l_i > psi = (log u - log_base)/N``. Start with ``initial_batch`` items,
    and at the k-th look (k = 1, 2, ...) stop when ``|Lambda*_t - psi| > c_t`` with the bound of
    :func:`concentration_bound` at ``delta_k = (p - 1)/(p k^p) delta`` (so ``sum_k delta_k <= delta`` and
    the decision differs from the exact one with probability at most delta, Lemma 3.1); otherwise grow
    the batch to ``min(N, ceil(gamma t))`` (Fig. 3, step 18). At t = N the decision is exact (the same
    compensated sum and comparison as :class:`~tallmh.acceptance.Exact`).

    The range ``C_{theta,theta'} >= max_i |l_i|`` (eq. 8) comes from the model's ``lik_ratio_bound`` (with
    control variates: ``cv_remainder_bound``), computed from data statistics found once by the model's
    ``setup(data)``; every built-in model has one (``GaussianMean`` and ``Gaussian``: the extremes of the
    quadratic ``l(x)`` over ``[min x, max x]``, Sec. 4.3; ``GaussianMixture``: the largest per-component
    ratio; ``LogisticRegression``: ``||theta' - theta|| max_i ||x_i||``, Sec. 4.2; each with headroom for the
    float rounding of the ``l_i``, so that the bound holds for the computed values and delta is really
    guaranteed).

    **A model without a bound** (``range_from=None``, the default): the test cannot stop early with a
    guarantee, so it reads all N items once (in order, no permutation) and makes the exact decision:
    ``n_data = N`` per step, exactly what :class:`~tallmh.acceptance.Exact` reads, never more.
    (The paper's alternative, a full pass for ``C = max_i |l_i|`` followed by the sequential test, reads
    up to 2N and is strictly worse than deciding from that same pass.) ``range_from="data"`` forces this
    exact pass even when the model has a bound; ``range_from="model"`` raises ConfigError when it has none.

    Support: a read item with a non-finite ``l_i`` rejects at once (reading stops at the end of its
    chunk; ``Decision.n_nonfinite`` counts such items). A proposal with ``log_base = -inf`` (prior or
    proposal ratio) is rejected without reading data. The concentration bounds do not lean on the CLT,
    so ``Decision.excess_error`` is left empty.
    """

    delta: float = 0.01
    bound: str = "bernstein-serfling"
    p: float = 2.0
    gamma: float = 2.0
    initial_batch: int = 100
    range_from: Optional[str] = None  # None (model bound if any, else exact pass), "model" or "data"

    name = "confidence"
    tracks_log_lik = False

    def __post_init__(self):
        if not (0.0 < float(self.delta) < 1.0):
            raise ConfigError(f"Confidence delta must be in (0, 1); got {self.delta}")
        if self.bound not in BOUNDS:
            raise ConfigError(f"unknown bound {self.bound!r}; choose one of {', '.join(BOUNDS)}")
        if not float(self.p) > 1.0:
            raise ConfigError(f"Confidence p must be > 1; got {self.p}")
        if not float(self.gamma) > 1.0:
            raise ConfigError(f"Confidence gamma must be > 1; got {self.gamma}")
        if int(self.initial_batch) < 2:
            raise ConfigError(f"Confidence initial_batch must be at least 2; got {self.initial_batch}")
        if self.range_from not in (None, "model", "data"):
            raise ConfigError(f"range_from must be None, 'model' or 'data'; got {self.range_from!r}")

    def check(self, n: int):
        if self.initial_batch > n:
            raise ConfigError(f"Confidence initial_batch {self.initial_batch} exceeds the number of data items N = {n}")

    def decide(self, key, problem: Problem) -> Decision:
        n = problem.n
        u, k_perm, _ = draw_u(key)
        dtype = problem.log_base.dtype
        psi = (jnp.log(u) - problem.log_base) / n
        if self.range_from == "model" and problem.bound is None:
            raise ConfigError("range_from='model' but the model has no lik_ratio_bound")
        impossible = problem.log_base == -jnp.inf  # rejected without reading data
        if problem.bound is None or self.range_from == "data":
            # No range: one in-order pass over all N items and the exact decision (never more than Exact).
            full = StreamReader(n, 4096, problem.lik_ratio, permuted=False, stop_on_nonfinite=True)
            acc = full.advance(None, MomentsSum.zero(dtype), jnp.where(impossible, 0, n))
            bad = acc.nonfinite
            accept = exact_accept("metropolis", u, problem.log_base, (acc.s.hi, acc.s.lo)) & (bad == 0)
            return Decision(accept, acc.read, jnp.int32(1), None, bad)

        c_range = jnp.asarray(problem.bound(), dtype)
        perm = make_permutation(k_perm)
        reader = StreamReader(n, self.initial_batch, problem.lik_ratio, stop_on_nonfinite=True)
        p = float(self.p)
        gamma = float(self.gamma)

        def cond(c):
            acc, b, look, done = c
            return ~done

        def body(c):
            acc, b, look, _ = c
            acc = reader.advance(perm, acc, b)
            m = acc.m
            look = look + 1
            lf = look.astype(dtype)
            delta_k = (p - 1.0) / (p * lf**p) * self.delta
            tf = jnp.maximum(m.t, 1).astype(dtype)
            sd = jnp.sqrt(m.m2 / tf)
            cb = concentration_bound(self.bound, jnp.maximum(m.t, 1), n, sd, c_range, delta_k)
            done = (jnp.abs(m.mean - psi) > cb) | (acc.read >= n) | (acc.nonfinite > 0)
            b_next = jnp.minimum(n, jnp.ceil(gamma * tf).astype(jnp.int32))
            return acc, b_next, look, done

        init = (MomentsSum.zero(dtype), jnp.int32(self.initial_batch), jnp.int32(0), impossible)
        acc, _, look, _ = jax.lax.while_loop(cond, body, init)
        bad = acc.nonfinite
        exact = exact_accept("metropolis", u, problem.log_base, (acc.s.hi, acc.s.lo))
        accept = jnp.where(acc.read >= n, exact, acc.m.mean > psi) & (bad == 0) & ~impossible
        return Decision(accept, acc.read, look, None, bad)
