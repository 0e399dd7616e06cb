"""Remainder bounds for front-end GLMs (PyMC, Bambi): which models get one, the bound against the true remainder
differences (float64, from the test's own design), and the exact subsampled test's chain against exact MH, with
a shrunk bound as the negative control."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.linear_predictor import affine_in

pm = pytest.importorskip("pymc")
sys.path.insert(0, str(Path(__file__).parent / "acceptance"))
from thinning_helpers import Shrunk, compare, exact_mh_case, run_chains, setup  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def has_bound(model):
    return tm.model.own_method(model, "factor_bound") is not None


def glm_data(n, family, seed=0, rare=0):
    """``X`` (n, 3): two normal features and, with ``rare`` > 0, a one-hot one in ``rare`` rows; ``y``."""
    rng = np.random.default_rng(seed)
    r = np.zeros(n)
    if rare:
        r[rng.choice(n, rare, replace=False)] = 1
    X = np.column_stack([rng.normal(size=n), rng.normal(size=n) * 2.0, r])
    beta = np.array([0.8, -0.3, 3.0 if family == "bernoulli" else 1.0])
    eta = -0.5 + X @ beta
    y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(np.int64) if family == "bernoulli" else rng.poisson(np.exp(eta))
    return X, y


def pymc_glm(X, y, family, **kw):
    with pm.Model() as m:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5, shape=X.shape[1])
        eta = a + pm.math.dot(X, b)
        if family == "bernoulli":
            pm.Bernoulli("y", logit_p=eta, observed=y)
        else:
            pm.Poisson("y", mu=pm.math.exp(eta), observed=y)
    return tm.from_pymc(m, **kw)


def numpyro_glm(X, y, family="bernoulli"):
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist

    def model(X, y=None):
        a = numpyro.sample("a", dist.Normal(0, 5))
        b = numpyro.sample("b", dist.Normal(0, 5).expand([X.shape[1]]))
        with numpyro.plate("rows", X.shape[0]):
            if family == "bernoulli":
                numpyro.sample("y", dist.Bernoulli(logits=a + X @ b), obs=y)
            else:
                numpyro.sample("y", dist.Poisson(jnp.exp(a + X @ b)), obs=y)

    return tm.from_numpyro(model, X.astype(np.float32), y.astype(np.float32))


# --- which models get a bound --------------------------------------------------------------------------------

def test_affinity_analysis():
    x = jnp.ones((4, 2))
    t = jnp.zeros(3)
    assert affine_in(lambda t, x: x @ t[:2] + t[2] * 2.0 - 1.0, t, x)[0]
    assert affine_in(lambda t, x: jnp.take(t, jnp.array([0, 1, 1, 2])) / 3.0 + x[:, 0], t, x)[0]
    assert not affine_in(lambda t, x: x @ t[:2] * t[2], t, x)[0]  # a product of two parameters
    assert not affine_in(lambda t, x: x @ jnp.exp(t[:2]), t, x)[0]  # a transformed parameter
    assert not affine_in(lambda t, x: jnp.abs(x @ t[:2]), t, x)[0]
    assert not affine_in(lambda t, x: jnp.where(t[0] > 0, x @ t[:2], 0.0), t, x)[0]  # a predicate on theta


@pytest.mark.slow
def test_which_bambi_models_get_a_bound():
    bmb = pytest.importorskip("bambi")
    import pandas as pd

    X, y = glm_data(600, "bernoulli")
    _, c = glm_data(600, "poisson")
    df = pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "y": y, "c": c,
                       "g": np.random.default_rng(0).choice(list("abcd"), 600)})
    for fam, f, expect in (("bernoulli", "y ~ x1 + C(g)", True), ("poisson", "c ~ x1 + x2", True),
                           ("bernoulli", "y ~ 1", True), ("gaussian", "x1 ~ x2", False),
                           ("negativebinomial", "c ~ x1", True), ("zero_inflated_negativebinomial", "c ~ x1", False)):
        model, _ = tm.from_bambi(bmb.Model(f, df, family=fam))
        assert has_bound(model) is expect, (f, fam, getattr(model, "factor_bound_reason", None))
    for centre in (True, False):  # group-level terms: no bound
        model, _ = tm.from_bambi(bmb.Model("y ~ x1 + (1|g)", df, family="bernoulli"), centre_groups=centre)
        assert not has_bound(model)


def test_which_formula_families_have_a_bound():
    """``tallmh run --formula``: bernoulli, poisson and negativebinomial have the built-in bounds; gaussian with a
    sampled noise sd has none."""
    from tallmh.frontends.formula import NegativeBinomialRegression, PoissonRegression

    assert has_bound(tm.models.LogisticRegression()) and has_bound(PoissonRegression())
    assert has_bound(tm.models.LinearRegression(noise_sd=1.0)) and has_bound(NegativeBinomialRegression())
    assert not has_bound(tm.models.LinearRegression(noise_sd=None))


def test_which_pymc_models_get_a_bound():
    X, y = glm_data(600, "bernoulli")
    assert has_bound(pymc_glm(X, y, "bernoulli")[0])
    with pm.Model() as m:  # a scale parameter in the predictor (exp of its unconstrained value)
        s = pm.HalfNormal("s", 1.0)
        b = pm.Normal("b", 0, 5, shape=2)
        pm.Bernoulli("y", logit_p=s * pm.math.dot(X[:, :2], b), observed=y)
    model, _ = tm.from_pymc(m)
    assert not has_bound(model) and "exp" in model.factor_bound_reason
    with pm.Model() as m:  # a probit link
        b = pm.Normal("b", 0, 5, shape=2)
        pm.Bernoulli("y", p=pm.math.invprobit(pm.math.dot(X[:, :2], b)), observed=y)
    model, _ = tm.from_pymc(m)
    assert not has_bound(model)


def test_which_numpyro_models_get_a_bound():
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist

    X, y = glm_data(500, "bernoulli")
    X, y = X.astype(np.float32), y.astype(np.float32)
    assert has_bound(numpyro_glm(X, y)[0])

    def scaled(X, y=None):
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        b = numpyro.sample("b", dist.Normal(0, 5).expand([X.shape[1]]))
        with numpyro.plate("rows", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=s * (X @ b)), obs=y)

    def probs(X, y=None):
        b = numpyro.sample("b", dist.Normal(0, 5).expand([X.shape[1]]))
        with numpyro.plate("rows", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(probs=jax.nn.sigmoid(X @ b)), obs=y)

    def rate_plus_one(X, y=None):  # a rate that is not exp(linear predictor)
        b = numpyro.sample("b", dist.Normal(0, 5).expand([X.shape[1]]))
        with numpyro.plate("rows", X.shape[0]):
            numpyro.sample("y", dist.Poisson(jnp.exp(X @ b) + 1.0), obs=y)

    assert has_bound(numpyro_glm(X, y, "poisson")[0])
    for fn in (scaled, probs, rate_plus_one):
        model, _ = tm.from_numpyro(fn, X, y)
        assert not has_bound(model), fn.__name__


@pytest.mark.slow
def test_bambi_glm_through_sample_with_the_exact_test():
    """A Bambi logistic regression sampled by ``tm.sample`` with the exact subsampled test: few items per step, the
    same posterior mean as exact MH within Monte Carlo error (short chains: a loose check; the slow tests below
    are the tight ones)."""
    bmb = pytest.importorskip("bambi")
    import pandas as pd

    X, y = glm_data(20_000, "bernoulli", seed=6)
    df = pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "y": y})
    model, data = tm.from_bambi(bmb.Model("y ~ x1 + x2", df, family="bernoulli"))
    kw = dict(num_samples=800, num_warmup=300, num_chains=2, seed=0, progress=False)
    res = tm.sample(model, data, test=tm.acceptance.PoissonThinning(), **kw)
    ref = tm.sample(model, data, test=tm.acceptance.Exact(), **kw)
    assert float(np.mean(res.stats["n_data"])) < 5.0
    ok, zm, zs, report = compare(np.asarray(res.flat_samples, np.float64), np.asarray(ref.flat_samples, np.float64),
                                 z=5.0)
    assert ok, report


# --- the bound against the true remainder differences ------------------------------------------------------

def _true_remainder(family, X, y, flat_c, flat):
    """``R_i(theta)`` in float64 from the test's design: ``theta = (a, b)`` (ravel order of {"a", "b"})."""
    def eta(t):
        return t[0] + X @ t[1:]

    ec, e = eta(np.asarray(flat_c, np.float64)), eta(np.asarray(flat, np.float64))
    t = e - ec
    if family == "bernoulli":
        p = 1 / (1 + np.exp(-ec))
        f = lambda u: y * u - np.logaddexp(0.0, u)  # noqa: E731
        return f(e) - f(ec) - (y - p) * t + 0.5 * p * (1 - p) * t * t
    mu = np.exp(ec)
    return -(np.exp(e) - mu - mu * t - 0.5 * mu * t * t)


