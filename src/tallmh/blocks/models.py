"""Models written in the blocks' protocol (:mod:`tallmh.blocks`): JointDPM, stochastic volatility, and two
small models with exact answers used by the tests (a two-component mixture and a linear-Gaussian
state-space model).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

__all__ = ["JointDPM", "StochasticVolatility", "TwoComponentMixture", "LinearGaussianSSM", "GroupedLogistic",
           "kalman_smoother"]

_LOG2PI = float(np.log(2 * np.pi))


def _log_normal(x, mean, var):
    return -0.5 * (_LOG2PI + jnp.log(var) + (x - mean) ** 2 / var)


# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JointDPM:
    """Joint Dirichlet-process mixture of experts (paper Sec. 4.2, eq. 8-9; Wade et al. 2014).

    Features ``X`` (N, D) and labels ``y`` (N,) in {0, 1}. A CRP(alpha) partition ``z`` (truncated at
    ``max_clusters`` labelled slots; a new cluster takes one empty slot, each with weight alpha / #empty);
    each cluster has collapsed normal-inverse-Wishart features (``m0, k0, v0, S0 = s0 I``) and its own
    logistic regression weights ``w_k ~ N(0, sig_w^2 I)`` (bias last). alpha ~ Gamma(1, 1), sampled as
    ``log alpha``.

    Sites: ``alpha`` (log alpha), ``z`` (N,) int32, ``w`` (K, D+1). ``aux``: per-cluster count, sum of x and
    sum of x x^T, updated in O(D^2) when an item moves. Empty clusters' weights are refreshed from the
    prior before each Gibbs move (they are independent of everything else, so this is an exact Gibbs step
    on them: Neal 2000, Alg. 8 with the empty slots as auxiliaries).
    """

    max_clusters: int = 20
    sig_w: float = 2.0
    k0: float = 0.1
    v0: float = 4.0
    s0: float = 0.3
    init_clusters: int = 4

    # -- set-up
    def init(self, key, data):
        x = data["X"]
        n, d = x.shape
        k_z, k_w = jax.random.split(key)
        z = jax.random.randint(k_z, (n,), 0, self.init_clusters, dtype=jnp.int32)
        w = self.sig_w * jax.random.normal(k_w, (self.max_clusters, d + 1), x.dtype)
        aux = self._stats(x, z)
        return {"alpha": jnp.zeros((), x.dtype), "z": z, "w": w}, aux

    def _stats(self, x, z):
        oh = jax.nn.one_hot(z, self.max_clusters, dtype=x.dtype)
        return {"n": jnp.sum(oh, 0), "sx": oh.T @ x, "sxx": jnp.einsum("nk,ni,nj->kij", oh, x, x)}

    # -- logistic regression part (the local sections of w_k)
    def site_log_prior(self, site, value, values, aux):
        if site == "w":
            return -0.5 * jnp.sum(value**2) / self.sig_w**2
        raise KeyError(site)

    def _loglik(self, w, x, y):
        s = 2.0 * y - 1.0
        return jax.nn.log_sigmoid(s * (x @ w[..., :-1].T + w[..., -1]))

    def local_log_density(self, site, value, values, aux, data, idx):
        return self._loglik(value, data["X"][idx], data["y"][idx].astype(value.dtype))

    # -- CRP concentration
    def log_conditional(self, site, value, values, aux, data):
        if site != "alpha":
            raise KeyError(site)
        a = jnp.exp(value)
        k_occ = jnp.sum(aux["n"] > 0)
        n = jnp.sum(aux["n"])
        return -a + value + k_occ * value + gammaln(a) - gammaln(a + n)

    # -- collapsed NIW predictive (multivariate Student t)
    def _t_logpdf(self, x, n, sx, sxx):
        d = x.shape[-1]
        dtype = x.dtype
        m0 = jnp.zeros((d,), dtype)
        s0 = self.s0 * jnp.eye(d, dtype=dtype)
        kn = self.k0 + n
        vn = self.v0 + n
        mn = (self.k0 * m0 + sx) / kn[..., None]
        sn = s0 + sxx + self.k0 * jnp.outer(m0, m0) - kn[..., None, None] * mn[..., :, None] * mn[..., None, :]
        dof = vn - d + 1.0
        cov = sn * ((kn + 1.0) / (kn * dof))[..., None, None]
        delta = x - mn
        sol = jnp.linalg.solve(cov, delta[..., None])[..., 0]
        maha = jnp.sum(delta * sol, -1)
        _, logdet = jnp.linalg.slogdet(cov)
        return (gammaln((dof + d) / 2) - gammaln(dof / 2) - 0.5 * d * jnp.log(dof * np.pi) - 0.5 * logdet
                - 0.5 * (dof + d) * jnp.log1p(maha / dof))

    # -- Gibbs on z
    def gibbs_refresh(self, site, key, values, aux):
        empty = aux["n"] <= 0
        fresh = self.sig_w * jax.random.normal(key, values["w"].shape, values["w"].dtype)
        return {**values, "w": jnp.where(empty[:, None], fresh, values["w"])}, aux

    def gibbs_remove(self, site, values, aux, data, i):
        return values, self._move(aux, data["X"][i], values["z"][i], -1.0)

    def gibbs_add(self, site, values, aux, data, i, k):
        return values, self._move(aux, data["X"][i], k, 1.0)

    def _move(self, aux, x, k, sign):
        return {"n": aux["n"].at[k].add(sign), "sx": aux["sx"].at[k].add(sign * x),
                "sxx": aux["sxx"].at[k].add(sign * jnp.outer(x, x))}

    def gibbs_logits(self, site, values, aux, data, i):
        x = data["X"][i]
        y = data["y"][i].astype(x.dtype)
        n = aux["n"]
        occupied = n > 0
        n_empty = jnp.sum(~occupied)
        alpha = jnp.exp(values["alpha"])
        log_crp = jnp.where(occupied, jnp.log(jnp.maximum(n, 1.0)),
                            jnp.where(n_empty > 0, jnp.log(alpha) - jnp.log(jnp.maximum(n_empty, 1)), -jnp.inf))
        feat = self._t_logpdf(x, n, aux["sx"], aux["sxx"])
        lab = self._loglik(values["w"], x, y)
        return log_crp + feat + lab

    # -- output
    def record(self, values, aux):
        return {"alpha": jnp.exp(values["alpha"]), "clusters": jnp.sum(aux["n"] > 0)}

    def predict(self, values, aux, x_test):
        """p(y = 1 | x) for each test point: the clusters' predictive weights times their logistic output."""
        n = aux["n"]
        alpha = jnp.exp(values["alpha"])
        occupied = n > 0

        def one(x):
            feat = self._t_logpdf(x, n, aux["sx"], aux["sxx"])
            lw = jnp.where(occupied, jnp.log(jnp.maximum(n, 1.0)) + feat, -jnp.inf)
            # a new cluster: prior predictive of x, label probability 1/2 under the symmetric prior on w
            new = jnp.log(alpha) + self._t_logpdf(x, jnp.zeros(()), jnp.zeros_like(x), jnp.zeros((x.shape[0],) * 2))
            lw_all = jnp.concatenate([lw, new[None]])
            p = jax.nn.softmax(lw_all)
            py = jax.nn.sigmoid(values["w"][:, :-1] @ x + values["w"][:, -1])
            return jnp.sum(p[:-1] * py) + p[-1] * 0.5

        return jax.vmap(one)(x_test)

    @staticmethod
    def simulate(n, n_test=1000, clusters=6, seed=0):
        """A 2-D synthetic set in the spirit of the paper's Fig. 6b: blobs, each with its own linear boundary."""
        rng = np.random.default_rng(seed)
        centers = rng.uniform(-3, 3, size=(clusters, 2))
        ws = rng.normal(0, 3.0, size=(clusters, 2))
        total = n + n_test
        comp = rng.integers(0, clusters, total)
        x = centers[comp] + 0.6 * rng.normal(size=(total, 2))
        logits = np.sum(ws[comp] * (x - centers[comp]), 1)
        y = (rng.uniform(size=total) < 1 / (1 + np.exp(-logits))).astype(np.float32)
        x = x.astype(np.float32)
        return ({"X": x[:n], "y": y[:n]}, {"X": x[n:], "y": y[n:]})


# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StochasticVolatility:
    """Stochastic volatility on S independent series of length T (paper Sec. 4.3, Fig. 7 bottom).

    ``x_t = exp(h_t / 2) eps_t``, ``h_t ~ N(phi h_{t-1}, sigma^2)`` with ``h_0 = 0``, phi ~ Beta(5, 1),
    sigma^2 ~ InvGamma(5, 0.05). Data: ``x`` (S, T); the series are the items (the plate). Sites: ``phi``
    (logit phi), ``sigma2`` (log sigma^2), ``h`` (S, T) with ``h[:, t]`` the paper's h_{t+1}. The local
    section of series s for phi and sigma^2 is ``sum_t log N(h_t | phi h_{t-1}, sigma^2)``.
    """

    a_phi: float = 5.0
    b_phi: float = 1.0
    a_s2: float = 5.0
    b_s2: float = 0.05

    def init(self, key, data):
        x = data
        return {"phi": jnp.asarray(2.0, x.dtype), "sigma2": jnp.asarray(np.log(0.0125), x.dtype),
                "h": jnp.zeros(x.shape, x.dtype)}, ()

    @staticmethod
    def _params(values):
        return jax.nn.sigmoid(values["phi"]), jnp.exp(values["sigma2"])

    def site_log_prior(self, site, value, values, aux):
        if site == "phi":  # Beta(a, b) on sigmoid(u), Jacobian phi (1 - phi)
            return self.a_phi * jax.nn.log_sigmoid(value) + self.b_phi * jax.nn.log_sigmoid(-value)
        if site == "sigma2":  # InvGamma(a, b) on exp(v), Jacobian exp(v)
            return -self.a_s2 * value - self.b_s2 * jnp.exp(-value)
        raise KeyError(site)

    def local_log_density(self, site, value, values, aux, data, idx):
        phi, s2 = self._params({**values, site: value})
        h = values["h"][idx]
        prev = jnp.concatenate([jnp.zeros_like(h[:, :1]), h[:, :-1]], axis=1)
        return jnp.sum(_log_normal(h, phi * prev, s2), axis=1)

    def ssm_transition_sample(self, site, key, prev, t, values):
        phi, s2 = self._params(values)
        mean = jnp.where(t == 0, 0.0, phi * prev)
        return mean + jnp.sqrt(s2) * jax.random.normal(key, prev.shape, prev.dtype)

    def ssm_transition_logpdf(self, site, x, prev, t, values):
        phi, s2 = self._params(values)
        return _log_normal(x, jnp.where(t == 0, 0.0, phi * prev), s2)

    def ssm_obs_logpdf(self, site, h, t, values, data, series):
        xt = jax.lax.dynamic_index_in_dim(data[series], t, axis=1, keepdims=False)[:, None]
        return -0.5 * (_LOG2PI + h + xt**2 * jnp.exp(-h))

    def record(self, values, aux):
        phi, s2 = self._params(values)
        return {"phi": phi, "sigma": jnp.sqrt(s2)}

    @staticmethod
    def simulate(series, length, phi=0.95, sigma=0.1, seed=0):
        rng = np.random.default_rng(seed)
        h = np.zeros((series, length))
        prev = np.zeros(series)
        for t in range(length):
            prev = phi * prev + sigma * rng.normal(size=series)
            h[:, t] = prev
        x = np.exp(h / 2) * rng.normal(size=h.shape)
        return x.astype(np.float32), h


# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TwoComponentMixture:
    """A small conjugate mixture for exact checks of the blocks (tests).

    ``z_i ~ Bernoulli(pi)``, ``pi ~ Beta(a, b)`` (site ``pi``: logit pi, MH), ``mu_k ~ N(m, s^2)`` (site ``mu``
    of shape (2,), grouped by z), ``x_i ~ N(mu_{z_i}, 1)``. :meth:`exact` enumerates the 2^N assignments
    with pi and mu integrated out analytically.
    """

    a: float = 2.0
    b: float = 5.0
    m: float = 0.0
    s: float = 2.0
    wrong_gibbs: bool = False  # negative control: ignores the likelihood in the z update

    def init(self, key, data):
        n = data.shape[0]
        z = jax.random.randint(key, (n,), 0, 2, dtype=jnp.int32)
        return {"pi": jnp.zeros((), data.dtype), "mu": jnp.asarray([-1.0, 1.0], data.dtype), "z": z}, \
            {"n": jnp.bincount(z, length=2).astype(data.dtype)}

    def site_log_prior(self, site, value, values, aux):
        return jnp.sum(_log_normal(value, self.m, self.s**2))

    def local_log_density(self, site, value, values, aux, data, idx):
        return _log_normal(data[idx], value, 1.0)

    def log_conditional(self, site, value, values, aux, data):
        return (self.a + aux["n"][1]) * jax.nn.log_sigmoid(value) + (self.b + aux["n"][0]) * jax.nn.log_sigmoid(-value)

    def gibbs_remove(self, site, values, aux, data, i):
        return values, {"n": aux["n"].at[values["z"][i]].add(-1.0)}

    def gibbs_add(self, site, values, aux, data, i, k):
        return values, {"n": aux["n"].at[k].add(1.0)}

    def gibbs_logits(self, site, values, aux, data, i):
        lp = jnp.stack([jax.nn.log_sigmoid(-values["pi"]), jax.nn.log_sigmoid(values["pi"])])
        if self.wrong_gibbs:
            return lp
        return lp + _log_normal(data[i], values["mu"], 1.0)

    def record(self, values, aux):
        return {"pi": jax.nn.sigmoid(values["pi"]), "mu": values["mu"], "z": values["z"]}

    def exact(self, x):
        """Exact posterior means of pi, mu_0, mu_1 and P(z_i = 1) by enumeration."""
        from itertools import product

        from scipy.special import betaln

        x = np.asarray(x, float)
        n = len(x)
        logw, e_pi, e_mu, zs = [], [], [], []
        for z in product([0, 1], repeat=n):
            z = np.array(z)
            lw = betaln(self.a + z.sum(), self.b + n - z.sum())
            mus = []
            for k in (0, 1):
                xk = x[z == k]
                nk = len(xk)
                cov = np.eye(nk) + self.s**2 * np.ones((nk, nk))
                if nk:
                    sign, ld = np.linalg.slogdet(cov)
                    r = xk - self.m
                    lw += -0.5 * (nk * np.log(2 * np.pi) + ld + r @ np.linalg.solve(cov, r))
                prec = 1 / self.s**2 + nk
                mus.append((self.m / self.s**2 + xk.sum()) / prec)
            logw.append(lw)
            e_pi.append((self.a + z.sum()) / (self.a + self.b + n))
            e_mu.append(mus)
            zs.append(z)
        w = np.exp(np.array(logw) - np.max(logw))
        w /= w.sum()
        return {"pi": float(w @ np.array(e_pi)), "mu": w @ np.array(e_mu), "z": w @ np.array(zs, float)}


@dataclass(frozen=True)
class LinearGaussianSSM:
    """``h_1 ~ N(0, q0)``, ``h_t = a h_{t-1} + N(0, q)``, ``y_t = h_t + N(0, r)`` on S series (tests:
    particle Gibbs against the Kalman smoother). Data ``y`` (S, T); site ``h`` (S, T)."""

    a: float = 0.9
    q: float = 0.5
    r: float = 1.0
    q0: float = 1.0

    def init(self, key, data):
        return {"h": jnp.zeros(data.shape, data.dtype)}, ()

    def ssm_transition_sample(self, site, key, prev, t, values):
        mean = jnp.where(t == 0, 0.0, self.a * prev)
        sd = jnp.where(t == 0, np.sqrt(self.q0), np.sqrt(self.q))
        return mean + sd * jax.random.normal(key, prev.shape, prev.dtype)

    def ssm_transition_logpdf(self, site, x, prev, t, values):
        return _log_normal(x, jnp.where(t == 0, 0.0, self.a * prev), jnp.where(t == 0, self.q0, self.q))

    def ssm_obs_logpdf(self, site, h, t, values, data, series):
        yt = jax.lax.dynamic_index_in_dim(data[series], t, axis=1, keepdims=False)[:, None]
        return _log_normal(yt, h, self.r)

    def record(self, values, aux):
        return {"h": values["h"]}


@dataclass(frozen=True)
class GroupedLogistic:
    """K logistic regressions, one per cluster of a mixture with known cluster laws (tests and benchmarks of a
    grouped :class:`~tallmh.blocks.SubsampledMH` with control variates).

    ``z_i ~ Uniform{0..K-1}``, ``x_i | z_i = k ~ N(means[k], feature_sd^2 I)`` (means fixed), ``w_k ~ N(0,
    sig_w^2 I)`` (site ``w`` of shape (K, D+1), bias last), ``y_i ~ Bernoulli(sigmoid(x_i . w_k[:D] +
    w_k[D]))`` for ``k = z_i``. Data ``{"X": (N, D), "y": (N,)}``. The per-item latents z are
    conditionally independent given w, so Gibbs on z is batched (``gibbs_logits_batch``, O(m K)).
    ``init_z``: ``"features"`` starts each item in the cluster of the nearest mean, ``"random"`` uniformly.
    """

    means: tuple = ((-3.0, 0.0), (3.0, 0.0), (0.0, 3.0))
    feature_sd: float = 1.0
    sig_w: float = 2.0
    init_z: str = "features"

    @property
    def k(self):
        return len(self.means)

    def init(self, key, data):
        x = data["X"]
        k_z, k_w = jax.random.split(key)
        if self.init_z == "random":
            z = jax.random.randint(k_z, (x.shape[0],), 0, self.k, dtype=jnp.int32)
        else:
            m = jnp.asarray(self.means, x.dtype)
            z = jnp.argmin(jnp.sum((x[:, None, :] - m[None]) ** 2, -1), -1).astype(jnp.int32)
        w = 0.1 * jax.random.normal(k_w, (self.k, x.shape[1] + 1), x.dtype)
        return {"w": w, "z": z}, ()

    def site_log_prior(self, site, value, values, aux):
        return -0.5 * jnp.sum(value**2) / self.sig_w**2

    def local_log_density(self, site, value, values, aux, data, idx):
        x = data["X"][idx]
        s = 2.0 * data["y"][idx].astype(x.dtype) - 1.0
        return jax.nn.log_sigmoid(s * (x @ value[:-1] + value[-1]))

    def gibbs_check(self, site):
        if site != "z":
            raise KeyError(site)

    def gibbs_logits_batch(self, site, values, data, items):
        x = data["X"][items]
        s = 2.0 * data["y"][items].astype(x.dtype) - 1.0
        m = jnp.asarray(self.means, x.dtype)
        feat = -0.5 * jnp.sum((x[:, None, :] - m[None]) ** 2, -1) / self.feature_sd**2
        w = values["w"]
        lab = jax.nn.log_sigmoid(s[:, None] * (x @ w[:, :-1].T + w[:, -1][None]))
        return feat + lab

    def gibbs_value(self, site, k):
        return k

    def record(self, values, aux):
        return {"w": values["w"], "sizes": jnp.bincount(values["z"], length=self.k)}

    def simulate(self, n, w, seed=0):
        """``n`` items drawn from the model with weights ``w`` (K, D+1); returns (data, z)."""
        rng = np.random.default_rng(seed)
        m = np.asarray(self.means, float)
        z = rng.integers(0, self.k, n)
        x = m[z] + self.feature_sd * rng.normal(size=(n, m.shape[1]))
        w = np.asarray(w, float)
        logit = np.sum(x * w[z, :-1], 1) + w[z, -1]
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
        return {"X": x.astype(np.float32), "y": y}, z.astype(np.int32)


def kalman_smoother(y, a, q, r, q0):
    """Posterior means and variances of h for one series ``y`` (T,) of :class:`LinearGaussianSSM` (RTS)."""
    y = np.asarray(y, float)
    t_len = len(y)
    mf, pf, mp, pp = np.zeros(t_len), np.zeros(t_len), np.zeros(t_len), np.zeros(t_len)
    m, p = 0.0, q0
    for t in range(t_len):
        if t > 0:
            m, p = a * m, a * a * p + q
        mp[t], pp[t] = m, p
        k = p / (p + r)
        m, p = m + k * (y[t] - m), (1 - k) * p
        mf[t], pf[t] = m, p
    ms, ps = mf.copy(), pf.copy()
    for t in range(t_len - 2, -1, -1):
        g = pf[t] * a / pp[t + 1]
        ms[t] = mf[t] + g * (ms[t + 1] - mp[t + 1])
        ps[t] = pf[t] + g * g * (ps[t + 1] - pp[t + 1])
    return ms, ps
