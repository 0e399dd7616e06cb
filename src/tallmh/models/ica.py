"""Independent component analysis on pre-whitened data, posterior over the Stiefel manifold (austerity Sec. 5.2)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, DataError
from ..model import Model
from ._rounding import rounding_headroom

__all__ = ["ICA", "amari_distance", "whiten"]


def amari_distance(W, W0):
    """Amari distance (Amari, Cichocki & Yang 1996) between unmixing matrices ``W`` and ``W0``, in [0, 1].

    With ``P = W W0^{-1}`` (the identity up to scaling and permutation when ``W`` unmixes like ``W0``):
    ``d = [sum_i (sum_j |p_ij| / max_j |p_ij| - 1) + sum_j (sum_i |p_ij| / max_i |p_ij| - 1)] / (2 D (D - 1))``.
    Invariant to permuting and rescaling (sign flips included) the rows of ``W``. ``W`` may carry leading
    batch axes (NumPy or JAX arrays).
    """
    xp = jnp if isinstance(W, jax.Array) else np
    W = xp.asarray(W)
    d = W.shape[-1]
    P = xp.abs(W @ xp.linalg.inv(xp.asarray(W0)))
    rows = xp.sum(xp.sum(P, axis=-1) / xp.max(P, axis=-1) - 1.0, axis=-1)
    cols = xp.sum(xp.sum(P, axis=-2) / xp.max(P, axis=-2) - 1.0, axis=-1)
    return (rows + cols) / (2.0 * d * (d - 1))


def whiten(X):
    """Centre and whiten ``X`` (N, D): returns ``(Xw, V, mean)`` with ``Xw = (X - mean) V^T``, ``cov(Xw) = I``.

    ``V = C^{-1/2}`` (symmetric inverse square root of the sample covariance C, by eigendecomposition in
    float64). Raises :class:`DataError` if C is singular.
    """
    X = np.asarray(X, float)
    if X.ndim != 2:
        raise DataError(f"whiten needs an (N, D) array; got shape {X.shape}")
    mean = X.mean(axis=0)
    Xc = X - mean
    C = Xc.T @ Xc / X.shape[0]
    evals, evecs = np.linalg.eigh(C)
    if not evals.min() > 1e-12 * max(evals.max(), 1e-300):
        raise DataError("the data's covariance is singular: cannot whiten (drop a redundant column)")
    V = evecs @ np.diag(evals**-0.5) @ evecs.T
    return Xc @ V.T, V, mean


class ICA(Model):
    """``p(x|W) = |det W| prod_j [4 cosh^2(w_j^T x / 2)]^{-1}``, uniform prior on the orthogonal matrices.

    Austerity paper Sec. 5.2 (the model of Hyvarinen & Oja 2000): each row ``w_j`` of the D x D unmixing
    matrix gives a source ``y_j = w_j^T x`` with the logistic density ``1/(4 cosh^2(y/2))`` (a
    super-Gaussian model: it favours peaked, heavy-tailed sources). The data must be pre-whitened
    (:func:`whiten`, or ``ICA.simulate``), so that ``W`` may be taken orthogonal; the prior is uniform on
    the orthogonal matrices (density 1 with respect to the Haar measure) and zero elsewhere: ``log_prior``
    is 0 when ``max |W W^T - I| < tol`` and ``-inf`` otherwise, so a Euclidean proposal is rejected
    without reading data (use :class:`tallmh.proposals.StiefelWalk`).

    **Determinant and orientation.** ``log|det W|`` is kept in ``log_lik`` as the paper writes it; it is
    0 on the manifold (``|det W| = 1``), so it changes no decision. The orthogonal matrices have two
    components (``det W = +1`` and ``-1``); the Stiefel walk stays on the one it starts in (the identity:
    ``det = +1``). Nothing is lost: the likelihood is even in each row (``cosh`` is even), so flipping
    the sign of one row maps the posterior on one component to the posterior on the other, and sign- and
    permutation-invariant summaries such as :func:`amari_distance` have the same posterior law on both.

    Parameter: the D x D matrix ``W`` (rows ``w_j``); data: ``{"X": (N, D)}`` whitened. ``log_lik`` uses
    ``log(4 cosh^2(y/2)) = |y| + 2 log(1 + exp(-|y|))`` (no overflow). For the confidence test,
    ``|l_i| <= ||x_i|| sum_j ||w'_j - w_j|| + |log|det W'| - log|det W||`` (the log density is 1-Lipschitz:
    its derivative is ``-tanh(y/2)``), with ``max_i ||x_i||`` computed once at set-up, plus headroom for the
    float rounding of the computed ``l_i`` (:func:`~tallmh.models._rounding.rounding_headroom`).
    """

    name = "ica"

    def __init__(self, tol: float = 1e-3):
        if not (np.isfinite(tol) and tol > 0):
            raise ConfigError(f"ICA tol must be positive; got {tol}")
        self.tol = float(tol)

    def log_prior(self, W):
        W = jnp.asarray(W)
        d = W.shape[-1]
        err = jnp.max(jnp.abs(W @ W.T - jnp.eye(d, dtype=W.dtype)))
        return jnp.where(err < self.tol, jnp.zeros((), W.dtype), -jnp.inf)

    def log_lik(self, W, batch):
        X = batch["X"]
        Y = X @ W.T
        a = jnp.abs(Y)
        _, logdet = jnp.linalg.slogdet(W)
        return logdet - jnp.sum(a + 2.0 * jax.nn.softplus(-a), axis=-1)

    def init(self, data):
        X = data["X"]
        if np.ndim(X) != 2:
            raise DataError(f"ICA needs data['X'] of shape (N, D); got shape {np.shape(X)}")
        return jnp.eye(np.shape(X)[1])

    def setup(self, data):
        X = np.asarray(data["X"])
        if X.ndim != 2 or X.shape[1] < 2:
            raise DataError(f"ICA needs data['X'] of shape (N, D) with D >= 2; got shape {X.shape}")
        C = X.T @ X / X.shape[0]
        if np.max(np.abs(C - np.eye(X.shape[1]))) > 0.05:
            raise DataError("ICA needs whitened data (E[x x^T] = I); whiten it first with tallmh.models.ica.whiten")
        return {"max_norm": jnp.max(jnp.linalg.norm(jnp.asarray(X), axis=1))}

    def lik_ratio_bound(self, W, W_prop, stats):
        """``max_i ||x_i|| sum_j ||w'_j - w_j|| + |log|det W'| - log|det W||`` plus headroom for float rounding.

        A computed ``log p(x_i|W)`` is made of D dot products ``w_j . x_i`` (each at most ``||w_j|| max
        ||x||``), D terms ``|y_j| + 2 log(1 + e^-|y_j|)`` summed, and ``log|det W|`` (an LU factorisation,
        off by about D eps): its rounding error is a few ``D eps`` times ``max ||x|| sum_j ||w_j|| + 2 D log
        2 + |log|det W|| + D``, far above the exact ``|l_i|`` for tiny steps on the manifold.
        """
        x = stats["max_norm"]
        rows = jnp.sum(jnp.linalg.norm(W_prop - W, axis=1))
        ld_p, ld = jnp.linalg.slogdet(W_prop)[1], jnp.linalg.slogdet(W)[1]
        c = rows * x + jnp.abs(ld_p - ld)
        d = W.shape[-1]

        def mag(w, logdet):
            return x * jnp.sum(jnp.linalg.norm(w, axis=1)) + 2.0 * d * math.log(2.0) + jnp.abs(logdet) + d

        return rounding_headroom(c, mag(W, ld) + mag(W_prop, ld_p), 4.0 + d)

    @staticmethod
    def simulate(n: int = 1_950_000, seed: int = 0, period: float = 97.3, dtype=np.float32):
        """Four mixed sources (the austerity paper's Sec. 5.2 set-up with generated signals), whitened.

        Sources, each scaled to unit variance: (a) iid Laplace (super-Gaussian, a stand-in for the paper's
        music recording); (b) a sine wave of period ``period`` samples (sub-Gaussian and periodic, a
        stand-in for its traffic noise); (c), (d) two independent standard Gaussian noises (as in the
        paper). Mixed by ``A`` with iid N(0, 1) entries, then whitened by :func:`whiten`.

        Returns ``(data, info)``: ``data = {"X": (n, 4)}``; ``info`` has ``A``, the whitening ``V``, and
        ``W0 = (V A)^{-1}``, the unmixing matrix of the whitened data (compare with
        :func:`amari_distance`), and the source names.
        """
        rng = np.random.default_rng(seed)
        t = np.arange(n, dtype=float)
        lap = rng.laplace(0.0, 1.0 / math.sqrt(2.0), n)
        sine = math.sqrt(2.0) * np.sin(2 * math.pi * t / period + rng.uniform(0, 2 * math.pi))
        g1, g2 = rng.standard_normal(n), rng.standard_normal(n)
        S = np.column_stack([lap, sine, g1, g2])
        A = rng.standard_normal((4, 4))
        Xw, V, _ = whiten(S @ A.T)
        info = {"A": A, "V": V, "W0": np.linalg.inv(V @ A),
                "sources": ["laplace", f"sine (period {period} samples)", "gaussian", "gaussian"]}
        return {"X": Xw.astype(dtype)}, info
