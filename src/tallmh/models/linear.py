"""Bayesian linear regression with known noise: a posterior in closed form, for tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, DataError
from ..model import Model

__all__ = ["LinearRegression"]


class LinearRegression(Model):
    """``y_i ~ N(x_i . theta, noise_sd^2)``, ``theta ~ N(0, prior_scale^2 I)``.

    :meth:`posterior` gives the exact Gaussian posterior (mean, covariance).
    """

    name = "linear-regression"

    def __init__(self, prior_scale: float = 10.0, noise_sd: float = 1.0):
        for nm, v in (("prior_scale", prior_scale), ("noise_sd", noise_sd)):
            if not (np.isfinite(v) and v > 0):
                raise ConfigError(f"{nm} must be positive; got {v}")
        self.prior_scale = float(prior_scale)
        self.noise_sd = float(noise_sd)

    def log_prior(self, theta):
        s = self.prior_scale
        return -0.5 * jnp.sum(theta**2) / s**2 - theta.shape[0] * (np.log(s) + 0.5 * np.log(2 * np.pi))

    def log_lik(self, theta, batch):
        r = batch["y"] - batch["X"] @ theta
        s = self.noise_sd
        return -0.5 * (r / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)

    def init(self, data):
        if np.ndim(data["X"]) != 2:
            raise DataError(f"LinearRegression needs data['X'] of shape (N, d); got {np.shape(data['X'])}")
        return jnp.zeros(np.shape(data["X"])[1])

    def setup(self, data):
        return {"max_norm": jnp.max(jnp.linalg.norm(jnp.asarray(data["X"]), axis=1))}

    def cv_remainder_bound(self, theta, theta_prop, center, stats, order):
        """Bound on ``max_i |l~_i|`` under Taylor control variates at ``center`` (flat vectors).

        The log-likelihood is quadratic, so the second-order remainder is 0 and the first-order one is
        ``-(x_i . a)^2 / (2 noise_sd^2)``, at most ``max_i ||x_i||^2 ||a||^2 / (2 noise_sd^2)`` in size.
        """
        if order == 2:
            return jnp.zeros((), theta.dtype)
        x2 = stats["max_norm"] ** 2 / (2.0 * self.noise_sd**2)
        return x2 * (jnp.sum((theta - center) ** 2) + jnp.sum((theta_prop - center) ** 2))

    def posterior(self, data):
        """Exact posterior mean and covariance (float64 numpy)."""
        X = np.asarray(data["X"], float)
        y = np.asarray(data["y"], float)
        prec = X.T @ X / self.noise_sd**2 + np.eye(X.shape[1]) / self.prior_scale**2
        cov = np.linalg.inv(prec)
        return cov @ (X.T @ y) / self.noise_sd**2, cov

    @staticmethod
    def simulate(n: int, d: int = 3, noise_sd: float = 1.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, d))
        theta = rng.standard_normal(d)
        y = X @ theta + noise_sd * rng.standard_normal(n)
        return {"X": X, "y": y}, theta
