"""Gaussian models of the adaptive-subsampling paper's Sec. 4.1 and 4.3.

Both have a range bound ``C_{theta,theta'} >= max_i |l_i|`` (adaptive subsampling paper, eq. 8) from the
smallest and largest data value (``setup``: one pass, counted as set-up items), so the confidence test
needs no full pass per step.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, DataError
from ..model import Model
from ._rounding import rounding_headroom

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

    def log_lik_ratio(self, theta, theta_prop, batch):
        """``l_i = d ((x_i - mu) - d/2) / sigma^2`` with ``d = mu' - mu``: no difference of two rounded log
        densities, and no rounded midpoint ``(mu + mu')/2``, whose error would enter every item alike."""
        d = theta_prop[0] - theta[0]
        return d * ((batch["x"] - theta[0]) - 0.5 * d) / self.sigma**2

    def init(self, data):
        return jnp.zeros(1)

    def factor_bound(self):
        """Quadratic in mu: the Taylor surrogate is exact (:class:`~tallmh.factor_bounds.ZeroRemainder`)."""
        from ..factor_bounds import ZeroRemainder

        return ZeroRemainder()

    def setup(self, data):
        x = jnp.asarray(data["x"])
        if x.ndim != 1:
            raise DataError(f"{type(self).__name__} needs data['x'] of shape (N,); got {x.shape}")
        return {"x_min": jnp.min(x), "x_max": jnp.max(x)}

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """``C = |theta' - theta| / sigma^2 max(|max x - m|, |min x - m|)``, ``m = (theta + theta')/2``.

        ``l(x) = (theta' - theta)(x - m) / sigma^2`` is linear in x, so its largest size over the data is at
        the smallest or largest item (adaptive subsampling paper, Sec. 4.3, whose bound is twice this).
        Plus headroom for the float rounding of the computed ``l_i`` (:func:`rounding_headroom`).
        """
        t, tp = theta[0], theta_prop[0]
        lo, hi = stats["x_min"], stats["x_max"]
        m = 0.5 * (t + tp)
        c = jnp.abs(tp - t) / self.sigma**2 * jnp.maximum(jnp.abs(hi - m), jnp.abs(lo - m))

        def mag(th):  # largest |log p(x_i|th)| and of its terms
            z2 = jnp.maximum((hi - th) ** 2, (lo - th) ** 2) / self.sigma**2
            return 0.5 * z2 + abs(np.log(self.sigma)) + 0.5 * _LOG_2PI

        return rounding_headroom(c, mag(t) + mag(tp))

    def posterior(self, data):
        x = np.asarray(data["x"], float)
        return float(np.mean(x)), self.sigma / np.sqrt(x.shape[0])


class Gaussian(Model):
    """``x_i ~ N(mu, sigma^2)`` with ``theta = (mu, log sigma)`` and a flat prior on theta.

    The adaptive-subsampling paper's Sec. 4.1 example (its Fig. 4 shows the marginal of sigma).
    Data: ``{"x": (N,) array}``.
    """

    name = "gaussian"

    def log_prior(self, theta):
        return jnp.zeros((), theta.dtype)

    def log_lik(self, theta, batch):
        mu, log_s = theta[0], theta[1]
        z = (batch["x"] - mu) * jnp.exp(-log_s)
        return -0.5 * z**2 - log_s - 0.5 * _LOG_2PI

    def log_lik_ratio(self, theta, theta_prop, batch):
        """``l_i = -(z'-z)(z'+z)/2 - (log s' - log s)`` with ``z' - z`` formed without cancellation
        (``(x - mu) e^{-log s} expm1(log s - log s') - (mu' - mu) e^{-log s'}``)."""
        mu, ls = theta[0], theta[1]
        mup, lsp = theta_prop[0], theta_prop[1]
        r = batch["x"] - mu
        z = r * jnp.exp(-ls)
        dz = z * jnp.expm1(ls - lsp) - (mup - mu) * jnp.exp(-lsp)
        return -0.5 * dz * (2.0 * z + dz) - (lsp - ls)

    def init(self, data):
        return jnp.zeros(2)

    def setup(self, data):
        return GaussianMean.setup(self, data)

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """Largest ``|l(x)|`` over ``x in [min x, max x]`` (eq. 8 with the data's range), plus float headroom.

        ``l(x) = log N(x|mu', s'^2) - log N(x|mu, s^2)`` is a quadratic in x, so its largest size over an
        interval is at an end or at the vertex: ``l`` is evaluated at those (at most) three points.
        """
        lo, hi = stats["x_min"], stats["x_max"]
        w, wp = jnp.exp(-2.0 * theta[1]), jnp.exp(-2.0 * theta_prop[1])
        a = 0.5 * (w - wp)  # l(x) = a x^2 + b x + const
        b = theta_prop[0] * wp - theta[0] * w
        safe_a = jnp.where(a != 0, a, 1.0)
        vertex = jnp.clip(jnp.where(a != 0, -b / (2.0 * safe_a), lo), lo, hi)
        pts = jnp.stack([lo, hi, vertex])
        l = self.log_lik(theta_prop, {"x": pts}) - self.log_lik(theta, {"x": pts})
        c = jnp.max(jnp.abs(l))

        def mag(th):
            z2 = jnp.maximum((hi - th[0]) ** 2, (lo - th[0]) ** 2) * jnp.exp(-2.0 * th[1])
            return 0.5 * z2 + jnp.abs(th[1]) + 0.5 * _LOG_2PI

        # the three values are computed like the l_i: twice the per-item headroom covers both roundings
        return rounding_headroom(c, 2.0 * (mag(theta) + mag(theta_prop)))
