"""Data read from files get the exact subsampled test by default where its item table fits in memory: the same
draws as the same data in memory, the table made in one pass over the files; austerity, said why, where not."""

import warnings

import numpy as np
import pytest

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh.storage import datasource as ds

N = 6000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    data, _ = tm.models.LogisticRegression.simulate(N, d=3, seed=2)
    root = tmp_path_factory.mktemp("disk_exact")
    np.save(root / "X.npy", data["X"])
    np.save(root / "y.npy", data["y"])
    return data, {"X": str(root / "X.npy"), "y": str(root / "y.npy")}


def _default(data, **kw):
    args = dict(num_samples=80, num_warmup=80, num_chains=2, seed=3, progress=False)
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs are not trusted; that is not what is tested here
        return tm.sample(tm.models.LogisticRegression(), data, **args)


@pytest.mark.parametrize("gather", ["zero_copy", pytest.param("callback", marks=pytest.mark.slow)])
def test_files_get_the_exact_default_with_the_in_memory_draws(files, gather):
    data, paths = files
    ref = _default(data)
    disk = tm.data.from_npy(paths, gather=gather)
    assert ds.in_files(disk) and ds.describe(disk) == {"X": gather, "y": gather}
    got = _default(disk)
    for r in (ref, got):
        assert any(m.startswith("default method: exact-subsampled+cv (the model bounds") for m in r.notes), r.notes
    np.testing.assert_array_equal(got.flat_samples, ref.flat_samples)
    np.testing.assert_array_equal(got.stats["n_data"], ref.stats["n_data"])
    assert np.mean(got.stats["n_data"]) < 50  # O(1) rows per step, not a pass
    assert got.setup_items == ref.setup_items - ref.n  # (degenerate columns are looked for in memory only)
    # negative control: another seed gives other draws (the comparison can fail)
    assert not np.array_equal(_default(disk, seed=4).flat_samples, ref.flat_samples)


def test_files_whose_table_does_not_fit_keep_austerity_and_say_why(files, monkeypatch):
    data, paths = files
    monkeypatch.setattr(fbm, "available_memory", lambda: fbm.TABLE_BYTES_PER_ITEM * N)  # (needs twice that)
    assert not fbm.table_fits(N) and fbm.table_fits(N, fraction=1.0)
    got = _default(tm.data.from_npy(paths), num_samples=20, num_warmup=20)
    assert any("default method: austerity" in m and "item table" in m and "memory available" in m
               for m in got.notes), got.notes
    # data in memory are not held back by the table's memory (the data themselves are larger)
    mem = _default(data, num_samples=20, num_warmup=20)
    assert any(m.startswith("default method: exact-subsampled") for m in mem.notes)
