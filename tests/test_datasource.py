"""Out-of-core data (tallmh.storage.datasource): .npy files and memmaps read in place."""

import warnings

import jax
import numpy as np
import pytest

import tallmh as tm
from tallmh import setup_passes
from tallmh.storage import datasource as ds
from tallmh.storage.data import take, validate_data

N = 5000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    data, _ = tm.models.LogisticRegression.simulate(N, d=3, seed=1)
    root = tmp_path_factory.mktemp("ooc")
    np.save(root / "X.npy", data["X"])
    np.save(root / "y.npy", data["y"])
    return data, {"X": str(root / "X.npy"), "y": str(root / "y.npy")}, root


def _run(data, test, cv, **kw):
    args = dict(test=test, control_variates=cv, num_samples=60, num_warmup=60, num_chains=2, seed=5,
                progress=False)
    args.update(kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # short runs are not trusted; that is not what is tested here
        return tm.sample(tm.models.LogisticRegression(), data, **args)


@pytest.mark.parametrize("gather", ["zero_copy", pytest.param("callback", marks=pytest.mark.slow)])
def test_austerity_with_control_variates_same_draws_as_in_memory(files, gather):
    data, paths, _ = files
    test, cv = tm.acceptance.Austerity(error=0.05, batch_size=100), tm.ControlVariates()
    ref = _run(data, test, cv)
    disk = tm.data.from_npy(paths, gather=gather)
    assert ds.describe(disk) == {"X": gather, "y": gather}
    got = _run(disk, test, cv)
    np.testing.assert_array_equal(got.flat_samples, ref.flat_samples)
    np.testing.assert_array_equal(got.stats["n_data"], ref.stats["n_data"])
    # (the check for degenerate columns reads a design in memory once; not one read from files)
    assert got.setup_items == ref.setup_items - ref.n
    # negative control: another seed gives other draws (the comparison can fail)
    assert not np.array_equal(_run(disk, test, cv, seed=6).flat_samples, ref.flat_samples)


@pytest.mark.parametrize("gather", ["zero_copy", pytest.param("callback", marks=pytest.mark.slow)])
def test_exact_same_draws_as_in_memory(files, gather):
    data, paths, _ = files
    ref = _run(data, tm.acceptance.Exact(), None, num_samples=30, num_warmup=30)
    got = _run(tm.data.from_npy(paths, gather=gather), tm.acceptance.Exact(), None, num_samples=30, num_warmup=30)
    np.testing.assert_array_equal(got.flat_samples, ref.flat_samples)


def test_memmap_leaves_are_accepted_without_a_copy(files):
    data, paths, _ = files
    mm = {k: np.load(p, mmap_mode="r") for k, p in paths.items()}
    out = validate_data(mm)
    assert ds.is_out_of_core(out)
    kinds = ds.describe(out)
    assert set(kinds.values()) <= {"zero_copy", "callback"}
    if kinds["X"] == "zero_copy":  # the JAX array is the file's memory, not a copy of it
        assert out["X"].unsafe_buffer_pointer() == mm["X"].ctypes.data
    np.testing.assert_array_equal(np.asarray(take(out, jax.numpy.array([3, 0, 4999]))["X"]),
                                  data["X"][[3, 0, 4999]])


def test_read_advice_reaches_the_files_and_not_memory(files, monkeypatch):
    """advise() reaches the memory map behind every on-disk leaf (zero-copy or host-gathered), once per
    map, and leaves in-memory data alone; tm.sample advises random reads while sampling and the default
    afterwards."""
    data, paths, _ = files
    for gather in ("zero_copy", "callback"):
        d = tm.data.from_npy(paths, gather=gather)
        assert ds.advise(d, "random") == 2 and ds.advise(d, "normal") == 2
    assert ds.advise(data, "random") == 0
    calls = []
    real = ds.advise
    monkeypatch.setattr(ds, "advise", lambda d, p: calls.append(p) or real(d, p))
    _run(tm.data.from_npy(paths), tm.acceptance.Austerity(batch_size=100), tm.ControlVariates(), audit=0)
    assert "sequential" in calls and "random" in calls and calls[-1] == "normal"


def test_host_gather_returns_the_asked_rows_in_order(files):
    data, paths, _ = files
    disk = tm.data.from_npy(paths, gather="callback")
    idx = jax.numpy.array([[4999, 0, 17], [17, 17, 2500]])
    rows = jax.jit(lambda d, i: take(d, i))(disk, idx)
    np.testing.assert_array_equal(np.asarray(rows["X"]), data["X"][np.asarray(idx)])
    np.testing.assert_array_equal(np.asarray(rows["y"]), data["y"][np.asarray(idx)])
    # vmapped over chains, as in tm.sample
    rows = jax.jit(jax.vmap(lambda i, d: take(d, i), in_axes=(0, None)))(idx, disk)
    np.testing.assert_array_equal(np.asarray(rows["X"]), data["X"][np.asarray(idx)])


class _Counting:
    """A stand-in for the memory map that records how many rows each read returns."""

    def __init__(self, mm):
        self.mm, self.shape, self.dtype, self.reads = mm, mm.shape, mm.dtype, []

    def __getitem__(self, item):
        out = np.asarray(self.mm[item])
        self.reads.append(out.shape[0])
        return out


def test_never_reads_the_whole_array_and_steps_read_o_batch_rows(files, monkeypatch):
    from tallmh.run import programs

    data, paths, _ = files
    # small blocks, so that "never whole" is visible at N = 5000: set-up reads at most 1024 rows at a time
    monkeypatch.setattr(ds, "BLOCK_ROWS", 1024)
    monkeypatch.setattr(setup_passes, "_CHUNK", 512)
    monkeypatch.setattr(setup_passes, "_BLOCK_CHUNKS", 2)
    monkeypatch.setattr(setup_passes, "HOST_BLOCK", 1024)
    disk = tm.data.from_npy(paths, gather="callback", check_finite=False)
    counters = {}
    for k, leaf in disk.items():
        tok = int(np.asarray(leaf.token))
        counters[k] = ds._HOST[tok] = _Counting(ds._HOST[tok])
    X = counters["X"]
    phase = {"setup_end": None}
    compile_chunk = programs.compile_chunk

    def compile_after_setup(self, *a, **k):  # the chunk is taken once set-up (mode, sums, model setup) is done
        if phase["setup_end"] is None:
            phase["setup_end"] = len(X.reads)
        return compile_chunk(self, *a, **k)

    monkeypatch.setattr(programs, "compile_chunk", compile_after_setup)
    marks = []
    res = _run(disk, tm.acceptance.Austerity(error=0.05, batch_size=50), tm.ControlVariates(), audit=0.0,
               num_chains=1, num_samples=100, num_warmup=100, chunk_size=20,
               callback=lambda info: marks.append(len(X.reads)))
    k = phase["setup_end"]
    setup, steps = X.reads[:k], X.reads[k:]
    # no read, set-up included, ever returned more than a block: the array is never materialised
    assert max(X.reads) <= 1024 < N
    # set-up reads = the counted set-up passes (model setup, Newton, sums) + the 16-row model check + the
    # rows the run's fingerprint reads (for checkpoints)
    from tallmh.storage.checkpoint import fingerprint_rows

    fp_rows = len(fingerprint_rows(N, res.resume_info["fingerprint"]["data"]["salt"]))
    assert sum(setup) == res.setup_items + 16 + fp_rows
    assert res.setup_items >= 3 * N
    # each compiled chunk of 20 steps read O(batch) rows per step, and at least the items the test used
    per_chunk = [sum(X.reads[a:b]) for a, b in zip([k] + marks[:-1], marks)]
    used = np.concatenate([res.warmup_stats["n_data"][0], res.stats["n_data"][0]])
    used_chunk = used.reshape(-1, 20).sum(axis=1)
    assert len(per_chunk) == len(used_chunk) == 10
    for rows, u in zip(per_chunk, used_chunk):
        assert u <= rows <= u + 20 * 50, (rows, u)  # read = used + at most one masked batch per step
        assert rows / 20 < 0.1 * N
    assert sum(steps) == sum(per_chunk)


def test_bad_files_give_clear_data_errors(files, tmp_path):
    data, paths, _ = files
    with pytest.raises(tm.DataError, match="no such file"):
        tm.data.from_npy({"X": str(tmp_path / "missing.npy"), "y": paths["y"]})
    np.save(tmp_path / "short_y.npy", data["y"][:100])
    with pytest.raises(tm.DataError, match="different numbers of rows"):
        tm.data.from_npy({"X": paths["X"], "y": str(tmp_path / "short_y.npy")})
    np.save(tmp_path / "words.npy", np.array(["a", "b"] * 10))
    with pytest.raises(tm.DataError, match="not numeric"):
        tm.data.from_npy(str(tmp_path / "words.npy"))
    (tmp_path / "junk.npy").write_bytes(b"not an npy file at all")
    with pytest.raises(tm.DataError, match="cannot open"):
        tm.data.from_npy(str(tmp_path / "junk.npy"))
    np.save(tmp_path / "scalar.npy", np.float32(1.0))
    with pytest.raises(tm.DataError, match="scalar"):
        tm.data.from_npy(str(tmp_path / "scalar.npy"))
    np.save(tmp_path / "fortran.npy", np.asfortranarray(data["X"]))
    with pytest.raises(tm.DataError, match="Fortran"):
        tm.data.from_npy(str(tmp_path / "fortran.npy"))
    if not jax.config.jax_enable_x64:  # float64 cannot be aliased by 32-bit JAX: zero-copy refused ...
        np.save(tmp_path / "X64.npy", data["X"].astype(np.float64))
        with pytest.raises(tm.DataError, match="zero-copy.*float64"):
            tm.data.from_npy(str(tmp_path / "X64.npy"), gather="zero_copy")
        # ... and "auto" reads it by host gathers, converting each gathered block
        h = tm.data.from_npy(str(tmp_path / "X64.npy"))
        assert isinstance(h, ds.HostArray) and h.dtype == np.float32
        np.testing.assert_array_equal(np.asarray(take(h, jax.numpy.array([7, 1]))), data["X"][[7, 1]])
    with pytest.raises(tm.DataError, match="whole into memory"):
        np.asarray(tm.data.from_npy(paths["X"], gather="callback"))


def test_non_finite_values_found_by_a_streamed_pass(files, tmp_path, monkeypatch):
    data, paths, _ = files
    monkeypatch.setattr(ds, "BLOCK_ROWS", 64)  # several blocks of 1024 rows (16 values per row block ...)
    X = data["X"].copy()
    X[4321, 2] = np.nan
    np.save(tmp_path / "Xnan.npy", X)
    with pytest.raises(tm.DataError, match="1 NaN or infinite"):
        tm.data.from_npy({"X": str(tmp_path / "Xnan.npy"), "y": paths["y"]})
    # a memmap leaf given straight to sample is checked the same way (streamed), before any compiling
    mm = {"X": np.load(tmp_path / "Xnan.npy", mmap_mode="r"), "y": np.load(paths["y"], mmap_mode="r")}
    with pytest.raises(tm.DataError, match="NaN or infinite"):
        tm.sample(tm.models.LogisticRegression(), mm, num_samples=5, num_warmup=0, progress=False)
    # waived: from_npy(check_finite=False) opens it; the check is the caller's
    assert ds.is_out_of_core(tm.data.from_npy({"X": str(tmp_path / "Xnan.npy"), "y": paths["y"]},
                                              check_finite=False))


def test_wrong_shapes_for_the_model_give_data_errors(files, tmp_path):
    data, paths, _ = files
    np.save(tmp_path / "X1.npy", data["X"][:, 1].copy())
    disk = tm.data.from_npy({"X": str(tmp_path / "X1.npy"), "y": paths["y"]})
    with pytest.raises(tm.DataError, match="shape \\(N, d\\)"):
        tm.sample(tm.models.LogisticRegression(), disk, num_samples=5, num_warmup=0, progress=False)
    np.save(tmp_path / "y2.npy", data["y"][:, None].copy())
    disk = tm.data.from_npy({"X": paths["X"], "y": str(tmp_path / "y2.npy")})
    # the same error, word for word, as for the same arrays in memory
    errs = []
    for d in (disk, {"X": data["X"], "y": data["y"][:, None]}):
        with pytest.raises(tm.TallmhError) as e:
            tm.sample(tm.models.LogisticRegression(), d, num_samples=5, num_warmup=0, progress=False)
        errs.append((type(e.value), str(e.value)))
    assert errs[0] == errs[1]


def test_setup_statistics_streamed_equal_the_whole_array_ones(files, monkeypatch):
    data, paths, _ = files
    monkeypatch.setattr(ds, "BLOCK_ROWS", 700)
    model = tm.models.LogisticRegression()
    whole = model.setup(validate_data(data))
    streamed = ds.setup_stats(model, tm.data.from_npy(paths), N)
    assert float(streamed["max_norm"]) == float(whole["max_norm"])

    class Mean(tm.Model):  # a statistic that is neither a max nor a min cannot be merged blockwise
        def __init__(self):
            super().__init__(lambda t: 0.0, lambda t, b: b["y"] * 0.0)

        def setup(self, d):
            return {"mean": np.mean(d["y"])}

    with pytest.raises(tm.ModelError, match="combine_setup"):
        ds.setup_stats(Mean(), tm.data.from_npy(paths), N)


@pytest.mark.slow
def test_out_of_core_benchmark_smoke(tmp_path):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "ooc.json"
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "out_of_core.py"), "--smoke",
                           "--data-dir", str(tmp_path / "data"), "--out", str(out)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    modes = {r["mode"]: r for r in res["runs"]}
    assert set(modes) == {"disk", "memory"}
    assert modes["disk"]["gather"]["X"] in ("zero_copy", "callback")
    # the same program on the same data: the same draws, so the same ESS and items per step
    assert modes["disk"]["ess_min"] == modes["memory"]["ess_min"]
    assert modes["disk"]["items_per_step"] == modes["memory"]["items_per_step"]
    assert (tmp_path / "data" / "N20000" / "meta.json").exists()  # --data-dir keeps the files for reuse


