"""Informed sub-sampling MCMC (tm.acceptance.Informed): target, subset chain, cost, errors.

Posterior checks are z-tests with MCSEs from ESS (tests/stats_helpers.py), fixed seeds. ISS targets an
approximate posterior in general; the checks use the one case where it is exact (a sufficient statistic
and a large eps: every subset the subset chain visits has the full data's mean, so the subset posterior
is the full one) and a negative control (eps = 0: uniform subsets, a visibly wider posterior).
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import tallmh as tm
from tallmh.informed import _distinct_draw

from ..stats_helpers import posterior_check

N_GAUSS = 2000


def x_stat(batch):  # module-level: the same function (and compiled chain) across tests
    return batch["x"]


@pytest.fixture(scope="module")
def gauss():
    rng = np.random.default_rng(3)
    data = {"x": jnp.asarray(0.3 + rng.standard_normal(N_GAUSS), jnp.float32)}
    model = tm.models.GaussianMean(sigma=1.0)
    mean, sd = model.posterior(data)
    return model, data, mean, sd


def _run(model, data, test, seed, init=None, warmup=1500, draws=2000):
    """4 chains; started at ``init`` with a jitter of 2 posterior sds (no mode search: quicker), or, with
    ``init=None``, at tm.sample's default (mode by Newton, dispersed Laplace starts)."""
    jitter = None if init is None else 2.0 / np.sqrt(N_GAUSS)
    return tm.sample(model, data, test=test, num_samples=draws, num_warmup=warmup, num_chains=4, seed=seed,
                     init=init, init_jitter=jitter, progress=False)


@pytest.mark.parametrize("statistic", [x_stat, pytest.param(None, marks=pytest.mark.slow)],
                         ids=["sufficient-x", "default-scores"])
@pytest.mark.slow
def test_exact_with_sufficient_statistic(gauss, statistic):
    """Gaussian mean, known variance: S = x is sufficient (and so are the scores (x - mu_hat)/sigma^2, the
    default). With eps = 1e3 the subset chain settles on subsets whose mean is the full data's, and ISS
    samples the exact posterior N(mean(x), 1/N) (ISS-MCMC report, Sec. 3.1: eps -> inf, sufficient S)."""
    model, data, mean, sd = gauss
    test = tm.acceptance.Informed(subset_size=100, swap=1, epsilon=1e3, statistic=statistic)
    # the default statistic runs through tm.sample's mode search (its mode and Hessian reach the kernel)
    r = _run(model, data, test, seed=1, init=jnp.array([0.3]) if statistic is not None else None)
    ok, report = posterior_check(r.samples, mean, sd)
    assert ok, report
    assert r.summary().overall["audit_steps"] == 0  # no self-audit against exact MH
    ex = r.final_state.extra
    # the subsets the chains hold match the full data's statistic closely: |Delta| << sigma sqrt(N)
    assert np.all(np.sqrt(np.asarray(ex.delta_sq)) < 0.05 * np.sqrt(N_GAUSS)), np.asarray(ex.delta_sq)


@pytest.mark.slow
def test_default_statistic_mode_found_in_init(gauss):
    """With init= given, tm.sample finds no mode; the kernel's init runs Newton itself (counted passes)."""
    model, data, mean, sd = gauss
    test = tm.acceptance.Informed(subset_size=100, swap=1, epsilon=1e3)
    r = _run(model, data, test, seed=2, init=jnp.array([0.0]))
    ok, report = posterior_check(r.samples, mean, sd)
    assert ok, report
    ex = r.final_state.extra
    np.testing.assert_allclose(np.asarray(ex.center)[:, 0], mean, atol=1e-4)
    assert np.all(np.asarray(ex.chain_passes) >= 2)
    # set-up counts the Newton passes of every chain, the statistic's pass and the initial subsets
    assert r.setup_items >= int(np.sum(ex.chain_passes)) * N_GAUSS + N_GAUSS + 4 * 100


@pytest.mark.slow
def test_negative_control_eps_zero_is_wider(gauss):
    """eps = 0: uniform subsets; each subset posterior is centred on its own mean, so the theta-marginal
    is about sqrt(N/n) = 4.5 times wider than the posterior: the same check must fail."""
    model, data, mean, sd = gauss
    test = tm.acceptance.Informed(subset_size=100, swap=1, epsilon=0.0, statistic=x_stat)
    r = _run(model, data, test, seed=1, init=jnp.array([0.3]))
    ok, report = posterior_check(r.samples, mean, sd)
    assert not ok, report
    assert np.std(r.samples) > 2.5 * sd


@pytest.mark.slow
def test_negative_control_wrong_statistic(gauss):
    """A statistic that says little about the mean (cos 4x: matching it leaves the subset's mean free)
    gives a visibly wrong posterior, as eps = 0 does."""
    model, data, mean, sd = gauss
    test = tm.acceptance.Informed(subset_size=100, swap=1, epsilon=1e3, statistic=lambda b: jnp.cos(4 * b["x"]))
    r = _run(model, data, test, seed=3, init=jnp.array([0.3]))
    ok, report = posterior_check(r.samples, mean, sd)
    assert not ok, report


def _drive(kernel, theta0, data, steps, seed):
    state = jax.jit(kernel.init)(theta0, data)

    @jax.jit
    def run(state, key):
        def body(st, i):
            st, info = kernel.step(jax.random.fold_in(key, i), st, data, i, False)
            return st, (st.extra.idx, info.n_data, info.accepted)

        return jax.lax.scan(body, state, jnp.arange(steps))

    return run(state, jax.random.PRNGKey(seed))


