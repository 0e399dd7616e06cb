"""Reversible-jump moves for variable selection: update, birth and death (Green 1995; austerity Sec. 5.3)."""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError

__all__ = ["ReversibleJump", "move_probabilities", "MOVE_UPDATE", "MOVE_BIRTH", "MOVE_DEATH", "move_of"]

MOVE_UPDATE, MOVE_BIRTH, MOVE_DEATH = 0, 1, 2


class RJState(NamedTuple):
    log_b: jax.Array  # (D + 1,) log probability of a birth move at model size k
    log_d: jax.Array  # (D + 1,) log probability of a death move at size k
    update_scale: jax.Array  # (D,) sd of the update move per feature
    birth_mean: jax.Array  # (D,) mean of the birth proposal per feature
    birth_scale: jax.Array  # (D,) sd of the birth proposal per feature


def move_probabilities(d: int, lam: float, min_size: int = 1, max_size: Optional[int] = None, total: float = 0.9):
    """Birth and death probabilities ``(b_k, d_k)`` for k = 0..d (Green 1995, Sec. 4.1).

    ``b_k = c min(1, p(k+1)/p(k))`` and ``d_k = c min(1, p(k-1)/p(k))`` with ``p(k) ∝ lam^k/k!`` the
    truncated Poisson prior on the model size (so ``p(k+1)/p(k) = lam/(k+1)``), ``b_k = 0`` at the largest
    size and ``d_k = 0`` at the smallest, and ``c`` as large as possible with ``b_k + d_k <= total`` for
    every k; an update move has the rest, ``1 - b_k - d_k``. These are the probabilities of the birth/death
    scheme of Green (1995) that Chen, Wang & McKeown (2011) use (the austerity paper says only "the same as
    in Chen et al."). Returns NumPy arrays of length d + 1 (zeros outside the allowed sizes).
    """
    hi = d if max_size is None else min(d, int(max_size))
    lo = int(min_size)
    if not (0 <= lo <= hi <= d):
        raise ConfigError(f"model sizes must satisfy 0 <= min_size <= max_size <= D; got {lo}, {hi}, D = {d}")
    k = np.arange(d + 1, dtype=float)
    rb = np.minimum(1.0, lam / (k + 1.0))
    rd = np.minimum(1.0, np.where(k > 0, k / lam, 0.0))
    allowed = (k >= lo) & (k <= hi)
    rb = np.where(allowed & (k < hi), rb, 0.0)
    rd = np.where(allowed & (k > lo), rd, 0.0)
    worst = float(np.max(rb + rd)) if np.any(rb + rd > 0) else 1.0
    c = total / worst
    return c * rb, c * rd


def _as_vector(v, d, name):
    a = np.asarray(v, dtype=float)
    if a.ndim == 0:
        a = np.full(d, float(a))
    if a.shape != (d,):
        raise ConfigError(f"ReversibleJump {name} must be a scalar or have one value per feature ({d}); got shape {a.shape}")
    return a


def _normal_logpdf(x, m, s):
    return -0.5 * ((x - m) / s) ** 2 - jnp.log(s) - 0.5 * math.log(2 * math.pi)


def move_of(theta, theta_p):
    """Which move led from ``theta`` to ``theta_p`` (flat vectors, beta then gamma): 1 birth, 2 death,
    0 otherwise (an update, or a rejected proposal when the two are equal). Works on batches (last axis)."""
    d = np.shape(theta)[-1] // 2
    k = np.sum(np.asarray(theta)[..., d:] > 0.5, axis=-1)
    kp = np.sum(np.asarray(theta_p)[..., d:] > 0.5, axis=-1)
    return np.where(kp > k, MOVE_BIRTH, np.where(kp < k, MOVE_DEATH, MOVE_UPDATE))


