"""The full-data acceptance tests: the oracle each approximate test is compared with."""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from ..errors import ConfigError
from .base import Decision, Moments, Problem, StreamReader, draw_u

__all__ = ["Exact"]

_EXACT_CHUNK = 4096


@dataclass(frozen=True)
class Exact:
    """Exact MH test on all N items.

    ``kind="metropolis"``: accept iff ``log u < log_base + sum_i l_i`` (Metropolis et al. 1953; Hastings
    1970; austerity paper eq. 1-2). ``kind="barker"``: accept iff ``log_base + sum_i l_i + X > 0`` with the
    logistic variable ``X = log u - log(1 - u)`` (Barker 1965; minibatch Barker paper eq. 9-10). Both draw
    u from the key exactly as the approximate tests do.

    ``temperature`` T divides the log-likelihood (target ``p0 prod_i p(x_i|theta)^(1/T)``), as in
    :class:`~tallmh.acceptance.Barker`, whose oracle is ``Exact(kind="barker", temperature=T)``.

    Inside :func:`tallmh.sample` the kernel keeps the current full log-likelihood, so a step evaluates
    ``log p(x_i|theta')`` once per item (N items read per step).
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

    def decide(self, key, problem: Problem) -> Decision:
        n = problem.n
        u, _, _ = draw_u(key)
        dtype = problem.log_base.dtype
        if problem.log_lik_current is not None:
            reader = StreamReader(n, self.chunk, problem.log_lik_prop, permuted=False)
            acc = reader.advance(None, Moments.zero(dtype), n)
            ll_prop = acc.mean * n
            lam = ll_prop - problem.log_lik_current
        else:
            reader = StreamReader(n, self.chunk, problem.lik_ratio, permuted=False)
            acc = reader.advance(None, Moments.zero(dtype), n)
            lam = acc.mean * n
            ll_prop = None
        lam = lam / self.temperature
        if self.kind == "metropolis":
            accept = jnp.log(u) < problem.log_base + lam
        else:
            accept = problem.log_base + lam + (jnp.log(u) - jnp.log1p(-u)) > 0
        return Decision(accept, jnp.int32(n), jnp.int32(1), ll_prop)