def test_subset_chain_has_nu_as_stationary_law():
    """N = 6, n = 2, k = 1: the 15 subsets' visit frequencies match nu(U) ∝ exp(-eps ||Delta(U)||^2)
    (report eq. (3)-(5)); chi-square test. The theta move never touches U."""
    vals = jnp.asarray([0.0, 0.5, 1.0, 1.5, 2.0, 4.0], jnp.float32)
    data = {"x": vals}
    model = tm.models.GaussianMean(sigma=1.0)
    eps = 0.05
    test = tm.acceptance.Informed(subset_size=2, swap=1, epsilon=eps, statistic=x_stat)
    kern = tm.build_kernel(model, tm.proposals.RandomWalk(0.3), test, 6, lambda t: t)
    steps = 30_000
    _, (idx, nd, _) = _drive(kern, jnp.array([1.0]), data, steps, seed=4)
    idx = np.sort(np.asarray(idx), axis=1)
    assert np.all(idx[:, 0] != idx[:, 1])
    subsets = list(itertools.combinations(range(6), 2))
    x = np.asarray(vals, float)
    delta = np.array([x.sum() - 3.0 * (x[a] + x[b]) for a, b in subsets])
    w = np.exp(-eps * delta**2)
    nu = w / w.sum()
    code = {s: i for i, s in enumerate(subsets)}
    counts = np.bincount([code[tuple(r)] for r in idx[::2]], minlength=15)  # thinned (autocorrelation)
    chi2 = np.sum((counts - counts.sum() * nu) ** 2 / (counts.sum() * nu))
    # thinned draws are still correlated; a generous level: p > 1e-4
    assert stats.chi2.sf(chi2, 14) > 1e-4, (counts, np.round(counts.sum() * nu))
    # negative control: the same counts against the uniform law must fail
    chi2_u = np.sum((counts - counts.sum() / 15) ** 2 / (counts.sum() / 15))
    assert stats.chi2.sf(chi2_u, 14) < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("n_items", [1_000, 100_003])
def test_cost_per_step_does_not_grow_with_n(n_items):
    """n_data per step is n + k whatever N, and the step's program holds no array with an axis of N."""
    data, _ = tm.models.LogisticRegression.simulate(n_items, d=2, seed=0)
    model = tm.models.LogisticRegression()
    test = tm.acceptance.Informed(subset_size=50, swap=3, epsilon=1.0)
    kern = tm.build_kernel(model, tm.proposals.RandomWalk(0.05), test, n_items, lambda t: t)
    theta0 = jnp.zeros(3)
    _, (idx, nd, _) = _drive(kern, theta0, data, 20, seed=0)
    assert set(np.asarray(nd).tolist()) == {53}
    idx = np.asarray(idx)
    assert all(len(set(r.tolist())) == 50 for r in idx)
    state = jax.eval_shape(kern.init, theta0, data)
    jaxpr = jax.make_jaxpr(lambda k, s, dt: kern.step(k, s, dt, 0, False))(jax.random.PRNGKey(0), state, data)

    def shapes(jx):
        for eqn in jx.eqns:
            for v in eqn.outvars:
                yield getattr(v.aval, "shape", ())
            for p in eqn.params.values():
                sub = getattr(p, "jaxpr", None)
                if sub is not None:
                    yield from shapes(getattr(sub, "jaxpr", sub))
                if isinstance(p, (tuple, list)):
                    for q in p:
                        sub = getattr(q, "jaxpr", None)
                        if sub is not None:
                            yield from shapes(getattr(sub, "jaxpr", sub))

    big = [s for s in shapes(jaxpr.jaxpr) if any(dim >= n_items for dim in s)]
    assert not big, big


def test_distinct_draw_is_uniform_and_avoids_members():
    exclude = jnp.asarray([0, 3, 4], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), 6000)
    draws = np.asarray(jax.vmap(lambda k: _distinct_draw(k, 2, 8, exclude))(keys))
    assert not np.isin(draws, [0, 3, 4]).any()
    assert np.all(draws[:, 0] != draws[:, 1])
    pairs = [tuple(sorted(r)) for r in draws.tolist()]
    allowed = list(itertools.combinations([1, 2, 5, 6, 7], 2))
    counts = np.array([pairs.count(p) for p in allowed])
    assert counts.sum() == 6000
    assert stats.chisquare(counts).pvalue > 1e-3, counts


def test_config_errors(gauss):
    model, data, _, _ = gauss
    with pytest.raises(tm.ConfigError):
        tm.acceptance.Informed(subset_size=0)
    with pytest.raises(tm.ConfigError):
        tm.acceptance.Informed(subset_size=10, swap=11)
    with pytest.raises(tm.ConfigError):
        tm.acceptance.Informed(subset_size=10, epsilon=-1.0)
    with pytest.raises(tm.ConfigError):
        tm.acceptance.Informed(subset_size=10, statistic=3)
    with pytest.raises(tm.ConfigError):
        tm.sample(model, data, test=tm.acceptance.Informed(subset_size=N_GAUSS), num_samples=5, num_warmup=0,
                  progress=False)
    with pytest.raises(tm.ConfigError):
        tm.sample(model, data, test=tm.acceptance.Informed(subset_size=50),
                  control_variates=tm.ControlVariates(), num_samples=5, num_warmup=0, progress=False)
    with pytest.raises(tm.ModelError):
        kern = tm.build_kernel(model, tm.proposals.RandomWalk(0.1),
                               tm.acceptance.Informed(subset_size=50, statistic=lambda b: b["x"][:3]),
                               N_GAUSS, lambda t: t)
        kern.init(jnp.zeros(1), data, None, None)
