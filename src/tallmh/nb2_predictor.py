"""NB2 regressions read from a front end's program: :class:`~tallmh.models.nb2_bound.NB2TrustBound`'s bound on an
affine linear predictor and an affine log dispersion.

A front end (:mod:`tallmh.frontends.pymc_glm`, :mod:`tallmh.frontends.numpyro_glm`) recognises a likelihood
``y_i ~ NB2(mean mu_i = exp(eta_i), dispersion alpha = e^tau)`` (``Var = mu + alpha mu^2``; PyMC's and Bambi's
``NegativeBinomial(mu, alpha=r)`` and NumPyro's ``NegativeBinomial2(mean, concentration=r)`` with ``r = 1/alpha``)
where, as programs, ``eta_i(theta) = a_i + x_i . theta`` and ``tau(theta) = b + v . theta`` are affine in the flat
unconstrained parameter vector (:func:`tallmh.linear_predictor.affine_in`) and ``tau`` reads no data (one
dispersion for all rows). With ``s_i = eta_i + tau`` the row's log-likelihood is ``h(s_i, tau)`` plus terms
linear in ``theta`` (:mod:`tallmh.models.nb2_bound`), and :class:`NB2TrustBound`'s proof uses only that ``s`` and
``tau`` are affine maps of ``theta``: its bound holds with ``rho_s = ||R^-1 (x_i + v)||``, ``rho_t = ||R^-1 v||``
(Cornish et al., ICML 2019, eq. 8, on the trust region ``||z||, ||z'|| <= sqrt(d) + 6.5`` with the exact decision
outside it). A row read costs ``O(y_i)`` (the sum over ``k < y_i``), as for the built-in NB2 regression.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ConfigError

__all__ = ["NB2PredictorBound", "nb2_loglik", "counts_fit", "attach_nb2"]

FAMILY = "nb2_log"


def nb2_loglik(eta, tau, y):
    """NB2 log-likelihood of counts ``y`` with mean ``exp(eta)`` and dispersion ``exp(tau)`` (``r = e^-tau``)."""
    from jax.scipy.special import gammaln

    log_r = -tau
    r = jnp.exp(log_r)
    lrm = jnp.logaddexp(log_r, eta)  # log(r + mu)
    return gammaln(y + r) - gammaln(r) - gammaln(y + 1.0) + r * (log_r - lrm) + y * (eta - lrm)


def counts_fit(y) -> bool:
    """Whole non-negative finite numbers, one per row."""
    y = np.asarray(y)
    return bool(y.ndim == 1 and np.all(np.isfinite(y)) and np.all(y >= 0) and np.all(y == np.round(y)))


class NB2PredictorBound:
    """:class:`~tallmh.models.nb2_bound.NB2TrustBound` for an NB2 likelihood whose log mean and log dispersion are
    affine in the flat parameter vector (see the module). ``pair(theta_flat, batch) -> (eta (b,), tau ())``;
    ``y_key`` names the counts in the batch (or is a function of the batch giving them). The batch's design (the
    Jacobians of ``s = eta + tau`` and of ``tau`` by forward differentiation, and their values at 0) is computed
    for the rows a bound reads; weights in the working precision are inflated by 1e-3 for their rounding."""

    # valid for weights and z whitened by any invertible A (tallmh.fused_table): the proof bounds |ds(a)|, |dtau(a)|
    # by Cauchy-Schwarz, |u . a| <= ||A^-1 u|| ||A^T a||, whatever A
    any_whitening = True

    def __init__(self, pair: Callable, y_key, dim: int, radius=None):
        from .models.nb2_bound import NB2TrustBound

        self.pair, self.y_key, self.dim = pair, y_key, int(dim)
        self.base = NB2TrustBound(radius)
        self._design_host = jax.jit(lambda batch: self.design(batch))

    def design(self, batch, dtype=None):
        """``{"U" (b, d), "a" (b,), "v" (d,), "t0" (), "y" (b,)}``: ``s = a + U theta``, ``tau = t0 + v . theta``."""
        dt = dtype or (jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        b = jax.tree_util.tree_leaves(batch)[0].shape[0]

        def f(t):
            eta, tau = self.pair(t, batch)
            tau = jnp.reshape(jnp.asarray(tau, dt), ())
            return jnp.broadcast_to(jnp.asarray(eta, dt), (b,)) + tau, tau

        zero = jnp.zeros(self.dim, dt)
        (a, t0), (U, v) = f(zero), jax.jacfwd(f)(zero)
        y = self.y_key(batch) if callable(self.y_key) else batch[self.y_key]
        return {"U": U, "a": a, "v": v, "t0": t0, "y": jnp.reshape(jnp.asarray(y), (b,)).astype(dt)}

    def _weights(self, xp, d, center, rinv):
        from .models.nb2_bound import nb2_weights

        rho_s = xp.sqrt(xp.sum((d["U"] @ rinv.T) ** 2, axis=-1))
        rho_t = xp.sqrt(xp.sum((rinv @ d["v"]) ** 2))
        s_c = d["a"] + d["U"] @ center
        tau_c = d["t0"] + d["v"] @ center
        return nb2_weights(xp, d["y"], s_c, tau_c, rho_s, rho_t, self.base.radius_for(center.shape[0]))

    def weights(self, center, rinv, batch):
        return self._weights(jnp, self.design(batch, center.dtype), center, rinv) * (1 + 1e-3)

    def weights_host(self, center, rinv, batch):
        d = self._design_host(jax.tree_util.tree_map(jnp.asarray, batch))
        host = {k: np.asarray(v, np.float64) for k, v in d.items()}
        if not counts_fit(host["y"]):
            raise ConfigError("the NB2 likelihood's responses must be whole non-negative counts")
        with np.errstate(over="ignore"):
            w = self._weights(np, host, np.asarray(center, np.float64), np.asarray(rinv, np.float64))
        return w * (1 + 1e-3)

    def phi(self, z, zp):
        return self.base.phi(z, zp)

    def region(self, z, zp):
        return self.base.region(z, zp)

    def remainder(self, theta, theta_p, center, batch):
        from .models.nb2_bound import nb2_remainder_steps

        d = self.design(batch, theta.dtype)
        c = center.astype(theta.dtype)
        steps = jnp.stack([theta - c, theta_p - c], axis=-1)
        ds, dt = d["U"] @ steps, d["v"] @ steps
        s_c, tau_c = d["a"] + d["U"] @ c, d["t0"] + d["v"] @ c
        return nb2_remainder_steps(d["y"], s_c, tau_c, ds[..., 0], ds[..., 1], dt[0], dt[1])


def attach_nb2(model, pair: Callable, y, unravel, flat0, data, few, refuse):
    """Give a front end's ``model`` the NB2 bound (:class:`NB2PredictorBound` on ``pair``) after the checks the
    front end cannot make structurally: the counts of ``few`` rows fit, and the model's per-row log-likelihood
    equals :func:`nb2_loglik` of ``pair`` on ``few`` rows at two parameter values (a cross-check of the reading).
    ``pair``'s affinity is the front end's to establish first. Returns the ``factor_bound`` method or
    ``refuse(why)``."""
    from .linear_predictor import attach_bound

    y_of = y if callable(y) else (lambda batch: batch[y])
    if not _all_counts(model, y_of, data):
        return refuse("responses that are not whole non-negative counts")
    rng = np.random.default_rng(1)
    for t in (flat0, flat0 + 0.3 * jnp.asarray(rng.standard_normal(flat0.shape), flat0.dtype)):
        eta, tau = pair(t, few)
        ours = np.asarray(nb2_loglik(eta, tau, jnp.asarray(y_of(few)).astype(t.dtype)), np.float64)
        theirs = np.asarray(model.log_lik(unravel(t), few), np.float64)
        if ours.shape != theirs.shape or not np.allclose(ours, theirs, rtol=1e-4, atol=1e-4):
            return refuse("its log-likelihood differs from the NB2 family's (the reading is not trusted)")
    dim = int(np.shape(flat0)[0])

    def nb2_bound():
        """The NB2 bound on a trust region around the centre, with the exact decision outside it, on the design of
        the affine log mean and log dispersion (:class:`tallmh.nb2_predictor.NB2PredictorBound`)."""
        return NB2PredictorBound(pair, y, dim)

    def s_flat(t, batch):  # (the coordinates read: the mean's and the dispersion's)
        eta, tau = pair(t, batch)
        return eta + jnp.reshape(tau, ())

    return attach_bound(model, FAMILY, s_flat, y, unravel, flat0, data, refuse, make_bound=nb2_bound)


def _all_counts(model, y_of, data, block: int = 1 << 16) -> bool:
    """Whether every row's response (``y_of`` of a batch: the model's own reading) is a whole non-negative count:
    one pass over all rows in blocks (counted as rows the conversion read). The bound's weights and remainders
    read ``y`` as a count."""
    from .model import count_conversion

    n = int(np.shape(next(iter(data.values())))[0])
    read = jax.jit(lambda b: jnp.reshape(jnp.asarray(y_of(b)), (-1,)))
    for a in range(0, n, block):
        b = {k: jnp.asarray(np.asarray(v)[a:a + block]) for k, v in data.items()}
        if not counts_fit(np.asarray(read(b))):
            return False
    count_conversion(model, n)
    return True