def test_full_passes_read_bounded_chunks_at_a_billion_rows():
    # an exact or audit pass at N = 1e9 reads chunks of at most 2**20 rows (46 MB at d = 11), not 2**28
    from tallmh.acceptance.base import MAX_CHUNK, StreamReader

    assert StreamReader(10**9, 4096, None, permuted=False).sizes == [4096, 2**16, 2**20]
    assert max(StreamReader(10**9, 100, None).sizes) <= MAX_CHUNK == 2**20
    assert StreamReader(10**6, 4096, None).sizes == [4096, 2**16]  # smaller N: the ladder as before


@pytest.fixture
def small_blocks(monkeypatch):
    """Files above the host passes' limit, in several blocks of the compiled passes (the last one partial):
    the set-up's passes read the files in threads and make the model's statistics from the same blocks."""
    monkeypatch.setattr(setup_passes, "HOST_MAX_ROWS", 1000)
    monkeypatch.setattr(setup_passes, "_CHUNK", 256)
    monkeypatch.setattr(setup_passes, "_BLOCK_CHUNKS", 4)  # 1024 rows a block: 4 full, one of 904
    setup_passes._PASS_FNS.clear()
    setup_passes._NEWTON_FNS.clear()
    yield
    setup_passes._PASS_FNS.clear()
    setup_passes._NEWTON_FNS.clear()


