"""Reversible-jump variable selection (austerity paper Sec. 5.3).

A small enumerable model: 3 candidate features, N = 300, a proper prior (nu ~ IG(1, 1)), so the exact
posterior model probabilities are integrals over at most 3 coefficients, computed here on a grid. The RJ
chain (update/birth/death moves through the ordinary kernel) must recover the inclusion probabilities
within Monte Carlo error, with every test deciding the moves (exact, austerity, confidence, Barker, and
austerity/confidence with control variates); a proposal that forgets the birth density in its ratio
(negative control) must fail the same check. Plus unit checks of the move probabilities and of the
paper's eqs. (11)-(12).
"""

import itertools
import math
import warnings

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import tallmh as tm
from tallmh.errors import ConfigError
from tallmh.proposals.rjmcmc import ReversibleJump, move_probabilities

LAM, NU_A, NU_B = 1.0, 1.0, 1.0


def make_data(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    X = (X - X.mean(0)) / X.std(0)
    z = 0.8 * X[:, 0] + 0.25 * X[:, 1]  # x1 strong, x2 weak, x3 irrelevant
    y = (rng.random(n) < 1 / (1 + np.exp(-z))).astype(float)
    return X, y


def _loglik(X, y, B):
    Z = X @ B.T
    return -np.sum(np.logaddexp(0, np.where(y[:, None] > 0.5, -Z, Z)), axis=0)


def exact_inclusion(X, y, lam=LAM, a=NU_A, b=NU_B, pts=41, width=7.0):
    """Posterior model probabilities by quadrature: for each model, a grid of ``pts`` points per active
    coefficient over its MLE +- ``width`` sd (the integrand is below e^-20 of its peak outside); the
    prior is the model's eq. (9) with the IG(a, b) hyperprior. 41 and 81 points agree to 1e-4."""
    n, D = X.shape
    logz = {}
    for gam in itertools.product([0, 1], repeat=D):
        k = sum(gam)
        if k == 0:
            continue
        Xa = X[:, [j for j in range(D) if gam[j]]]
        bet = np.zeros(k)
        for _ in range(50):
            p = 1 / (1 + np.exp(-Xa @ bet))
            H = (Xa * (p * (1 - p))[:, None]).T @ Xa
            bet = bet + np.linalg.solve(H, Xa.T @ (y - p))
        sd = np.sqrt(np.diag(np.linalg.inv(H)))
        axes = [np.linspace(bet[i] - width * sd[i], bet[i] + width * sd[i], pts) for i in range(k)]
        G = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, k)
        vol = np.prod([ax[1] - ax[0] for ax in axes])
        lp = (k * math.log(lam) - (math.lgamma(D + 1) - math.lgamma(D - k + 1)) - k * math.log(2)
              + math.lgamma(k + a) - (k + a) * np.log(np.abs(G).sum(1) + b))
        ll = np.concatenate([_loglik(Xa, y, G[s:s + 20000]) for s in range(0, len(G), 20000)])
        t = ll + lp
        logz[gam] = t.max() + math.log(np.exp(t - t.max()).sum() * vol)
    models = list(logz)
    v = np.array([logz[g] for g in models])
    w = np.exp(v - v.max())
    w /= w.sum()
    return np.array([sum(w[i] for i, g in enumerate(models) if g[j]) for j in range(D)])


@pytest.fixture(scope="module")
def problem():
    X, y = make_data()
    return {"X": X.astype(np.float32), "y": y.astype(np.float32)}, exact_inclusion(X, y)


def _model():
    return tm.models.VariableSelection(lam=LAM, nu_shape=NU_A, nu_scale=NU_B)


def _proposal(model):
    return ReversibleJump.for_model(model, update_scale=0.15, birth_scale=0.3)


INIT = {"beta": jnp.array([0.5, 0.0, 0.0]), "gamma": jnp.array([1.0, 0.0, 0.0])}


def inclusion_check(gamma_draws, truth, p=1e-3):
    """z-tests of each inclusion frequency against the truth (ArviZ MCSE of the mean; Bonferroni).
    A feature whose true probability is within 1e-9 of 0 or 1 must have exactly that frequency."""
    g = np.asarray(gamma_draws, float)
    zcrit = stats.norm.isf(p / (2 * g.shape[-1]))
    zs = []
    for j in range(g.shape[-1]):
        x = g[..., j]
        if truth[j] > 1 - 1e-9 or truth[j] < 1e-9:
            zs.append(0.0 if abs(x.mean() - truth[j]) < 1e-3 else np.inf)
            continue
        se = float(az.mcse(x, method="mean"))
        zs.append((x.mean() - truth[j]) / se)
    return all(abs(z) < zcrit for z in zs), {"freq": g.mean(axis=(0, 1)).round(4).tolist(),
                                             "truth": np.round(truth, 4).tolist(), "z": np.round(zs, 2).tolist()}


