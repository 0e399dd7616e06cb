"""Data in files at scale, before and around the set-up's first full pass: the finiteness check made by that pass
stops the exact default (with the large-N sampler) on a NaN row, naming its rows, before any draw; and the
target's constant check reads a prefix of a target that is not constant."""

import warnings

import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as lt  # (its large-N sampler)
from tallmh.models._target import check_target
from tallmh.storage import datasource as ds
from tests.test_datasource import files, small_blocks  # noqa: F401 (fixtures)


def _default(data):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs are not trusted; that is not what is tested here
        return tm.sample(tm.models.LogisticRegression(), data, num_samples=60, num_warmup=60, num_chains=2, seed=5,
                         progress=False)


def test_a_nan_row_stops_the_exact_default_in_its_first_pass(files, tmp_path, small_blocks, monkeypatch):  # noqa: F811
    data, paths, _ = files
    monkeypatch.setattr(ds, "CHECK_NOW_MAX_ROWS", 1000)  # (opening the files reads nothing: the pass checks)
    monkeypatch.setattr(lt, "BULK_MIN_N", 0)
    monkeypatch.setattr(lt, "HEAVY_MAX", 64)
    made, table = [], lt.BulkBuilder.table
    monkeypatch.setattr(lt.BulkBuilder, "table", lambda self, *a, **k: made.append(1) or table(self, *a, **k))
    X = data["X"].copy()
    X[3500, 1] = np.nan  # in the fourth block of the first full pass
    np.save(tmp_path / "Xnan.npy", X)
    disk = tm.data.from_npy({"X": str(tmp_path / "Xnan.npy"), "y": paths["y"]})
    assert not ds.finite_checked(disk["X"])
    with pytest.raises(tm.DataError, match="1 NaN or infinite value\\(s\\) in rows 3,072 to 4,095"):
        _default(disk)
    assert not made  # (stopped before any table)
    clean = tm.data.from_npy(paths)
    res = _default(clean)
    assert res.method.startswith("exact-subsampled") and made == [1]
    assert ds.finite_checked(clean["X"]) and ds.finite_checked(clean["y"])


class _Reads(np.ndarray):
    """An array that records the largest row any slice of it reached."""

    def __getitem__(self, key):
        if isinstance(key, slice):
            type(self).reached = max(type(self).reached, min(key.stop or len(self), len(self)))
        return super().__getitem__(key)


def test_the_constant_target_check_reads_a_prefix():
    y = (np.random.default_rng(0).random(1 << 22) < 0.3).astype(np.float32).view(_Reads)
    _Reads.reached = 0
    check_target(y)
    assert 0 < _Reads.reached <= 1024  # (read by slices from the start, and only the first)
    z = np.zeros(1 << 22, np.float32)
    z[-1] = 1.0  # constant but for the last value: read to the end, not constant
    check_target(z)
    with pytest.raises(tm.DataError, match="constant"):
        check_target(np.zeros(1 << 22, np.float32))
    with pytest.raises(tm.DataError, match="constant"):
        check_target(np.ones((5, 1)))
    check_target(np.array([np.nan, np.nan]))  # (NaN differs from itself: not constant, as before)


def test_rows_gathered_in_runs_are_numpys(tmp_path, monkeypatch):
    """storage.runs.gather: the same array as ``a[idx]`` for the warm sub-samples' runs of rows (on a memory map,
    2-D and 1-D), for scattered rows, few rows, and out-of-range rows (NumPy's error); the runs are read by the
    threads (one copy per run) on a memory map, not for a sub-sample of rows in memory."""
    from tallmh import setup_passes
    from tallmh.storage import runs

    n = 1 << 20
    X = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
    np.save(tmp_path / "X.npy", X)
    mm = np.load(tmp_path / "X.npy", mmap_mode="r")
    idx = setup_passes.warm_rows(n, 1 << 18)
    copies = []
    real = runs.ThreadPoolExecutor
    monkeypatch.setattr(runs, "ThreadPoolExecutor", lambda *a, **k: copies.append(a) or real(*a, **k))
    np.testing.assert_array_equal(runs.gather(mm, idx), X[idx])
    assert copies  # (the runs' path taken)
    np.testing.assert_array_equal(runs.gather(mm, idx, mm), X[idx])  # (their reads advised first)
    np.testing.assert_array_equal(runs.gather(X[:, 0], idx), X[idx, 0])
    scattered = np.random.default_rng(1).integers(0, n, 1 << 17)
    np.testing.assert_array_equal(runs.gather(mm, scattered), X[scattered])
    np.testing.assert_array_equal(runs.gather(mm, idx[:100]), X[idx[:100]])
    with pytest.raises(IndexError):
        runs.gather(mm, np.arange(n - 10, n + (1 << 16)))
    copies.clear()  # rows in memory (no page faults to wait on): a[idx] itself below runs._MIN_ROWS_MEMORY rows
    np.testing.assert_array_equal(runs.gather(X, idx), X[idx])
    assert not copies
