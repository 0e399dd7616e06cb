"""Adaptive Metropolis (Haario, Saksman & Tamminen 2001) with global scale adaptation."""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = ["AdaptiveMetropolis"]


class AMState(NamedTuple):
    mean: jax.Array  # running mean of the chain
    cov: jax.Array  # running covariance of the chain
    log_scale: jax.Array  # log lambda: proposal covariance is lambda^2 cov
    chol: jax.Array  # Cholesky factor of lambda^2 (cov + jitter I); frozen after warmup
    prior_weight: jax.Array  # pseudo-draws the initial covariance counts for


class AdaptiveMetropolis:
    """Gaussian random walk whose covariance is learnt during warmup, then frozen.

    Proposal ``theta' = theta + lambda L z`` with ``L L^T = Sigma + jitter I``. During warmup, after each
    step k: ``mu += h (theta - mu)``, ``Sigma += h ((theta - mu)(theta - mu)^T - Sigma)`` with
    ``h = 1/(k - s + 1 + w0)``: a running average over doubling windows starting at
    ``s = 50 (2^j - 1)``, in which the estimate at the window's start weighs as ``w0 = 10 d`` draws
    (``100 d`` when the initial covariance is a Laplace approximation), so the early transient is forgotten and ``log lambda += g (accepted - target)`` with
    ``g = (k + 1)^(-kappa)`` (Andrieu & Thoms 2008, Algorithm 4; the
    covariance learning of Haario et al. 2001; the Robbins-Monro scale of Atchade & Rosenthal 2005).
    ``target_accept`` defaults to 0.234 for d > 2 and 0.44 for d <= 2 (Roberts & Rosenthal 2001), as the
    adaptive-subsampling paper's experiments use. After warmup the proposal is a fixed random walk, so the
    sampling phase is a homogeneous Markov chain.

    ``initial_scale``: starting proposal sd per coordinate; by default ``1/sqrt(N)``, the order of the
    posterior sd of a regular model with N items. When control variates are on and no ``initial_scale``
    is given, the starting covariance is the Laplace approximation ``(-hess log posterior(theta_hat))^-1``
    from the sums the control variates computed anyway (the proposal starts as ``2.38^2/d`` times it).
    """

    name = "adaptive-metropolis"

    def __init__(self, initial_scale: Optional[float] = None, target_accept: Optional[float] = None,
                 kappa: float = 0.6, jitter: float = 1e-10):
        if initial_scale is not None and not (np.isfinite(initial_scale) and initial_scale > 0):
            raise ConfigError(f"initial_scale must be positive; got {initial_scale}")
        if target_accept is not None and not (0.0 < target_accept < 1.0):
            raise ConfigError(f"target_accept must be in (0, 1); got {target_accept}")
        if not (0.5 < kappa <= 1.0):
            raise ConfigError(f"kappa must be in (0.5, 1]; got {kappa}")
        self.initial_scale = initial_scale
        self.target_accept = target_accept
        self.kappa = float(kappa)
        self.jitter = float(jitter)

    def target(self, d: int) -> float:
        if self.target_accept is not None:
            return float(self.target_accept)
        return 0.234 if d > 2 else 0.44

    def init(self, theta, n: int, cov_hint=None) -> AMState:
        d = theta.shape[0]
        lam = 2.38 / np.sqrt(d)
        if cov_hint is not None and self.initial_scale is None:
            cov = jnp.asarray(cov_hint, theta.dtype)
        else:
            s = self.initial_scale if self.initial_scale is not None else 1.0 / np.sqrt(n)
            cov = jnp.eye(d, dtype=theta.dtype) * (s * np.sqrt(d) / 2.38) ** 2
        log_scale = jnp.asarray(np.log(lam), theta.dtype)
        w0 = jnp.asarray((100.0 if cov_hint is not None and self.initial_scale is None else 10.0) * d, theta.dtype)
        return AMState(theta, cov, log_scale, self._chol(cov, log_scale), w0)

    def _chol(self, cov, log_scale):
        d = cov.shape[0]
        scale_ref = jnp.trace(cov) / d
        c = jnp.linalg.cholesky(cov + (self.jitter * scale_ref + 1e-30) * jnp.eye(d, dtype=cov.dtype))
        return jnp.exp(log_scale) * c

    def propose(self, key, theta, state: AMState):
        z = jax.random.normal(key, theta.shape, theta.dtype)
        return theta + state.chol @ z, jnp.zeros((), theta.dtype)

    def update(self, state: AMState, theta, accepted, step):
        d = theta.shape[0]
        k = step.astype(theta.dtype)
        g = (k + 1.0) ** (-self.kappa)
        # running average within doubling windows starting at 50 (2^j - 1): at each window start the
        # current estimate becomes the prior worth prior_weight draws, so the transient is forgotten
        j = jnp.floor(jnp.log2(k / 50.0 + 1.0))
        window_start = 50.0 * (2.0**j - 1.0)
        gc = 1.0 / (k - window_start + 1.0 + state.prior_weight)
        mean = state.mean + gc * (theta - state.mean)
        dev = theta - mean
        cov = state.cov + gc * (jnp.outer(dev, dev) - state.cov)
        log_scale = state.log_scale + g * (accepted.astype(theta.dtype) - self.target(d))
        chol = self._chol(cov, log_scale)
        ok = jnp.all(jnp.isfinite(chol))
        return AMState(mean, cov, log_scale, jnp.where(ok, chol, state.chol), state.prior_weight)
