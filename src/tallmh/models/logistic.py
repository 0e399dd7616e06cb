"""Bayesian logistic regression with a Gaussian prior."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, DataError
from ..factor_bounds import SAFETY, cubic_sup
from ._target import check_target
from ..model import Model
from ._rounding import rounding_headroom
from ._logistic_block import M3_LOGISTIC, U_PEAK, weights_block

__all__ = ["LogisticRegression", "softplus_diff", "LogisticCubicBound", "LogisticLocalBound", "logistic_remainder_diff"]

# |x| above this is beyond float32's useful range for a margin x . theta (its square overflows float32 at 1.8e19)
MAX_FEATURE = 1e15


@jax.jit
def _feature_stats(X):
    """``(max_ij |x_ij|, max_i ||x_i||)`` over the finite entries and rows, in one compiled pass over X (an
    in-memory array read in place is not copied)."""
    a = jnp.abs(X)
    finite = jnp.isfinite(a)
    biggest = jnp.max(jnp.where(finite, a, 0.0))
    # rows with a non-finite value (only where the finiteness check was waived) are left out of the
    # bound: their ratios are non-finite, counted and their proposals rejected
    norms = jnp.linalg.norm(jnp.where(finite, X, 0.0), axis=1)
    return biggest, jnp.max(jnp.where(jnp.all(finite, axis=1), norms, 0.0))


STATS_SLICE = 8192  # rows per slice of the host statistics' one sweep (a slice stays in the cache)


def _feature_stats_host(X):
    """``(biggest, max_i ||x_i||)`` for an array in host memory whose entries are all finite, in NumPy (no program
    to compile, and ~5x faster than the compiled row norms on a 2-core CPU); None for an array on an accelerator or
    with a non-finite entry (an entry that is NaN or infinite makes its row's squared norm so, and so the largest
    one: the same verdict as a count of the non-finite entries, which the caller may therefore skip:
    :meth:`LogisticRegression.setup_checked`).

    ``biggest`` is ``max_ij |x_ij|`` where it matters, above ``MAX_FEATURE / 2`` (the range check's error names it);
    below, the largest row norm, which bounds it and says that the check passes without a sweep of its own. The
    row norms are made in one sweep over X in slices of ``STATS_SLICE`` rows while each slice is in the cache
    (``einsum``: each row's sum formed alone, the same numbers as over the whole array), where a maximum, a minimum
    and the row norms each read the whole block from memory (measured per block of 2^20 rows of d = 11 in float32,
    one core: ~6 ms against ~12)."""
    from ..storage.datasource import host_view

    Xh = host_view(X)
    if Xh is None:
        return None
    n = Xh.shape[0]
    sq, top = None, None
    with np.errstate(over="ignore", invalid="ignore"):  # (an overflowing square: the exact check below)
        for s in range(0, n, STATS_SLICE):
            x = Xh[s:s + STATS_SLICE]
            if sq is None:
                sq = np.empty(min(STATS_SLICE, n), np.einsum("ij,ij->i", x[:1], x[:1]).dtype)
            r = sq[:x.shape[0]]
            np.einsum("ij,ij->i", x, x, out=r)
            t = r.max()  # (NaN where a row's is: kept as it is, not compared, which would drop it)
            top = t if top is None or not np.isfinite(t) else max(top, t)
            if not np.isfinite(t):
                break
    norm = float(np.sqrt(top))
    if np.isfinite(norm) and norm <= MAX_FEATURE / 2:
        return norm, norm
    hi, lo = Xh.max(), Xh.min()  # (a non-finite entry, or one near or beyond the range: the exact largest entry)
    if not (np.isfinite(hi) and np.isfinite(lo)):
        return None
    biggest = max(float(hi), -float(lo))
    return (biggest, np.inf) if biggest > MAX_FEATURE or not np.isfinite(norm) else (biggest, norm)


def softplus_diff(z, d):
    """``softplus(z + d) - softplus(z)`` accurate to a few ulps relative for any margin ``z`` and step ``d``.

    Two exact forms of the same number: ``log1p(sigmoid(z) expm1(d))``, used where ``v = sigmoid(z)
    expm1(d) >= -1/2`` (no cancellation: ``log1p`` of an accurately computed ``v`` away from -1, and
    accurate for tiny steps), and ``log(sigmoid(-z) + sigmoid(z) e^d) = logaddexp(-softplus(z),
    d - softplus(-z))`` elsewhere (where the first form would take ``log1p`` of nearly -1, which in float
    rounds to ``log(0) = -inf``: a large margin with a large step back, e.g. ``z = 20, d = -25``) and for
    steps too large for ``expm1``. The plain difference of two softplus values loses all relative accuracy
    for small steps at large margins.
    """
    z = jnp.asarray(z)
    d = jnp.asarray(d)
    big = 80.0  # expm1(80) = 5.5e34 stays below float32's largest value
    v = jax.nn.sigmoid(z) * jnp.expm1(jnp.minimum(d, big))
    near = jnp.log1p(jnp.maximum(v, -0.5))
    far = jnp.logaddexp(-jax.nn.softplus(z), d - jax.nn.softplus(-z))
    return jnp.where((v >= -0.5) & (d < big), near, far)


# --- the remainder bound of the exact subsampled test (tallmh.factor_bounds) ------------------------------


def _q_polys(kmax):
    """``Q_k(a)`` with ``f^(k)(u) = -p q Q_k(a)`` for ``f = log sigmoid``, ``p = sigmoid(u)``, ``q = 1 - p``,
    ``a = 1 - 2p``: ``Q_2 = 1``, ``Q_{k+1} = a Q_k - (1 - a^2)/2 Q_k'`` (from ``dp/du = p q``)."""
    polys = {2: np.poly1d([1.0])}
    for k in range(2, kmax):
        qk = polys[k]
        polys[k + 1] = np.poly1d([1.0, 0.0]) * qk - np.poly1d([-0.5, 0.0, 0.5]) * qk.deriv()
    return polys


_SERIES_MAX = 0.5  # |delta| below which the remainder is summed as its Taylor series
_SERIES_K = 13  # terms up to delta^_SERIES_K: truncation below (0.5/pi)^11 of the cubic term
_Q = _q_polys(_SERIES_K)  # (once: in the list below it was made again for every k, at each import)
_COEFS = [(k, [float(c) / math.factorial(k) for c in _Q[k].coeffs]) for k in range(3, _SERIES_K + 1)]


def _horner(coefs, a):
    out = jnp.zeros_like(a) + coefs[0]
    for c in coefs[1:]:
        out = out * a + c
    return out


def logistic_remainder_diff(m, d, dp):
    """``R(d') - R(d)`` for ``R(t) = f(m + t) - f(m) - f'(m) t - f''(m) t^2 / 2``, ``f = log sigmoid``.

    Where ``max(|d|, |d'|) <= 1/2``: ``(d' - d) sum_{k=3}^{13} c_k h_{k-1}(d', d)`` with the Taylor
    coefficients ``c_k = f^(k)(m) / k! = -p q Q_k(a) / k!`` (polynomials in ``a = 1 - 2p = -tanh(m/2)`` of
    small coefficients) and the complete symmetric polynomials ``h_j(x, y) = (x^{j+1} - y^{j+1}) / (x - y)``
    by their recursion ``h_j = e1 h_{j-1} - e2 h_{j-2}`` (``e1 = x + y``, ``e2 = x y``): no cancellation, exactly
    antisymmetric in ``d, d'``, and accurate to a few ulps relative. Elsewhere: every term formed as a multiple
    of ``d' - d``: ``f(m + d') - f(m + d) = -softplus_diff(-(m + d), -(d' - d))`` (accurate for any step) less
    ``f'(m) (d' - d) + f''(m) (d' - d)(d' + d) / 2``, averaged with the same from ``d'`` to ``d`` (so that the
    result is exactly antisymmetric).
    (The plain difference of the four terms in float32 loses the remainder entirely for small steps: that
    version broke the bound of :func:`cubic_sup` in tests at N = 10^7.)
    """
    p, q = jax.nn.sigmoid(m), jax.nn.sigmoid(-m)
    pq = p * q
    a = -jnp.tanh(0.5 * m)
    small = jnp.maximum(jnp.abs(d), jnp.abs(dp)) <= _SERIES_MAX
    x = jnp.where(small, dp, 0.0)
    y = jnp.where(small, d, 0.0)
    e1, e2 = x + y, x * y
    h_prev, h = jnp.ones_like(x), e1  # h_0, h_1
    acc = jnp.zeros_like(x)
    for k, coefs in _COEFS:  # term k multiplies h_{k-1}
        h_prev, h = h, e1 * h - e2 * h_prev  # now h = h_{k-1}
        acc = acc + _horner(coefs, a) * h
    series = -(x - y) * pq * acc

    x = jnp.where(small, 0.0, dp)
    y = jnp.where(small, 0.0, d)

    def forward(y, x):  # R(x) - R(y) with every term proportional to x - y
        step = x - y
        return -softplus_diff(-(m + y), -step) - q * step + 0.5 * pq * step * (x + y)

    far = 0.5 * (forward(y, x) - forward(x, y))  # (exactly antisymmetric)
    return jnp.where(small, series, far)


class LogisticCubicBound:
    """``|R_i(theta') - R_i(theta)| <= rho_i^3 (M / 6) S(z, z')`` with ``M = sqrt(3)/18`` (global, no trust region).

    For ``ell_i = log sigmoid(s_i x_i . theta)``, ``s_i = 2 y_i - 1``; ``rho_i = ||R^-1 x_i||``.
    """

    any_whitening = True  # valid for weights and z whitened by any invertible A (tallmh.fused_table)

    m3 = M3_LOGISTIC

    def weights(self, center, rinv, batch):
        v = batch["X"] @ rinv.T
        rho2 = jnp.sum(v * v, axis=-1)
        return rho2 * jnp.sqrt(rho2)

    def weights_host(self, center, rinv, batch):
        v = np.asarray(batch["X"], np.float64) @ rinv.T
        rho2 = np.einsum("ij,ij->i", v, v)
        return rho2 * np.sqrt(rho2)

    def weights_block(self, center, rinv, batch):
        """:meth:`weights` of a block of host rows in NumPy, in the rows' precision (:mod:`._logistic_block`)."""
        return weights_block(batch["X"], center, rinv)

    def phi(self, z, zp):
        return (self.m3 / 6.0 * SAFETY) * cubic_sup(z, zp)

    def region(self, z, zp):
        return jnp.bool_(True)

    def remainder(self, theta, theta_p, center, batch):
        X = batch["X"]
        md = X @ jnp.stack([center, theta - center, theta_p - center], axis=-1)
        s = jnp.where(batch["y"] > 0.5, 1.0, -1.0).astype(md.dtype)
        return logistic_remainder_diff(s * md[..., 0], s * md[..., 1], s * md[..., 2])





def m3_local(m, half, xp):
    """``sup |f'''(u)|`` (``f = log sigmoid``) over ``|u - m| <= half``: ``k(u) = p q tanh(|u|/2)`` is even, increasing
    on ``[0, U_PEAK]`` and decreasing beyond, so the supremum is ``M`` where the interval's ``|u|`` range holds
    ``U_PEAK``, else ``k`` at its end nearest to it."""
    lo = xp.maximum(xp.abs(m) - half, 0.0)
    hi = xp.abs(m) + half

    def k(u):
        e = xp.exp(-u)  # u >= 0: p q = e / (1 + e)^2, tanh(u/2) = (1 - e) / (1 + e)
        return e / (1.0 + e) ** 2 * (1.0 - e) / (1.0 + e)

    inside = (lo <= U_PEAK) & (hi >= U_PEAK)
    edge = k(xp.where(hi < U_PEAK, hi, lo))  # (one evaluation of k: the end nearest to U_PEAK)
    return xp.where(inside, M3_LOGISTIC, xp.minimum(edge, M3_LOGISTIC))


class LogisticLocalBound(LogisticCubicBound):
    """A sharper bound where the margins at the centre are large (very unbalanced or well separated data): on the
    trust region ``||z||, ||z'|| <= radius`` every margin ``u_i`` stays within ``rho_i radius`` of its value ``m_i``
    at the centre, so ``|f'''|`` there is at most ``K_i = sup_{|u - m_i| <= rho_i radius} |f'''(u)|``
    (:func:`m3_local`; at most ``sqrt(3)/18``, and about ``e^-|m_i|`` for a large margin):

        |R_i(theta') - R_i(theta)| <= rho_i^3 K_i / 6 S(z, z')      inside the region,

    by the argument of :class:`LogisticCubicBound` with ``K_i`` in place of ``M``. Outside the region the test takes
    the full exact decision (the region is a condition on both points: symmetric, never the drawn count).
    ``radius=None``: ``sqrt(d) + 6.5``, which a near-Gaussian posterior in whitened coordinates (``||z||^2 ~
    chi^2_d``) leaves with probability below 1e-9, so that the fallback's expected cost (N items times that) stays
    small."""

    def __init__(self, radius=None, offset=None):
        if radius is not None and not radius > 0:
            raise ConfigError(f"the trust region's radius must be positive; got {radius}")
        self.radius = None if radius is None else float(radius)
        self.offset = offset  # the batch key of an offset added to the margins (a front end's eta(0)), if any

    def radius_for(self, d: int) -> float:
        return self.radius if self.radius is not None else math.sqrt(d) + 6.5

    def weights(self, center, rinv, batch):
        X = batch["X"]
        v = X @ rinv.T
        rho = jnp.sqrt(jnp.sum(v * v, axis=-1))
        m = X @ center  # (the sign of the margin does not matter: the supremum is even in m)
        if self.offset is not None:
            m = m + batch[self.offset]
        return rho**3 * m3_local(m, rho * self.radius_for(center.shape[0]), jnp)

    def weights_host(self, center, rinv, batch):
        X = np.asarray(batch["X"], np.float64)
        v = X @ rinv.T
        rho = np.sqrt(np.einsum("ij,ij->i", v, v))
        m = X @ np.asarray(center, np.float64)
        if self.offset is not None:
            m = m + np.asarray(batch[self.offset], np.float64)
        return rho**3 * m3_local(m, rho * self.radius_for(np.shape(center)[0]), np) * (1 + 1e-9)

    def weights_block(self, center, rinv, batch):
        """:meth:`weights` of a block of host rows in NumPy, in the rows' precision (:mod:`._logistic_block`)."""
        off = None if self.offset is None else batch[self.offset]
        return weights_block(batch["X"], center, rinv, self.radius_for(np.shape(center)[0]), off)

    def phi(self, z, zp):
        return (SAFETY / 6.0) * cubic_sup(z, zp)  # (the K_i are in the weights)

    def region(self, z, zp):
        return jnp.maximum(jnp.linalg.norm(z), jnp.linalg.norm(zp)) <= self.radius_for(z.shape[0])


class LogisticRegression(Model):
    """``y_i ~ Bernoulli(sigmoid(x_i . theta))``, ``theta ~ N(0, prior_scale^2 I)``.

    Data: ``{"X": (N, d) array, "y": (N,) array of 0/1}``; add a column of ones to X for an intercept.
    The confidence test's range uses ``|log p(y|x,theta') - log p(y|x,theta)| <= |x.(theta'-theta)| <=
    ||x|| ||theta' - theta||`` (log-sigmoid is 1-Lipschitz), with ``max_i ||x_i||`` computed once at
    set-up (adaptive subsampling paper, Sec. 4.2). ``remainder_bound``: the exact subsampled test's bound,
    ``"local"`` (default) or ``"global"`` (see :meth:`factor_bound`).
    """

    name = "logistic-regression"

    def __init__(self, prior_scale: float = 10.0, remainder_bound: str = "local"):
        if not (np.isfinite(prior_scale) and prior_scale > 0):
            raise ConfigError(f"prior_scale must be positive; got {prior_scale}")
        if remainder_bound not in ("global", "local"):
            raise ConfigError(f"remainder_bound must be 'global' or 'local'; got {remainder_bound!r}")
        self.prior_scale = float(prior_scale)
        self.remainder_bound = remainder_bound

    def log_prior(self, theta):
        d = theta.shape[0]
        s = self.prior_scale
        return -0.5 * jnp.sum(theta**2) / s**2 - d * (np.log(s) + 0.5 * np.log(2 * np.pi))

    def log_lik(self, theta, batch):
        z = batch["X"] @ theta
        y = batch["y"]
        # log sigmoid(z) if y = 1, log sigmoid(-z) if y = 0
        return -jax.nn.softplus(jnp.where(y > 0.5, -z, z))

    def remainder_weight(self, center, chol, batch):
        """``rho_i^3 = (x_i^T Sigma x_i)^(3/2)`` with ``Sigma = chol chol^T`` the Laplace covariance: the weight
        of item i's second-order Taylor remainder, ``|r_i| <= M_3 / 6 rho_i^3 ||v||^3`` in the whitened
        coordinates ``v`` (:mod:`tallmh.strata`; the same bound as :mod:`tallmh.certify`'s)."""
        rho2 = jnp.sum((batch["X"] @ chol) ** 2, axis=-1)
        return rho2 * jnp.sqrt(rho2)

    def log_lik_ratio(self, theta, theta_prop, batch):
        """``l_i = log sigmoid(s_i z'_i) - log sigmoid(s_i z_i) = -(softplus(-s_i z'_i) - softplus(-s_i z_i))`` with
        ``s_i = 2 y_i - 1``, ``z_i = x_i . theta`` and the step ``d_i = x_i . (theta' - theta)`` formed directly;
        the softplus difference by :func:`softplus_diff` (no overflow, no cancellation)."""
        # both margins from one product with two columns (one compiled kernel, not two)
        zd = batch["X"] @ jnp.stack([theta, theta_prop - theta], axis=-1)
        z, d = zd[..., 0], zd[..., 1]
        flip = batch["y"] > 0.5
        return -softplus_diff(jnp.where(flip, -z, z), jnp.where(flip, -d, d))

    def lik_value_grad_hess(self, theta, batch, mask):
        """``(sum_i l_i, sum_i grad l_i, sum_i hess l_i)`` over the items where ``mask`` is true, in closed
        form: with ``p_i = sigmoid(x_i . theta)``, ``grad = X^T (y - p)`` and ``hess = -X^T diag(p (1 - p)) X``:
        one matrix product each, where autodiff's Hessian traces d gradient passes. The value is
        :meth:`log_lik`'s own sum. Used by the set-up passes (Newton's mode search, the control-variate
        sums) in place of autodiff; ``tests/test_control_variates.py`` checks it against autodiff."""
        X = batch["X"]
        z = X @ theta
        m = mask.astype(z.dtype)
        p = jax.nn.sigmoid(z)
        v = jnp.sum(jnp.where(mask, self.log_lik(theta, batch), 0.0))
        g = X.T @ (m * (batch["y"] - p))
        h = -(X * (m * p * (1.0 - p))[:, None]).T @ X
        return v, g, h

    def lik_grad_remainder(self, theta, center, batch, order, mask=None):
        """The minibatch sums of the Langevin drift, in closed form: ``sum_i grad l_i(theta)`` (``order`` 0,
        ``center`` None), ``sum_i (grad l_i(theta) - grad l_i(c))`` (1), or ``sum_i (grad l_i(theta) -
        grad l_i(c) - hess l_i(c) (theta - c))`` (2), over the rows of ``batch`` (where ``mask``, if given).

        With ``p(z) = sigmoid(z)``, ``grad l_i(theta) = x_i (y_i - p(z_i))`` and ``hess l_i = -p'(z_i) x_i x_i^T``,
        so each is ``X^T w`` for a weight per item: ``w = y - p(z)``, ``-(p(z) - p(zc))``, and ``-(p(z) - p(zc))
        + p'(zc) d`` with ``zc = x . c`` and the step ``d = x . (theta - c)`` from one product with two columns
        (``z = zc + d``). The difference ``p(z) - p(zc) = -p(z) p(-zc) expm1(-d)`` is formed without
        cancellation for ``|d| < 1``. Two matrix products where autodiff's gradient and its Jacobian-vector
        product make six (the chain's compile); ``tests/test_langevin.py`` checks it against autodiff."""
        X = batch["X"]
        y = (batch["y"] > 0.5).astype(X.dtype)
        keep = (lambda w: w) if mask is None else (lambda w: jnp.where(mask, w, 0.0))
        if order == 0:
            return X.T @ keep(y - jax.nn.sigmoid(X @ theta))
        zd = X @ jnp.stack([center, theta - center], axis=-1)
        zc, d = zd[..., 0], zd[..., 1]
        z = zc + d
        pc, qc = jax.nn.sigmoid(zc), jax.nn.sigmoid(-zc)
        p = jax.nn.sigmoid(z)
        small = jnp.abs(d) < 1.0
        diff = jnp.where(small, -p * qc * jnp.expm1(-jnp.where(small, d, 0.0)), p - pc)
        w = -diff if order == 1 else pc * qc * d - diff
        return X.T @ keep(w)

    def lik_value_grad_hess_host(self, theta, batch):
        """:meth:`lik_value_grad_hess` over every row of a batch of NumPy arrays, in float64 on the host
        (``theta`` a float64 vector): the set-up passes' form where the data lies in host memory or in a file
        (no program to compile, and float64 sums). ``tests/test_setup_passes.py`` checks it against the
        compiled form."""
        X = np.asarray(batch["X"], np.float64)
        y = np.asarray(batch["y"], np.float64)
        z = X @ theta
        # with e = exp(-|z|): softplus(+-z) = max(+-z, 0) + log1p(e), sigmoid(z) = 1 / (1 + e) for z >= 0 and
        # e / (1 + e) below, and p (1 - p) = e / (1 + e)^2: one exponential and one logarithm per row
        e = np.exp(-np.abs(z))
        r = 1.0 / (1.0 + e)
        s = np.where(y > 0.5, -z, z)
        v = -(np.sum(np.maximum(s, 0.0)) + np.sum(np.log1p(e)))
        p = np.where(z >= 0.0, r, e * r)
        g = X.T @ (y - p)
        Xw = X * np.sqrt(e * r * r)[:, None]  # (H = -Xw^T Xw, rows scaled by sqrt(p (1 - p)): faster than X^T W X)
        h = -(Xw.T @ Xw)
        return float(v), g, h

    def log_lik_host(self, theta, batch):
        """:meth:`log_lik` in float64 on the host (a batch of NumPy arrays, ``theta`` a float64 vector)."""
        z = np.asarray(batch["X"], np.float64) @ theta
        s = np.where(np.asarray(batch["y"]) > 0.5, -z, z)
        return -(np.maximum(s, 0.0) + np.log1p(np.exp(-np.abs(z))))

    def log_prior_vgh_host(self, theta):
        """The log prior's value, gradient and Hessian at the float64 vector ``theta``, in NumPy."""
        s2 = self.prior_scale**2
        d = theta.shape[0]
        v = -0.5 * float(theta @ theta) / s2 - d * (np.log(self.prior_scale) + 0.5 * np.log(2 * np.pi))
        return v, -theta / s2, -np.eye(d) / s2

    def init(self, data):
        X = data["X"]
        if np.ndim(X) != 2:
            raise DataError(f"LogisticRegression needs data['X'] of shape (N, d); got shape {np.shape(X)}")
        if isinstance(data.get("y"), (np.ndarray, jax.Array)):  # (in memory or memory-mapped: N values read)
            check_target(data["y"])
        # (a transfer, not jnp.zeros: that compiles two small programs in a fresh process)
        return jax.device_put(np.zeros(np.shape(X)[1], jax.dtypes.canonicalize_dtype(np.float64)))

    def setup(self, data):
        return self.setup_checked(data)[0]

    def setup_checked(self, data):
        """:meth:`setup`'s statistics and the data keys its sweep found all finite: ``"y"`` (its values are 0 or 1)
        and ``"X"`` where the statistics were made on the host (every row's squared norm is finite, so every
        entry is: :func:`_feature_stats_host`). The set-up's first pass over files then skips those leaves'
        own finiteness check (:class:`tallmh.storage.datasource.StatsTap`)."""
        y = np.asarray(data["y"])
        if y.ndim != 1:
            raise DataError(f"LogisticRegression needs data['y'] of shape (N,); got {y.shape}")
        if not np.all((y == 0) | (y == 1)):
            raise DataError("LogisticRegression needs a binary target y with values 0 and 1")
        X = data["X"]
        if not isinstance(X, (jax.Array, np.ndarray)) and type(X).__name__ != "InPlaceArray":
            X = jnp.asarray(X)
        if not np.prod(np.shape(X)):
            return {"max_norm": jnp.zeros((), X.dtype)}, ("y",)
        host = _feature_stats_host(X)
        if host is not None:
            biggest, max_norm = host
            max_norm = jax.device_put(np.asarray(max_norm, jax.dtypes.canonicalize_dtype(X.dtype)))
        else:
            biggest, max_norm = _feature_stats(X if not isinstance(X, np.ndarray) else jnp.asarray(X))
        biggest = float(biggest)
        if biggest > MAX_FEATURE:
            raise DataError(f"LogisticRegression: data['X'] holds a value of magnitude {biggest:.3g}, beyond the "
                            f"useful range of {X.dtype} margins (|x| <= {MAX_FEATURE:.0e}); rescale the features")
        return {"max_norm": max_norm}, ("y", "X") if host is not None else ("y",)

    def lik_ratio_bound(self, theta, theta_prop, stats):
        """``||theta' - theta|| max_i ||x_i||`` (Sec. 4.2) plus headroom for the float rounding of the ``l_i``.

        A computed ``log p(y_i|x_i, theta)`` is off by at most about ``(d/2 + 4) eps (||x_i|| ||theta|| +
        1)`` (the dot product ``x_i . theta``, then softplus, which is 1-Lipschitz).
        """
        x = stats["max_norm"]
        c = jnp.linalg.norm(theta_prop - theta) * x
        return rounding_headroom(c, self._magnitude(theta, theta_prop, x), self._ops(theta))

    @staticmethod
    def _ops(theta):
        return 4.0 + 0.5 * theta.shape[0]

    @staticmethod
    def _magnitude(theta, theta_prop, x):
        return x * (jnp.linalg.norm(theta) + jnp.linalg.norm(theta_prop)) + 2.0

    def cv_remainder_bound(self, theta, theta_prop, center, stats, order):
        """Bound on ``max_i |l~_i|`` for Taylor control variates at ``center`` (flat vectors).

        With ``r_i(t) = ell_i(t) - p_i(t)`` the Taylor remainder, ``|r_i(t)| <= M_{k+1}/(k+1)!
        (||x_i|| ||t - center||)^(k+1)`` where ``M_2 = 1/4`` and ``M_3 = 1/(6 sqrt 3)`` bound the second and
        third derivatives of ``log sigmoid``; so ``|l~_i| <= |r_i(theta')| + |r_i(theta)|``.

        Plus headroom for float rounding: the computed ``l~_i`` carry the rounding of ``log p`` at theta
        and theta' and of the proxy terms ``g_i . a`` (at most ``||x_i|| ||a||``) and ``a^T H_i a`` (at most
        ``||x_i||^2 ||a||^2 / 4``), far above the exact remainder near the centre.
        """
        import math

        x = stats["max_norm"]
        a = jnp.linalg.norm(theta - center) * x
        ap = jnp.linalg.norm(theta_prop - center) * x
        if order == 1:
            c = 0.25 / 2.0 * (a**2 + ap**2)
        else:
            c = 1.0 / (6.0 * math.sqrt(3.0)) / 6.0 * (a**3 + ap**3)
        mag = self._magnitude(theta, theta_prop, x) + (a + ap) + 0.25 * (a**2 + ap**2)
        return rounding_headroom(c, mag, self._ops(theta))

    def factor_bound(self):
        """The per-item bound on the Taylor remainders' differences that the exact subsampled test thins
        against. Default (``remainder_bound="local"``): :class:`LogisticLocalBound`, ``rho_i^3 (K_i / 6) S(z, z')``
        with ``K_i`` the supremum of the third derivative over the margins its trust region allows, the exact
        decision outside the region (far fewer items per step where the margins at the centre are large: 1%
        positives, well separated classes; ``K_i`` is never above the global bound's constant). ``"global"``:
        ``rho_i^3 (sqrt(3)/18 / 6) S(z, z')`` everywhere (:class:`LogisticCubicBound`)."""
        return LogisticLocalBound() if self.remainder_bound == "local" else LogisticCubicBound()

    @staticmethod
    def simulate(n: int, d: int = 10, seed: int = 0, intercept: bool = True, dtype=np.float32):
        """Synthetic data: standard normal features (plus a column of ones), true theta ~ N(0, I/d)."""
        rng = np.random.default_rng(seed)
        X = rng.standard_normal((n, d)).astype(dtype)
        if intercept:
            X = np.concatenate([np.ones((n, 1), dtype), X], axis=1)
        theta = rng.standard_normal(X.shape[1]) / np.sqrt(d)
        p = 1.0 / (1.0 + np.exp(-(X @ theta)))
        y = (rng.random(n) < p).astype(dtype)
        return {"X": X, "y": y}, theta