@pytest.mark.parametrize("family", ["bernoulli", "poisson", "numpyro", "numpyro-poisson"])
def test_bound_holds_on_random_pairs_near_and_far(family):
    fam = "poisson" if family.endswith("poisson") else "bernoulli"
    X, y = glm_data(3000, fam, seed=2, rare=20 if fam == "bernoulli" else 0)
    model, data = numpyro_glm(X, y, fam) if family.startswith("numpyro") else pymc_glm(X, y, family)
    family = fam
    assert has_bound(model)
    unravel, cv, stats, _ = setup(model, data)
    T = stats[fbm.FACTOR_KEY]
    bound = model.factor_bound()
    rinv = np.asarray(T.chol_cov, np.float64).T  # (R^-1: chol_cov is R^-T)
    w = bound.weights_host(np.asarray(T.center, np.float64), rinv, data)
    L = np.asarray(T.chol_cov, np.float64)
    c = np.asarray(T.center, np.float64)
    rng = np.random.default_rng(3)
    d = c.shape[0]
    checked = 0
    batch = jax.tree_util.tree_map(jnp.asarray, data)
    for i in range(60):
        z = rng.normal(size=d) * rng.uniform(0.1, 3)  # (Poisson: a part of them leave the trust region)
        zp = z + rng.normal(size=d) * 10 ** rng.uniform(-2, 0.5)
        th, thp = c + L @ z, c + L @ zp
        zz, zzp = jnp.asarray(T.rt @ (th - c), jnp.float32), jnp.asarray(T.rt @ (thp - c), jnp.float32)
        if not bool(bound.region(zz, zzp)):
            continue
        checked += 1
        true = _true_remainder(family, X, y, c, thp) - _true_remainder(family, X, y, c, th)
        ours = np.asarray(bound.remainder(jnp.asarray(th, jnp.float32), jnp.asarray(thp, jnp.float32),
                                          T.center, batch), np.float64)
        b = w * float(bound.phi(zz, zzp))
        assert np.all(np.abs(true) <= b * (1 + 1e-6) + 1e-12), np.max(np.abs(true) / np.maximum(b, 1e-300))
        assert np.all(np.abs(ours) <= b + 1e-7)
        np.testing.assert_allclose(ours, true, rtol=2e-3, atol=1e-6 * max(1.0, np.max(np.abs(true))))
    assert checked >= 30
    assert np.max(w) > 0


