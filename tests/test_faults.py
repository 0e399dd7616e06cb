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


# ---------------------------------------------------------------------------------------------------
# a run folder is data, never code


def _crafted_folder(tmp_path, small_csv, formula):
    """A run folder as someone else could send it: run.json naming ``formula``, a checkpoint file."""
    folder = tmp_path / "received"
    folder.mkdir()
    settings = {"data": str(small_csv / "t.csv"), "target": None, "features": None, "model": "linear",
                "noise_sd": None, "noise_prior_scale": 5.0, "test": "auto", "samples": 10, "warmup": 10,
                "proposal": "auto", "start": "mode", "no_standardize": False, "no_intercept": False,
                "epsilon": None, "batch_size": "auto", "delta": 0.05, "bound": None, "initial_batch": 50,
                "gamma": 2.0, "barker_batch": 100, "barker_delta": 0.01, "chains": 1, "seed": 0,
                "prior_scale": 10.0, "error": None, "formula": formula, "family": "gaussian", "min_ess": 400,
                "stream": False}
    (folder / "run.json").write_text(json.dumps({"settings": settings, "data_sha256": "x", "mode": None}))
    (folder / CHECKPOINT).write_bytes(b"")
    return folder


def test_resume_refuses_a_formula_that_would_run_code_without_running_it(small_csv, tmp_path, capsys):
    marker = tmp_path / "ran"
    formula = f"y ~ a + I(__import__('os').system('touch {marker}'))"
    folder = _crafted_folder(tmp_path, small_csv, formula)
    assert main(["run", "--resume", str(folder), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert not marker.exists()
    assert "refused: the formula in run.json" in err and len(err.strip().splitlines()) == 1, err
    # the same refusal for the other ways a formula could run code
    from tallmh.frontends.safe_formula import check_formula
    from tallmh.errors import CLIError

    for bad in ["y ~ np.random.seed(1)", "y ~ os.system('x')", "y ~ a.__class__", "y ~ {a + 1}", "y ~ a[0]",
                "y ~ (lambda: 1)()", "y ~ I(a)(b)", "y ~ I(lambda: 1)", "y ~ I(a if b else c)", "y ~ a + eval('1')",
                "y ~ I((a := 1))", "y ~ a; import os", "y ~ I(a)(1)", "y ~ C(g, levels=open('f'))"]:
        with pytest.raises(CLIError, match="refused"):
            check_formula(bad)
    for good in ["y ~ a + b", "y ~ a * b - 1", "y ~ 0 + a:b + C(g)", "y ~ np.log(a + 10) + I(b ** 2)",
                 "y ~ center(a) + scale(b) + C(g, contr.treatment('x'))", "y ~ (a + b) ** 2", "y ~ `my col` + 1e-3"]:
        assert check_formula(good) == good


def test_resume_with_a_formula_typed_again_runs_it(small_csv, tmp_path, capsys):
    """The user's own run: the formula given again beside --resume is theirs; another one is refused."""
    folder = _crafted_folder(tmp_path, small_csv, "y ~ a + I(np.arcsin(b / 10))")  # np.arcsin: not listed
    assert main(["run", "--resume", str(folder), "--quiet"]) == 2
    assert "refused: the formula" in capsys.readouterr().err
    assert main(["run", "--resume", str(folder), "--formula", "y ~ a", "--quiet"]) == 2
    assert "is not the formula of the saved run" in capsys.readouterr().err
    # typed again: accepted (then refused further on, for the crafted folder's data digest)
    assert main(["run", "--resume", str(folder), "--formula", "y ~ a + I(np.arcsin(b / 10))", "--quiet"]) == 2
    assert "is not the data of the saved run" in capsys.readouterr().err


def test_no_symbolic_link_in_a_run_folder_is_followed(tmp_path):
    """A link in ``<checkpoint>.draws`` (to a file or folder elsewhere) is refused when the checkpoint is read,
    and never written through when the draws are written."""
    import shutil

    from tallmh.storage.drawstore import DrawStore

    model, data = _logistic()
    ck = tmp_path / "ck.npz"
    with pytest.warns(tm.TrustWarning):
        tm.sample(model, data, num_samples=48, checkpoint=str(ck), stream_draws=True, seed=5, **_QUICK)
    draws = tmp_path / "ck.npz.draws"
    victim = tmp_path / "elsewhere.bin"
    shutil.copy(draws / "sampling.theta.bin", victim)
    before = victim.read_bytes()
    (draws / "sampling.theta.bin").unlink()
    (draws / "sampling.theta.bin").symlink_to(victim)
    with pytest.raises(tm.ConfigError, match="symbolic link"):
        tm.load_result(str(ck))
    # the writing side: a kept file that is a link is refused, a new file replaces the link, not its target
    store = DrawStore(str(draws), 2, 3, "float64")
    with pytest.raises(OSError, match="symbolic link"):
        store.start({"warmup": 0, "sampling": 48}, {}, keep=True)
    store.close()
    store = DrawStore(str(draws), 2, 3, "float64")
    store.start({}, {}, keep=False)
    store.append("sampling", np.ones((2, 4, 3)), {})
    store.close()
    assert victim.read_bytes() == before and not (draws / "sampling.theta.bin").is_symlink()
    # the whole draws folder a link: refused
    shutil.rmtree(draws)
    (tmp_path / "other").mkdir()
    draws.symlink_to(tmp_path / "other")
    with pytest.raises(OSError, match="symbolic link"):
        DrawStore(str(draws), 2, 3, "float64")


def test_cli_resume_refuses_a_run_folder_with_links(small_csv, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--noise-sd", "1",
                 "--samples", "20", "--warmup", "20", "--chains", "1", "--quiet", "--out", str(out)]) == 0
    (tmp_path / "elsewhere").mkdir()
    os.rename(out / (CHECKPOINT + ".draws"), tmp_path / "elsewhere" / "d")
    (out / (CHECKPOINT + ".draws")).symlink_to(tmp_path / "elsewhere" / "d")
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--samples", "40", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and len(err.strip().splitlines()) == 1, err


def test_cli_resume_refuses_a_checkpoint_of_another_method(small_csv, tmp_path, capsys):
    """A checkpoint of a --test exact run copied into a folder whose run used the default test is refused."""
    import shutil

    base = ["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--noise-sd", "1", "--samples",
            "20", "--warmup", "20", "--chains", "1", "--quiet"]
    assert main(base + ["--test", "exact", "--out", str(tmp_path / "exact")]) == 0
    assert main(base + ["--out", str(tmp_path / "auto")]) == 0
    (tmp_path / "auto" / CHECKPOINT).unlink()
    shutil.rmtree(tmp_path / "auto" / (CHECKPOINT + ".draws"))
    shutil.copy(tmp_path / "exact" / CHECKPOINT, tmp_path / "auto" / CHECKPOINT)
    shutil.copytree(tmp_path / "exact" / (CHECKPOINT + ".draws"), tmp_path / "auto" / (CHECKPOINT + ".draws"))
    capsys.readouterr()
    assert main(["run", "--resume", str(tmp_path / "auto"), "--samples", "40", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "refused" in err and "--test auto" in err and len(err.strip().splitlines()) == 1, err
    # its own checkpoint still continues
    assert main(["run", "--resume", str(tmp_path / "exact"), "--samples", "40", "--quiet"]) == 0


# ---------------------------------------------------------------------------------------------------
# a closed terminal: SIGHUP, then every write to it fails (EIO)


def _run_on_a_terminal_closed(csv, out, extra, close_after, delay):
    """``tallmh run`` on a pseudo-terminal whose master side is closed (the SSH session gone: SIGHUP, then EIO
    on every write) ``delay`` seconds after ``close_after(output, out)`` holds; ``(status, output)``."""
    import pty
    import select

    argv = [sys.executable, "-m", "tallmh", "run", str(csv), "--target", "y", "--model", "linear", "--noise-sd",
            "1", "--chains", "1", "--out", str(out), *extra]
    env = _env()
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session of its own with the terminal as its controlling terminal
        try:
            os.execve(sys.executable, argv, env)
        finally:
            os._exit(127)
    seen, t_seen, deadline = b"", None, time.time() + 120
    try:
        while time.time() < deadline:
            if t_seen is not None and time.time() >= t_seen + delay:
                break
            r, _, _ = select.select([fd], [], [], 0.05)
            if r:
                try:
                    chunk = os.read(fd, 4096)
                except OSError:
                    chunk = b""
                if not chunk:
                    break
                seen += chunk
            if t_seen is None and close_after(seen, out):
                t_seen = time.time()
        assert t_seen is not None, seen.decode(errors="replace")[-2000:]
    finally:
        os.close(fd)  # the terminal goes away
    deadline = time.time() + 180
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError("the run did not end within 180 s of the hang-up")
        time.sleep(0.1)
    code = os.waitstatus_to_exitcode(status)
    return code, seen.decode(errors="replace")


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # (the child only calls execve)
@pytest.mark.parametrize("phase", ["setup", "warmup", "sampling"])
def test_closed_terminal_keeps_the_run(small_csv, tmp_path, capsys, phase):
    """SIGHUP and EIO never fail the stop: exit status 129, the folder and the draws kept (a checkpoint even
    when none was due yet), and --resume continues bit for bit."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:  # (as for the termination signals above)
        pytest.skip("SIGHUP is ignored in this process (e.g. the tests run under nohup): the child keeps it ignored, "
                    "as tallmh's command line does on purpose, so a closed terminal does not stop its run")
    out = tmp_path / "run"
    def drawn(name):  # the first draws of the phase streamed to disk
        return lambda seen, out: os.path.exists(out / (CHECKPOINT + ".draws") / f"{name}.theta.bin") and \
            os.path.getsize(out / (CHECKPOINT + ".draws") / f"{name}.theta.bin") > 0

    extra, close_after, delay = {  # (no checkpoint is due before the hang-up: the default is every 300 s)
        "setup": (["--samples", "200", "--warmup", "100"], lambda seen, out: b"rows, d =" in seen, 1.0),
        "warmup": (["--samples", "10", "--warmup", "100000000"], drawn("warmup"), 0.5),
        "sampling": (["--samples", "100000000", "--warmup", "0"], drawn("sampling"), 0.5),
    }[phase]
    code, seen = _run_on_a_terminal_closed(small_csv / "t.csv", out, extra, close_after, delay)
    assert code == 129 or (phase == "setup" and code == 0), (code, seen[-2000:])
    assert (out / "run.json").exists(), (code, seen[-2000:], os.listdir(out) if out.exists() else None)
    assert not (out / ".tallmh.lock").exists()
    if phase == "setup" and not (out / CHECKPOINT).exists():
        # stopped before sampling began: the settings kept, and --resume starts the run again (the same draws)
        assert main(["run", "--resume", str(out), "--quiet"]) == 0, capsys.readouterr().err
        assert _draws(out).shape == (1, 200, 3)
        return
    saved = tm.load_result(str(out / CHECKPOINT))
    if phase == "warmup":
        assert saved.partial and saved.flat_warmup.shape[1] > 0 and (out / "posterior.nc").exists()
        return
    k = saved.flat_samples.shape[1]
    total = k + 10 if phase == "sampling" else 200
    rc = main(["run", "--resume", str(out), "--samples", str(total), "--quiet"])
    if not saved.partial:  # (the run ended before the hang-up reached it, which may then have come while the
        # outputs were written: status 129 after them): a complete run, which --resume says it holds
        assert k == total and rc == 2
        return
    assert rc == 0, capsys.readouterr().err
    theta = _draws(out)
    assert theta.shape == (1, total, 3)
    np.testing.assert_array_equal(theta[:, :k], saved.flat_samples)


def test_stop_while_the_outputs_are_written_is_not_swallowed(small_csv, tmp_path, capsys, monkeypatch):
    """A stop signal landing in a weakref callback while a finished run writes its outputs: the outputs are
    finished and the command ends with the stop's status (before: the exception was swallowed in the callback,
    a traceback printed and the status 0)."""
    import weakref

    from tallmh import interrupts, run_table

    real = run_table._write_files

    def write_files(v, out):
        class Obj:
            pass

        o = Obj()
        weakref.finalize(o, lambda: os.kill(os.getpid(), signal.SIGTERM))
        del o  # the signal is delivered inside the finaliser
        return real(v, out)

    monkeypatch.setattr(run_table, "_write_files", write_files)
    before = {s: signal.getsignal(s) for s in interrupts.STOP_SIGNALS}
    try:
        interrupts.install_interrupt_counter()
        rc = main(["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--noise-sd", "1",
                   "--samples", "20", "--warmup", "20", "--chains", "1", "--quiet", "--out", str(tmp_path / "o")])
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        interrupts._STOPPED_BY.clear()
    err = capsys.readouterr().err
    assert rc == 143 and "Traceback" not in err, err
    assert "SIGTERM: finishing the outputs" in err
    for f in ("posterior.nc", "results.json", "report.html"):
        assert (tmp_path / "o" / f).exists()


# ---------------------------------------------------------------------------------------------------
# degenerate data, named before sampling in one line


def test_api_names_degenerate_data_in_one_line():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 2))
    for model, y in ((tm.models.LogisticRegression(), np.ones(300)), (tm.models.LinearRegression(), np.full(300, 3.0))):
        with pytest.raises(tm.DataError, match="target 'y' is constant") as e:
            tm.sample(model, {"X": X, "y": y}, num_samples=10, progress=False)
        assert "\n" not in str(e.value)
    with pytest.raises(tm.DataError, match=r"not numeric \(dtype <U") as e:  # (before: JAX's raw TypeError)
        tm.sample(tm.models.LogisticRegression(), {"X": X, "y": np.array(["a", "b"] * 150)}, num_samples=10,
                  progress=False)
    with pytest.raises(tm.ConfigError, match=r"reads data\['y'\], which this data does not have \(it has 'X', 'z'\)"):
        tm.sample(tm.models.LogisticRegression(), {"X": X, "z": np.ones(300)}, num_samples=10, progress=False)
    from tallmh.reporting.results import estimated_rate

    assert estimated_rate(0.05, 0.5) == "0.075" and estimated_rate(0.05, 93.4).startswith("1 (")


def _csv(tmp_path, name, **cols):
    pd.DataFrame(cols).to_csv(tmp_path / name, index=False)
    return str(tmp_path / name)


def test_cli_refuses_a_constant_target(tmp_path, capsys):
    path = _csv(tmp_path, "c.csv", x=np.arange(100.0), y=np.ones(100))
    assert main(["run", path, "--target", "y", "--model", "logistic", "--out", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "target 'y' is constant" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_cli_names_separating_columns(tmp_path, capsys):
    rng = np.random.default_rng(1)
    x = rng.normal(size=400)
    g = (rng.random(400) < 0.1).astype(float)
    y = ((rng.random(400) < 0.5) | (g == 1)).astype(float)  # every row with g = 1 has y = 1
    path = _csv(tmp_path, "s.csv", x=x, g=g, z=np.where(y == 1, 1.0, -1.0) + 0.1 * rng.random(400), y=y)
    assert main(["run", path, "--target", "y", "--model", "logistic", "--samples", "20", "--warmup", "20",
                 "--chains", "1", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if line.startswith("tallmh: note:")]
    assert len(notes) == 2, captured.err
    assert "column 'g' separates the target: every row with g = 1 has y = 1" in notes[0]
    assert "column 'z' separates the target" in notes[1]
    assert "data note: column 'x'" not in captured.out and "data note: column 'g'" in captured.out
    res = json.loads((tmp_path / "o" / "results.json").read_text())
    assert len(res["data_notes"]) == 2


def test_cli_collinear_one_hot_columns_are_named_and_their_contrasts_match_least_squares(tmp_path, capsys):
    """One-hot columns of every level beside the intercept: named in a note, kept; the identified contrasts
    (differences of levels, the slope) agree with least squares within Monte Carlo error."""
    rng = np.random.default_rng(2)
    n = 3000
    level = rng.integers(0, 3, n)
    hot = np.eye(3)[level]
    x = rng.normal(size=n)
    y = np.array([0.0, 1.0, -0.5])[level] + 0.7 * x + rng.normal(size=n)
    path = _csv(tmp_path, "h.csv", x=x, g_a=hot[:, 0], g_b=hot[:, 1], g_c=hot[:, 2], y=y)
    out = tmp_path / "o"
    assert main(["run", path, "--target", "y", "--model", "linear", "--noise-sd", "1", "--samples", "2000",
                 "--chains", "2", "--test", "exact", "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "columns intercept, g_a, g_b, g_c are exactly collinear" in captured.err, captured.err
    import arviz as az

    beta = az.from_netcdf(str(out / "posterior.nc")).posterior["beta"].values.reshape(-1, 5)  # intercept, x, g_a..c
    D = np.column_stack([np.ones(n), x, hot[:, 1], hot[:, 2]])  # level a as the baseline: identified
    ols = np.linalg.lstsq(D, y, rcond=None)[0]
    contrasts = np.column_stack([beta[:, 1], beta[:, 3] - beta[:, 2], beta[:, 4] - beta[:, 2]])
    want = ols[1:]
    ess = np.array([float(az.ess(c.reshape(2, -1))) for c in contrasts.T])
    mcse = contrasts.std(axis=0) / np.sqrt(ess)
    # posterior mean - least squares: within 4 MCSE plus the prior's pull (N(0, 10^2): under 0.01 sd here)
    np.testing.assert_array_less(np.abs(contrasts.mean(axis=0) - want), 4 * mcse + 0.01 * contrasts.std(axis=0))
    # negative control: the same check fails for a contrast read from the wrong columns
    wrong = beta[:, 3] - beta[:, 4]
    assert abs(wrong.mean() - want[1]) > 4 * mcse[1] + 0.01 * contrasts.std(axis=0)[1]


# ---------------------------------------------------------------------------------------------------
# damaged caches


def test_a_damaged_compiled_program_is_removed_and_compiled_again(tmp_path, monkeypatch):
    """A flipped bit in an entry of the compiled-program cache: the entry fails its checksum and is removed,
    never loaded (a damaged executable crashed later runs: SIGABRT, SIGILL, LLVM errors); the next run
    compiles it again, with the same draws."""
    import jax

    from tallmh.run import _exec_cache, programs

    previous = jax.config.jax_compilation_cache_dir
    tm.set_compilation_cache(str(tmp_path))
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=3)

    def run():
        return tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Exact(), num_samples=60,
                         num_warmup=40, num_chains=2, seed=5, chunk_size=20, progress=False)

    loaded = []
    real_load = _exec_cache.load
    monkeypatch.setattr(_exec_cache, "load", lambda key: loaded.append(real_load(key)) or loaded[-1])
    try:
        programs.RUNNERS.clear()
        first = run()
        (entry,) = list((tmp_path / "tallmh-executables").glob("*.pkl"))
        raw = bytearray(entry.read_bytes())
        for at in (len(raw) // 3, len(raw) // 2, (3 * len(raw)) // 4):  # three bits in the executable
            raw[at] ^= 1 << (at % 8)
        entry.write_bytes(bytes(raw))
        programs.RUNNERS.clear()  # as in a new process
        second = run()
        assert loaded[-1] is None  # the damaged entry was not loaded but removed, and the program compiled anew
        assert not entry.exists() or entry.read_bytes() != bytes(raw)  # (and stored again, sound)
        np.testing.assert_array_equal(first.flat_samples, second.flat_samples)
        if entry.exists():  # the entry stored again loads in the next process
            programs.RUNNERS.clear()
            third = run()
            assert loaded[-1] is not None
            np.testing.assert_array_equal(first.flat_samples, third.flat_samples)
    finally:
        programs.RUNNERS.clear()
        tm.set_compilation_cache(previous)


def _npy_table(tmp_path, name="t.npy", seed=4):
    rng = np.random.default_rng(seed)
    n = 400
    a, b = rng.normal(size=n), rng.normal(size=n)
    y = 1.0 + 0.5 * a - 0.3 * b + rng.normal(size=n)
    path = tmp_path / name
    np.save(path, np.column_stack([a, b, y]))
    return path


def test_deleted_or_damaged_table_cache_is_rebuilt_and_the_run_resumes(tmp_path, capsys, monkeypatch):
    """The table cache of a .npy run deleted (the docs say caches may be deleted at any time) or truncated
    between an interrupt and --resume: rebuilt, and the run continues bit for bit."""
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    path = _npy_table(tmp_path)
    out = tmp_path / "run"
    base = ["--target", "2", "--model", "linear", "--noise-sd", "1", "--warmup", "20", "--chains", "1", "--quiet"]
    assert main(["run", str(path), *base, "--samples", "30", "--out", str(out)]) == 0
    first = _draws(out)
    import shutil

    (table,) = list((tmp_path / "cache" / "tables").iterdir())
    shutil.rmtree(table)  # deleted
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--samples", "40", "--quiet"]) == 0, capsys.readouterr().err
    second = _draws(out)
    np.testing.assert_array_equal(second[:, :30], first)
    (table,) = list((tmp_path / "cache" / "tables").iterdir())
    x = table / "X.npy"
    os.truncate(x, os.path.getsize(x) // 2)  # truncated
    assert main(["run", "--resume", str(out), "--samples", "50", "--quiet"]) == 0, capsys.readouterr().err
    np.testing.assert_array_equal(_draws(out)[:, :40], second)


def test_a_moved_data_file_is_accepted_beside_resume_when_its_content_matches(small_csv, tmp_path, capsys):
    import shutil

    src = tmp_path / "t.csv"
    shutil.copy(small_csv / "t.csv", src)
    out = tmp_path / "run"
    assert main(["run", str(src), "--target", "y", "--model", "linear", "--noise-sd", "1", "--samples", "30",
                 "--warmup", "20", "--chains", "1", "--quiet", "--out", str(out)]) == 0
    first = _draws(out)
    moved = tmp_path / "elsewhere.csv"
    os.rename(src, moved)
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--samples", "40", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "is not there (moved?)" in err and len(err.strip().splitlines()) == 1, err
    # other data beside --resume: refused; the moved file: accepted, and run.json follows it
    assert main(["run", str(small_csv / "t2.csv"), "--resume", str(out), "--samples", "40", "--quiet"]) == 2
    assert "is not the data of the saved run" in capsys.readouterr().err
    assert main(["run", str(moved), "--resume", str(out), "--samples", "40", "--quiet"]) == 0, capsys.readouterr().err
    np.testing.assert_array_equal(_draws(out)[:, :30], first)
    assert json.loads((out / "run.json").read_text())["settings"]["data"] == str(moved)
    assert main(["run", "--resume", str(out), "--samples", "50", "--quiet"]) == 0


def test_a_full_cache_disk_is_one_line_and_leaves_no_half_made_cache(tmp_path, capsys, monkeypatch):
    """The table cache's files are reserved before their memory maps are written: a full disk is an error
    naming the file (before: SIGBUS when the map's pages were written, and a .tmp folder left)."""
    import errno

    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    path = _npy_table(tmp_path)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    assert main(["run", str(path), "--target", "2", "--model", "linear", "--noise-sd", "1", "--samples", "10",
                 "--out", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "No space left on device" in err and "X.npy" in err and len(err.strip().splitlines()) == 1, err
    assert not [p for p in (tmp_path / "cache" / "tables").iterdir()]


# ---------------------------------------------------------------------------------------------------
# ending a long run


def test_diagnostics_of_a_long_chain_read_a_thinned_copy_and_stay_conservative(monkeypatch):
    """ESS and R-hat of chains longer than MAX_DIAG_DRAWS come from every t-th draw (bounded time and
    memory); for an AR(1) chain with known ESS the estimate is close and not above it (thinning loses
    information), and a chain of independent draws keeps its full ESS."""
    from tallmh.reporting import diagnostics

    seen = []
    real = diagnostics._ess_core
    monkeypatch.setattr(diagnostics, "_ess_core", lambda x: seen.append(x.shape) or real(x))
    rng = np.random.default_rng(0)
    n, rho = 1_000_000, 0.9
    e = rng.standard_normal((2, n))
    x = np.empty((2, n))
    x[:, 0] = e[:, 0] / np.sqrt(1 - rho**2)
    from scipy.signal import lfilter

    x[:, 1:] = lfilter([1.0], [1.0, -rho], e[:, 1:], axis=1, zi=rho * x[:, :1])[0]
    true = 2 * n * (1 - rho) / (1 + rho)
    est = float(diagnostics.ess_all(x[:, :, None], "mean")[0])
    assert max(s[1] for s in seen) <= diagnostics.MAX_DIAG_DRAWS  # only the thinned draws were transformed
    assert 0.75 * true < est < 1.05 * true, (est, true)
    assert np.isfinite(diagnostics.rhat_all(x[:, :, None])[0])
    # negative control: independent draws thinned keep about the thinned count only (the estimate cannot
    # exceed the draws it reads), so a thinned ESS never overstates
    iid = rng.standard_normal((2, n, 1))
    assert float(diagnostics.ess_all(iid)[0]) <= 1.1 * 2 * diagnostics.MAX_DIAG_DRAWS


def test_a_long_run_writes_a_thinned_posterior_nc_and_keeps_every_draw(small_csv, tmp_path, capsys, monkeypatch):
    from tallmh import run_table

    monkeypatch.setattr(run_table, "MAX_OUTPUT_DRAWS", 50)
    out = tmp_path / "o"
    assert main(["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--noise-sd", "1",
                 "--samples", "200", "--warmup", "20", "--chains", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "use every 4th draw (50 of 200 per chain; the verdict reads them all)" in printed
    theta = _draws(out)
    full = tm.load_result(str(out / CHECKPOINT)).flat_samples
    assert theta.shape == (2, 50, 3) and full.shape == (2, 200, 3)
    np.testing.assert_array_equal(theta, full[:, ::4])
    res = json.loads((out / "results.json").read_text())
    assert res["posterior_nc_every"] == 4 and res["methods"][0]["draws"] == 2 * 200  # (all chains)


def test_odd_checkpoint_metadata_is_the_documented_one_line_error(tmp_path):
    """Deeply nested or oversized JSON in a crafted checkpoint's metadata: ConfigError, not RecursionError or
    OverflowError."""
    for meta in ("[" * 100_000 + "]" * 100_000,
                 '{"format": "tallmh-checkpoint", "version": 1e999999, "payload": {}}',
                 '{"format": "tallmh-checkpoint", "version": 2, "payload": {"n": 1' + "0" * 5000 + '}}'):
        path = tmp_path / "ck.npz"
        np.savez(path, __meta__=np.frombuffer(meta.encode(), np.uint8))
        with pytest.raises(tm.ConfigError) as e:
            tm.load_result(str(path))
        assert "\n" not in str(e.value)


def test_a_failed_checkpoint_of_streamed_draws_says_where_they_are(tmp_path, monkeypatch):
    """With the draws streamed to disk, a checkpoint that cannot be written says they are on disk (not "in
    memory") and names the checkpoint's file."""
    from tallmh.storage import checkpoint

    model, data = _logistic()
    ck = tmp_path / "ck.npz"
    monkeypatch.setattr(checkpoint.np, "savez", _enospc)
    with pytest.warns(RuntimeWarning, match=r"checkpoint not saved \(.*ck\.npz.*No space left on device.*\); the "
                                            r"draws are kept on disk in .*ck\.npz\.draws"):
        r = tm.sample(model, data, num_samples=32, checkpoint=str(ck), checkpoint_every_s=1e-9, stream_draws=True,
                      seed=3, **_QUICK)
    assert r.flat_samples.shape == (2, 32, 3)


def test_streamed_csv_refuses_a_row_with_an_extra_field_and_names_a_bad_cell(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    rows = [f"{a:.4f},{b:.4f},{1.0 + a - b + rng.normal():.4f}" for a, b in rng.normal(size=(200, 2))]
    extra = rows.copy()
    extra[120] += ",9"  # line 122 of the file
    (tmp_path / "extra.csv").write_text("a,b,y\n" + "\n".join(extra) + "\n")
    cell = rows.copy()
    cell[150] = "1.5,abc," + cell[150].split(",")[2]  # data row 151: 'abc' in column b (after valid numbers)
    (tmp_path / "cell.csv").write_text("a,b,y\n" + "\n".join(cell) + "\n")
    base = ["--target", "y", "--model", "linear", "--noise-sd", "1", "--samples", "10", "--quiet", "--stream"]
    assert main(["run", str(tmp_path / "extra.csv"), *base, "--out", str(tmp_path / "o1")]) == 1
    err = capsys.readouterr().err
    assert "Expected 3 fields in line 122, saw 4" in err and len(err.strip().splitlines()) == 1, err
    assert main(["run", str(tmp_path / "cell.csv"), *base, "--out", str(tmp_path / "o2")]) == 1
    err = capsys.readouterr().err
    assert "column 'b' is not numeric: data row 151 holds 'abc'" in err and len(err.strip().splitlines()) == 1, err


def test_posterior_nc_space_check_estimates_the_compressed_file(tmp_path):
    """The free space asked for posterior.nc is that of the compressed file (ArviZ writes it with zlib), not
    the arrays' own size (about 4 times more: a write that fitted was refused)."""
    import xarray as xr
    import zlib

    from tallmh.reporting.report import _compressed_size

    rng = np.random.default_rng(0)
    stats = xr.Variable(("chain", "draw"), (rng.random((4, 500_000)) < 0.01).astype(np.int64))  # mostly zeros
    draws = xr.Variable(("chain", "draw"), rng.normal(size=(4, 500_000)))  # barely compressible
    for v in (stats, draws):
        real = len(zlib.compress(np.asarray(v.values).tobytes(), 4))
        est = _compressed_size(v)
        assert 0.8 * real <= est <= 1.2 * real, (est, real, v.nbytes)
    assert _compressed_size(stats) < 0.25 * stats.nbytes  # the old estimate: 4 times too much and more


def test_a_huge_constant_column_is_named_as_constant(tmp_path, capsys):
    n = 2000
    rng = np.random.default_rng(0)
    path = _csv(tmp_path, "big.csv", a=rng.normal(size=n), c=np.full(n, 1e30), y=(rng.random(n) < 0.5).astype(int))
    assert main(["run", path, "--target", "y", "--samples", "10", "--out", str(tmp_path / "o"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "feature 'c' is constant (every row is 1e+30)" in err and "NaN" not in err, err


def test_a_stop_while_the_table_is_read_keeps_the_settings(small_csv, tmp_path, capsys, monkeypatch):
    """Ctrl-C (or SIGTERM, a closed terminal) while the table is first read, before run.json held the table's
    digest: the settings are kept (before: the folder was cleaned up and nothing said how to go on), the exit
    status is the stop's, and --resume starts the run again: the same draws as a run never stopped. A failure
    there (not a stop) still leaves nothing behind."""
    from tallmh import run_table

    argv = ["run", str(small_csv / "t.csv"), "--target", "y", "--model", "linear", "--noise-sd", "1",
            "--samples", "30", "--warmup", "20", "--chains", "1", "--quiet"]
    real = run_table._design

    def stopped(args, tell):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_table, "_design", stopped)
    out = tmp_path / "run"
    assert main(argv + ["--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert "before sampling began" in err and f"--resume {out}" in err, err
    saved = json.loads((out / "run.json").read_text())
    assert saved["data_sha256"] is None and saved["settings"]["samples"] == 30
    monkeypatch.setattr(run_table, "_design", real)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0, capsys.readouterr().err
    assert json.loads((out / "run.json").read_text())["data_sha256"]  # the table's digest, once read
    plain = tmp_path / "plain"
    assert main(argv + ["--out", str(plain)]) == 0
    np.testing.assert_array_equal(_draws(out), _draws(plain))

    def failed(args, tell):
        raise tm.DataError("a bad table")

    monkeypatch.setattr(run_table, "_design", failed)
    assert main(argv + ["--out", str(tmp_path / "bad")]) == 1
    assert not (tmp_path / "bad").exists()
