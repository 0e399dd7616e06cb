"""The keyed permutation behind subsampling, and data validation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import tallmh as tm
from tallmh.storage.data import make_permutation, permute, validate_data


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 4097, 100_003])
def test_permutation_is_a_bijection(n):
    perm = make_permutation(jax.random.PRNGKey(n))
    idx = np.asarray(permute(perm, jnp.arange(n), n))
    assert np.array_equal(np.sort(idx), np.arange(n))


def test_chunks_of_one_step_never_repeat():
    n = 10_007
    perm = make_permutation(jax.random.PRNGKey(3))
    seen = np.concatenate([np.asarray(permute(perm, jnp.arange(s, s + 500), n)) for s in range(0, 5000, 500)])
    assert len(np.unique(seen)) == len(seen) == 5000
    assert seen.min() >= 0 and seen.max() < n


def test_positions_cover_range_uniformly_chi_squared():
    # The item at a fixed position, over many keys, is uniform on range(N).
    n, draws = 997, 40_000
    keys = jax.random.split(jax.random.PRNGKey(0), draws)
    first = jax.vmap(lambda k: permute(make_permutation(k), jnp.arange(3), n))(keys)
    for pos in range(3):
        counts = np.bincount(np.asarray(first[:, pos]), minlength=n)
        p = stats.chisquare(counts).pvalue
        assert p > 0.001, (pos, p)
    # pairs (pos 0, pos 1) are not tied: their difference mod N is uniform on 1..N-1
    diff = np.asarray((first[:, 1] - first[:, 0]) % n)
    assert np.all(diff != 0)
    counts = np.bincount(diff, minlength=n)[1:]
    assert stats.chisquare(counts).pvalue > 0.001


def test_negative_control_chi_squared_detects_a_biased_sampler():
    # The same check must reject a sampler that favours low indices.
    n, draws = 997, 40_000
    rng = np.random.default_rng(0)
    biased = np.minimum(rng.integers(0, n, draws), rng.integers(0, n, draws))
    counts = np.bincount(biased, minlength=n)
    assert stats.chisquare(counts).pvalue < 1e-6


def test_subsampling_cost_does_not_depend_on_n():
    # The traced permutation has no operation whose size depends on N.
    def f(n):
        perm = make_permutation(jax.random.PRNGKey(0))
        jaxpr = jax.make_jaxpr(lambda p: permute(perm, p, n))(jnp.arange(64))
        return str(jaxpr)

    small, big = f(1000), f(10**9)
    import re
    assert not re.search(r"\[10{5,}", big)
    assert len(small.splitlines()) == len(big.splitlines())


def test_validate_data_errors():
    with pytest.raises(tm.DataError, match="different leading lengths"):
        validate_data({"X": np.zeros((5, 2)), "y": np.zeros(4)})
    with pytest.raises(tm.DataError, match="empty"):
        validate_data({"x": np.zeros(0)})
    with pytest.raises(tm.DataError, match="NaN or infinite"):
        validate_data({"x": np.array([1.0, np.nan])})
    with pytest.raises(tm.DataError, match="NaN or infinite"):
        validate_data({"x": np.array([1.0, np.inf])})
    with pytest.raises(tm.DataError, match="no arrays"):
        validate_data({})
    with pytest.raises(tm.DataError, match="scalar"):
        validate_data({"x": 1.0})
