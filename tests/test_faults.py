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