# --- chains against exact MH ---------------------------------------------------------------------------------

STEPS = 3000


@pytest.fixture(scope="module")
def rare_case():
    X, y = glm_data(5000, "bernoulli", seed=4, rare=12)
    model, data = pymc_glm(X, y, "bernoulli")
    unravel, cv, stats, prop, ref = exact_mh_case(model, data, STEPS)
    return model, data, unravel, cv, stats, prop, ref


@pytest.mark.slow
def test_pymc_logistic_chain_matches_exact_mh(rare_case):
    model, data, unravel, cv, stats, prop, ref = rare_case
    draws, _, nd = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert ok, report
    assert nd.mean() < 50, nd.mean()


@pytest.mark.slow
def test_pymc_logistic_chain_with_shrunk_bound_fails_the_same_check(rare_case):
    model, data, unravel, cv, stats, prop, ref = rare_case
    table, _ = fbm.prepare(model, data, 5000, unravel, cv, Shrunk(model.factor_bound(), 0.02))
    draws, _, _ = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv,
                             {**stats, fbm.FACTOR_KEY: table}, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert not ok, report


@pytest.mark.slow
def test_pymc_poisson_chain_matches_exact_mh():
    X, y = glm_data(5000, "poisson", seed=5, rare=12)
    model, data = pymc_glm(X, y, "poisson")
    unravel, cv, stats, prop, ref = exact_mh_case(model, data, STEPS)
    draws, _, nd = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert ok, report
    assert nd.mean() < 50, nd.mean()


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bernoulli", "poisson"])
def test_numpyro_glm_chain_matches_exact_mh(family):
    X, y = glm_data(5000, family, seed=4, rare=12)
    model, data = numpyro_glm(X, y, family)
    assert has_bound(model)
    unravel, cv, stats, prop, ref = exact_mh_case(model, data, STEPS)
    draws, _, nd = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    assert ok, report
    assert nd.mean() < 50, nd.mean()
