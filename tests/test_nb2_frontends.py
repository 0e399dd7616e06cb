"""NB2-log GLMs read from PyMC, Bambi and NumPyro: which models get the NB2 bound (and so the exact default), the
bound against the true remainder differences (the built-in NB2 regression's float64 remainder, which is invariant
under the affine change of parameters between the two), and a PyMC chain against exact MH with a shrunk bound as
the negative control."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.models.nb2_bound import nb2_remainder_diff
from tallmh.run.configure import recommended

pm = pytest.importorskip("pymc")
numpyro = pytest.importorskip("numpyro")
import numpyro.distributions as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent / "acceptance"))
from thinning_helpers import Shrunk, compare, exact_mh_case, run_chains, setup  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def has_bound(model):
    return tm.model.own_method(model, "factor_bound") is not None


def nb_data(n, seed=0, alpha=0.5, rare=0):
    """``X`` (n, 2) normal features (the second, with ``rare`` > 0, one-hot in ``rare`` rows), NB2 counts with
    mean ``exp(0.5 + X (0.8, -0.3 or -2.5))`` and dispersion ``alpha`` (gamma-Poisson)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    beta = np.array([0.8, -0.3])
    if rare:
        X[:, 1] = 0.0
        X[rng.choice(n, rare, replace=False), 1] = 1.0
        beta[1] = -2.5
    mu = np.exp(0.5 + X @ beta)
    y = rng.poisson(rng.gamma(1.0 / alpha, mu * alpha))
    return X, y


def pymc_nb(X, y, mu=None, alpha_rows=False, zero_inflated=False):
    with pm.Model() as m:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5, shape=X.shape[1])
        r = pm.HalfNormal("r", 5.0)
        eta = a + pm.math.dot(X, b)
        mean = pm.math.exp(eta) if mu is None else mu(eta)
        alpha = r * np.exp(X[:, 0]) if alpha_rows else r
        if zero_inflated:
            pm.ZeroInflatedNegativeBinomial("y", psi=0.8, mu=mean, alpha=alpha, observed=y)
        else:
            pm.NegativeBinomial("y", mu=mean, alpha=alpha, observed=y)
    return tm.from_pymc(m)


def numpyro_nb(X, y, kind="nb2"):
    def model(X, y=None):
        a = numpyro.sample("a", dist.Normal(0, 5))
        b = numpyro.sample("b", dist.Normal(0, 5).expand([X.shape[1]]))
        c = numpyro.sample("conc", dist.HalfNormal(5.0))
        eta = a + X @ b
        with numpyro.plate("rows", X.shape[0]):
            if kind == "nb2":
                numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(eta), c), obs=y)
            elif kind == "zero_inflated":
                numpyro.sample("y", dist.ZeroInflatedNegativeBinomial2(jnp.exp(eta), c, gate=0.2), obs=y)
            elif kind == "softplus_link":
                numpyro.sample("y", dist.NegativeBinomial2(jax.nn.softplus(eta), c), obs=y)
            elif kind == "conc_per_row":
                numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(eta), c * jnp.exp(X[:, 0])), obs=y)

    return tm.from_numpyro(model, X.astype(np.float32), y.astype(np.float32))


def bambi_nb(X, y, family="negativebinomial"):
    bmb = pytest.importorskip("bambi")
    import pandas as pd

    df = pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "y": y})
    return tm.from_bambi(bmb.Model("y ~ x1 + x2", df, family=family))


def exact_default(model, data):
    n = int(np.shape(next(iter(data.values())))[0])
    test, _, why = recommended(model, data, n, model.init())
    return isinstance(test, tm.acceptance.PoissonThinning), why


# --- which models get the bound ------------------------------------------------------------------------------

def test_pymc_nb2_gets_the_bound_and_the_exact_default():
    X, y = nb_data(400)
    model, data = pymc_nb(X, y)
    assert has_bound(model) and model.glm_family == "nb2_log", model.factor_bound_reason
    ok, why = exact_default(model, data)
    assert ok and why == "the model bounds its Taylor remainders: exact subsampled MH", why


