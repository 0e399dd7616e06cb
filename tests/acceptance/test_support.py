"""Support: a read item whose log-likelihood ratio is NaN or infinite rejects at once.

A model with a data-dependent support (a Gaussian truncated at b, data in (0, 1)): at ``b' < max_i x_i``
some items have ``log p(x_i|theta') = -inf`` (or NaN, in a variant written with ``log(b - x)``). Every test must
reject every such proposal, count the non-finite items it saw and stop reading early; on a proposal
inside the support (control) the tests accept at their usual rates and see no non-finite item. A
proposal with ``log_base = -inf`` is rejected without reading data.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh.kernel import make_problem

N = 20_000
KEYS = 48


class Truncated(tm.Model):
    """``p(x|mu, b) ∝ exp(-(x - mu)^2 / 2) 1{x <= b}`` (unnormalised: enough for these decisions), flat prior;
    ``nan=True`` writes the log-likelihood so that items outside the support give NaN instead of -inf."""

    name = "truncated"

    def __init__(self, nan=False):
        self.nan = nan

    def log_prior(self, theta):
        return jnp.zeros((), theta.dtype)

    def log_lik(self, theta, batch):
        x = batch["x"]
        q = -0.5 * (x - theta[0]) ** 2
        if self.nan:  # log of a negative number where x > b
            return q + 0.0 * jnp.log(theta[1] - x)
        return jnp.where(x <= theta[1], q, -jnp.inf)


TESTS = {
    "exact": tm.acceptance.Exact(),
    "exact-barker": tm.acceptance.Exact(kind="barker"),
    "confidence": tm.acceptance.Confidence(delta=0.05, initial_batch=100),  # no bound: one exact pass
    "barker": tm.acceptance.Barker(batch_size=100),
    "austerity": tm.acceptance.Austerity(epsilon=0.05, batch_size=100),
}


class TruncatedWithBound(Truncated):
    """A (wrong, tiny) range, only to drive Confidence through its sequential branch."""

    def lik_ratio_bound(self, theta, theta_prop, stats):
        return jnp.asarray(1e-6, theta.dtype)


_RUNNERS = {}


def _runner(test, model):
    """A compiled ``(th, thp, keys, log_base) -> (accept, n_data, n_nonfinite)`` per (test, model)."""
    ck = (test, type(model), model.nan)
    if ck not in _RUNNERS:
        _, unravel = ravel_pytree(jnp.zeros(2, jnp.float32))

        @jax.jit
        def run(xs, th, thp, keys, log_base):
            data = {"x": xs}

            def one(key):
                p = make_problem(model, data, N, unravel, None, th, thp, log_base)
                d = test.decide(key, p)
                return d.accept, d.n_data, d.n_nonfinite

            return jax.lax.map(one, keys)

        _RUNNERS[ck] = run
    return _RUNNERS[ck]


def _decide(test, model, x, th, thp, keys, log_base=0.0):
    f32 = jnp.float32
    out = _runner(test, model)(jnp.asarray(x), jnp.asarray(th, f32), jnp.asarray(thp, f32), keys, f32(log_base))
    return tuple(np.asarray(o) for o in out)


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).uniform(0.0, 1.0, N).astype(np.float32)


@pytest.mark.parametrize("nan", [False, True], ids=["-inf", "nan"])
@pytest.mark.parametrize("name", ["exact", "exact-barker", "confidence", "confidence-sequential", "barker"])
def test_nonfinite_items_reject_at_once(name, nan, x):
    keys = jax.random.split(jax.random.PRNGKey(1), KEYS)
    test = TESTS["confidence"] if name == "confidence-sequential" else TESTS[name]
    model = TruncatedWithBound(nan) if name == "confidence-sequential" else Truncated(nan)
    # b' = 0.95: 5% of the items lie outside the support; mu' moves towards the data, so without those
    # items the proposal would be accepted (Delta ~ +950): only the support check rejects
    acc, nd, bad = _decide(test, model, x, [0.4, 1.0], [0.5, 0.95], keys)
    assert not acc.any()
    assert np.all(bad >= 1)
    assert np.all(nd < N)  # it stopped reading (at the end of the chunk with the first bad item)
    # control: inside the support (b' = 1.01 > max x) the tests accept sometimes and see no bad item
    acc, nd, bad = _decide(test, model, x, [0.5, 1.0], [0.51, 1.01], keys)
    assert np.all(bad == 0)
    assert 0.05 < acc.mean() < 0.95


@pytest.mark.parametrize("name", ["exact", "confidence", "confidence-sequential", "barker"])
def test_minus_inf_log_base_rejects_without_reading(name, x):
    keys = jax.random.split(jax.random.PRNGKey(2), 8)
    test = TESTS["confidence"] if name == "confidence-sequential" else TESTS[name]
    model = TruncatedWithBound() if name == "confidence-sequential" else Truncated()
    acc, nd, bad = _decide(test, model, x, [0.5, 1.0], [0.51, 1.01], keys, log_base=-np.inf)
    assert not acc.any() and np.all(nd == 0) and np.all(bad == 0)


def test_bounded_tests_report_no_normal_approximation_excess():
    # Barker (its own bound on the acceptance error) and Confidence (concentration bounds) do not lean on
    # the CLT for the decision: they leave Decision.excess_error empty
    rng = np.random.default_rng(4)
    xs = np.exp(2.0 * rng.standard_normal(N))
    data = {"x": jnp.asarray(xs.astype(np.float32))}
    model = tm.models.Gaussian()
    th = jnp.asarray([np.mean(xs), np.log(np.std(xs))], jnp.float32)
    thp = th + jnp.asarray([0.01, 0.01], jnp.float32)
    _, unravel = ravel_pytree(th)
    stats = model.setup(data)
    for name in ("barker", "confidence"):
        p = make_problem(model, data, N, unravel, stats, th, thp, jnp.float32(0.0))
        assert TESTS[name].decide(jax.random.PRNGKey(0), p).excess_error is None
