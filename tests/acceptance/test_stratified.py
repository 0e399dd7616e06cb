"""Stratified austerity: a stratum of items summed exactly at every step, the rest subsampled."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tallmh.acceptance import Austerity, Exact
from tallmh.acceptance.austerity import rest_item
from tallmh.acceptance.base import Problem, draw_u

from .helpers import binomial_margin


def test_rest_item_enumerates_the_complement():
    rng = np.random.default_rng(0)
    for n, k in [(50, 7), (1000, 100), (9, 9 - 1)]:
        rows = np.sort(rng.choice(n, k, replace=False)).astype(np.int32)
        got = np.asarray(rest_item(jnp.asarray(rows), jnp.arange(n - k, dtype=jnp.int32)))
        assert np.array_equal(got, np.setdiff1d(np.arange(n), rows))


def _heavy_population(n=20_000, seed=1):
    """Items ~ N(0, 0.01^2), with 0.1% of them 100x larger (near 1): the heavy items hold the sum."""
    rng = np.random.default_rng(seed)
    vals = 0.01 * rng.standard_normal(n)
    heavy = np.sort(rng.choice(n, n // 1000, replace=False))
    vals[heavy] = 1.0 + 0.01 * rng.standard_normal(heavy.size)
    return jnp.asarray(vals.astype(np.float32)), jnp.asarray(heavy.astype(np.int32))


def _decisions(test, vals, rows, gap, count=200, seed=5, total=None):
    """Decisions of ``test`` and of Exact() with the threshold ``gap`` below the full sum, same keys."""
    n = vals.shape[0]
    total = jnp.float32(np.sum(np.asarray(vals, np.float64)) if total is None else total)

    @jax.jit
    def f(key_gap):
        key, g = key_gap
        u = draw_u(key)[0]
        p = Problem(n, (jnp.log(u) - total) + g, lambda idx: vals[idx], None, None, exact_rows=rows)
        d = test.decide(key, p)
        return d.accept, Exact().decide(key, p).accept, d.n_data

    keys = jax.random.split(jax.random.PRNGKey(seed), count)
    gaps = jnp.broadcast_to(jnp.asarray(gap, jnp.float32), (count,))
    return map(np.asarray, jax.lax.map(f, (keys, gaps)))


@pytest.mark.parametrize("gap", [1.0, pytest.param(-1.0, marks=pytest.mark.slow)])
def test_heavy_items_stratified_keeps_the_error_promise(gap):
    vals, heavy = _heavy_population()
    acc, ref, nd = _decisions(Austerity(error=0.05), vals, heavy, gap)
    assert ref.mean() in (0.0, 1.0)  # a clear-cut step: the heavy items' sum decides it
    wrong = float(np.mean(acc != ref))
    assert wrong <= 0.05 + binomial_margin(0.05, len(acc))
    assert np.all(nd >= heavy.shape[0]) and np.all(nd <= vals.shape[0])


@pytest.mark.slow
def test_heavy_items_unstratified_errs_negative_control():
    # the same steps without the stratum: a subsample rarely holds enough heavy items, and the t-test errs
    vals, heavy = _heavy_population()
    acc, ref, _ = _decisions(Austerity(error=0.05), vals, None, 1.0)
    assert np.mean(acc != ref) > 0.2


def test_stratified_full_read_is_exact():
    # a batch of all N: every decision is Exact()'s, the stratum's and the rest's compensated sums added
    vals, heavy = _heavy_population(n=2000)
    gaps = np.linspace(-0.5, 0.5, 60)  # close calls on both sides
    acc, ref, nd = _decisions(Austerity(error=0.05, batch_size=2000 - heavy.shape[0]), vals, heavy, gaps, count=60)
    assert np.all(nd == 2000)
    assert 0.2 < ref.mean() < 0.8
    assert np.array_equal(acc, ref)


def test_nonfinite_item_in_the_stratum_rejects():
    vals, heavy = _heavy_population(n=2000)
    total = np.sum(np.asarray(vals, np.float64))
    vals = vals.at[heavy[0]].set(jnp.nan)
    acc, _, nd = _decisions(Austerity(error=0.05), vals, heavy, 5.0, count=20, total=total)
    assert not acc.any()
    assert np.all(nd >= heavy.shape[0])
