"""The confidence test's ranges ``C_{theta,theta'} >= max_i |l_i|`` (adaptive subsampling paper, eq. 8).

In float32 (JAX's default), on random (theta, theta') pairs from tiny steps (where the computed ``l_i``
are mostly rounding) to large ones, each built-in model's bound (with and without control variates)
must exceed the largest computed ``|l_i|`` over all N items. Negative control: the same bounds without
their rounding headroom fail. Then the test itself: on ``GaussianMean`` (the paper's Sec. 4.3 setting)
``Confidence`` reads far fewer than N items per decision and its decisions differ from Exact's with
probability at most delta on fixed pairs; a model without a bound makes one exact pass of N items.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import tallmh as tm
import tallmh.control_variates as cvm
import tallmh.models._rounding as rounding
from tallmh.kernel import make_problem

from .helpers import binomial_margin, decisions

N = 20_000
SCALES = (1e-7, 1e-5, 1e-3, 1e-1)


def _setting(name):
    rng = np.random.default_rng(3)
    f32 = np.float32
    if name == "gaussian-mean":
        data = {"x": (0.5 + 0.1 * rng.standard_normal(N)).astype(f32)}
        return tm.models.GaussianMean(), data, np.array([0.5], f32), None
    if name == "gaussian":
        data = {"x": (2.0 + 3.0 * rng.standard_normal(N)).astype(f32)}
        return tm.models.Gaussian(), data, np.array([2.0, np.log(3.0)], f32), None
    if name == "mixture":
        data = tm.models.GaussianMixture.simulate(N, seed=1)
        data = {"x": data["x"].astype(f32)}
        return tm.models.GaussianMixture(), data, np.array([0.0, 1.0], f32), None
    if name == "mixture-tempered":
        data = {"x": tm.models.GaussianMixture.simulate(N, seed=2)["x"].astype(f32)}
        return tm.models.GaussianMixture(temperature=100.0), data, np.array([0.0, 1.0], f32), None
    if name.startswith("logistic"):
        data, theta = tm.models.LogisticRegression.simulate(N, d=4, seed=0)
        return tm.models.LogisticRegression(), data, theta.astype(f32), _order(name)
    if name.startswith("linear"):
        data, theta = tm.models.LinearRegression.simulate(N, d=3, seed=0)
        data = {k: v.astype(f32) for k, v in data.items()}
        return tm.models.LinearRegression(), data, theta.astype(f32), _order(name)
    raise ValueError(name)


def _order(name):
    return int(name[-1]) if name[-1] in "12" else None


def _max_l_and_bound(model, data, center, order, pairs):
    """Largest computed |l_i| over all N items, and the bound, for each pair (float32, kernel code path)."""
    data = jax.tree_util.tree_map(jnp.asarray, data)
    stats = model.setup(data)
    flat, unravel = ravel_pytree(jnp.asarray(center))
    cv = None
    if order is not None:
        cv = cvm.proxy_sums(model, data, N, unravel, jnp.asarray(center), order)

    @jax.jit
    def one(th, thp):
        p = make_problem(model, data, N, unravel, stats, th, thp, jnp.float32(0.0), None, cv, order or 2)
        l = p.lik_ratio(jnp.arange(N))
        return jnp.max(jnp.abs(l)), p.bound()

    out = [one(jnp.asarray(a), jnp.asarray(b)) for a, b in zip(*pairs)]
    return np.array([float(o[0]) for o in out]), np.array([float(o[1]) for o in out])


def _pairs(center, count=24, seed=0, offset=0.01):
    rng = np.random.default_rng(seed)
    d = center.shape[0]
    scales = np.array(SCALES)[np.arange(count) % len(SCALES)]
    th = center + offset * rng.standard_normal((count, d))
    thp = th + scales[:, None] * rng.standard_normal((count, d))
    return th.astype(np.float32), thp.astype(np.float32)


CASES = ["gaussian-mean", "gaussian", "mixture", "mixture-tempered", "logistic", "linear",
         "logistic-cv1", "logistic-cv2", "linear-cv1", "linear-cv2"]


@pytest.mark.parametrize("name", CASES)
def test_bound_holds_for_computed_ratios(name):
    model, data, center, order = _setting(name)
    pairs = _pairs(center)
    ml, b = _max_l_and_bound(model, data, center, order, pairs)
    assert np.all(np.isfinite(b)) and np.all(ml <= b), (ml, b)
    # not vacuous: on the large steps the analytic part is what counts
    big = np.arange(len(ml)) % len(SCALES) == len(SCALES) - 1
    tight = {"gaussian-mean": 0.9, "gaussian": 0.9, "mixture": 0.2, "mixture-tempered": 0.2,
             "logistic": 0.1, "linear": 0.1, "logistic-cv1": 0.01, "logistic-cv2": 1e-3,
             "linear-cv1": 0.01, "linear-cv2": 1e-3}[name]
    assert np.max(ml[big] / b[big]) > tight, (ml / b)


@pytest.mark.parametrize("name", ["gaussian-mean", "gaussian", "mixture", "linear-cv2", "logistic-cv2"])
def test_negative_control_bounds_without_headroom_fail(name, monkeypatch):
    # Without the rounding headroom, the computed l_i of tiny steps (or the order-2 remainders of a
    # quadratic log-likelihood, exactly 0 in real arithmetic) exceed the analytic bound.
    model, data, center, order = _setting(name)
    pairs = _pairs(center, offset=1e-4)  # near the centre, where the exact remainders are tiny
    mod = __import__(type(model).__module__, fromlist=["rounding_headroom"])
    monkeypatch.setattr(mod, "rounding_headroom", lambda c, magnitude, ops=8.0: jnp.asarray(c))
    ml, b = _max_l_and_bound(model, data, center, order, pairs)
    assert np.any(ml > b), (ml, b)


def test_rounding_headroom_is_relative_and_absolute():
    c = rounding.rounding_headroom(jnp.float32(2.0), 10.0, ops=4.0)
    eps = float(np.finfo(np.float32).eps)
    assert np.isclose(float(c), 2.0 * (1 + 16 * eps) + 40.0 * eps, rtol=1e-6)


# --- the confidence test on GaussianMean (adaptive subsampling paper, Sec. 4.3) ------------------------

NG = 50_000
KEYS = 300


@pytest.fixture(scope="module")
def gauss_setting():
    rng = np.random.default_rng(5)
    # Sec. 4.3's model N(theta, 1) on data N(1/2, sigma_X^2); sigma_X = 0.01: data clustered in terms of
    # log-likelihood, where the paper expects the gains (with its sigma_X = 0.1 the test reads about half
    # of N per decision at N = 5e4 to 1e6; before, every decision read N + t items)
    x = (0.5 + 0.01 * rng.standard_normal(NG)).astype(np.float32)
    model = tm.models.GaussianMean()
    mean, sd = model.posterior({"x": x})
    pairs_a, pairs_b = [], []
    while len(pairs_a) < 6:  # steps of an MH chain at equilibrium with moderate acceptance
        a = mean + sd * rng.standard_normal()
        b = a + 2.4 * sd * rng.standard_normal()
        dlt = -0.5 * np.sum((x - b) ** 2 - (x - a) ** 2, dtype=np.float64)
        if 0.15 < min(1.0, np.exp(dlt)) < 0.85:
            pairs_a.append([a])
            pairs_b.append([b])
    pairs = (np.array(pairs_a, np.float32), np.array(pairs_b, np.float32))
    keys = jax.random.split(jax.random.PRNGKey(3), KEYS)
    ref, _ = decisions(tm.acceptance.Exact(), model, {"x": x}, pairs, keys)
    return model, {"x": x}, pairs, keys, ref


@pytest.mark.slow
def test_confidence_on_gaussian_mean_reads_few_items_and_errs_at_most_delta(gauss_setting):
    model, data, pairs, keys, ref = gauss_setting
    delta = 0.05
    acc, nd = decisions(tm.acceptance.Confidence(delta=delta, initial_batch=100), model, data, pairs, keys)
    err = (acc != ref).mean(axis=1)
    assert np.all(err <= delta + binomial_margin(delta, KEYS)), err
    assert 0.1 < ref.mean() < 0.9
    # no full pass per step any more: the mean items per decision is a fraction of N
    assert nd.mean() < 0.3 * NG, nd.mean()
    assert np.median(nd) < 0.2 * NG, np.median(nd)


class _ShrunkBound(tm.models.GaussianMean):
    def lik_ratio_bound(self, theta, theta_prop, stats):
        return 0.002 * super().lik_ratio_bound(theta, theta_prop, stats)


@pytest.mark.slow
def test_negative_control_shrunk_gaussian_range_errs_more_than_delta(gauss_setting):
    _, data, pairs, keys, ref = gauss_setting
    delta = 0.05
    acc, _ = decisions(tm.acceptance.Confidence(delta=delta, bound="hoeffding", initial_batch=100),
                       _ShrunkBound(), data, pairs, keys)
    err = (acc != ref).mean(axis=1)
    assert np.any(err > delta + binomial_margin(delta, KEYS)), err


def test_model_without_bound_makes_one_exact_pass(gauss_setting):
    _, data, pairs, keys, ref = gauss_setting
    plain = tm.Model(log_prior=lambda t: jnp.zeros((), t.dtype),
                     log_lik=lambda t, b: -0.5 * (b["x"] - t[0]) ** 2 - 0.5 * np.log(2 * np.pi))
    acc, nd = decisions(tm.acceptance.Confidence(delta=0.05), plain, data, pairs, keys[:50])
    assert np.all(nd == NG)  # N items: what Exact reads, not 2N
    assert np.array_equal(acc, ref[:, :50])
    with pytest.raises(tm.errors.ConfigError):
        tm.decide(tm.acceptance.Confidence(range_from="model"), plain, data, pairs[0][0], pairs[1][0],
                  jax.random.PRNGKey(0))
