"""Gaussian random-walk proposal."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = ["RandomWalk"]


class RWState(NamedTuple):
    chol: jax.Array  # (d, d) lower Cholesky factor of the proposal covariance


class RandomWalk:
    """Symmetric Gaussian random walk ``theta' = theta + L z``, ``z ~ N(0, I)``; ``log q`` ratio 0.

    ``scale``: a scalar (isotropic sd), a vector of per-coordinate sds, or a (d, d) covariance matrix
    (over the flattened parameter vector).
    """

    name = "random-walk"

    def __init__(self, scale=0.1):
        s = np.asarray(scale, dtype=float)
        if not np.all(np.isfinite(s)):
            raise ConfigError("RandomWalk scale must be finite")
        if s.ndim <= 1 and np.any(s <= 0):
            raise ConfigError(f"RandomWalk scale must be positive; got {scale}")
        if s.ndim == 2:
            if s.shape[0] != s.shape[1]:
                raise ConfigError(f"RandomWalk covariance must be square; got shape {s.shape}")
            try:
                np.linalg.cholesky(s)
            except np.linalg.LinAlgError as e:
                raise ConfigError("RandomWalk covariance matrix is not positive definite") from e
        if s.ndim > 2:
            raise ConfigError("RandomWalk scale must be a scalar, a vector of sds or a covariance matrix")
        self.scale = s

    def init(self, theta, n: int) -> RWState:
        d = theta.shape[0]
        s = self.scale
        if s.ndim == 0:
            chol = jnp.eye(d) * s
        elif s.ndim == 1:
            if s.shape[0] != d:
                raise ConfigError(f"RandomWalk got {s.shape[0]} sds for a {d}-dimensional parameter")
            chol = jnp.diag(jnp.asarray(s))
        else:
            if s.shape[0] != d:
                raise ConfigError(f"RandomWalk covariance is {s.shape}, parameter has dimension {d}")
            chol = jnp.linalg.cholesky(jnp.asarray(s))
        return RWState(chol.astype(theta.dtype))

    def propose(self, key, theta, state: RWState):
        z = jax.random.normal(key, theta.shape, theta.dtype)
        return theta + state.chol @ z, jnp.zeros((), theta.dtype)

    def update(self, state, theta, accepted, step):
        return state
