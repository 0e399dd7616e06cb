"""Langevin proposal with a minibatch gradient, corrected by the MH test (austerity paper, Sec. 5.4)."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..data import make_permutation, permute
from ..errors import ConfigError

__all__ = ["Langevin"]


class LangevinState(NamedTuple):
    step_size: jax.Array


class Langevin:
    """``theta' = theta + (h/2) g_B(theta) + sqrt(h) z`` with a minibatch gradient estimate ``g_B``.

    ``g_B(theta) = grad log p0(theta) + (N/b) sum_{i in B} grad log p(x_i|theta)`` over a minibatch B of
    ``batch_size`` items drawn without replacement (O(b) through the keyed permutation); with control
    variates on, the estimate is ``grad log p0 + G + H (theta - theta_hat) + (N/b) sum_B (grad ell_i(theta) -
    grad ell_i(theta_hat) - H_i (theta - theta_hat))``. Each minibatch defines its own proposal kernel
    ``q_B``, and the MH test uses ``log q_B(theta|theta') - log q_B(theta'|theta)`` with the *same* B
    both ways, so each component kernel satisfies detailed balance and so does their mixture (austerity
    paper Sec. 5.4). Without a test this is SGLD (Welling & Teh 2011), which is biased.

    Items read for the gradient (2b per step: at theta and theta') are not in ``n_data``, which counts
    the acceptance test's items; they are reported by ``result.stats`` as part of ``n_data`` only if
    ``count_gradient_items`` (default True) is set, which adds ``2 b`` to each step.
    """

    name = "langevin"
    needs_data = True

    def __init__(self, step_size: float, batch_size: int = 100, count_gradient_items: bool = True):
        if not (np.isfinite(step_size) and step_size > 0):
            raise ConfigError(f"Langevin step_size must be positive; got {step_size}")
        if int(batch_size) < 1:
            raise ConfigError(f"Langevin batch_size must be at least 1; got {batch_size}")
        self.step_size = float(step_size)
        self.batch_size = int(batch_size)
        self.count_gradient_items = bool(count_gradient_items)

    def check(self, n: int):
        if self.batch_size > n:
            raise ConfigError(f"Langevin batch_size {self.batch_size} exceeds the number of data items N = {n}")

    def init(self, theta, n: int) -> LangevinState:
        return LangevinState(jnp.asarray(self.step_size, theta.dtype))

    def items_per_step(self) -> int:
        return 2 * self.batch_size if self.count_gradient_items else 0

    def propose_with_data(self, key, theta, state: LangevinState, grad_fn, n: int):
        """``grad_fn(theta, idx)`` returns the minibatch gradient estimate on items ``idx``."""
        k_b, k_z = jax.random.split(key)
        idx = permute(make_permutation(k_b), jnp.arange(self.batch_size), n)
        h = state.step_size
        g = grad_fn(theta, idx)
        theta_p = theta + 0.5 * h * g + jnp.sqrt(h) * jax.random.normal(k_z, theta.shape, theta.dtype)
        g_p = grad_fn(theta_p, idx)
        fwd = -jnp.sum((theta_p - theta - 0.5 * h * g) ** 2) / (2 * h)
        bwd = -jnp.sum((theta - theta_p - 0.5 * h * g_p) ** 2) / (2 * h)
        return theta_p, bwd - fwd

    def propose(self, key, theta, state):
        raise ConfigError("the Langevin proposal needs the data; use it through tallmh.sample")

    def update(self, state, theta, accepted, step):
        return state