def test_passes_over_files_read_in_threads_give_the_in_memory_draws(files, small_blocks):
    data, paths, _ = files
    test, cv = tm.acceptance.Austerity(error=0.05, batch_size=100), tm.ControlVariates()
    ref = _run(data, test, cv)
    disk = tm.data.from_npy(paths)
    tap = ds.stats_tap(tm.models.LogisticRegression(), disk, N, setup_passes.HOST_MAX_ROWS)
    assert tap is not None and ds.stats_tap(tm.models.LogisticRegression(), data, N, 1000) is None  # files only
    got = _run(disk, test, cv)
    np.testing.assert_array_equal(got.flat_samples, ref.flat_samples)
    np.testing.assert_array_equal(got.stats["n_data"], ref.stats["n_data"])
    # the model's statistics came from the first Newton pass's blocks: one pass over the files fewer (and no
    # check for degenerate columns, made for a design in memory only)
    assert got.setup_items == ref.setup_items - 2 * N
    # without a full pass to feed them (a given start, no control variates) they cost their own pass
    start = np.zeros(4)
    ref_e = _run(data, tm.acceptance.Austerity(error=0.05, batch_size=100), None, init=start)
    got_e = _run(disk, tm.acceptance.Austerity(error=0.05, batch_size=100), None, init=start)
    np.testing.assert_array_equal(got_e.flat_samples, ref_e.flat_samples)
    # (the model's own pass, and in memory the pass naming degenerate columns of a built-in regression's X)
    assert got_e.setup_items == N and ref_e.setup_items == 2 * N


