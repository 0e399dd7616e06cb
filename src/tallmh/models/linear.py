"""Bayesian linear regression, with the noise sd known or sampled; posteriors in closed form for tests."""

from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import jax
import numpy as np

from ..errors import ConfigError, DataError
from ._target import check_target
from ..model import Model
from ._rounding import rounding_headroom

__all__ = ["LinearRegression"]

_LOG_2PI = float(np.log(2 * np.pi))


def _sufficient_stats(data, chunk: int = 262_144):
    """``X'X``, ``X'y``, ``y'y`` and N in float64, reading the rows in chunks (one pass)."""
    X, y = data["X"], data["y"]
    n, d = np.shape(X)
    xtx = np.zeros((d, d))
    xty = np.zeros(d)
    yty = 0.0
    for a in range(0, n, chunk):
        Xs = np.asarray(X[a:a + chunk], np.float64)
        ys = np.asarray(y[a:a + chunk], np.float64)
        xtx += Xs.T @ Xs
        xty += Xs.T @ ys
        yty += float(ys @ ys)
    return xtx, xty, yty, n


class LinearRegression(Model):
    """``y_i ~ N(x_i . beta, sigma^2)``, ``beta ~ N(0, prior_scale^2 I)``.

    ``noise_sd``: a number fixes ``sigma`` (the parameter is ``beta``, shape ``(d,)``); ``None`` samples it:
    the parameter is then ``theta = (beta, log sigma)``, shape ``(d + 1,)``, with the prior
    ``log sigma ~ N(0, noise_prior_scale^2)`` (weakly informative on the log scale: with the default 5,
    sigma between e^-10 and e^10 at two prior sd). The default ``noise_sd=1.0`` keeps the fixed model of
    earlier versions: only right when the noise sd really is 1; pass ``noise_sd=None`` otherwise.

    :meth:`posterior` gives the exact posterior mean and covariance (closed form when sigma is fixed; a
    one-dimensional quadrature over ``log sigma`` of the conjugate Gaussian in ``beta`` when sampled).
    """

    name = "linear-regression"

    def __init__(self, prior_scale: float = 10.0, noise_sd: Optional[float] = 1.0, noise_prior_scale: float = 5.0):
        checks = [("prior_scale", prior_scale), ("noise_prior_scale", noise_prior_scale)]
        if noise_sd is not None:
            checks.append(("noise_sd", noise_sd))
        for nm, v in checks:
            try:
                ok = bool(np.isfinite(v) and v > 0)
            except TypeError:
                ok = False
            if not ok:
                raise ConfigError(f"{nm} must be a positive number; got {v!r}")
        self.prior_scale = float(prior_scale)
        self.noise_sd = None if noise_sd is None else float(noise_sd)
        self.noise_prior_scale = float(noise_prior_scale)
        if self.noise_sd is None:
            # with sigma sampled there is no finite range bound (sigma -> 0) and the log-likelihood is not
            # quadratic in (beta, log sigma): no bounds, for the confidence test with or without control variates
            self.lik_ratio_bound = None
            self.cv_remainder_bound = None
            self.factor_bound = None  # (nor a remainder bound for the exact subsampled test)

    @property
    def samples_noise(self) -> bool:
        """True when ``sigma`` is a parameter (``noise_sd=None``)."""
        return self.noise_sd is None

    def describe_prior(self) -> str:
        """The prior in words, e.g. for a report."""
        s = f"beta ~ N(0, {self.prior_scale:g}^2) per coefficient"
        if self.samples_noise:
            return s + f"; log sigma ~ N(0, {self.noise_prior_scale:g}^2) (sigma: the noise sd, sampled)"
        return s + f"; noise sd fixed at {self.noise_sd:g}"

    # --- the model -------------------------------------------------------------------------------

    def _split(self, theta):
        if self.samples_noise:
            return theta[:-1], theta[-1]
        return theta, None

    def log_prior(self, theta):
        beta, log_sigma = self._split(theta)
        s = self.prior_scale
        lp = -0.5 * jnp.sum(beta**2) / s**2 - beta.shape[0] * (np.log(s) + 0.5 * _LOG_2PI)
        if log_sigma is not None:
            t = self.noise_prior_scale
            lp = lp - 0.5 * (log_sigma / t) ** 2 - np.log(t) - 0.5 * _LOG_2PI
        return lp

    def log_lik(self, theta, batch):
        beta, log_sigma = self._split(theta)
        r = batch["y"] - batch["X"] @ beta
        if log_sigma is None:
            s = self.noise_sd
            return -0.5 * (r / s) ** 2 - np.log(s) - 0.5 * _LOG_2PI
        return -0.5 * (r * jnp.exp(-log_sigma)) ** 2 - log_sigma - 0.5 * _LOG_2PI

    def log_lik_ratio(self, theta, theta_prop, batch):
        """``l_i`` without cancellation: with ``r = y - x.beta`` and ``dr = -x.(beta' - beta)`` formed
        directly, ``z = r/s``, ``z' - z = z expm1(log s - log s') + dr/s'`` and
        ``l_i = -(z' - z)(z' + z)/2 - (log s' - log s)`` (fixed s: ``-dr (2 r + dr) / (2 s^2)``)."""
        beta, ls = self._split(theta)
        beta_p, ls_p = self._split(theta_prop)
        r = batch["y"] - batch["X"] @ beta
        dr = -(batch["X"] @ (beta_p - beta))
        if ls is None:
            return -0.5 * dr * (2.0 * r + dr) / self.noise_sd**2
        z = r * jnp.exp(-ls)
        dz = z * jnp.expm1(ls - ls_p) + dr * jnp.exp(-ls_p)
        return -0.5 * dz * (2.0 * z + dz) - (ls_p - ls)

    def init(self, data):
        if np.ndim(data["X"]) != 2:
            raise DataError(f"LinearRegression needs data['X'] of shape (N, d); got {np.shape(data['X'])}")
        d = np.shape(data["X"])[1]
        if isinstance(data.get("y"), (np.ndarray, jax.Array)):  # (in memory or memory-mapped: N values read)
            check_target(data["y"])
        if not self.samples_noise:
            return jnp.zeros(d)
        sd_y = float(np.std(np.asarray(data["y"], np.float64)))  # a start on the scale of the target
        return jnp.concatenate([jnp.zeros(d), jnp.full((1,), np.log(sd_y) if sd_y > 0 else 0.0)])

    def setup(self, data):
        return {"max_norm": jnp.max(jnp.linalg.norm(jnp.asarray(data["X"]), axis=1)),
                "max_abs_y": jnp.max(jnp.abs(jnp.asarray(data["y"])))}

    def _magnitude(self, theta, stats):
        """Bound on ``|log p(y_i|x_i, theta)|`` and the terms it is made of (for rounding headroom)."""
        r = stats["max_abs_y"] + stats["max_norm"] * jnp.linalg.norm(theta)
        return 0.5 * r**2 / self.noise_sd**2 + abs(np.log(self.noise_sd)) + 0.5 * np.log(2 * np.pi) + 1.0

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """``C >= max_i |l_i|`` (adaptive subsampling paper, eq. 8), plus float headroom; sigma fixed (with sigma
        sampled the instance attribute is None).

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

        Sigma fixed. The log-likelihood is quadratic, so the second-order remainder is 0 and the first-order one is
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

    # --- exact answers ----------------------------------------------------------------------------

    def factor_bound(self):
        """With sigma fixed the log-likelihood is quadratic in beta: its second-order Taylor expansion is exact,
        every remainder zero (:class:`~tallmh.factor_bounds.ZeroRemainder`), and the exact subsampled test reads
        no item. (With sigma sampled there is no bound.)"""
        from ..factor_bounds import ZeroRemainder

        return ZeroRemainder()

    def posterior(self, data):
        """Exact posterior mean and covariance (float64 numpy).

        Sigma fixed: the conjugate Gaussian of ``beta``. Sigma sampled: mean and covariance of
        ``(beta, log sigma)``, integrating the conjugate Gaussian ``beta | sigma, y`` against
        ``p(log sigma | y)`` on a grid of 3,001 points over +-14 Laplace sd of ``log sigma`` (the marginal
        likelihood ``p(y | sigma)`` is Gaussian in ``y``, computed from ``X'X``, ``X'y``, ``y'y``).
        """
        xtx, xty, yty, n = _sufficient_stats(data)
        if not self.samples_noise:
            prec = xtx / self.noise_sd**2 + np.eye(xtx.shape[0]) / self.prior_scale**2
            cov = np.linalg.inv(prec)
            return cov @ xty / self.noise_sd**2, cov
        lam, V = np.linalg.eigh(xtx)
        lam = np.maximum(lam, 0.0)
        z = V.T @ xty  # X'y in the eigenbasis
        s0sq = self.prior_scale**2
        tau = self.noise_prior_scale

        def log_post_u(u):  # log p(y | sigma = e^u) + log prior(u), up to a constant
            s2 = np.exp(2 * u)
            a = lam / s2 + 1.0 / s0sq  # eigenvalues of the posterior precision of beta
            return (-n * u - yty / (2 * s2) - 0.5 * np.sum(np.log(a)) + 0.5 * np.sum((z / s2) ** 2 / a)
                    - 0.5 * (u / tau) ** 2)

        # mode and curvature of log p(u | y) by Newton with numerical derivatives, from the OLS residual sd
        u = 0.5 * np.log(max(yty - z @ (z / np.maximum(lam, 1e-300)), 1e-300) / max(n, 1))
        u = float(np.clip(u, -30, 30)) if np.isfinite(u) else 0.0
        for _ in range(100):
            h = 1e-3
            f0, fp, fm = log_post_u(u), log_post_u(u + h), log_post_u(u - h)
            g, c = (fp - fm) / (2 * h), (fp - 2 * f0 + fm) / h**2
            step = -g / c if c < 0 else np.sign(g) * 0.5
            step = float(np.clip(step, -1.0, 1.0))
            u += step
            if abs(step) < 1e-10:
                break
        sd_u = 1.0 / np.sqrt(max(-c, 1e-12))
        grid = u + np.linspace(-14, 14, 3001) * sd_u
        lp = np.array([log_post_u(v) for v in grid])
        w = np.exp(lp - lp.max())
        w /= w.sum()
        d = xtx.shape[0]
        e_beta = np.zeros(d)
        e_bb = np.zeros((d, d))
        e_bu = np.zeros(d)
        for wi, ui in zip(w, grid):
            if wi < 1e-300:
                continue
            s2 = np.exp(2 * ui)
            a = lam / s2 + 1.0 / s0sq
            m = V @ ((z / s2) / a)
            C = (V / a) @ V.T
            e_beta += wi * m
            e_bb += wi * (C + np.outer(m, m))
            e_bu += wi * m * ui
        e_u = float(w @ grid)
        var_u = float(w @ (grid - e_u) ** 2)
        mean = np.concatenate([e_beta, [e_u]])
        cov = np.zeros((d + 1, d + 1))
        cov[:d, :d] = e_bb - np.outer(e_beta, e_beta)
        cov[:d, d] = cov[d, :d] = e_bu - e_beta * e_u
        cov[d, d] = var_u
        return mean, 0.5 * (cov + cov.T)

    def posterior_mode(self, data, max_iter: int = 100):
        """Posterior mode, the inverse of the negative Hessian there (Laplace covariance), and the full
        passes over the data used (one: everything comes from ``X'X``, ``X'y``, ``y'y`` in float64).

        Sigma fixed: the exact Gaussian posterior. Sigma sampled: Newton's method with step halving on
        ``(beta, log sigma)`` from the least-squares fit.
        """
        xtx, xty, yty, n = _sufficient_stats(data)
        d = xtx.shape[0]
        p0 = 1.0 / self.prior_scale**2
        if not self.samples_noise:
            prec = xtx / self.noise_sd**2 + np.eye(d) * p0
            cov = np.linalg.inv(prec)
            return cov @ xty / self.noise_sd**2, 0.5 * (cov + cov.T), 1
        t2 = self.noise_prior_scale**2

        def parts(beta, u):
            S = max(yty - 2 * beta @ xty + beta @ xtx @ beta, 0.0)
            e = np.exp(-2 * u)
            f = -n * u - 0.5 * S * e - 0.5 * p0 * beta @ beta - 0.5 * u * u / t2
            g = np.concatenate([(xty - xtx @ beta) * e - p0 * beta, [-n + S * e - u / t2]])
            H = np.zeros((d + 1, d + 1))
            H[:d, :d] = -xtx * e - p0 * np.eye(d)
            H[:d, d] = H[d, :d] = -2 * (xty - xtx @ beta) * e
            H[d, d] = -2 * S * e - 1.0 / t2
            return f, g, H

        beta = np.linalg.solve(xtx + 1e-9 * np.eye(d) * max(1.0, np.trace(xtx) / d), xty)
        S = max(yty - 2 * beta @ xty + beta @ xtx @ beta, 1e-300)
        theta = np.concatenate([beta, [0.5 * np.log(S / max(n, 1))]])
        f, g, H = parts(theta[:d], theta[d])
        for _ in range(max_iter):
            step = np.linalg.solve(-H, g) if np.all(np.linalg.eigvalsh(-H) > 0) else 1e-3 * g
            t = 1.0
            while t > 1e-10:
                cand = theta + t * step
                fc, gc, Hc = parts(cand[:d], cand[d])
                if np.isfinite(fc) and fc >= f - 1e-12 * abs(f):
                    break
                t *= 0.5
            moved = np.max(np.abs(cand - theta))
            theta, f, g, H = cand, fc, gc, Hc
            if moved < 1e-12 * (1 + np.max(np.abs(theta))):
                break
        cov = np.linalg.inv(-H)
        return theta, 0.5 * (cov + cov.T), 1

    @staticmethod
    def simulate(n: int, d: int = 3, noise_sd: float = 1.0, seed: int = 0):
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, d))
        theta = rng.standard_normal(d)
        y = X @ theta + noise_sd * rng.standard_normal(n)
        return {"X": X, "y": y}, theta
