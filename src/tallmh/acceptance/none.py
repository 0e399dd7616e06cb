"""No test at all: always accept (for uncorrected SGLD; biased by design)."""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp

from .base import Decision, Problem

__all__ = ["AlwaysAccept"]


@dataclass(frozen=True)
class AlwaysAccept:
    """Accept every proposal without reading data.

    With :class:`tallmh.proposals.Langevin` this is stochastic gradient Langevin dynamics (Welling &
    Teh 2011), whose stationary distribution is biased for any step size > 0 (austerity paper Fig. 8).
    Provided as the baseline the MH-corrected samplers are compared with, not for inference.
    """

    name = "none"
    tracks_log_lik = False

    def check(self, n: int):
        return None

    def decide(self, key, problem: Problem) -> Decision:
        return Decision(jnp.bool_(True), jnp.int32(0), jnp.int32(0))
