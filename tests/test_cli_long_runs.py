"""Long runs from the command line: Ctrl-C keeps the draws, --resume continues, --out never
clobbers, and ``--model linear`` samples the noise sd.

The Ctrl-C test runs ``python -m tallmh`` as a real process and sends it SIGINT once sampling has made a
checkpoint; the others call ``tallmh.cli.main`` in-process on small tables.
"""

import argparse
import json
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest

import tallmh as tm
from tallmh.reporting import diagnostics
from tallmh.cli import main
from tallmh.frontends.design import load_design
from tests.test_cli import _env, _snapshot


def _linear_table(path, n, noise_sd, seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"age": rng.normal(40, 12, n), "income": rng.normal(5e4, 1.5e4, n)})
    df["y"] = 3.0 + 0.05 * df["age"] + 2e-5 * df["income"] + noise_sd * rng.standard_normal(n)
    df.to_csv(path, index=False)
    return df


@pytest.fixture(scope="module")
def linear_csv(tmp_path_factory):
    root = tmp_path_factory.mktemp("linear")
    _linear_table(root / "small.csv", 400, 2.0, seed=1)
    _linear_table(root / "noise2.csv", 2000, 2.0, seed=2)
    return root


def _draws(folder):
    import tallmh as tm

    idata = tm.diagnostics.read_netcdf(str(folder / "posterior.nc"))
    return idata.posterior["theta"].values


