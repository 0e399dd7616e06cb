"""Random walk on the Stiefel manifold of orthogonal D x D matrices (Ouyang 2008; austerity paper Sec. 5.2)."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = ["StiefelWalk", "rotation_angle_density", "matrix_side"]


class StiefelState(NamedTuple):
    psi: jax.Array  # peakedness of the walk (fixed; no adaptation)


def matrix_side(size: int, shape=None) -> int:
    """The side D of the square matrix whose row-major flattening has ``size`` entries (ConfigError if none)."""
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if len(shape) != 2 or shape[0] != shape[1]:
            raise ConfigError(f"StiefelWalk works on square D x D matrices; got shape {shape}")
        if shape[0] * shape[1] != size:
            raise ConfigError(f"StiefelWalk shape {shape} has {shape[0] * shape[1]} entries; the parameter has {size}")
        d = shape[0]
    else:
        d = int(round(math.sqrt(size)))
        if d * d != size:
            raise ConfigError(f"StiefelWalk needs a flattened D x D matrix; a parameter of {size} coordinates is not "
                              "square (pass shape=(D, D) or use a square matrix parameter)")
    if d < 2:
        raise ConfigError(f"StiefelWalk needs D >= 2; got D = {d}")
    return d


def rotation_angle_density(phi, psi):
    """Density of the walk's rotation angle ``phi = atan2(z_2, psi + z_1)``, ``z ~ N(0, I_2)``, on (-pi, pi].

    The angle of a bivariate normal with mean ``(psi, 0)`` and unit covariance (the projected normal law):
    ``f(phi) = exp(-psi^2/2)/(2 pi) * [1 + c sqrt(2 pi) Phi(c) exp(c^2/2)]`` with ``c = psi cos(phi)``. It is
    even in ``phi``, which is why the walk is symmetric. NumPy, for tests and documentation.
    """
    from math import erf

    phi = np.asarray(phi, float)
    c = psi * np.cos(phi)
    big_phi = 0.5 * (1.0 + np.vectorize(erf)(c / math.sqrt(2.0)))
    return np.exp(-0.5 * psi**2) / (2 * math.pi) * (1.0 + c * math.sqrt(2 * math.pi) * big_phi * np.exp(0.5 * c**2))


class StiefelWalk:
    """Ouyang's random walk on the orthogonal matrices, as the austerity paper (Sec. 5.2) describes it.

    The parameter is a D x D matrix ``W`` with orthonormal rows ``w_1..w_D`` (the Stiefel manifold
    V_D(R^D) = O(D)), carried by the kernel as its row-major flat vector of D^2 coordinates; the walk
    reads D from that size (or from ``shape``), so the kernel needs no special case. One proposal:

    1. pick a row ``w_k`` to discard and another row ``w_j`` (j != k), uniformly;
    2. ``v = psi w_j + z`` with ``z ~ N(0, I_D)`` ("scale it by a constant psi, add standard Gaussian noise");
    3. project ``v`` on the orthogonal complement of the other D - 2 rows and renormalise: the new ``w_j``.
       That complement is the plane spanned by ``w_j`` and ``w_k``, so the projection is
       ``(v . w_j) w_j + (v . w_k) w_k``, computed in that plane's basis (the same vector, without the
       rounding of subtracting D - 2 projections);
    4. set ``w_k`` to the unit vector orthogonal to the other D - 1 rows. It is unique up to its sign; we
       take the sign that keeps ``det W`` (``w_k' = -sin(phi) w_j + cos(phi) w_k``).

    So a step rotates the pair ``(w_j, w_k)`` within its plane by the angle ``phi = atan2(z_2, psi + z_1)``
    (``z_1 = z . w_j``, ``z_2 = z . w_k`` are independent N(0, 1)): ``W' = G W`` with G a Givens rotation. Its
    density :func:`rotation_angle_density` is even in ``phi`` and the reverse move (same pair, angle
    ``-phi``) is as likely as the forward one, so ``q(W'|W) = q(W|W')``: the log proposal ratio is 0, and
    the austerity test uses ``mu0 = log(u)/N`` (paper eq. 6) under the uniform prior. Rotations in all
    coordinate planes generate SO(D), and the left-invariant Haar measure is stationary for ``W -> G W``,
    so under a flat target the chain is uniform on the connected component of its start.

    **Orientation.** The sign choice of step 4 keeps ``det W`` (+1 or -1) fixed: the chain lives on the
    component of O(D) it starts in. For ICA this loses nothing: the likelihood is unchanged by flipping
    the sign of any row of ``W`` (the model density is even), which maps one component onto the other, so
    the posterior restricted to one component is the full posterior up to that symmetry, and sign- and
    permutation-invariant summaries (the Amari distance) have the same law on both.

    ``psi >= 0`` sets the peakedness: ``psi = 0`` gives a uniform angle, and for large ``psi`` the angle is
    about ``N(0, 1/psi^2)``. Before each move, ``W`` is pulled back onto the manifold by one Newton-Schulz
    polar step ``W (3 I - W^T W) / 2`` (a no-op in exact arithmetic), so rounding errors do not accumulate
    over long chains: ``W^T W = I`` holds to float32 rounding (about 1e-6) at every step. ``psi`` is fixed;
    ``update`` does nothing.
    """

    name = "stiefel-walk"

    def __init__(self, psi: float, shape: Optional[tuple] = None):
        if not (np.isfinite(psi) and psi >= 0):
            raise ConfigError(f"StiefelWalk psi must be finite and >= 0; got {psi}")
        self.psi = float(psi)
        self.shape = None if shape is None else tuple(int(s) for s in shape)
        if self.shape is not None:
            matrix_side(self.shape[0] * self.shape[1] if len(self.shape) == 2 else -1, self.shape)

    def init(self, theta, n: int, cov_hint=None) -> StiefelState:
        d = matrix_side(int(theta.shape[0]), self.shape)
        if not isinstance(theta, jax.core.Tracer):  # a concrete start can be checked here
            w = np.asarray(theta, float).reshape(d, d)
            err = float(np.max(np.abs(w @ w.T - np.eye(d)))) if np.all(np.isfinite(w)) else float("inf")
            if not err < 1e-3:
                raise ConfigError("StiefelWalk needs an orthogonal starting matrix (W W^T = I); "
                                  f"max |W W^T - I| = {err:.3g}")
        return StiefelState(jnp.asarray(self.psi, theta.dtype))

    def propose(self, key, theta, state: StiefelState):
        d = matrix_side(int(theta.shape[0]), self.shape)
        dtype = theta.dtype
        w = theta.reshape(d, d)
        w = 0.5 * w @ (3.0 * jnp.eye(d, dtype=dtype) - w.T @ w)  # polar retraction of rounding drift
        k_k, k_j, k_z = jax.random.split(key, 3)
        k = jax.random.randint(k_k, (), 0, d)
        j = (k + jax.random.randint(k_j, (), 1, d)) % d  # uniform over the rows other than k
        wj, wk = w[j], w[k]
        v = state.psi * wj + jax.random.normal(k_z, (d,), dtype)
        a, b = v @ wj, v @ wk  # the projection of v on span(w_j, w_k), in that basis
        r = jnp.sqrt(a * a + b * b)
        ok = r > 0  # r = 0 has probability 0; keep W then
        r = jnp.where(ok, r, 1.0)
        c, s = jnp.where(ok, a / r, 1.0), jnp.where(ok, b / r, 0.0)
        new_j = c * wj + s * wk
        new_k = -s * wj + c * wk
        w_new = w.at[j].set(new_j).at[k].set(new_k)
        return w_new.reshape(-1), jnp.zeros((), dtype)

    def update(self, state, theta, accepted, step):
        return state
