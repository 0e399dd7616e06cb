"""benchmarks/permutation.py and benchmarks/gpu.py run end to end (no timing assertions).

The scripts run in subprocesses with ``PYTHONPATH`` set to this checkout's ``src`` and write into
``tmp_path``, so the committed results are never touched.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")


def _run(args, timeout, env_extra=None):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               JAX_PLATFORMS="cpu", **(env_extra or {}))
    env.pop("OUT", None)
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow  # ~15-40 s on a loaded 2-core CPU (compiling)
def test_permutation_benchmark_tiny_run(tmp_path):
    out = tmp_path / "p.json"
    p = _run([os.path.join(BENCH, "permutation.py"), "--sizes", "1024,1025", "--chunks", "64",
              "--items", "4096", "--reps", "1", "--out", str(out)], timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["n"], r["chunk"]) for r in rows] == [(1024, 64), (1025, 64)]
    # the old Feistel needs no walk at a power of 4 and walks just above one (its domain is then ~4N)
    assert rows[0]["feistel_walk_rounds_max_per_chunk"] == 0
    assert rows[1]["feistel_walk_rounds_max_per_chunk"] > 3 and rows[1]["feistel_domain_over_n"] > 3.9
    for r in rows:
        assert r["swap_or_not_ns_per_item"] > 0 and r["loglik_ns_per_item"] > 0


def test_gpu_benchmark_without_a_gpu_says_so_and_writes_nothing(tmp_path):
    out = tmp_path / "gpu.json"
    p = _run([os.path.join(BENCH, "gpu.py"), "--out", str(out)], timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "No GPU" in p.stdout and not out.exists()


@pytest.mark.slow  # ~3-4 minutes on a loaded 2-core CPU (six cells, each compiling)
def test_gpu_benchmark_smoke_on_cpu(tmp_path):
    out = tmp_path / "gpu_smoke.json"
    p = _run([os.path.join(BENCH, "gpu.py"), "--smoke", "--out", str(out)], timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    res = json.loads(out.read_text())
    methods = {(r["method"], r["chains"]) for r in res["rows"] if "error" not in r and "skipped" not in r}
    assert {("tallmh-austerity-cv", 4), ("hmcecs", 1), ("nuts", 1)} <= methods
    for r in res["rows"]:
        if "ess_min" in r:
            assert r["draws"] > 0 and r["time_per_step_s"] > 0 and r["data_per_step"] > 0
