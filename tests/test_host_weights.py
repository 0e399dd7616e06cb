"""The exact test's per-item weights made in NumPy beside the compiled set-up pass (``fused_table.HOST_WEIGHTS``):
they bound the float64 weights once inflated for their rounding, agree with the compiled ones to the last bits of
float32, reach the table in row order from data in memory and in files, and leave the pass's sums unchanged."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import fused_table
from tallmh import setup_passes as setup
from tallmh.storage import datasource as ds
from tallmh.models.logistic import LogisticCubicBound, LogisticLocalBound

from .stats_helpers import npy_files
from .test_fused_table import fused_search, heavy_rows


def rows_and_whitening(n=50000, d=6, seed=3):
    """Rows over every branch of the local bound's supremum: margins at the centre from 0 to ~30 (the peak of
    |f'''| inside the interval, below it, beyond it), unequal scales, 1% of rows 40x longer; a whitening A^-1
    that is not triangular and a centre off the origin."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)) * np.geomspace(0.1, 10.0, d)
    X[::100] *= 40.0
    X[:, 0] = np.arange(n) % 2  # (half the rows with a margin ~12 at the centre, beyond the peak)
    c = rng.normal(size=d) * 0.05 / np.geomspace(0.1, 10.0, d)
    c[0] = 12.0
    m = rng.normal(size=(d, d))
    ainv = np.linalg.inv(np.linalg.cholesky(m @ m.T + d * np.eye(d)) * 30.0) @ np.linalg.qr(m)[0]
    return X, c, ainv, rng.normal(size=n).astype(np.float32)


@pytest.mark.parametrize("bound", [LogisticCubicBound(), LogisticLocalBound(), LogisticLocalBound(offset="o")],
                         ids=["global", "local", "local+offset"])
def test_numpy_weights_bound_the_float64_ones_and_match_the_compiled(bound):
    X, c, ainv, off = rows_and_whitening()
    batch = {"X": X.astype(np.float32), "o": off}
    exact = bound.weights_host(c, ainv, {"X": X.astype(np.float32), "o": off.astype(np.float64)})
    w = bound.weights_block(c.astype(np.float32), ainv.astype(np.float32), batch)
    assert w.dtype == np.float32 and w.shape == (X.shape[0],)
    compiled = np.asarray(jax.jit(bound.weights)(jnp.asarray(c, jnp.float32), jnp.asarray(ainv, jnp.float32),
                                                 jax.tree_util.tree_map(jnp.asarray, batch)), np.float64)
    w = w.astype(np.float64)
    assert np.all(exact > 0)
    assert np.any(w < exact)  # (float32 rounds some weights below the float64 ones: the inflation is needed)
    assert np.all(w * fused_table._INFLATE >= exact)  # the inflation covers float32's rounding
    assert np.max(np.abs(w / exact - 1)) < 2e-5
    assert np.max(np.abs(w / compiled - 1)) < 2e-5  # the compiled weights' numbers, to float32's last bits
    # in float64 rows, the float64 arithmetic: weights_host.s numbers (which inflate the local ones by 1e-9)
    w64 = bound.weights_block(c, ainv, {"X": X, "o": off.astype(np.float64)})
    ref = bound.weights_host(c, ainv, {"X": X, "o": off.astype(np.float64)})
    assert w64.dtype == np.float64 and np.max(np.abs(w64 / ref - 1)) < 1e-8


def test_the_local_weights_take_every_branch_of_the_supremum():
    X, c, ainv, _ = rows_and_whitening()
    from tallmh.models.logistic import U_PEAK

    rho = np.linalg.norm(X @ ainv.T, axis=1)
    half = rho * LogisticLocalBound().radius_for(X.shape[1])
    a = np.abs(X @ c)
    inside = (np.maximum(a - half, 0) <= U_PEAK) & (a + half >= U_PEAK)
    below, beyond = a + half < U_PEAK, a - half > U_PEAK
    assert inside.sum() > 100 and below.sum() > 100 and beyond.sum() > 100


@pytest.mark.parametrize("where", ["memory", "files"])
def test_full_pass_hands_the_host_parts_in_row_order_beside_unchanged_sums(monkeypatch, tmp_path, where):
    monkeypatch.setattr(setup, "_BLOCK_CHUNKS", 2)  # (blocks of 2 chunks: several blocks, the last one short)
    monkeypatch.setattr(setup, "_CHUNK", 512)
    data, theta = tm.models.LogisticRegression.simulate(5000, d=3, seed=2)
    if where == "files":
        src = npy_files(tmp_path, data)
    else:
        src = jax.tree_util.tree_map(jnp.asarray, data)
    model = tm.models.LogisticRegression()
    t0 = jnp.asarray(theta, jnp.float32)
    vgh = setup._newton_chunk_fns(model, lambda x: x, t0)[0]
    n = 5000
    plain = list(setup.full_pass(vgh, src, n, (t0,)))
    got = []
    with_host = list(setup.full_pass(vgh, src, n, (t0,), host=(lambda rows, a, b: (a, b, np.array(rows["X"])),
                                                               lambda a, b, p: got.append((a, b, p)))))
    assert len(plain) == len(with_host)
    for p, q in zip(plain, with_host):  # the compiled sums bit for bit
        assert all(np.array_equal(x, y) for x, y in zip(p, q))
    assert [(a, b) for a, b, _ in got] == [(s, min(n, s + 1024)) for s in range(0, n, 1024)]
    for a, b, (a2, b2, rows) in got:
        assert (a, b) == (a2, b2) and np.array_equal(rows, data["X"][a:b])


def test_over_files_the_compiled_blocks_do_not_wait_for_a_slow_host_part(tmp_path):
    import time

    data, _ = tm.models.LogisticRegression.simulate(9000, d=3, seed=4)
    src = npy_files(tmp_path, data)
    events = []

    def part(rows, a, b):
        if a == 0:
            time.sleep(0.5)  # (the first block's NumPy side slow: the compiled calls go on meanwhile)
        return a, b, float(np.sum(rows["X"]))

    def sink(a, b, p):
        events.append(("sink", a, b, p))

    n = 9000
    for s, _ in setup._file_blocks(jax.jit(lambda args, rows, k: rows["X"].sum()), (), ds.host_reader(src), n, 1024,
                                   range(0, n, 1024), None, host=(part, sink)):
        events.append(("block", s))
    sinks = [e for e in events if e[0] == "sink"]
    assert [(a, b) for _, a, b, _ in sinks] == [(s, min(n, s + 1024)) for s in range(0, n, 1024)]  # (in order, all)
    assert all(p == (a, b, float(np.sum(data["X"][a:b]))) for _, a, b, p in sinks)
    first = events.index(sinks[0])
    assert first > 1 and first <= 1 + setup.HOST_LAG + 1  # (blocks went on, at most HOST_LAG of them ahead)
    assert [s for e in events if e[0] == "block" for s in e[1:]] == list(range(0, n, 1024))

    def bad(rows, a, b):
        if a == 2048:
            raise ValueError("a host part failed")
        return a

    with pytest.raises(ValueError, match="a host part failed"):
        for _ in setup._file_blocks(jax.jit(lambda args, rows, k: rows["X"].sum()), (), ds.host_reader(src), n, 1024,
                                    range(0, n, 1024), None, host=(bad, lambda a, b, p: None)):
            pass


def test_the_fused_pass_with_numpy_weights_keeps_the_sums_and_the_tables_rates(monkeypatch):
    """The set-up's fused pass with the weights in NumPy and in the compiled call: the same centre and derivatives
    bit for bit, and each item's weight within float32's rounding of the other's."""
    data = heavy_rows()
    out = {}
    for host in (True, False):
        monkeypatch.setattr(fused_table, "HOST_WEIGHTS", host)
        model, jd, cv, req = fused_search(monkeypatch, data)
        c, at, _, tb = req.result
        out[host] = (np.asarray(cv.center), np.asarray(cv.hess_sum), np.asarray(at), tb.rate_total())
    for a, b in zip(out[True][:3], out[False][:3]):
        assert np.array_equal(a, b)
    assert abs(out[True][3] / out[False][3] - 1) < 1e-4


class _OverflowingBlock(LogisticCubicBound):
    """The global bound's weights made to overflow float32 on the host (rows scaled by 1e16: rho^3 ~ 1e45)."""

    def weights_block(self, center, rinv, batch):
        return super().weights_block(center, rinv, {"X": np.asarray(batch["X"]) * np.float32(1e16)})


def test_numpy_weights_that_overflow_are_reported_as_the_compiled_ones(monkeypatch):
    """Weights that are not finite: the widened one-pass table is dropped (the sums still given), an unwidened one
    raises the builder's error, as for the compiled weights (tests/test_one_pass.py), and NumPy warns of nothing."""
    from tallmh import one_pass
    from jax.flatten_util import ravel_pytree

    model = tm.models.LogisticRegression()
    data, _ = tm.models.LogisticRegression.simulate(3000, d=2, seed=0)
    jd = jax.tree_util.tree_map(jnp.asarray, data)
    flat0, unravel = ravel_pytree(model.init(jd))
    chunk_vgh, _ = setup._newton_chunk_fns(model, unravel, flat0)
    req = fused_table.FusedTable(jd, _OverflowingBlock(), one_pass.OnePassPlan(100, jd))
    d = flat0.shape[0]
    assert fused_table._host_weights(req.bound, jd, flat0, np.eye(d)) is not None  # (the NumPy path is taken)
    with np.errstate(all="raise"):
        v, g, h = req.run(setup.full_pass, chunk_vgh, jd, 3000, flat0, "test", neg_h=np.eye(d) * 100.0, scale=0.5)
        assert np.isfinite(v) and np.all(np.isfinite(g)) and req.result is None
        with pytest.raises(tm.errors.ConfigError):
            req.run(setup.full_pass, chunk_vgh, jd, 3000, flat0, "test", neg_h=np.eye(d) * 100.0)


@pytest.mark.parametrize("radius", [None, 0.5])
def test_numpy_weights_are_the_same_bits_whatever_the_slice(monkeypatch, radius):
    from tallmh.models import _logistic_block as lb

    rng = np.random.default_rng(7)
    n, d = 70000, 11
    X = (rng.standard_normal((n, d)) * np.geomspace(0.1, 10, d)).astype(np.float32)
    rinv = np.linalg.inv(np.linalg.cholesky(np.cov(rng.standard_normal((d, 40))) + np.eye(d))).astype(np.float32)
    c = (0.1 * rng.standard_normal(d)).astype(np.float32)
    got = {}
    for size in (8192, 32768, 1 << 17):  # (the last: one slice for all rows)
        monkeypatch.setattr(lb, "SLICE", size)
        got[size] = lb.weights_block(X, c, rinv, radius=radius)
    assert all(np.array_equal(got[8192], w) for w in got.values())