def test_statistics_tapped_from_a_pass_equal_the_streamed_ones(files, small_blocks):
    data, paths, _ = files
    disk = tm.data.from_npy(paths)
    model = tm.models.LogisticRegression()
    tap = ds.stats_tap(model, disk, N, 1000)
    fn = setup_passes._newton_chunk_fns(model, lambda t: t, np.zeros(4, np.float32))[0]
    th = jax.numpy.asarray(np.array([0.1, -0.2, 0.3, 0.05], np.float32))
    with ds.tapping(disk, tap):
        on_disk = [np.asarray(r[1]) for r in setup_passes.full_pass(fn, disk, N, (th,))]
    assert tap.fed_rows == N
    in_memory = [np.asarray(r[1]) for r in setup_passes.full_pass(fn, validate_data(data), N, (th,))]
    np.testing.assert_array_equal(np.stack(on_disk), np.stack(in_memory))  # the same chunks, bit for bit
    assert float(tap.result()["max_norm"]) == float(model.setup(validate_data(data))["max_norm"])
    # a tap fed only the first blocks streams the rest
    tap2 = ds.stats_tap(model, disk, N, 1000)
    tap2.feed(0, 1024, ds.read_rows(disk, 0, 1024))
    tap2.feed(2048, 3072, ds.read_rows(disk, 2048, 3072))  # not the next rows: ignored
    assert tap2.fed_rows == 1024
    assert float(tap2.result()["max_norm"]) == float(model.setup(validate_data(data))["max_norm"])


