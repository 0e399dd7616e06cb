"""Austerity's per-step promise on skewed per-item ratios, and the estimate of its normal-approximation error.

The error form corrects its boundary for the skewness of the items read (``skew_adjusted_t``: a one-term
Edgeworth shift with the without-replacement cumulants) and does not stop where that correction is too large
to trust. Checked at the design's worst case (gap ~ 0 for every u: values summing to 0, ``log_base =
log(1/2)``), N = 20,000, batch 500, on exponential, log-normal(0, 1) and Bernoulli(0.02) items, against
exact MH with the same keys. The negative control is the symmetric boundary (``skew_correction=False``),
which exceeds the target on the skewed items, and whose estimated error inflation
(``Decision.excess_error``) says so, while the corrected test's does not.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.acceptance.austerity import skew_adjusted_t
from tallmh.acceptance.base import Moments, Problem
from tallmh.reporting.results import EXCESS_MAX

from .helpers import binomial_margin

N, M, KEYS, TARGET = 20_000, 500, 4000, 0.05


@functools.lru_cache(maxsize=None)
def _decider(test):
    def run(values, keys):
        problem = Problem(values.shape[0], jnp.asarray(np.log(0.5), values.dtype), lambda idx: values[idx], None, None)
        return jax.vmap(lambda k: test.decide(k, problem))(keys)

    return jax.jit(run)


def _population(kind, seed=0):
    rng = np.random.default_rng(seed)
    v = {"exponential": lambda: rng.exponential(size=N),
         "lognormal": lambda: np.exp(rng.standard_normal(N)),
         "bernoulli": lambda: (rng.random(N) < 0.02).astype(float),
         "gaussian": lambda: rng.standard_normal(N)}[kind]()
    v = v - v.mean()
    return jnp.asarray(v / v.std(), jnp.float32)


@functools.lru_cache(maxsize=None)
def _run(kind, corrected):
    v = _population(kind)
    keys = jax.random.split(jax.random.PRNGKey(0), KEYS)
    ref = np.asarray(_decider(tm.acceptance.Exact())(v, keys).accept)
    dec = _decider(tm.acceptance.Austerity(error=TARGET, batch_size=M, skew_correction=corrected))(v, keys)
    nd = np.asarray(dec.n_data)
    err = float(np.mean(np.asarray(dec.accept) != ref))
    excess = float(np.mean(np.asarray(dec.excess_error)[(nd > 0) & (nd < N)]))
    return err, excess, nd.mean() / N


def test_third_moment_merge_matches_numpy():
    x = np.random.default_rng(0).exponential(size=1000).astype(np.float32)
    acc = Moments.zero(jnp.float32)
    for a, b in ((0, 7), (7, 300), (300, 301), (301, 1000)):  # uneven chunks, one of a single item
        acc = acc.merge(jnp.asarray(x[a:b]), jnp.ones(b - a, bool))
    d = x.astype(np.float64) - x.mean()
    assert float(acc.m3) == pytest.approx(np.sum(d**3), rel=1e-4)
    assert float(acc.skewness()) == pytest.approx(np.mean(d**3) / np.mean(d**2) ** 1.5, rel=1e-4)


def test_skew_shift_direction_and_size():
    # positive skewness: the lower tail of t is heavier, so the statistic is shifted up (the lower boundary
    # moves out, the upper one in); no skewness, no shift; at f = 0 it is Hall's g (2c^2 + 1) / (6 sqrt(n))
    c = 2.5
    t, s = skew_adjusted_t(0.0, 2.0, 400.0, 0.0, c)
    assert float(t) == pytest.approx(2.0 * (2 * c * c + 1) / (6 * 20.0), rel=1e-5) and float(s) == pytest.approx(float(t))
    assert float(skew_adjusted_t(0.0, -2.0, 400.0, 0.0, c)[0]) == pytest.approx(-float(t))
    assert float(skew_adjusted_t(1.0, 0.0, 400.0, 0.3, c)[0]) == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["exponential", "lognormal", "bernoulli"])
def test_error_form_keeps_its_target_on_skewed_items(kind):
    err, excess, frac = _run(kind, True)
    assert err <= TARGET + binomial_margin(TARGET, KEYS), (kind, err)
    assert excess < EXCESS_MAX, (kind, excess)  # and the run-level check does not cry wolf
    assert frac < 1.0  # it still subsamples


@pytest.mark.slow
def test_negative_control_symmetric_boundary_exceeds_and_is_flagged():
    err, excess, _ = _run("bernoulli", False)
    assert err > TARGET + binomial_margin(TARGET, KEYS), err
    assert excess > EXCESS_MAX, excess
    # the symmetric and corrected boundaries agree on normal items (no false alarm there either)
    err_g, excess_g, _ = _run("gaussian", False)
    assert excess_g < 0.1 * EXCESS_MAX, excess_g