def _run_until_first_checkpoint(linear_csv, out):
    """A CLI run of (practically) endless sampling, returned once its first checkpoint exists (draws made)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tallmh", "run", str(linear_csv / "small.csv"), "--target", "y", "--model", "linear",
         "--samples", "100000000", "--warmup", "0", "--checkpoint-every", "1", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    deadline = time.time() + 240
    try:
        while not (out / "checkpoint.npz").exists():
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.time() < deadline, "no checkpoint within 240 s"
            time.sleep(0.2)
    except BaseException:
        proc.kill()
        raise
    return proc


@pytest.mark.slow
def test_sigint_mid_sampling_keeps_the_draws_and_resume_continues(linear_csv, tmp_path, capsys):
    out = tmp_path / "run"
    proc = _run_until_first_checkpoint(linear_csv, out)
    try:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)  # a hang would fail here
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("tallmh: interrupted after ") and "--resume" in last, stderr[-1000:]
    theta = _draws(out)
    k = theta.shape[1]
    assert theta.shape[0] == 2 and 0 < k < 100_000_000 and theta.shape[2] == 4  # intercept, age, income, log sd
    res = json.loads((out / "results.json").read_text())
    assert res["partial"] is True and res["methods"][0]["draws"] == 2 * k
    assert res["verdict"].startswith("NOT trusted") and "partial" in res["verdict"]
    assert "[PARTIAL]" in stdout and (out / "report.html").stat().st_size > 0

    # --resume continues the interrupted run: the draws made so far stay, bit for bit
    rc = main(["run", "--resume", str(out), "--samples", str(k + 30), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0, err[-2000:]
    theta2 = _draws(out)
    assert theta2.shape == (2, k + 30, 4)
    np.testing.assert_array_equal(theta2[:, :k], theta)
    res = json.loads((out / "results.json").read_text())
    assert res["partial"] is False and res["methods"][0]["draws"] == 2 * (k + 30)


@pytest.mark.slow  # three runs; tests/test_long_runs.py checks the same for tm.sample by default
def test_resume_gives_the_draws_of_one_long_run(linear_csv, tmp_path, capsys):
    data = str(linear_csv / "small.csv")
    common = ["--target", "y", "--model", "linear", "--warmup", "50", "--quiet", "--test", "austerity",
              "--batch-size", "100"]
    assert main(["run", data, *common, "--samples", "40", "--out", str(tmp_path / "a")]) == 0
    first = _draws(tmp_path / "a")
    assert main(["run", "--resume", str(tmp_path / "a"), "--samples", "90"]) == 0
    assert main(["run", data, *common, "--samples", "90", "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    resumed, straight = _draws(tmp_path / "a"), _draws(tmp_path / "b")
    assert resumed.shape == straight.shape == (2, 90, 4)
    np.testing.assert_array_equal(resumed[:, :40], first)
    np.testing.assert_array_equal(resumed, straight)
    # a complete run has nothing more to do unless asked for more draws
    rc = main(["run", "--resume", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert rc == 2 and "complete run of 90 draws" in err


@pytest.mark.slow
def test_a_second_run_into_the_same_out_fails_without_touching_the_first(linear_csv, tmp_path, capsys):
    data = str(linear_csv / "small.csv")
    out = tmp_path / "out"
    args = ["run", data, "--target", "y", "--model", "linear", "--samples", "20", "--warmup", "10", "--quiet",
            "--out", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    before = _snapshot(out)
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and "holds an earlier run" in err and "--overwrite" in err
    assert err.count("\n") == 1
    assert _snapshot(out) == before
    # --overwrite replaces the run's files and keeps the user's own
    (out / "mine.txt").write_text("keep me")
    assert main(args + ["--overwrite", "--seed", "5"]) == 0
    assert (out / "mine.txt").read_text() == "keep me"
    assert _snapshot(out)["posterior.nc"] != before["posterior.nc"]


def _closed_form(csv, **model_kw):
    ns = argparse.Namespace(data=str(csv), target="y", features=None, model="linear", test="exact", batch_size=500,
                            initial_batch=100, barker_batch=1000, no_standardize=False, no_intercept=False)
    X, y, names, _ = load_design(ns)
    model = tm.models.LinearRegression(**model_kw)
    return model.posterior({"X": X, "y": y})


@pytest.mark.slow
@pytest.mark.parametrize("fixed_sd", [None, 1.0], ids=["sampled", "fixed-at-1 (negative control)"])
def test_linear_model_on_noise_sd_2_matches_the_closed_form(linear_csv, tmp_path, capsys, fixed_sd):
    """Posterior sd of every coefficient within Monte Carlo error of the exact posterior (noise sd sampled,
    a quadrature over log sigma; LinearRegression.posterior). Negative control: the noise sd fixed at 1
    (the old behaviour) gives sds about half the right size, far outside that error."""
    csv = linear_csv / "noise2.csv"
    out = tmp_path / "o"
    argv = ["run", str(csv), "--target", "y", "--model", "linear", "--chains", "2", "--seed", "3", "--quiet",
            "--out", str(out)]
    if fixed_sd is None:
        argv += ["--samples", "4000", "--warmup", "1000"]
    else:  # a factor of two in the sds shows in a short run
        argv += ["--noise-sd", str(fixed_sd), "--samples", "1000", "--warmup", "500"]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    capsys.readouterr()
    draws = _draws(out).astype(np.float64)
    mean, cov = _closed_form(csv, prior_scale=10.0, noise_sd=None, noise_prior_scale=5.0)
    d = 3  # intercept, age, income (standardised scale)
    sd_true = np.sqrt(np.diag(cov))[:d]
    z_sd, z_mean = [], []
    for j in range(d):
        x = draws[:, :, j]
        sd_hat = x.std(ddof=1)
        # MCSE of an sd: sd / sqrt(2 ESS), with the ESS of the squared deviations
        ess_sq = diagnostics.ess((x - x.mean()) ** 2)
        z_sd.append(abs(sd_hat - sd_true[j]) / (sd_true[j] / np.sqrt(2 * ess_sq)))
        z_mean.append(abs(x.mean() - mean[j]) / (x.std(ddof=1) / np.sqrt(diagnostics.ess(x))))
    if fixed_sd is None:
        assert max(z_sd) < 4, z_sd
        assert max(z_mean) < 4, z_mean
        log_sd = draws[:, :, d]
        assert abs(log_sd.mean() - mean[d]) < 4 * log_sd.std() / np.sqrt(diagnostics.ess(log_sd))
        assert abs(np.exp(log_sd.mean()) - 2.0) < 0.15
        res = json.loads((out / "results.json").read_text())
        assert "noise_sd" in res["coefficients"]["names"] and "log sigma ~ N(0, 5^2)" in res["model"]["prior"]
    else:
        ratio = draws[:, :, :d].std(axis=(0, 1), ddof=1) / sd_true
        assert np.all(ratio < 0.6), ratio
        assert min(z_sd) > 6, z_sd  # far beyond the 4 the right model passes


@pytest.mark.slow
def test_interrupt_during_warmup_writes_the_outputs_and_resume_goes_on(linear_csv, tmp_path, capsys, monkeypatch):
    """Ctrl-C before the first sampling draw (simulated: tm.sample's callback raises KeyboardInterrupt, as
    Ctrl-C does): every output is written for 0 draws, the status is 130, and --resume finishes the run."""
    orig = tm.sample

    def interrupted_in_warmup(*args, **kw):
        if kw.get("resume") is None:
            def stop(info):
                if info["phase"] == "warmup" and info["done"] > 0:
                    raise KeyboardInterrupt
            kw["callback"] = stop
        return orig(*args, **kw)

    monkeypatch.setattr(tm, "sample", interrupted_in_warmup)
    out = tmp_path / "o"
    rc = main(["run", str(linear_csv / "small.csv"), "--target", "y", "--model", "linear", "--samples", "30",
               "--warmup", "200", "--quiet", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 130, err[-2000:]
    assert "interrupted after 0 of 30 draws per chain" in err.strip().splitlines()[-1]
    assert _draws(out).shape == (2, 0, 4)
    res = json.loads((out / "results.json").read_text())
    assert res["partial"] is True and res["methods"][0]["draws"] == 0
    assert "too few draws" in res["verdict"] or "partial" in res["verdict"]
    rc = main(["run", "--resume", str(out), "--quiet"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    assert _draws(out).shape == (2, 30, 4)


@pytest.mark.slow  # a second real process; the first Ctrl-C path is tested above
def test_a_second_ctrl_c_ends_the_process_at_once(linear_csv, tmp_path):
    out = tmp_path / "run"
    proc = _run_until_first_checkpoint(linear_csv, out)
    try:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.5)  # the first one is being handled: the run winds up and its files are written
        t0 = time.time()
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)  # a hang fails here
        waited = time.time() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    assert "interrupted again; stopping now" in stderr, stderr[-1000:]
    assert waited < 30, waited
