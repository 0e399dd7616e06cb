"""Bayesian linear regression with known noise: a posterior in closed form, for tests."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, DataError
from ..model import Model
from ._rounding import rounding_headroom

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
        return {"max_norm": jnp.max(jnp.linalg.norm(jnp.asarray(data["X"]), axis=1)),
                "max_abs_y": jnp.max(jnp.abs(jnp.asarray(data["y"])))}

    def _magnitude(self, theta, stats):
        """Bound on ``|log p(y_i|x_i, theta)|`` and the terms it is made of (for rounding headroom)."""
        r = stats["max_abs_y"] + stats["max_norm"] * jnp.linalg.norm(theta)
        return 0.5 * r**2 / self.noise_sd**2 + abs(np.log(self.noise_sd)) + 0.5 * np.log(2 * np.pi) + 1.0

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """``C >= max_i |l_i|`` (adaptive subsampling paper, eq. 8), plus float headroom.

        ``l_i = (x_i . (theta' - theta)) (y_i - x_i . (theta + theta')/2) / noise_sd^2``, so ``|l_i| <=
        max ||x|| ||theta' - theta|| (max |y| + max ||x|| ||theta + theta'|| / 2) / noise_sd^2``.
        """
        x = stats["max_norm"]
        c = x * jnp.linalg.norm(theta_prop - theta) * (
            stats["max_abs_y"] + 0.5 * x * jnp.linalg.norm(theta + theta_prop)) / self.noise_sd**2
        ops = 4.0 + 0.5 * theta.shape[0]
        return rounding_headroom(c, self._magnitude(theta, stats) + self._magnitude(theta_prop, stats), ops)

    def cv_remainder_bound(self, theta, theta_prop, center, stats, order):
        """Bound on ``max_i |l~_i|`` under Taylor control variates at ``center`` (flat vectors).

        The log-likelihood is quadratic, so the second-order remainder is 0 and the first-order one is
        ``-(x_i . a)^2 / (2 noise_sd^2)``, at most ``max_i ||x_i||^2 ||a||^2 / (2 noise_sd^2)`` in size.
        Plus headroom for float rounding: the computed ``l~_i`` carry the rounding of ``log p`` at theta
        and theta' and of the proxy terms (the exact remainder of order 2 is 0, the computed one is not).
        """
        x = stats["max_norm"]
        a2 = jnp.sum((theta - center) ** 2)
        ap2 = jnp.sum((theta_prop - center) ** 2)
        if order == 2:
            c = jnp.zeros((), theta.dtype)
        else:
            c = x**2 / (2.0 * self.noise_sd**2) * (a2 + ap2)
        rc = stats["max_abs_y"] + x * jnp.linalg.norm(center)
        proxy = (rc * x * (jnp.sqrt(a2) + jnp.sqrt(ap2)) + 0.5 * x**2 * (a2 + ap2)) / self.noise_sd**2
        mag = self._magnitude(theta, stats) + self._magnitude(theta_prop, stats) + proxy
        return rounding_headroom(c, mag, 4.0 + 0.5 * theta.shape[0])

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