def _run(data, test, proposal=None, num_samples=20000, control_variates=None, seed=1):
    model = _model()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = tm.sample(model, data, test=test, proposal=proposal or _proposal(model), num_samples=num_samples,
                      num_warmup=500, num_chains=4, seed=seed, init=INIT, progress=False,
                      control_variates=control_variates)
    return r


def test_move_probabilities_green_scheme():
    for d, lam, lo, hi in ((3, 1.0, 1, None), (10, 3.0, 1, 8), (50, 5.0, 1, None)):
        b, dd = move_probabilities(d, lam, lo, hi)
        top = d if hi is None else hi
        assert np.all(b + dd <= 0.9 + 1e-12) and abs((b + dd).max() - 0.9) < 1e-12
        assert b[top] == 0 and dd[lo] == 0 and np.all(b[top + 1:] == 0) and np.all(dd[:lo] == 0)
        # b_k p(k) = d_{k+1} p(k+1): the move probabilities alone balance the size prior (Green 1995)
        for k in range(lo, top):
            pk, pk1 = lam**k / math.factorial(k), lam ** (k + 1) / math.factorial(k + 1)
            assert abs(b[k] * pk - dd[k + 1] * pk1) < 1e-12 * max(pk, pk1)


def test_log_ratio_is_the_papers_eq_11_and_12():
    """Prior ratio + log q ratio of a birth and a death equal the logs of the paper's eqs. (11), (12)
    (a = b = 0, the paper's prior; with its lam read as our lam / 2, see VariableSelection)."""
    d, lam, sb = 6, 2.0, 0.4
    model = tm.models.VariableSelection(lam=lam)
    prop = ReversibleJump.for_model(model, update_scale=0.1, birth_scale=sb)
    from jax.flatten_util import ravel_pytree

    theta = {"beta": jnp.array([0.3, -0.2, 0.0, 0.0, 0.7, 0.0]), "gamma": jnp.array([1.0, 1, 0, 0, 1, 0])}
    flat, unravel = ravel_pytree(theta)
    st = prop.init(flat, 100)
    b, dd = move_probabilities(d, lam, 1, None)
    lam_paper = lam / 2
    seen = set()
    props, lqs = jax.jit(jax.vmap(lambda key: prop.propose(key, flat, st)))(
        jax.random.split(jax.random.PRNGKey(0), 400))
    log_prior = jax.jit(jax.vmap(lambda th: model.log_prior(unravel(th))))
    lps = np.asarray(log_prior(props), float)
    lp0 = float(model.log_prior(theta))
    for i in range(400):
        thp, lq = np.asarray(props[i], float), float(lqs[i])
        k, kp = int(np.asarray(flat)[d:].sum()), int(thp[d:].sum())
        ours = float(lps[i]) - lp0 + lq
        s, sp = float(np.abs(np.asarray(flat)[:d]).sum()), float(np.abs(thp[:d]).sum())
        if kp == k + 1:
            j = int(np.argmax(thp[d:] - np.asarray(flat)[d:]))
            n_b = stats.norm.logpdf(thp[j], 0, sb)
            # eq. (11): mu0 N - log u = log[ s^-k p(g->g') N(beta_j) (D-k) / (s'^-(k+1) p(g'->g) lam k) ]
            paper = (-k * math.log(s) + math.log(b[k] / (d - k)) + n_b + math.log(d - k)
                     - (-(k + 1) * math.log(sp) + math.log(dd[k + 1] / (k + 1)) + math.log(lam_paper * k)))
            seen.add("birth")
        elif kp == k - 1:
            j = int(np.argmax(np.asarray(flat)[d:] - thp[d:]))
            n_b = stats.norm.logpdf(float(np.asarray(flat)[j]), 0, sb)
            # eq. (12): log[ s^-k p(g->g') lam (k-1) / (s'^-(k-1) p(g'->g) N(beta_j) (D-k+1)) ]
            paper = (-k * math.log(s) + math.log(dd[k] / k) + math.log(lam_paper * (k - 1))
                     - (-(k - 1) * math.log(sp) + math.log(b[k - 1] / (d - k + 1)) + n_b + math.log(d - k + 1)))
            seen.add("death")
        else:
            paper = -k * math.log(s) + k * math.log(sp)  # eq. (10)
            seen.add("update")
        # the kernel's log_base is log[prior' q(th|th') / (prior q(th'|th))] = -(mu0 N - log u)
        assert abs(ours + paper) < 1e-4 * max(1.0, abs(paper)), (i, ours, paper)
    assert seen == {"birth", "death", "update"}


