"""Variable selection in logistic regression with a Laplace prior, for reversible jump (austerity Sec. 5.3)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from ..errors import ConfigError, DataError
from ..model import Model
from ._rounding import rounding_headroom

__all__ = ["VariableSelection", "size_prior_log_weights"]


def size_prior_log_weights(d: int, lam: float, min_size: int, max_size: int) -> np.ndarray:
    """``log p(k)`` (unnormalised) of the right-truncated Poisson model size, ``p(k) ∝ lam^k / k!`` on
    ``min_size <= k <= max_size`` (``-inf`` outside), for k = 0..d (austerity paper eq. 7 summed over the
    ``binom(d, k)`` models of size k)."""
    k = np.arange(d + 1, dtype=float)
    lw = k * math.log(lam) - np.array([math.lgamma(v + 1.0) for v in k])
    lw[(k < min_size) | (k > max_size)] = -np.inf
    return lw


class VariableSelection(Model):
    """Logistic regression with variable selection: ``theta = {"beta": (D,), "gamma": (D,)}``.

    Austerity paper Sec. 5.3 (after the Bayesian lasso of Chen, Wang & McKeown 2011). ``gamma_j`` in
    {0, 1} says whether feature j is in the model; an inactive coefficient is held at exactly 0, so the
    parameter keeps a fixed size (2 D flat coordinates, ``beta`` first: the order of ``ravel_pytree``) and
    the compiled kernel needs no special case; the moves of
    :class:`tallmh.proposals.ReversibleJump` keep ``beta_j = 0`` whenever ``gamma_j = 0``.

    Likelihood (eq. 8): ``y_i ~ Bernoulli(sigmoid(x_i . beta))`` (= ``x_i,active . beta_active``). It does
    not depend on ``gamma`` at all, so Taylor control variates work in ``beta``: their proxy is the
    usual logistic one, and a birth or death is a move of one coordinate of ``beta`` (give the centre,
    e.g. ``ControlVariates(center={"beta": beta_hat, "gamma": ones})``: Newton cannot move on the 0/1
    lattice of ``gamma`` and would stop at the start).

    Prior: ``p(beta_j | gamma_j = 1, nu) = exp(-|beta_j|/nu) / (2 nu)``, a right-truncated Poisson on the
    model size ``p(gamma | lam) ∝ lam^k / (binom(D, k) k!)`` on ``min_size <= k <= max_size`` (eq. 7),
    and on the shrinkage ``nu`` an inverse gamma ``IG(nu_shape, nu_scale)``, integrated out:

        p(beta, gamma) ∝ lam^k / (binom(D, k) k!) 2^-k Gamma(k + a) (||beta||_1 + b)^-(k + a)

    with ``a = nu_shape``, ``b = nu_scale``. The paper's choice ``p(nu) ∝ 1/nu`` is ``a = b = 0``, where this
    is its eq. (9) ``||beta||_1^-k lam^k B(k, D - k + 1)`` times ``2^-k``: the paper's eq. (9) drops the
    ``2^-k`` of the Laplace normaliser, which is the same as using ``lam / 2`` in place of ``lam`` (we keep
    it). Beware: with ``a = b = 0``, ``||beta||_1^-k`` is not integrable at ``beta_active = 0`` (a
    logarithmic divergence), so the posterior is improper, although its extra mass sits where the
    likelihood of tall data is negligible and chains started away from 0 do not go there. Use
    ``a, b > 0`` for a proper posterior (the tests do, to enumerate model probabilities exactly).

    ``log_prior`` returns ``-inf`` off the support: ``gamma`` not 0/1, an inactive ``beta_j != 0``, or a
    size outside ``[min_size, max_size]``. ``min_size`` defaults to 1 (the paper allows deaths only for
    k > 1). For the confidence test, ``|l_i| <= |x_i . (beta' - beta)| <= sum_j |beta'_j - beta_j| max_i
    |x_ij|`` (log-sigmoid is 1-Lipschitz); the per-feature maxima are computed once at set-up. Every bound
    adds headroom for the float rounding of the computed ``l_i`` (:func:`~tallmh.models._rounding.rounding_headroom`).
    """

    name = "variable-selection"

    def __init__(self, lam: float = 1.0, nu_shape: float = 0.0, nu_scale: float = 0.0, min_size: int = 1,
                 max_size=None):
        if not (np.isfinite(lam) and lam > 0):
            raise ConfigError(f"lam must be positive; got {lam}")
        if not (nu_shape >= 0 and nu_scale >= 0 and np.isfinite(nu_shape) and np.isfinite(nu_scale)):
            raise ConfigError(f"nu_shape and nu_scale must be >= 0; got {nu_shape}, {nu_scale}")
        if (nu_shape == 0) != (nu_scale == 0):
            raise ConfigError("nu_shape and nu_scale are both 0 (the paper's p(nu) ∝ 1/nu) or both positive")
        if int(min_size) < (1 if nu_shape == 0 else 0):
            raise ConfigError("min_size must be >= 1 with the paper's p(nu) ∝ 1/nu (Gamma(0) is infinite)")
        if max_size is not None and int(max_size) < int(min_size):
            raise ConfigError(f"max_size {max_size} < min_size {min_size}")
        self.lam = float(lam)
        self.nu_shape = float(nu_shape)
        self.nu_scale = float(nu_scale)
        self.min_size = int(min_size)
        self.max_size = None if max_size is None else int(max_size)

    def size_range(self, d: int):
        hi = d if self.max_size is None else min(d, self.max_size)
        if self.min_size > hi:
            raise ConfigError(f"min_size {self.min_size} exceeds the number of candidate features {d}")
        return self.min_size, hi

    def log_prior(self, theta):
        beta, gamma = theta["beta"], theta["gamma"]
        d = beta.shape[0]
        lo, hi = self.size_range(d)
        on = gamma > 0.5
        k = jnp.sum(on).astype(beta.dtype)
        s = jnp.sum(jnp.abs(beta))
        a, b = self.nu_shape, self.nu_scale
        lp = (k * math.log(self.lam) - (gammaln(d + 1.0) - gammaln(k + 1.0) - gammaln(d - k + 1.0))
              - gammaln(k + 1.0) - k * math.log(2.0) + gammaln(k + a) - (k + a) * jnp.log(s + b))
        ok = (jnp.all((gamma == 0) | (gamma == 1)) & jnp.all(jnp.where(on, True, beta == 0))
              & (k >= lo) & (k <= hi) & (s + b > 0))
        return jnp.where(ok, lp, -jnp.inf)

    def log_lik(self, theta, batch):
        z = batch["X"] @ theta["beta"]
        y = batch["y"]
        return -jax.nn.softplus(jnp.where(y > 0.5, -z, z))

    def init(self, data):
        """The model with the first feature only (the intercept, when there is one), its coefficient 0.1."""
        X = data["X"]
        if np.ndim(X) != 2:
            raise DataError(f"VariableSelection needs data['X'] of shape (N, D); got shape {np.shape(X)}")
        d = np.shape(X)[1]
        gamma = np.zeros(d)
        gamma[0] = 1.0
        return {"beta": jnp.asarray(0.1 * gamma), "gamma": jnp.asarray(gamma)}

    def setup(self, data):
        y = np.asarray(data["y"])
        if y.ndim != 1 or not np.all((y == 0) | (y == 1)):
            raise DataError("VariableSelection needs a binary target y of shape (N,) with values 0 and 1")
        return {"max_abs": jnp.max(jnp.abs(jnp.asarray(data["X"])), axis=0)}

    @staticmethod
    def _ops(beta):
        return 4.0 + 0.5 * beta.shape[0]

    @staticmethod
    def _magnitude(beta, m):
        """Bound on the size of the terms a computed ``log p(y_i|x_i, beta)`` is made of: ``|x_i . beta| <=
        sum_j |beta_j| max_i |x_ij|``, and softplus adds at most log 2."""
        return jnp.sum(jnp.abs(beta) * m) + 2.0

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """``sum_j |beta'_j - beta_j| max_i |x_ij|`` plus headroom for float rounding: a computed ``log
        p(y_i|x_i, beta)`` is off by about ``(D/2 + 4) eps (|x_i . beta| + 2)`` (the dot product over D
        features, then softplus), far above the exact ``|l_i|`` for tiny steps."""
        m = stats["max_abs"]
        b, bp = theta["beta"], theta_prop["beta"]
        c = jnp.sum(jnp.abs(bp - b) * m)
        return rounding_headroom(c, self._magnitude(b, m) + self._magnitude(bp, m), self._ops(b))

    def cv_remainder_bound(self, theta, theta_prop, center, stats, order):
        """Taylor remainder bound of the logistic model in ``beta`` (flat vectors, ``beta`` first):
        ``|r_i(t)| <= M_{k+1}/(k+1)! (sum_j |t_j - c_j| max_i |x_ij|)^(k+1)`` (``M_2 = 1/4``,
        ``M_3 = 1/(6 sqrt 3)``), and ``|l~_i| <= |r_i(theta')| + |r_i(theta)|``.

        Plus headroom for float rounding: the computed ``l~_i`` carry the rounding of ``log p`` at theta and
        theta' and of the proxy terms ``g_i . a`` (at most ``a``) and ``a^T H_i a / 2`` (at most ``a^2 / 8``),
        where ``a = sum_j |t_j - c_j| max_i |x_ij|``: near the centre this is far above the exact remainder."""
        m = stats["max_abs"]
        d = m.shape[0]
        a = jnp.sum(jnp.abs(theta[:d] - center[:d]) * m)
        ap = jnp.sum(jnp.abs(theta_prop[:d] - center[:d]) * m)
        if order == 1:
            c = 0.125 * (a**2 + ap**2)
        else:
            c = 1.0 / (36.0 * math.sqrt(3.0)) * (a**3 + ap**3)
        mag = (self._magnitude(theta[:d], m) + self._magnitude(theta_prop[:d], m) + (a + ap)
               + 0.25 * (a**2 + ap**2))
        return rounding_headroom(c, mag, self._ops(theta[:d]))

    def full_init(self, beta):
        """Every feature in, at ``beta`` (e.g. the MAP of the full model)."""
        beta = jnp.asarray(beta)
        return {"beta": beta, "gamma": jnp.ones_like(beta)}
