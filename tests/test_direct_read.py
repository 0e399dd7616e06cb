"""Direct reads of a set-up pass's blocks from files: the same rows, byte for byte, as through the memory maps (any
header length and row size, the last block short), the same sums from the pass, buffers reused, and the memory maps
kept where direct reads are not used."""

import gc

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import setup_passes as setup
from tallmh.storage import datasource as ds
from tallmh.storage import direct_read

from .stats_helpers import npy_files


def _files(tmp_path, n, d, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    data = {"X": rng.standard_normal((n, d)).astype(dtype), "y": (rng.random(n) < 0.4).astype(np.float32)}
    return data, npy_files(tmp_path, data)


@pytest.mark.parametrize("d", [1, 3, 11])
def test_direct_rows_are_the_memory_maps_bytes(tmp_path, d):
    data, src = _files(tmp_path, 5003, d)
    read = direct_read.reader(src, "always")
    assert read is not None, "this file system refused O_DIRECT"
    mapped = ds.host_reader(src)
    for a, b in [(0, 1), (0, 5003), (17, 4113), (4096, 5003), (5002, 5003)]:
        got, want = read(a, b), mapped(a, b)
        for k in data:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
            assert np.array_equal(got[k], want[k]) and np.array_equal(got[k], data[k][a:b])


def test_buffers_are_reused_once_their_rows_are_gone(tmp_path, monkeypatch):
    _, src = _files(tmp_path, 4000, 5)
    read = direct_read.reader(src, "always")
    made = []
    new = direct_read._new_buffer
    monkeypatch.setattr(direct_read, "_new_buffer", lambda nbytes: made.append(nbytes) or new(nbytes))
    for _ in range(5):
        rows = read(0, 1000)
        del rows
        gc.collect()
    kept = [read(0, 1000) for _ in range(3)]  # (alive at once: a buffer each)
    assert len(made) == 2 + 2 * 2 and kept  # (one per leaf, taken again each time; then two more per leaf)


def test_the_pass_gives_the_same_sums_with_direct_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(setup, "_BLOCK_CHUNKS", 2)  # (several blocks, the last one short)
    monkeypatch.setattr(setup, "_CHUNK", 512)
    data, theta = tm.models.LogisticRegression.simulate(5000, d=3, seed=2)
    src = npy_files(tmp_path, data)
    t0 = jnp.asarray(theta, jnp.float32)
    vgh = setup._newton_chunk_fns(tm.models.LogisticRegression(), lambda x: x, t0)[0]
    used = []
    reader = direct_read.reader
    monkeypatch.setattr(direct_read, "reader", lambda data, mode=None: used.append(1) or reader(data, "always"))
    direct = list(setup.full_pass(vgh, src, 5000, (t0,)))
    assert used
    monkeypatch.setattr(direct_read, "MODE", "never")
    monkeypatch.setattr(direct_read, "reader", reader)
    mapped = list(setup.full_pass(vgh, src, 5000, (t0,)))
    assert len(direct) == len(mapped)
    for p, q in zip(direct, mapped):
        assert all(np.array_equal(x, y) for x, y in zip(p, q))


def test_files_that_fit_in_memory_keep_their_memory_maps(tmp_path, monkeypatch):
    _, src = _files(tmp_path, 1000, 4)
    assert direct_read.reader(src) is None  # ("auto": a small file stays in the page cache)
    assert direct_read.reader(src, "never") is None
    monkeypatch.setattr(direct_read, "_memory_bytes", lambda: 1000)  # (a machine with less memory than the files)
    assert direct_read.reader(src) is not None
    mem = {k: np.asarray(ds.read_rows(src, 0, 1000)[k]) for k in ("X", "y")}
    assert direct_read.reader(mem, "always") is None  # (not memory maps of files)
