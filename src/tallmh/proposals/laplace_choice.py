"""Two proposals around the run's Laplace approximation in one compiled kernel, one of them chosen in warmup.

:class:`LaplaceChoice` proposes either as :class:`~tallmh.proposals.CrankNicolson` (``mode`` 0: rho adapted in
warmup, 0 being the independence sampler) or as :class:`~tallmh.proposals.SurrogateLangevin` (``mode`` 1: MALA on
the surrogate, fixed step ``1.65 d^(-1/3)`` in Laplace sd). Which one is a field of the chain's state, so the
runner switches between them without compiling again; it runs the Crank-Nicolson warmup, then, unless the
independence sampler is seen to be fine, a MALA pilot, and fixes the mode for the draws kept
(:mod:`tallmh.run.proposal_choice`). After warmup nothing adapts: the draws come from one fixed MH kernel.
Neither proposal reads data (O(d^2) per step each; both are computed and one is selected).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from .laplace import LaplaceState, from_run

__all__ = ["LaplaceChoice", "MALA_STEP"]

MALA_STEP = 1.65  # MALA's step in Laplace sd is MALA_STEP * d^(-1/3) (Roberts & Rosenthal 1998's scaling)


class ChoiceState(NamedTuple):
    lap: LaplaceState  # centre, factor, its inverse, Crank-Nicolson's log(1 - rho)
    mode: jax.Array  # int32: 0 Crank-Nicolson, 1 MALA on the surrogate
    step: jax.Array  # MALA's step (Laplace sd)


class LaplaceChoice:
    """Crank-Nicolson or surrogate MALA from the run's Laplace approximation, the choice a field of the state.

    ``mode`` 0 is :class:`~tallmh.proposals.CrankNicolson` (Cotter et al. 2013, eq. 4.2) with ``rho`` adapted
    during warmup towards ``target_accept`` (as there); ``mode`` 1 is :class:`~tallmh.proposals.SurrogateLangevin`
    (preconditioned MALA on the Laplace approximation, Roberts & Tweedie 1996) with step ``mala_step`` (default
    ``1.65 d^(-1/3)``). Chains start in mode 0; the runner sets the mode (:mod:`tallmh.run.proposal_choice`).
    """

    name = "laplace-choice"
    needs_data = False
    uses_center = uses_cov_hint = True
    selects = True  # the runner chooses the mode in warmup

    def __init__(self, rho: float = 0.0, target_accept: float = 0.25, mala_step=None):
        if not 0.0 <= rho < 1.0:
            raise ConfigError(f"LaplaceChoice rho must lie in [0, 1); got {rho}")
        if not 0.0 < target_accept < 1.0:
            raise ConfigError(f"LaplaceChoice target_accept must lie in (0, 1); got {target_accept}")
        if mala_step is not None and not mala_step > 0:
            raise ConfigError(f"LaplaceChoice mala_step must be positive; got {mala_step}")
        self.rho, self.target_accept = float(rho), float(target_accept)
        self.mala_step = None if mala_step is None else float(mala_step)
        self.adapt = True
        self._chosen = None  # (not a setting: out of the run's fingerprint)

    @property
    def chosen(self):
        """The proposal warmup chose, by name (``"crank-nicolson"`` or ``"surrogate-mala"``); None before."""
        return self._chosen

    def init(self, theta, n: int, cov_hint=None, center=None) -> ChoiceState:
        c, L, Linv = from_run(theta, cov_hint, center, type(self).__name__)
        d = theta.shape[0]
        e = self.mala_step if self.mala_step is not None else MALA_STEP * d ** (-1.0 / 3.0)
        lap = LaplaceState(c, L, Linv, jnp.asarray(np.log1p(-self.rho), theta.dtype))
        return ChoiceState(lap, jnp.zeros((), jnp.int32), jnp.asarray(e, theta.dtype))

    def propose(self, key, theta, state: ChoiceState):
        lap = state.lap
        xi = jax.random.normal(key, theta.shape, theta.dtype)
        z = lap.chol_inv @ (theta - lap.center)
        # Crank-Nicolson: reversible for N(0, I) in whitened coordinates
        r = -jnp.expm1(lap.log_gap)
        zp_cn = r * z + jnp.sqrt(1.0 - r * r) * xi
        # MALA on the surrogate: drift -(e^2 / 2) z, its own Gaussian ratio
        e = state.step
        a = 1.0 - 0.5 * e * e
        zp_m = a * z + e * xi
        zp = jnp.where(state.mode == 1, zp_m, zp_cn)
        log_q_cn = 0.5 * (zp @ zp - z @ z)
        rb, rf = z - a * zp, zp - a * z
        log_q_m = 0.5 * (rf @ rf - rb @ rb) / (e * e)
        return lap.center + lap.chol @ zp, jnp.where(state.mode == 1, log_q_m, log_q_cn)

    def update(self, state: ChoiceState, theta, accepted, step):
        lap = state.lap
        g = (step.astype(theta.dtype) + 1.0) ** -0.6
        top = np.log1p(-self.rho)
        gap = jnp.clip(lap.log_gap + g * (accepted.astype(theta.dtype) - self.target_accept), np.log(1e-4), top)
        # only the Crank-Nicolson mode adapts (its rho); MALA's step is fixed
        return state._replace(lap=lap._replace(log_gap=jnp.where(state.mode == 0, gap, lap.log_gap)))