def test_masks_and_errors():
    m = _model()
    assert np.isfinite(float(m.log_prior(INIT)))
    assert float(m.log_prior({"beta": jnp.array([0.5, 0.1, 0.0]), "gamma": jnp.array([1.0, 0, 0])})) == -np.inf
    assert float(m.log_prior({"beta": jnp.zeros(3), "gamma": jnp.zeros(3)})) == -np.inf  # k < min_size
    with pytest.raises(ConfigError):
        tm.models.VariableSelection(nu_shape=1.0, nu_scale=0.0)
    with pytest.raises(ConfigError):
        tm.models.VariableSelection(min_size=0)  # Gamma(0) with the paper's 1/nu
    with pytest.raises(ConfigError):
        ReversibleJump(update_scale=-1.0)
    with pytest.raises(ConfigError):
        ReversibleJump().init(jnp.zeros(5), 10)
    with pytest.raises(ConfigError):
        ReversibleJump(birth_scale=[0.1, 0.2]).init(jnp.zeros(6), 10)


@pytest.mark.slow
def test_exact_rj_recovers_inclusion_probabilities(problem):
    data, truth = problem
    assert abs(truth[1] - 0.398) < 0.002 and abs(truth[2] - 0.104) < 0.002  # the case is not degenerate
    r = _run(data, tm.acceptance.Exact(), num_samples=8000)
    g = np.asarray(r.samples["gamma"])
    assert set(np.unique(g)) <= {0.0, 1.0}
    beta, gam = np.asarray(r.samples["beta"]), g
    assert np.all(beta[gam == 0] == 0)  # the mask holds along the chain
    ok, rep = inclusion_check(g, truth)
    assert ok, rep


TESTS = {
    "austerity": (tm.acceptance.Austerity(epsilon=0.01, batch_size=50), None),
    "confidence": (tm.acceptance.Confidence(delta=0.01, initial_batch=50), None),
    "barker": (tm.acceptance.Barker(batch_size=300), None),
    "austerity+cv": (tm.acceptance.Austerity(epsilon=0.01, batch_size=50), "cv"),
    "confidence+cv": (tm.acceptance.Confidence(delta=0.01, initial_batch=50), "cv"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TESTS))
def test_every_test_decides_the_moves(problem, name):
    data, truth = problem
    test, cv = TESTS[name]
    cvo = None
    if cv:
        # centre: the full model's MLE (the likelihood depends on beta only; gamma's proxy terms are 0)
        X, y = np.asarray(data["X"], float), np.asarray(data["y"], float)
        bet = np.zeros(3)
        for _ in range(30):
            p = 1 / (1 + np.exp(-X @ bet))
            bet = bet + np.linalg.solve((X * (p * (1 - p))[:, None]).T @ X, X.T @ (y - p))
        cvo = tm.ControlVariates(order=2, center={"beta": jnp.asarray(bet, jnp.float32), "gamma": jnp.ones(3)})
    r = _run(data, test, control_variates=cvo)
    ok, rep = inclusion_check(r.samples["gamma"], truth)
    assert ok, (name, rep)
    if name.startswith("austerity"):
        assert r.stats["n_data"].mean() < 300  # it did subsample


class ForgetsBirthDensity(ReversibleJump):
    """Negative control: the ratio of births and deaths without the N(beta_j) term (a classic RJ bug)."""

    def propose(self, key, theta, state):
        thp, lq = super().propose(key, theta, state)
        d = theta.shape[0] // 2
        k, kp = jnp.sum(theta[d:]), jnp.sum(thp[d:])
        j_b = jnp.argmax(thp[d:] - theta[d:])
        j_d = jnp.argmax(theta[d:] - thp[d:])
        lb = jax.scipy.stats.norm.logpdf(thp[j_b], 0.0, state.birth_scale[j_b])
        ld = jax.scipy.stats.norm.logpdf(theta[j_d], 0.0, state.birth_scale[j_d])
        return thp, lq + jnp.where(kp > k, lb, 0.0) - jnp.where(kp < k, ld, 0.0)


@pytest.mark.slow
def test_negative_control_wrong_dimension_matching(problem):
    data, truth = problem
    model = _model()
    bad = ForgetsBirthDensity(update_scale=0.15, birth_scale=0.3, lam=model.lam)
    r = _run(data, tm.acceptance.Exact(), proposal=bad, num_samples=8000)
    ok, rep = inclusion_check(r.samples["gamma"], truth)
    assert not ok, rep