def test_invalid_rows_found_by_the_tapped_pass_give_the_models_error(files, tmp_path, small_blocks):
    data, paths, _ = files
    y = data["y"].copy()
    y[3000] = 2.0  # the third block of the first full pass
    np.save(tmp_path / "y_bad.npy", y)
    disk = tm.data.from_npy({"X": paths["X"], "y": str(tmp_path / "y_bad.npy")})
    with pytest.raises(tm.DataError, match="binary target"):
        _run(disk, tm.acceptance.Austerity(error=0.05, batch_size=100), tm.ControlVariates())
    # the same error as for the same arrays in memory (checked by the model's own set-up pass there)
    with pytest.raises(tm.DataError, match="binary target"):
        _run({"X": data["X"], "y": y}, tm.acceptance.Austerity(error=0.05, batch_size=100), tm.ControlVariates())


def test_a_deferred_finiteness_check_is_made_by_the_first_pass(files, tmp_path, small_blocks, monkeypatch):
    data, paths, _ = files
    X = data["X"].copy()
    X[3500, 1] = np.inf  # in the fourth block of the first full pass
    np.save(tmp_path / "Xinf.npy", X)
    bad = {"X": str(tmp_path / "Xinf.npy"), "y": paths["y"]}
    with pytest.raises(tm.DataError, match="1 NaN or infinite"):
        tm.data.from_npy(bad)  # "auto": a small file is checked when opened
    monkeypatch.setattr(ds, "CHECK_NOW_MAX_ROWS", 1000)
    disk = tm.data.from_npy(bad)  # "auto" above CHECK_NOW_MAX_ROWS: deferred, so opening reads nothing
    assert not ds.finite_checked(disk["X"])
    cv = (tm.acceptance.Austerity(error=0.05, batch_size=100), tm.ControlVariates())
    with pytest.raises(tm.DataError, match="1 NaN or infinite value\\(s\\) in rows 3,072 to 4,095"):
        _run(disk, *cv)
    # no full pass to make it (a given start, no control variates): streamed after the set-up, before any draw
    with pytest.raises(tm.DataError, match="NaN or infinite"):
        _run(tm.data.from_npy(bad, check_finite="deferred"), cv[0], None, init=np.zeros(4))
    # any other use streams it first
    with pytest.raises(tm.DataError, match="NaN or infinite"):
        validate_data(tm.data.from_npy(bad, check_finite="deferred"))
    # in the first rows (those the model is first evaluated on): found before the model sees them
    X0 = data["X"].copy()
    X0[3, 0] = np.nan
    np.save(tmp_path / "X0.npy", X0)
    with pytest.raises(tm.DataError, match="1 NaN or infinite value\\(s\\) in rows 0 to 15"):
        _run(tm.data.from_npy({"X": str(tmp_path / "X0.npy"), "y": paths["y"]}), *cv)
    # clean files: the same draws as in memory, and the leaves are marked checked by the pass
    clean = tm.data.from_npy(paths, check_finite="deferred")
    np.testing.assert_array_equal(_run(clean, *cv).flat_samples, _run(data, *cv).flat_samples)
    assert ds.finite_checked(clean["X"]) and ds.finite_checked(clean["y"])
    with pytest.raises(tm.ConfigError, match="check_finite"):
        tm.data.from_npy(paths, check_finite="later")
