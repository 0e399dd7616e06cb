"""With a batch of all N items, every approximate test makes exactly the decisions of its Exact oracle."""

import jax
import numpy as np
import pytest
from jax import enable_x64

import tallmh as tm

from .helpers import decisions, logistic_problem


def _pairs(theta, d, count, scale, seed):
    rng = np.random.default_rng(seed)
    th = theta + 0.05 * rng.standard_normal((count, d))
    return th, th + scale * rng.standard_normal((count, d))


@pytest.mark.parametrize(
    "make_test, oracle",
    [
        (lambda n: tm.acceptance.Austerity(epsilon=0.05, batch_size=n), "metropolis"),
        (lambda n: tm.acceptance.Confidence(delta=0.05, initial_batch=n), "metropolis"),
        (lambda n: tm.acceptance.Confidence(delta=0.05, initial_batch=n, bound="hoeffding", range_from="data"), "metropolis"),
        (lambda n: tm.acceptance.Barker(batch_size=n), "barker"),
    ],
    ids=["austerity", "confidence-bs", "confidence-hoeffding-data", "barker"],
)
@pytest.mark.slow
def test_batch_of_n_gives_the_exact_decision(make_test, oracle):
    with enable_x64(True):
        model, data, theta = logistic_problem(n=1500, d=3)
        n, d = 1500, theta.shape[0]
        # steps of a few posterior sds: acceptance probabilities spread over (0, 1)
        pairs = _pairs(theta, d, 40, 0.04, seed=1)
        keys = jax.random.split(jax.random.PRNGKey(7), 50)
        test = make_test(n)
        acc, nd = decisions(test, model, data, pairs, keys)
        ref, _ = decisions(tm.acceptance.Exact(kind=oracle), model, data, pairs, keys)
        assert 0.1 < ref.mean() < 0.9  # the comparison covers both outcomes
        assert np.array_equal(acc, ref)
        assert np.all(nd >= n)


def test_same_key_same_u_for_exact_kinds():
    # Exact(metropolis) accepts iff u < a; Exact(barker) iff u > 1 - sigmoid(Delta): both from the same u.
    with enable_x64(True):
        model, data, theta = logistic_problem(n=500, d=2)
        pairs = _pairs(theta, 3, 30, 0.08, seed=2)
        keys = jax.random.split(jax.random.PRNGKey(1), 200)
        m, _ = decisions(tm.acceptance.Exact(), model, data, pairs, keys)
        b, _ = decisions(tm.acceptance.Exact(kind="barker"), model, data, pairs, keys)
        # Metropolis acceptance dominates Barker's: with a shared u, Barker-accept implies Metropolis-accept
        # whenever Delta <= 0, and their rates match min(1, e^D) and sigmoid(D) (checked elsewhere).
        assert m.mean() >= b.mean()


@pytest.mark.slow
def test_tempered_barker_with_all_items_matches_tempered_exact():
    with enable_x64(True):
        model, data, theta = logistic_problem(n=400, d=2)
        pairs = _pairs(theta, 3, 20, 0.3, seed=4)
        keys = jax.random.split(jax.random.PRNGKey(2), 50)
        acc, _ = decisions(tm.acceptance.Barker(batch_size=400, temperature=10.0), model, data, pairs, keys)
        ref, _ = decisions(tm.acceptance.Exact(kind="barker", temperature=10.0), model, data, pairs, keys)
        plain, _ = decisions(tm.acceptance.Exact(kind="barker"), model, data, pairs, keys)
        assert np.array_equal(acc, ref)
        assert not np.array_equal(acc, plain)
