"""The 2-D Gaussian mixture of Welling & Teh (2011), as used in the minibatch Barker paper Sec. 6.1."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from ..errors import ConfigError
from ..model import Model

__all__ = ["GaussianMixture"]


class GaussianMixture(Model):
    """``theta ~ N(0, diag(s1^2, s2^2))``, ``x_i ~ 0.5 N(theta_1, sx^2) + 0.5 N(theta_1 + theta_2, sx^2)``.

    Eq. (21) of the minibatch Barker paper with ``s1^2 = 10, s2^2 = 1, sx^2 = 2``. ``temperature`` T
    tempers the likelihood: the target is ``p0(theta) prod_i p(x_i|theta)^(1/T)`` (the paper uses
    N = 10^6 and T = 10^4 to recover the shape of the original 100-point posterior).
    """

    name = "gaussian-mixture"

    def __init__(self, temperature: float = 1.0, var1: float = 10.0, var2: float = 1.0, var_x: float = 2.0):
        for nm, v in (("temperature", temperature), ("var1", var1), ("var2", var2), ("var_x", var_x)):
            if not (np.isfinite(v) and v > 0):
                raise ConfigError(f"{nm} must be positive; got {v}")
        self.temperature = float(temperature)
        self.var1, self.var2, self.var_x = float(var1), float(var2), float(var_x)

    def log_prior(self, theta):
        return (-0.5 * theta[0] ** 2 / self.var1 - 0.5 * theta[1] ** 2 / self.var2
                - 0.5 * np.log(self.var1 * self.var2) - np.log(2 * np.pi))

    def log_lik(self, theta, batch):
        x = batch["x"]
        c = -0.5 * np.log(2 * np.pi * self.var_x) + np.log(0.5)
        a = c - 0.5 * (x - theta[0]) ** 2 / self.var_x
        b = c - 0.5 * (x - theta[0] - theta[1]) ** 2 / self.var_x
        return logsumexp(jnp.stack([a, b]), axis=0) / self.temperature

    def init(self, data):
        return jnp.zeros(2)

    @staticmethod
    def simulate(n: int, theta=(0.0, 1.0), var_x: float = 2.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        comp = rng.random(n) < 0.5
        mu = np.where(comp, theta[0], theta[0] + theta[1])
        return {"x": mu + np.sqrt(var_x) * rng.standard_normal(n)}