def test_pymc_other_likelihoods_are_refused():
    X, y = nb_data(400)
    for kw, word in ((dict(mu=pm.math.log1pexp), "log link"), (dict(alpha_rows=True), "alpha"),
                     (dict(zero_inflated=True), "MixtureRV")):
        model, data = pymc_nb(X, y, **kw)
        assert not has_bound(model) and word in model.factor_bound_reason, (kw, model.factor_bound_reason)
        ok, why = exact_default(model, data)
        assert not ok and "no bound" in why, why


def test_numpyro_nb2_gets_the_bound_and_the_exact_default():
    X, y = nb_data(400)
    model, data = numpyro_nb(X, y)
    assert has_bound(model) and model.glm_family == "nb2_log", model.factor_bound_reason
    assert exact_default(model, data)[0]


def test_a_dispersion_computed_from_the_rows_is_seen():
    """(Such a NumPyro model is refused earlier, as not additive over rows; the reading refuses it on its own.)"""
    from tallmh.linear_predictor import reads_data

    t, b = jnp.zeros(2), {"x": jnp.ones((4, 2))}
    assert reads_data(lambda t, b: jnp.exp(t[0] + jnp.mean(b["x"][:, 0])), t, b)
    assert not reads_data(lambda t, b: jnp.exp(t[0] + 0.0 * b["x"].shape[0]), t, b)


def test_numpyro_other_likelihoods_are_refused():
    X, y = nb_data(400)
    for kind, word in (("zero_inflated", "ZeroInflated"), ("softplus_link", "exp(linear predictor)"),
                       ("conc_per_row", "differs between rows")):
        model, data = numpyro_nb(X, y, kind)
        assert not has_bound(model) and word in model.factor_bound_reason, (kind, model.factor_bound_reason)
        assert not exact_default(model, data)[0], kind
    half = y.astype(np.float64)
    half[123] += 0.5  # (one response, in a row the front end's own checks do not read, not a whole count)
    model, _ = numpyro_nb(X, half)
    assert not has_bound(model) and "counts" in model.factor_bound_reason, model.factor_bound_reason


@pytest.mark.slow
def test_bambi_nb2_gets_the_bound_and_zero_inflated_is_refused():
    X, y = nb_data(400)
    model, data = bambi_nb(X, y)
    assert has_bound(model) and model.glm_family == "nb2_log", model.factor_bound_reason
    assert exact_default(model, data)[0]
    model, data = bambi_nb(X, y, "zero_inflated_negativebinomial")
    assert not has_bound(model) and "MixtureRV" in model.factor_bound_reason
    assert not exact_default(model, data)[0]


# --- the bound against the true remainder differences --------------------------------------------------------

def _to_builtin(model, flat0):
    """``M`` (d, d) with ``(a, b, tau) = M @ flat`` (the maps are linear: read by differentiating at 0)."""
    from jax.flatten_util import ravel_pytree

    _, unravel = ravel_pytree(model.init())
    log_r = "r_log__" if "r_log__" in unravel(flat0) else "conc"

    def f(t):
        th = unravel(t)
        return jnp.concatenate([jnp.reshape(th["a"], (1,)), th["b"], -jnp.reshape(th[log_r], (1,))])

    return np.asarray(jax.jacfwd(f)(jnp.zeros_like(flat0)), np.float64)


_true = jax.jit(nb2_remainder_diff)


