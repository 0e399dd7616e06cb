"""Gaussian models of the adaptive-subsampling paper's Sec. 4.1 and 4.3."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError
from ..model import Model

__all__ = ["GaussianMean", "Gaussian"]

_LOG_2PI = float(np.log(2 * np.pi))


class GaussianMean(Model):
    """``x_i ~ N(mu, sigma^2)`` with known sigma and a flat prior on mu (adaptive subsampling, Sec. 4.3).

    Parameter: ``mu`` (scalar array of shape (1,)). Posterior: ``N(mean(x), sigma^2 / N)`` exactly.
    Data: ``{"x": (N,) array}``.
    """

    name = "gaussian-mean"

    def __init__(self, sigma: float = 1.0):
        if not (np.isfinite(sigma) and sigma > 0):
            raise ConfigError(f"sigma must be positive; got {sigma}")
        self.sigma = float(sigma)

    def log_prior(self, theta):
        return jnp.zeros((), theta.dtype)

    def log_lik(self, theta, batch):
        z = (batch["x"] - theta[0]) / self.sigma
        return -0.5 * z**2 - np.log(self.sigma) - 0.5 * _LOG_2PI

    def init(self, data):
        return jnp.zeros(1)

    def posterior(self, data):
        x = np.asarray(data["x"], float)
        return float(np.mean(x)), self.sigma / np.sqrt(x.shape[0])


class Gaussian(Model):
    """``x_i ~ N(mu, sigma^2)`` with ``theta = (mu, log sigma)`` and a flat prior on theta.

    The adaptive-subsampling paper's Sec. 4.1 example (its Fig. 4 shows the marginal of sigma).
    """

    name = "gaussian"

    def log_prior(self, theta):
        return jnp.zeros((), theta.dtype)

    def log_lik(self, theta, batch):
        mu, log_s = theta[0], theta[1]
        z = (batch["x"] - mu) * jnp.exp(-log_s)
        return -0.5 * z**2 - log_s - 0.5 * _LOG_2PI

    def init(self, data):
        return jnp.zeros(2)
