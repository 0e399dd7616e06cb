"""Runs that survive faults: termination signals, foreign or crafted checkpoints, full disks, a second run on
the same folder, data files that change under a run.

The signal tests run ``python -m tallmh`` as a real process on a small table; the rest call the API or
``tallmh.cli.main`` in-process on small data.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import tallmh as tm
from tallmh.cli import CHECKPOINT, main
from tests.test_cli import _env


@pytest.fixture(scope="module")
def small_csv(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    rng = np.random.default_rng(3)
    n = 300
    df = pd.DataFrame({"a": rng.normal(0, 1, n), "b": rng.normal(0, 1, n)})
    df["y"] = 1.0 + 0.5 * df["a"] - 0.3 * df["b"] + rng.standard_normal(n)
    df.to_csv(root / "t.csv", index=False)
    df2 = df.copy()
    df2["y"] = df2["y"] + 0.25  # other data of the same shape
    df2.to_csv(root / "t2.csv", index=False)
    return root


def _draws(folder):
    import arviz as az

    return az.from_netcdf(str(folder / "posterior.nc")).posterior["theta"].values


def _endless_run(csv, out):
    """A CLI run of (practically) endless sampling, returned once its first checkpoint exists (draws made)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tallmh", "run", str(csv), "--target", "y", "--model", "linear", "--noise-sd", "1",
         "--samples", "100000000", "--warmup", "0", "--chains", "1", "--checkpoint-every", "0.5", "--out",
         str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.time() + 180
    try:
        while not (out / CHECKPOINT).exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.time() < deadline, "no checkpoint within 180 s"
            time.sleep(0.1)
    except BaseException:
        proc.kill()
        raise
    return proc


@pytest.mark.parametrize("sig,status", [(signal.SIGTERM, 143),
                                        pytest.param(signal.SIGHUP, 129, marks=pytest.mark.slow)])
