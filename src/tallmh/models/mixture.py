"""The 2-D Gaussian mixture of Welling & Teh (2011), as used in the minibatch Barker paper Sec. 6.1."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from ..errors import ConfigError, DataError
from ..model import Model
from ._rounding import rounding_headroom

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

    def setup(self, data):
        x = jnp.asarray(data["x"])
        if x.ndim != 1:
            raise DataError(f"GaussianMixture needs data['x'] of shape (N,); got {x.shape}")
        return {"x_min": jnp.min(x), "x_max": jnp.max(x)}

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """``C >= max_i |l_i|`` (adaptive subsampling paper, eq. 8) from the data's range, plus float headroom.

        With equal weights, ``sum_k w p'_k(x) / sum_k w p_k(x)`` lies between the smallest and the largest
        per-component ratio ``p'_k(x)/p_k(x)``, and ``log p'_k(x)/p_k(x) = (m'_k - m_k)(x - (m_k + m'_k)/2)
        / sx^2`` is linear in x (component means ``m_1 = theta_1``, ``m_2 = theta_1 + theta_2``). So
        ``|l(x)| <= max_k |m'_k - m_k| max(|max x - c_k|, |min x - c_k|) / (sx^2 T)``, ``c_k`` the midpoints.
        """
        lo, hi = stats["x_min"], stats["x_max"]
        m = jnp.stack([theta[0], theta[0] + theta[1]])
        mp = jnp.stack([theta_prop[0], theta_prop[0] + theta_prop[1]])
        mid = 0.5 * (m + mp)
        reach = jnp.maximum(jnp.abs(hi - mid), jnp.abs(lo - mid))
        c = jnp.max(jnp.abs(mp - m) * reach) / self.var_x / self.temperature

        def mag(mm):  # largest size of a component's log density over the data, tempered
            z2 = jnp.max(jnp.maximum((hi - mm) ** 2, (lo - mm) ** 2)) / self.var_x
            return (0.5 * z2 + abs(0.5 * np.log(2 * np.pi * self.var_x) - np.log(0.5)) + 1.0) / self.temperature

        # logsumexp adds a few roundings of its own: 16 ulps of the magnitudes
        return rounding_headroom(c, mag(m) + mag(mp), ops=16.0)

    @staticmethod
    def simulate(n: int, theta=(0.0, 1.0), var_x: float = 2.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        comp = rng.random(n) < 0.5
        mu = np.where(comp, theta[0], theta[0] + theta[1])
        return {"x": mu + np.sqrt(var_x) * rng.standard_normal(n)}