class ReversibleJump:
    """Update, birth and death moves on ``theta = (beta, gamma)`` (austerity paper Sec. 5.3).

    For :class:`tallmh.models.VariableSelection`: the flat parameter is ``beta`` (D) followed by
    ``gamma`` (D, 0/1), and ``beta_j = 0`` whenever ``gamma_j = 0``. With k active features, one move is
    drawn with probabilities ``(1 - b_k - d_k, b_k, d_k)`` (:func:`move_probabilities`, Green 1995):

    - **update**: an active j, uniformly; ``beta_j += update_scale_j * eta``, ``eta ~ N(0, 1)``
      (symmetric: log q ratio 0, so the paper's eq. 10 ``mu0 = log[u ||beta||^-k / ||beta'||^-k]/N``);
    - **birth** (k < max size): an inactive j, uniformly; ``gamma_j = 1``,
      ``beta_j ~ N(birth_mean_j, birth_scale_j^2)`` (the paper: ``N(0, sigma_birth)``, so ``birth_mean``
      defaults to 0);
    - **death** (k > min size): an active j, uniformly; ``gamma_j = 0``, ``beta_j = 0`` (discarded).

    The dimension matching of a birth is the identity (``beta_j = u``), so its Jacobian is 1 and

        log q ratio (birth k -> k+1) = log[d_{k+1} / (k+1)] - log[b_k / (D - k)] - log N(beta_j)
        log q ratio (death k -> k-1) = log[b_{k-1} / (D - k + 1)] + log N(beta_j) - log[d_k / k]

    returned as ``log q(theta|theta') - log q(theta'|theta)``. With the model's prior ratio (its
    ``log_prior``, which sees the mask) the kernel's data-free part is then exactly the log of the
    paper's eqs. (11) and (12) times ``N`` (with ``p(gamma -> gamma')`` there the probability of the
    chosen move and index, ``b_k/(D-k)`` and ``d_k/k``), so every acceptance test (exact, austerity,
    confidence, Barker, with or without control variates) decides these moves through the ordinary kernel.

    ``lam``, ``min_size`` and ``max_size`` set the move probabilities; use the model's values (any values
    give a correct sampler, since the same probabilities enter the ratio; the model's prior is what
    defines the target). ``update_scale``, ``birth_scale``, ``birth_mean``: scalars or one value per
    feature. Nothing adapts (``update`` is a no-op).
    """

    name = "reversible-jump"

    def __init__(self, update_scale=0.01, birth_scale=0.1, lam: float = 1.0, min_size: int = 1, max_size=None,
                 birth_mean=0.0, total_jump_probability: float = 0.9):
        for nm, v in (("update_scale", update_scale), ("birth_scale", birth_scale)):
            a = np.asarray(v, float)
            if not (np.all(np.isfinite(a)) and np.all(a > 0)):
                raise ConfigError(f"ReversibleJump {nm} must be positive; got {v}")
        if not np.all(np.isfinite(np.asarray(birth_mean, float))):
            raise ConfigError("ReversibleJump birth_mean must be finite")
        if not (np.isfinite(lam) and lam > 0):
            raise ConfigError(f"ReversibleJump lam must be positive; got {lam}")
        if not (0.0 < total_jump_probability <= 1.0):
            raise ConfigError(f"total_jump_probability must be in (0, 1]; got {total_jump_probability}")
        self.update_scale = update_scale if np.ndim(update_scale) == 0 else tuple(np.asarray(update_scale, float))
        self.birth_scale = birth_scale if np.ndim(birth_scale) == 0 else tuple(np.asarray(birth_scale, float))
        self.birth_mean = birth_mean if np.ndim(birth_mean) == 0 else tuple(np.asarray(birth_mean, float))
        self.lam = float(lam)
        self.min_size = int(min_size)
        self.max_size = None if max_size is None else int(max_size)
        self.total_jump_probability = float(total_jump_probability)

    @classmethod
    def for_model(cls, model, update_scale=0.01, birth_scale=0.1, birth_mean=0.0, **kw):
        """Moves whose probabilities use ``model``'s size prior (``lam``, ``min_size``, ``max_size``)."""
        return cls(update_scale, birth_scale, lam=model.lam, min_size=model.min_size, max_size=model.max_size,
                   birth_mean=birth_mean, **kw)

    def init(self, theta, n: int, cov_hint=None) -> RJState:
        size = int(theta.shape[0])
        if size % 2 or size < 2:
            raise ConfigError(f"ReversibleJump needs theta = (beta, gamma) of 2 D coordinates; got {size}")
        d = size // 2
        b, dd = move_probabilities(d, self.lam, self.min_size, self.max_size, self.total_jump_probability)
        with np.errstate(divide="ignore"):
            log_b, log_d = np.log(b), np.log(dd)
        dt = theta.dtype
        return RJState(jnp.asarray(log_b, dt), jnp.asarray(log_d, dt),
                       jnp.asarray(_as_vector(self.update_scale, d, "update_scale"), dt),
                       jnp.asarray(_as_vector(self.birth_mean, d, "birth_mean"), dt),
                       jnp.asarray(_as_vector(self.birth_scale, d, "birth_scale"), dt))

    def propose(self, key, theta, state: RJState):
        size = theta.shape[0]
        d = size // 2
        dtype = theta.dtype
        beta, gamma = theta[:d], theta[d:]
        on = gamma > 0.5
        k = jnp.sum(on).astype(jnp.int32)
        kf = k.astype(dtype)
        k_move, k_pick, k_noise = jax.random.split(key, 3)
        log_b, log_d = state.log_b[k], state.log_d[k]
        pb, pd = jnp.exp(log_b), jnp.exp(log_d)
        u = jax.random.uniform(k_move, (), dtype)
        move = jnp.where(u < pb, MOVE_BIRTH, jnp.where(u < pb + pd, MOVE_DEATH, MOVE_UPDATE))
        # a uniform index among the active (update, death) or the inactive (birth) features
        score = jax.random.uniform(k_pick, (d,), dtype)
        pool = jnp.where(move == MOVE_BIRTH, ~on, on)
        j = jnp.argmax(jnp.where(pool, score, -1.0))
        eta = jax.random.normal(k_noise, (), dtype)

        # update
        beta_u = beta.at[j].add(state.update_scale[j] * eta)
        # birth
        b_new = state.birth_mean[j] + state.birth_scale[j] * eta
        beta_b = beta.at[j].set(b_new)
        gamma_b = gamma.at[j].set(1.0)
        log_n_birth = _normal_logpdf(b_new, state.birth_mean[j], state.birth_scale[j])
        lq_birth = (state.log_d[jnp.minimum(k + 1, d)] - jnp.log(kf + 1.0)) - (log_b - jnp.log(d - kf)) - log_n_birth
        # death
        beta_d = beta.at[j].set(0.0)
        gamma_d = gamma.at[j].set(0.0)
        log_n_death = _normal_logpdf(beta[j], state.birth_mean[j], state.birth_scale[j])
        lq_death = (state.log_b[jnp.maximum(k - 1, 0)] - jnp.log(d - kf + 1.0) + log_n_death) - (log_d - jnp.log(kf))

        is_b, is_d = move == MOVE_BIRTH, move == MOVE_DEATH
        new_beta = jnp.where(is_b, beta_b, jnp.where(is_d, beta_d, beta_u))
        new_gamma = jnp.where(is_b, gamma_b, jnp.where(is_d, gamma_d, gamma))
        log_q = jnp.where(is_b, lq_birth, jnp.where(is_d, lq_death, jnp.zeros((), dtype)))
        # a move with no candidate index (cannot happen with consistent probabilities) is rejected
        log_q = jnp.where(jnp.any(pool), log_q, -jnp.inf)
        return jnp.concatenate([new_beta, new_gamma]), log_q.astype(dtype)

    def update(self, state, theta, accepted, step):
        return state