def test_termination_signal_keeps_the_draws(small_csv, tmp_path, sig, status):
    if signal.getsignal(sig) == signal.SIG_IGN:  # e.g. the tests run under nohup: the child inherits it
        pytest.skip(f"{signal.Signals(sig).name} is ignored in this process, and a child keeps it ignored, "
                    "as tallmh's command line does on purpose")
    out = tmp_path / "run"
    proc = _endless_run(small_csv / "t.csv", out)
    try:
        time.sleep(0.3)
        proc.send_signal(sig)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == status, stderr[-2000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(f"tallmh: stopped by {signal.Signals(sig).name} after ") and "--resume" in last, last
    theta = _draws(out)
    k = theta.shape[1]
    assert theta.shape[0] == 1 and 0 < k < 100_000_000
    res = json.loads((out / "results.json").read_text())
    assert res["partial"] is True and res["methods"][0]["draws"] == k
    assert (out / "report.html").stat().st_size > 0
    # the checkpoint holds the same draws, and a resume continues from them
    assert tm.load_result(str(out / CHECKPOINT)).flat_samples.shape[1] == k


def test_sample_turns_sigterm_into_a_partial_result_and_restores_the_handler():
    data, _ = tm.models.LogisticRegression.simulate(500, d=2, seed=1)
    before = signal.getsignal(signal.SIGTERM)
    calls = []

    def callback(info):
        calls.append(info["done"])
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.warns(tm.TrustWarning, match="partial run"):
        r = tm.sample(tm.models.LogisticRegression(), data, num_samples=10**6, num_warmup=0, num_chains=2,
                      chunk_size=16, callback=callback, progress=False, seed=1, init=np.zeros(3), audit=0.0)
    assert r.partial and r.flat_samples.shape[1] >= 48
    assert signal.getsignal(signal.SIGTERM) == before


# ---------------------------------------------------------------------------------------------------
# checkpoints: crafted, foreign, stale, unfinished


def _logistic(n=400, seed=1):
    data, _ = tm.models.LogisticRegression.simulate(n, d=2, seed=seed)
    return tm.models.LogisticRegression(), data


_QUICK = dict(num_warmup=10, num_chains=2, progress=False, init=np.zeros(3), audit=0.0, chunk_size=16)


def test_crafted_pickle_checkpoint_is_refused_unread(tmp_path):
    import pickle

    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = tmp_path / "checkpoint.npz"
    path.write_bytes(pickle.dumps({"version": 2, "x": Payload()}))
    with pytest.raises(tm.ConfigError, match="is not a tallmh checkpoint") as e:
        tm.load_result(str(path))
    assert "\n" not in str(e.value) and not marker.exists()
    # a pickle inside an .npz (an object array) is refused too
    np.savez(path, __meta__=np.array([Payload()], dtype=object))
    with pytest.raises(tm.ConfigError):
        tm.load_result(str(path))
    assert not marker.exists()


def test_checkpoint_round_trip_and_resume_refuses_foreign_runs(tmp_path):
    model, data = _logistic()
    ck = str(tmp_path / "ck.npz")
    with pytest.warns(tm.TrustWarning):
        tm.sample(model, data, test=tm.acceptance.Exact(), num_samples=16, checkpoint=ck, seed=3, **_QUICK)
    loaded = tm.load_result(ck)
    assert loaded.flat_samples.shape == (2, 16, 3) and not loaded.partial
    assert type(loaded.test).__name__ == "Exact" and type(loaded.proposal).__name__ == "AdaptiveMetropolis"
    kw = dict(num_samples=32, num_warmup=10, progress=False)
    other = {"X": data["X"].copy(), "y": data["y"].copy()}
    other["X"][::7, 1] += 0.5  # other data of the same shape
    for why, args in [("the data differs", (model, other)),
                      ("the model differs", (tm.models.LogisticRegression(prior_scale=2.0), data))]:
        with pytest.raises(tm.ConfigError, match=f"resume: refused: {why}") as e:
            tm.sample(*args, resume=loaded, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(tm.ConfigError, match="resume: refused: the test differs"):
        tm.sample(model, data, resume=loaded, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100), **kw)
    # the same data, model and test: accepted
    with pytest.warns(tm.TrustWarning):
        r = tm.sample(model, data, resume=loaded, **kw)
    np.testing.assert_array_equal(r.flat_samples[:, :16], loaded.flat_samples)


def test_checkpoint_of_an_unfinished_run_loads_as_partial(tmp_path):
    """A checkpoint saved while the run goes on (what a kill -9 leaves) says the run is unfinished."""
    model, data = _logistic()
    ck = str(tmp_path / "ck.npz")
    copies = []

    def callback(info):
        if os.path.exists(ck) and not copies:
            copies.append(tm.load_result(ck))

    with pytest.warns(tm.TrustWarning):
        tm.sample(model, data, num_samples=200, checkpoint=ck, checkpoint_every_s=1e-9, callback=callback, seed=3,
                  **_QUICK)
    mid = copies[0]
    assert mid.partial and mid.flat_samples.shape[1] < 200
    assert "partial" in mid.verdict
    assert not tm.load_result(ck).partial  # the finished run's own checkpoint


# ---------------------------------------------------------------------------------------------------
# disk faults


def _enospc(*args, **kwargs):
    raise OSError(28, "No space left on device")


def test_failed_checkpoint_write_warns_and_keeps_every_draw(tmp_path, monkeypatch):
    from tallmh.storage import checkpoint

    model, data = _logistic()
    ck = tmp_path / "ck.npz"
    real = np.savez
    fail = {"on": True}

    def savez(*a, **k):
        if fail["on"]:
            _enospc()
        return real(*a, **k)

    monkeypatch.setattr(checkpoint.np, "savez", savez)
    with pytest.warns(RuntimeWarning, match="checkpoint not saved .*No space left on device.*kept in memory"):
        r = tm.sample(model, data, num_samples=64, checkpoint=str(ck), checkpoint_every_s=1e-9, seed=3, **_QUICK)
    assert r.flat_samples.shape == (2, 64, 3) and not r.partial  # nothing lost
    assert not ck.exists() and os.listdir(tmp_path) == []  # no temporary left behind
    fail["on"] = False
    r.save(str(ck))
    np.testing.assert_array_equal(tm.load_result(str(ck)).flat_samples, r.flat_samples)


def test_failed_write_keeps_the_previous_file_and_says_so_in_one_line(tmp_path, monkeypatch):
    from tallmh.storage import safe_io

    target = tmp_path / "f.json"
    target.write_text("old")
    # a temporary left by a process that no longer exists is cleaned up by the next write
    stale = tmp_path / ".f.json.tmp-999999999-abc"
    stale.write_text("junk")

    def write(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        _enospc()

    with pytest.raises(safe_io.WriteError) as e:
        safe_io.atomic_write(str(target), write)
    assert str(target) in e.value.strerror and "No space left" in e.value.strerror
    assert target.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["f.json"]
    # not enough free space: refused before writing
    monkeypatch.setattr(safe_io.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    with pytest.raises(safe_io.WriteError, match="not enough free space"):
        safe_io.atomic_write(str(target), lambda tmp: open(tmp, "w").write("new"), nbytes=100)
    assert target.read_text() == "old"


def test_cli_output_write_failure_is_one_line_and_the_draws_are_kept(small_csv, tmp_path, capsys, monkeypatch):
    from tallmh.reporting import report

    out = tmp_path / "run"
    monkeypatch.setattr(report, "idata_with_names", lambda *a, **k: _enospc())
    args = ["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--noise-sd", "1", "--samples",
            "30", "--warmup", "20", "--chains", "2", "--quiet"]
    rc = main([*args, "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("tallmh: error: ") and "No space left" in err[0] and "--resume" in err[0]
    assert tm.load_result(str(out / CHECKPOINT)).flat_samples.shape == (2, 30, 3)
    assert not (out / "posterior.nc").exists() and not [f for f in os.listdir(out) if ".tmp-" in f]
    # with space again, --resume writes the outputs from the checkpoint (no new draws)
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    np.testing.assert_array_equal(_draws(out), tm.load_result(str(out / CHECKPOINT)).flat_samples)


# ---------------------------------------------------------------------------------------------------
# one run per --out; resume from anywhere


def test_a_second_run_on_a_locked_out_is_refused_in_one_line(small_csv, tmp_path, capsys):
    from tallmh.cli import OutFolder

    out = tmp_path / "run"
    first = OutFolder(str(out))
    first.make()  # what a running command holds
    try:
        rc = main(["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--samples", "5",
                   "--warmup", "5", "--quiet", "--out", str(out)])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and "is in use by another tallmh run" in err[0], err
    finally:
        first.release()
    assert os.listdir(out) == []  # the refused run wrote nothing; the first's lock file went with it


def test_cli_resume_refuses_a_foreign_checkpoint_and_runs_from_another_folder(small_csv, tmp_path, capsys,
                                                                             monkeypatch):
    common = ["--target", "y", "--model", "linear", "--noise-sd", "1", "--samples", "20", "--warmup", "10",
              "--chains", "2", "--quiet"]
    monkeypatch.chdir(small_csv)
    assert main(["run", "t.csv", *common, "--out", str(tmp_path / "a")]) == 0
    assert main(["run", "t2.csv", *common, "--out", str(tmp_path / "b")]) == 0
    settings = json.loads((tmp_path / "a" / "run.json").read_text())["settings"]
    assert os.path.isabs(settings["data"])
    capsys.readouterr()
    # b's checkpoint (other data of the same shape) put into a: refused in one line
    (tmp_path / "a" / CHECKPOINT).write_bytes((tmp_path / "b" / CHECKPOINT).read_bytes())
    monkeypatch.chdir(tmp_path)
    rc = main(["run", "--resume", str(tmp_path / "a"), "--samples", "40", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "resume: refused: the data differs" in err[0], err
    # its own checkpoint resumes, from another working folder
    assert main(["run", "--resume", str(tmp_path / "b"), "--samples", "40", "--quiet"]) == 0
    assert _draws(tmp_path / "b").shape == (2, 40, 3)


# ---------------------------------------------------------------------------------------------------
# on-disk data that changes under a run


def _npy_data(tmp_path, n=2000):
    data, _ = tm.models.LogisticRegression.simulate(n, d=2, seed=4)
    np.save(tmp_path / "X.npy", data["X"])
    np.save(tmp_path / "y.npy", data["y"])
    return tm.data.from_npy({"X": str(tmp_path / "X.npy"), "y": str(tmp_path / "y.npy")})


@pytest.mark.parametrize("change", ["truncate", "modify"])
def test_on_disk_file_changed_mid_run_stops_with_the_draws_kept(tmp_path, change):
    disk = _npy_data(tmp_path)
    path = tmp_path / "X.npy"
    ck = tmp_path / "ck.npz"
    seen = []

    def callback(info):
        seen.append(info["done"])
        if len(seen) == 2:
            if change == "truncate":
                os.truncate(path, os.path.getsize(path) // 2)
            else:
                with open(path, "r+b") as f:
                    f.seek(-8, os.SEEK_END)
                    f.write(np.float32([1e3, -1e3]).tobytes())
                os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))  # a coarse clock still sees it

    with pytest.raises(tm.DataError, match="the data file .*X.npy (changed size|was modified) during the run") as e:
        tm.sample(tm.models.LogisticRegression(), disk, num_samples=10**6, checkpoint=str(ck), callback=callback,
                  **_QUICK)
    assert "\n" not in str(e.value)
    r = e.value.result
    assert r.partial and r.flat_samples.shape[1] > 0
    assert tm.load_result(str(ck)).flat_samples.shape == r.flat_samples.shape
    # and a resume on the changed file is refused as stale
    if change == "modify":
        with pytest.raises(tm.ConfigError, match="changed since the checkpoint was made"):
            tm.sample(tm.models.LogisticRegression(), _reopen(tmp_path), resume=tm.load_result(str(ck)),
                      num_samples=10**6, num_warmup=10, progress=False)


def _reopen(tmp_path):
    return tm.data.from_npy({"X": str(tmp_path / "X.npy"), "y": str(tmp_path / "y.npy")})


@pytest.mark.parametrize("trial", [0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow)])
def test_kill_9_at_a_random_moment_leaves_a_folder_that_resumes(small_csv, tmp_path, capsys, trial):
    out = tmp_path / "run"
    proc = _endless_run(small_csv / "t.csv", out)
    try:
        time.sleep(float(np.random.default_rng(trial).uniform(0.0, 2.0)))  # mid-chunk, mid-checkpoint, ...
    finally:
        proc.kill()  # SIGKILL: no handler runs
        proc.communicate(timeout=60)
    saved = tm.load_result(str(out / CHECKPOINT))
    assert saved.partial  # a checkpoint saved while the run went on says so
    k = saved.flat_samples.shape[1]
    assert main(["run", "--resume", str(out), "--samples", str(k + 10), "--quiet"]) == 0, capsys.readouterr().err
    theta = _draws(out)
    assert theta.shape == (1, k + 10, 3)
    np.testing.assert_array_equal(theta[:, :k], saved.flat_samples)
    assert not [f for f in os.listdir(out) if ".tmp-" in f or f.endswith(".lock")]


# ---------------------------------------------------------------------------------------------------
# draws streamed to disk


def test_streamed_draws_keep_the_checkpoint_flat_and_resume_bit_for_bit(tmp_path):
    model, data = _logistic()
    ck = str(tmp_path / "ck.npz")
    kw = dict(_QUICK, seed=5)
    sizes = []

    def callback(info):
        sizes.append(os.path.getsize(ck) if os.path.exists(ck) else None)

    with pytest.warns(tm.TrustWarning):
        r1 = tm.sample(model, data, num_samples=48, checkpoint=ck, stream_draws=True, **kw)
    assert isinstance(r1.flat_samples, np.memmap) and r1.flat_samples.shape == (2, 48, 3)
    loaded = tm.load_result(ck)
    with pytest.warns(tm.TrustWarning):
        r2 = tm.sample(model, data, resume=loaded, num_samples=400, num_warmup=10, checkpoint=ck, stream_draws=True, audit=0.0,
                       checkpoint_every_s=1e-9, callback=callback, progress=False, chunk_size=16)
        straight = tm.sample(model, data, num_samples=400, **kw)
    np.testing.assert_array_equal(r2.flat_samples, straight.flat_samples)
    np.testing.assert_array_equal(r2.flat_warmup, straight.flat_warmup)
    for k in straight.stats:
        np.testing.assert_array_equal(r2.stats[k], straight.stats[k])
    sizes = [s for s in sizes if s is not None]
    assert len(sizes) > 5 and max(sizes) - min(sizes) < 256  # the checkpoint does not grow with the draws
    # a crafted reference to a file outside the checkpoint's folder is refused
    from tallmh.storage import checkpoint

    meta = np.load(ck, allow_pickle=False)["__meta__"].tobytes().decode()
    bad = meta.replace('"file": "ck.npz.draws/', '"file": "../../ck.npz.draws/', 1)
    assert bad != meta
    np.savez(str(tmp_path / "bad.npz"), __meta__=np.frombuffer(bad.encode(), np.uint8))
    with pytest.raises(tm.ConfigError, match="outside the checkpoint's folder"):
        checkpoint.read(str(tmp_path / "bad.npz"))


def test_nonfinite_items_written_mid_run_are_counted_under_control_variates(monkeypatch):
    """NaNs appearing in the data mid-run reach the minibatch gradient of the default proposal (Langevin) with
    control variates first; such proposals are counted as reading non-finite items, not passed off as out of
    the support (negative control: before this count, the run reported 0 such items and no warning)."""
    from tallmh.storage import datasource as ds

    # read in place at any size and address (a small array at an unaligned address is otherwise copied, and
    # the NaNs written below would never reach the run)
    monkeypatch.setattr(ds, "_COPY_BELOW_BYTES", 0)
    data, _ = tm.models.LogisticRegression.simulate(4000, d=2, seed=2)
    X = data["X"]
    calls = []

    def callback(info):
        calls.append(1)
        if len(calls) == 3:
            X[:2000, 1] = np.nan  # the data is read in place

    with pytest.warns(tm.TrustWarning, match="non-finite"):
        r = tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=200),
                      control_variates=tm.ControlVariates(order=2), num_samples=100, num_warmup=40, num_chains=2,
                      chunk_size=20, callback=callback, progress=False, audit=0.0)
    assert type(r.proposal).__name__ == "Langevin"
    assert r.nonfinite_items > 0 and not r.trusted