@pytest.mark.parametrize("front", ["pymc", "numpyro"])
def test_bound_holds_on_random_pairs(front):
    """``|R_i(theta') - R_i(theta)| <= w_i phi(z, z')`` on every row at random pairs near and far in the trust
    region, with the true differences from the built-in NB2 regression's float64 remainder at the mapped
    parameters; the front end's own float32 remainder agrees with them."""
    X, y = nb_data(3000, seed=2)
    model, data = pymc_nb(X, y) if front == "pymc" else numpyro_nb(X, y)
    ours_of = jax.jit(lambda th, thp, c, b: model.factor_bound().remainder(th, thp, c, b))
    assert has_bound(model)
    unravel, cv, stats, _ = setup(model, data)
    T = stats[fbm.FACTOR_KEY]
    bound = model.factor_bound()
    c = np.asarray(T.center, np.float64)
    M = _to_builtin(model, jnp.asarray(T.center))
    rinv = np.asarray(T.chol_cov, np.float64).T
    w = bound.weights_host(c, rinv, data)
    L = np.asarray(T.chol_cov, np.float64)
    Xb = np.column_stack([np.ones(len(y)), X])
    rng = np.random.default_rng(3)
    batch = jax.tree_util.tree_map(jnp.asarray, data)
    checked, tight = 0, 0.0
    for _ in range(30):
        z = rng.normal(size=c.shape[0]) * rng.uniform(0.1, 2.0)
        zp = z + rng.normal(size=c.shape[0]) * 10 ** rng.uniform(-2, 0.3)
        th, thp = c + L @ z, c + L @ zp
        zz, zzp = jnp.asarray(T.rt @ (th - c), jnp.float32), jnp.asarray(T.rt @ (thp - c), jnp.float32)
        if not bool(bound.region(zz, zzp)):
            continue
        checked += 1
        with jax.enable_x64(True):
            true = np.asarray(_true(*(jnp.asarray(v, jnp.float64) for v in (Xb, y, M @ c, M @ th, M @ thp))))
        b = w * float(bound.phi(zz, zzp))
        assert np.all(np.abs(true) <= b * (1 + 1e-6) + 1e-10), np.max(np.abs(true) / np.maximum(b, 1e-300))
        ours = np.asarray(ours_of(jnp.asarray(th, jnp.float32), jnp.asarray(thp, jnp.float32), T.center, batch),
                          np.float64)
        np.testing.assert_allclose(ours, true, rtol=2e-3, atol=1e-5 * max(1.0, np.max(np.abs(true))))
        tight = max(tight, float(np.max(np.abs(true) / b)))
    assert checked >= 20 and tight > 1e-3, (checked, tight)


# --- a chain against exact MH --------------------------------------------------------------------------------

STEPS = 3000


@pytest.fixture(scope="module")
def pymc_case():
    X, y = nb_data(5000, seed=6, rare=15)
    model, data = pymc_nb(X, y)
    assert has_bound(model)
    unravel, cv, stats, prop, ref = exact_mh_case(model, data, STEPS)
    return model, data, unravel, cv, stats, prop, ref


def test_sample_runs_the_exact_default_on_a_pymc_nb2():
    """``tm.sample`` with defaults: the exact test (said in the notes), few rows a step, no full pass."""
    X, y = nb_data(20_000, seed=8)
    model, data = pymc_nb(X, y)
    r = tm.sample(model, data, num_samples=300, num_warmup=300, num_chains=2, seed=0, progress=False)
    assert any(m.startswith("default method: exact-subsampled") for m in r.notes), r.notes
    nd = np.asarray(r.stats["n_data"])
    assert nd.mean() < 20 and nd.max() < 20_000, (nd.mean(), nd.max())


@pytest.mark.slow
def test_pymc_nb2_chain_matches_exact_mh(pymc_case):
    model, data, unravel, cv, stats, prop, ref = pymc_case
    draws, _, nd = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv, stats, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    print(report, "\nrows per step", nd.mean())
    assert ok, report
    assert nd.mean() < 50, nd.mean()


@pytest.mark.slow
def test_pymc_nb2_chain_with_shrunk_bound_fails_the_same_check(pymc_case):
    model, data, unravel, cv, stats, prop, ref = pymc_case
    table, _ = fbm.prepare(model, data, 5000, unravel, cv, Shrunk(model.factor_bound(), 0.02))
    draws, _, _ = run_chains(model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv,
                             {**stats, fbm.FACTOR_KEY: table}, STEPS, seed=1)
    ok, zm, zs, report = compare(draws, ref)
    print(report)
    assert not ok, report
