"""The exact test's item table made in blocks (factor_bounds.TableBuilder): the same table, array for array, as
the whole-vector grouping by a stable argsort it replaces (so the same draws), at block boundaries too."""

import jax
import numpy as np
import pytest

from tallmh import factor_bounds as fbm
from tallmh.errors import ConfigError


def reference_table(w, dt=np.float32):
    """The grouping as made before, from the whole weight vector by a stable argsort of N (the reference)."""
    w = np.asarray(w, np.float64)
    idx = np.nonzero(w > 0)[0]
    wk = w[idx]
    key = np.floor(np.log2(wk) / np.log2(2.0 ** (1.0 / 8.0))).astype(np.int64)
    key = np.maximum(key, key.max() - (fbm.MAX_GROUPS - 1))
    o = np.argsort(key, kind="stable")
    key_s = key[o]
    starts = np.concatenate([[0], np.nonzero(np.diff(key_s))[0] + 1])
    counts = np.diff(np.concatenate([starts, [key_s.size]]))
    b = np.maximum.reduceat(wk[o], starts)
    G = starts.size
    mass = b * counts
    k = np.maximum(np.ceil(mass / mass.sum() * (2**30 - G)), 1).astype(np.int64)
    K = int(k.sum())
    total = float(np.max(mass * K / k)) * (1 + 1e-6)
    rate = np.nextafter((total * k / (K * counts)).astype(dt), np.inf).astype(dt)
    pad = fbm.MAX_GROUPS - G
    order = np.concatenate([idx[o], np.nonzero(w <= 0)[0]]).astype(np.int32)
    return dict(order=order, start=np.pad(starts, (0, pad)), count=np.pad(counts, (0, pad), constant_values=1),
                cum=np.pad(np.cumsum(k), (0, pad), constant_values=K), rate=np.pad(rate, (0, pad)),
                total=np.float32(total) * np.float32(1 + 1e-6))


def weights(n, spread, zeros, seed):
    rng = np.random.default_rng(seed)
    w = np.exp(rng.normal(0, spread, n)) * rng.gamma(0.5, 1.0, n)
    w[rng.random(n) < zeros] = 0.0
    return w


def same(table, ref):
    for name, r in ref.items():
        np.testing.assert_array_equal(np.asarray(getattr(table, name)), r, err_msg=name)


D = 3
ARGS = (np.zeros(D), np.eye(D), np.eye(D))


@pytest.mark.parametrize("spread,zeros", [(2.0, 0.0), (3.0, 0.2), (15.0, 0.05)])  # (15: > 513 keys, clamped)
def test_same_table_as_whole_vector_argsort(spread, zeros):
    w = weights(50_000, spread, zeros, seed=int(spread))
    if spread > 10:
        k = np.floor(8 * np.log2(w[w > 0]))
        assert k.max() - k.min() > fbm.MAX_GROUPS  # (the lowest group takes the keys below)
    same(fbm.build_table(w, *ARGS), reference_table(w))


@pytest.mark.parametrize("add_block,sort_block", [(7, 5), (1000, 4096), (4093, 1), (20_000, 3)])
def test_block_boundaries(add_block, sort_block):
    """Blocks of any size, added and sorted, not dividing N: the same table."""
    n = 20_001
    w = weights(n, 4.0, 0.1, seed=3)
    w[n - 1] = 0.0
    w[4092:4095] = [5.0, 0.0, 5.0]
    tb = fbm.TableBuilder(n)
    for s in range(0, n, add_block):
        tb.add(s, w[s:s + add_block])
    same(tb.table(*ARGS, block=sort_block), reference_table(w))


def test_same_draws():
    w = weights(30_000, 2.0, 0.1, seed=9)
    t = fbm.build_table(w, *ARGS)
    ref = reference_table(w)
    t_ref = t._replace(**{k: jax.numpy.asarray(v) for k, v in ref.items()})
    got = jax.jit(lambda k: fbm.draw_items(k, t, 4096))(jax.random.PRNGKey(1))
    exp = jax.jit(lambda k: fbm.draw_items(k, t_ref, 4096))(jax.random.PRNGKey(1))
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(exp[0]))
    # zero-weight items are never drawn
    assert np.all(w[np.asarray(got[0])] > 0)


def test_all_zero_and_bad_weights():
    t = fbm.build_table(np.zeros(10), *ARGS)
    assert float(t.total) == 0.0 and t.order.shape == (10,)
    with pytest.raises(ConfigError, match="finite and non-negative"):
        fbm.build_table(np.array([1.0, -1.0]), *ARGS)
    with pytest.raises(ConfigError, match="finite and non-negative"):
        fbm.build_table(np.array([1.0, np.inf]), *ARGS)
    tb = fbm.TableBuilder(10)
    with pytest.raises(ValueError, match="in order"):
        tb.add(5, np.ones(5))
    tb.add(0, np.ones(5))
    with pytest.raises(ValueError, match="5 of 10"):
        tb.table(*ARGS)


def test_large_order_not_copied():
    """The item order of a large table lies in page-aligned memory of its own, which the CPU backend's JAX array
    takes without a copy (the JAX array keeps it alive); its values are the reference's."""
    n = 1 << 17
    w = weights(n, 2.0, 0.1, seed=11)
    t = fbm.build_table(w, *ARGS)
    import gc

    gc.collect()
    np.testing.assert_array_equal(np.asarray(t.order), reference_table(w)["order"])
    if jax.default_backend() == "cpu":
        assert t.order.unsafe_buffer_pointer() % 4096 == 0
