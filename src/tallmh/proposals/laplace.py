"""Proposals built on the Laplace approximation ``N(c, Sigma)`` at the control variates' centre, for the exact
subsampled test (:class:`tallmh.acceptance.PoissonThinning`), where a step costs O(1) items whatever it
proposes: the remainders' bound grows with the distance of ``theta, theta'`` from ``c`` in the Laplace metric,
not with the length of the move, so long moves that follow the posterior's shape are cheap.

``Sigma = H^-1`` with ``H`` minus the Hessian of the log posterior at ``c`` (the control variates' sum plus the
prior's), as :func:`tallmh.factor_bounds.laplace_factors` computes it; ``chol`` is a factor with
``chol chol^T = Sigma`` (``FactorTable.chol_cov``). Made without ``center`` and ``chol`` (``CrankNicolson()``), a
proposal takes them from the run: ``tm.sample`` gives the kernel's init the control variates' centre and the
Laplace covariance there (the exact subsampled test's default proposal).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = ["CrankNicolson", "SurrogateLangevin", "LaplaceState", "from_run"]


class LaplaceState(NamedTuple):
    center: jax.Array
    chol: jax.Array  # Sigma = chol chol^T
    chol_inv: jax.Array
    log_gap: jax.Array  # CrankNicolson: rho = 1 - exp(log_gap) (adapted in warmup; 0 is the independence sampler)


def from_run(theta, cov_hint, center, name):
    """``(c, chol, chol^-1)`` from the run's Laplace approximation (traced: the kernel's init)."""
    if cov_hint is None or center is None:
        raise ConfigError(f"{name}() without a centre takes the Laplace approximation at the control variates' "
                          "centre, which this run does not have: use second-order control variates "
                          "(tm.ControlVariates(order=2)) or pass center= and chol=")
    dt = theta.dtype
    cov = jnp.asarray(cov_hint, dt)
    chol = _cholesky(0.5 * (cov + cov.T))
    return jnp.asarray(center, dt), chol, _lower_inverse(chol)


# The factor and its inverse by loops of vector operations instead of LAPACK: on the CPU, JAX's first LAPACK call in
# a process imports SciPy for its kernels (~0.7 s), on a fresh process's critical path (the chains' start states
# wait for this init). d is the parameter's dimension: d iterations of O(d^2) work each.

def _cholesky(a):
    """Lower Cholesky factor of a symmetric positive definite ``a`` (column by column; NaN where ``a`` is not
    positive definite: every entry, as ``jnp.linalg.cholesky``)."""
    d = a.shape[0]
    idx = jnp.arange(d)

    def column(j, L):
        v = a[:, j] - L @ jnp.where(idx < j, L[j], 0.0)  # (the columns from j on are still zero)
        piv = jnp.sqrt(v[j])
        return L.at[:, j].set(jnp.where(idx > j, v / piv, jnp.where(idx == j, piv, 0.0)))

    L = jax.lax.fori_loop(0, d, column, jnp.zeros_like(a))
    return jnp.where(jnp.all(jnp.isfinite(L)), L, jnp.nan)


def _lower_inverse(L):
    """``L^-1`` of a lower triangular ``L`` (forward substitution, row by row)."""
    d = L.shape[0]
    idx = jnp.arange(d)

    def row(i, X):
        return X.at[i].set((jnp.where(idx == i, 1.0, 0.0) - jnp.where(idx < i, L[i], 0.0) @ X) / L[i, i])

    return jax.lax.fori_loop(0, d, row, jnp.zeros_like(L))


def _checked(center, chol):
    c = np.asarray(center, np.float64)
    L = np.asarray(chol, np.float64)
    if c.ndim != 1 or L.shape != (c.shape[0], c.shape[0]):
        raise ConfigError(f"the Laplace approximation needs a centre of shape (d,) and a (d, d) factor; got "
                          f"{c.shape} and {L.shape}")
    if not (np.all(np.isfinite(c)) and np.all(np.isfinite(L))):
        raise ConfigError("the Laplace approximation's centre and factor must be finite")
    try:
        Linv = np.linalg.inv(L)
    except np.linalg.LinAlgError as e:
        raise ConfigError("the Laplace approximation's covariance factor is singular") from e
    return c, L, Linv


class CrankNicolson:
    """Preconditioned Crank-Nicolson proposal around the Laplace approximation (Cotter, Roberts, Stuart & White,
    *MCMC methods for functions*, Statist. Sci. 2013, eq. 4.2, with the Gaussian reference ``N(c, s^2 Sigma)``):

        theta' = c + rho (theta - c) + sqrt(1 - rho^2) s chol xi,   xi ~ N(0, I),

    reversible with respect to ``N(c, s^2 Sigma)``, so ``log q(theta|theta') - log q(theta'|theta) =
    (||z'||^2 - ||z||^2) / (2 s^2)``, ``z = chol^-1 (theta - c)``. ``rho = 0`` is the independence sampler from the
    Laplace approximation: acceptance near 1 where the posterior is near Gaussian, and still exact where it is
    not. ``scale`` s > 1 widens the reference (heavier posterior tails than the Laplace approximation's).

    ``adapt`` (default True): during warmup ``rho`` moves from its start towards 1 while the acceptance rate is
    below ``target_accept`` and back towards the start above it (Robbins-Monro on ``log(1 - rho)``, steps
    ``(k + 1)^-0.6``), so a posterior far from its Laplace approximation gets shorter, local moves instead of
    rejected independent ones; ``rho`` is fixed after warmup (the chain is then a fixed MH kernel).
    ``center``/``chol`` None: the run's Laplace approximation (see the module's docstring).
    """

    name = "crank-nicolson"
    needs_data = False

    def __init__(self, center=None, chol=None, rho: float = 0.0, scale: float = 1.0, adapt: bool = True,
                 target_accept: float = 0.25):
        if not 0.0 <= rho < 1.0:
            raise ConfigError(f"CrankNicolson rho must lie in [0, 1); got {rho}")
        if not scale > 0:
            raise ConfigError(f"CrankNicolson scale must be positive; got {scale}")
        if not 0.0 < target_accept < 1.0:
            raise ConfigError(f"CrankNicolson target_accept must lie in (0, 1); got {target_accept}")
        if (center is None) != (chol is None):
            raise ConfigError("CrankNicolson takes center and chol together (or neither: the run's Laplace "
                              "approximation)")
        self.center = self.chol = self.chol_inv = None
        if center is not None:
            self.center, self.chol, self.chol_inv = _checked(center, chol)
        self.rho, self.scale = float(rho), float(scale)
        self.adapt, self.target_accept = bool(adapt), float(target_accept)
        self.uses_center = self.uses_cov_hint = center is None

    def _state(self, theta, cov_hint, center, log_gap):
        name = type(self).__name__
        if self.center is None:
            c, L, Linv = from_run(theta, cov_hint, center, name)
        else:
            if theta.shape != self.center.shape:
                raise ConfigError(f"{name} centre has {self.center.shape[0]} coordinates; the parameter has "
                                  f"{theta.shape[0]}")
            dt = theta.dtype
            c, L, Linv = (jnp.asarray(a, dt) for a in (self.center, self.chol, self.chol_inv))
        return LaplaceState(c, L, Linv, jnp.asarray(log_gap, theta.dtype))

    def init(self, theta, n: int, cov_hint=None, center=None) -> LaplaceState:
        return self._state(theta, cov_hint, center, np.log1p(-self.rho))

    def propose(self, key, theta, state: LaplaceState):
        xi = jax.random.normal(key, theta.shape, theta.dtype)
        s = self.scale
        r = -jnp.expm1(state.log_gap)  # rho
        theta_p = state.center + r * (theta - state.center) + (jnp.sqrt(1.0 - r * r) * s) * (state.chol @ xi)
        z = state.chol_inv @ (theta - state.center)
        zp = state.chol_inv @ (theta_p - state.center)
        return theta_p, 0.5 * (zp @ zp - z @ z) / (s * s)

    def update(self, state, theta, accepted, step):
        if not self.adapt:
            return state
        g = (step.astype(theta.dtype) + 1.0) ** -0.6
        top = np.log1p(-self.rho)
        gap = jnp.clip(state.log_gap + g * (accepted.astype(theta.dtype) - self.target_accept), np.log(1e-4), top)
        return state._replace(log_gap=gap)


class SurrogateLangevin:
    """Preconditioned MALA on the surrogate: the drift is the gradient of the Laplace approximation's log density,
    ``-H (theta - c)``, preconditioned by ``Sigma = H^-1`` (Roberts & Tweedie 1996; Girolami & Calderhead 2011,
    eq. 9 with a constant metric):

        theta' = theta - (eps^2 / 2) (theta - c) + eps chol xi,

    with the Gaussian proposal's own ratio ``log q(theta|theta') - log q(theta'|theta)`` (no data read: the
    gradient is the surrogate's, O(d^2)). ``step`` is eps, in units of the Laplace sd (about ``1.65 d^(-1/3)``
    is MALA's usual optimum). ``center``/``chol`` None: the run's Laplace approximation.
    """

    name = "surrogate-langevin"
    needs_data = False

    def __init__(self, center=None, chol=None, step: float = 1.0):
        if not step > 0:
            raise ConfigError(f"SurrogateLangevin step must be positive; got {step}")
        if (center is None) != (chol is None):
            raise ConfigError("SurrogateLangevin takes center and chol together (or neither: the run's Laplace "
                              "approximation)")
        self.center = self.chol = self.chol_inv = None
        if center is not None:
            self.center, self.chol, self.chol_inv = _checked(center, chol)
        self.step = float(step)
        self.uses_center = self.uses_cov_hint = center is None

    _state = CrankNicolson._state

    def init(self, theta, n: int, cov_hint=None, center=None) -> LaplaceState:
        return self._state(theta, cov_hint, center, 0.0)

    def propose(self, key, theta, state: LaplaceState):
        e = self.step
        xi = jax.random.normal(key, theta.shape, theta.dtype)
        z = state.chol_inv @ (theta - state.center)
        zp = (1.0 - 0.5 * e * e) * z + e * xi
        theta_p = state.center + state.chol @ zp

        def log_q(to, frm):  # log q(to | from) in whitened coordinates, up to a constant
            r = to - (1.0 - 0.5 * e * e) * frm
            return -0.5 * (r @ r) / (e * e)

        return theta_p, log_q(z, zp) - log_q(zp, z)

    def update(self, state, theta, accepted, step):
        return state
