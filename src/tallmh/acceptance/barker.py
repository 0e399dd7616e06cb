"""The minibatch Barker test with an additive correction variable (Seita et al. 2017, Alg. 1)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from ..storage.data import make_permutation
from ..errors import ConfigError
from .base import Decision, MomentsSum, Problem, StreamReader, draw_u
from .exact import exact_accept

__all__ = ["Barker"]


@dataclass(frozen=True)
class Barker:
    """Minibatch Barker acceptance test (minibatch Barker paper, Sec. 3-5, Algorithm 1).

    The exact Barker test accepts iff ``Delta + X_log > 0`` with ``Delta`` the full log acceptance ratio
    (eq. 6-7) and ``X_log`` logistic (eq. 10). From a minibatch of b items the test forms
    ``Delta* = (N/T) mean_i l_i + log_base`` (eq. 8), whose sampling variance is estimated by
    ``s^2 = (N/T)^2 s_l^2 / b (1 - b/N)`` (without replacement). It reads ``batch_size`` more items while
    ``s^2 >= 1`` or the CLT error estimate ``eps = (6.4 E|X|^3 + 2 E|X|)/sqrt(b)`` (Corollary 1, with the
    moments of the standardised ``l_i`` estimated from the minibatch) exceeds ``delta``; then draws
    ``X_nc ~ N(0, 1 - s^2)`` and ``X_corr`` from the precomputed correction distribution ``C_1`` (Sec. 4,
    ``scripts/make_barker_correction.py``) and accepts iff ``Delta* + X_nc + X_corr > 0`` (eq. 13). The
    acceptance probability then differs from the exact Barker one by at most eps (Corollary 2) plus the
    table's own L_inf error.

    If the minibatch grows to all N items, the test decides exactly, with the same logistic variable
    ``logit(u)`` that :class:`~tallmh.acceptance.Exact` ``(kind="barker", temperature=T)`` draws from the
    key. A sample
    standard deviation of 0 (all ``l_i`` equal so far) gives no information on the spread and makes the
    test read more (the same guard as the austerity test).

    ``temperature`` T divides the log-likelihood: the chain targets ``p0(theta) prod_i p(x_i|theta)^(1/T)``.

    Support: a read item with a non-finite ``l_i`` rejects at once (reading stops at the end of its
    chunk; ``Decision.n_nonfinite`` counts such items); a proposal with ``log_base = -inf`` is rejected
    without reading data. The stopping rule enforces the paper's own bound on the acceptance probability's
    error (eps <= delta above), so ``Decision.excess_error`` is left empty; the self-audit measures the
    acceptance bias directly.
    """

    batch_size: int = 100
    delta: float = 0.5
    temperature: float = 1.0

    name = "barker"
    tracks_log_lik = False

    def __post_init__(self):
        if int(self.batch_size) < 2:
            raise ConfigError(f"Barker batch_size must be at least 2; got {self.batch_size}")
        if not (0.0 < float(self.delta) < 1.0):
            raise ConfigError(f"Barker delta must be in (0, 1); got {self.delta}")
        if not float(self.temperature) > 0.0:
            raise ConfigError(f"Barker temperature must be positive; got {self.temperature}")

    def check(self, n: int):
        if self.batch_size > n:
            raise ConfigError(f"Barker batch_size {self.batch_size} exceeds the number of data items N = {n}")

    def decide(self, key, problem: Problem) -> Decision:
        from ._correction import load_correction, sample_correction

        table = load_correction()
        n = problem.n
        u, k_perm, k_extra = draw_u(key)
        dtype = problem.log_base.dtype
        perm = make_permutation(k_perm)
        reader = StreamReader(n, self.batch_size, problem.lik_ratio, stop_on_nonfinite=True,
                              ladder_base=None)  # each look reads batch_size more: one rung suffices
        scale = jnp.asarray(n / float(self.temperature), dtype)
        nf = jnp.asarray(n, dtype)
        impossible = problem.log_base == -jnp.inf  # rejected without reading data

        def stats(m):
            tf = jnp.maximum(m.t, 1).astype(dtype)
            var_l = m.var()
            s2 = scale**2 * var_l / tf * jnp.maximum(1.0 - tf / nf, 0.0)
            sd_b = jnp.sqrt(m.m2 / tf)  # sd normalised by t, for the standardised moments
            safe = jnp.where(sd_b > 0, sd_b, 1.0)
            rho1 = m.abs1 / tf / safe
            rho3 = m.abs3 / tf / safe**3
            eps = jnp.where(sd_b > 0, (6.4 * rho3 + 2.0 * rho1) / jnp.sqrt(tf), jnp.inf)
            return s2, eps

        def cond(c):
            acc, rounds = c
            s2, eps = stats(acc.m)
            return (acc.read < n) & (acc.nonfinite == 0) & ~impossible & ((s2 >= 1.0) | (eps > self.delta))

        def body(c):
            acc, rounds = c
            return reader.advance(perm, acc, jnp.minimum(acc.read + self.batch_size, n)), rounds + 1

        acc0 = reader.advance(perm, MomentsSum.zero(dtype), jnp.where(impossible, 0, self.batch_size))
        acc, rounds = jax.lax.while_loop(cond, body, (acc0, jnp.int32(1)))
        m = acc.m
        s2, _ = stats(m)
        delta_star = scale * m.mean + problem.log_base
        k_nc, k_corr = jax.random.split(k_extra)
        x_nc = jnp.sqrt(jnp.maximum(1.0 - s2, 0.0)) * jax.random.normal(k_nc, (), dtype)
        x_corr = sample_correction(k_corr, jnp.asarray(table.values, dtype), jnp.asarray(table.cdf, dtype))
        exact = exact_accept("barker", u, problem.log_base, (acc.s.hi, acc.s.lo), self.temperature)
        accept = jnp.where(acc.read >= n, exact, delta_star + x_nc + x_corr > 0)
        bad = acc.nonfinite
        accept = accept & (bad == 0) & ~impossible
        return Decision(accept, acc.read, rounds, None, bad)
