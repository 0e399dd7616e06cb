"""Austerity that has read all N items decides by the compensated sum, exactly as Exact() does."""

import jax
import jax.numpy as jnp
import numpy as np

from tallmh.acceptance import Austerity, Exact
from tallmh.acceptance.base import Moments, Problem, draw_u


def _close_calls(test, n=4000, count=400):
    """Decisions of ``test`` and of Exact() on items near 1,000 (float32), with log_base set so that the exact
    threshold lies within +-2 of the full sum (~4e6, whose float32 ulp is 0.25): the float running mean
    compared with ``(log u - log_base) / N`` cannot resolve these."""
    rng = np.random.default_rng(0)
    vals = jnp.asarray((1000.0 + 50.0 * rng.standard_normal(n)).astype(np.float32))
    total = jnp.float32(np.sum(np.asarray(vals, np.float64)))

    @jax.jit
    def both(key, off):
        u = draw_u(key)[0]
        p = Problem(n, (jnp.log(u) - total) + off, lambda idx: vals[idx], None, None)
        dec = test.decide(key, p)
        return dec.accept, Exact().decide(key, p).accept, dec.n_data

    keys = jax.random.split(jax.random.PRNGKey(3), count)
    offs = jnp.linspace(-2.0, 2.0, count).astype(jnp.float32)
    return map(np.asarray, jax.vmap(both)(keys, offs))


def test_full_read_decides_as_exact():
    # (the running mean's decision, before the fix, disagreed with Exact() in 41 of these 400)
    acc, ref, nd = _close_calls(Austerity(error=0.05, batch_size=4000))
    assert np.all(nd == 4000)
    assert 0.2 < ref.mean() < 0.8  # both outcomes are compared
    assert np.array_equal(acc, ref)


def test_running_mean_alone_would_disagree():
    # negative control: the float32 running mean (Moments, merged batch by batch as the test reads) against
    # mu0 = (log u - log_base) / N, the rule the test used at n = N before, errs on this very set
    n = 4000
    rng = np.random.default_rng(0)
    vals = jnp.asarray((1000.0 + 50.0 * rng.standard_normal(n)).astype(np.float32))
    total = jnp.float32(np.sum(np.asarray(vals, np.float64)))
    acc = Moments.zero(jnp.float32)
    for b in range(0, n, 100):
        acc = acc.merge(vals[b:b + 100], jnp.ones((100,), bool))
    keys = jax.random.split(jax.random.PRNGKey(3), 400)
    offs = jnp.linspace(-2.0, 2.0, 400).astype(jnp.float32)

    def by_mean(key, off):
        u = draw_u(key)[0]
        log_base = (jnp.log(u) - total) + off
        return acc.mean > (jnp.log(u) - log_base) / n

    old = np.asarray(jax.vmap(by_mean)(keys, offs))
    _, ref, _ = _close_calls(Exact())
    assert np.sum(old != ref) > 0


def test_default_batch_full_reads_agree():
    # the default batch: wherever the sequential test read all N items, its decision is Exact()'s
    acc, ref, nd = _close_calls(Austerity())
    full = nd == 4000
    assert full.sum() > 200
    assert np.array_equal(acc[full], ref[full])
