"""The benchmark scripts run end to end in their smoke mode and write their JSON (no timing assertions).

Both scripts start at once in subprocesses (each spends most of its time compiling, so running them side
by side keeps the wall time down), write into ``tmp_path`` (``--out``) so the committed results in
``benchmarks/results/`` are never touched, and must exit 0.
"""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # runs the scripts; CI runs it with -m slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "benchmarks")
TIMEOUT_S = 120  # a hang guard, not a timing assertion


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    runs = {}
    procs = {}
    for name in ("scaling", "decision_error"):
        out = tmp_path_factory.mktemp(name)
        cmd = [sys.executable, os.path.join(BENCH, f"{name}.py"), "--smoke", "--out", str(out)]
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), out)
    for name, (proc, out) in procs.items():
        try:
            text, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            pytest.fail(f"{name}.py --smoke did not finish in {TIMEOUT_S}s:\n{text[-3000:]}")
        runs[name] = (proc.returncode, text, out)
    return runs


def _load(runs, name, filename):
    rc, text, out = runs[name]
    assert rc == 0, f"{name}.py --smoke exited {rc}:\n{text[-3000:]}"
    path = out / filename
    assert path.exists(), f"{name}.py --smoke did not write {filename}:\n{text[-3000:]}"
    return json.loads(path.read_text()), text


def test_scaling_smoke(smoke_runs):
    res, text = _load(smoke_runs, "scaling", "scaling.json")
    assert {"meta", "config", "rows", "slopes", "per_n", "total_runtime_s"} <= set(res)
    for key in ("platform", "cpu_count", "jax_version", "date", "command"):
        assert key in res["meta"]
    assert res["config"]["smoke"] is True
    assert res["config"]["sizes"] == [1000, 10000]
    tests = {"exact", "austerity", "confidence", "barker"}
    assert {r["test"] for r in res["rows"]} == tests
    assert len(res["rows"]) == 2 * len(tests)
    for r in res["rows"]:
        for key in ("N", "steps", "items_per_step", "seconds_per_step", "compile_s", "acceptance_rate", "data_fraction"):
            assert key in r
        assert 0 < r["items_per_step"] <= r["N"]
        if r["test"] == "exact":
            assert r["items_per_step"] == r["N"]
    assert set(res["slopes"]) == tests
    for s in res["slopes"].values():
        assert {"items_slope_all", "time_slope_all", "items_slope_last2", "time_slope_last2"} <= set(s)
    assert res["slopes"]["exact"]["items_slope_all"] == pytest.approx(1.0)
    assert "log-log slopes" in text


def test_decision_error_smoke(smoke_runs):
    res, _ = _load(smoke_runs, "decision_error", "decision_error.json")
    assert {"meta", "config", "rows", "total_runtime_s"} <= set(res)
    for key in ("platform", "cpu_count", "jax_version", "date", "command"):
        assert key in res["meta"]
    assert res["config"]["smoke"] is True
    rows = res["rows"]
    assert [r["epsilon"] for r in rows] == res["config"]["epsilons"]
    for r in rows:
        for key in ("data_fraction", "wrong_rate", "wrong_rate_binomial_se", "wrong_rate_pair_clustered_se",
                    "wrong_accept_rate", "wrong_reject_rate", "decisions"):
            assert key in r
        assert 0 < r["data_fraction"] <= 1
        assert 0 <= r["wrong_rate"] <= 1
    exact = [r for r in rows if r["epsilon"] == 0]
    assert exact and exact[0]["data_fraction"] == 1.0 and exact[0]["wrong_rate"] == 0.0
    out = smoke_runs["decision_error"][2]
    png = out / "decision_error.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_time_to_trusted_quick(tmp_path):
    """``time_to_trusted.py --quick`` runs tallmh in a fresh process (N = 2000, Laplace reference) and writes
    the row with the whole-process time, its breakdown, ESS and the error against the reference."""
    cmd = [sys.executable, os.path.join(BENCH, "time_to_trusted.py"), "--quick", "--methods", "tallmh",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "time_to_trusted_quick.json").read_text())
    (row,) = res["rows"]
    assert row["method"] == "tallmh" and row["N"] == 2000 and row["cache"] == "cold"
    parts = ("import_s", "data_s", "setup_s", "compile_s", "warmup_s", "sampling_s", "other_s", "startup_exit_s")
    for k in parts:
        assert row[k] >= 0.0, (k, row[k])
    # the breakdown adds up to the whole process measured from outside
    assert abs(sum(row[k] for k in parts) + row["before_import_s"] - row["process_s"]) < 1e-6 * row["process_s"] + 1e-3
    assert row["draws"] == 300 and row["ess_min"] > 0 and row["rhat_max"] > 0.9
    assert 0.0 <= row["max_mean_err_sd"] < 1.0  # against the Laplace approximation at N = 2000
    assert (tmp_path / "time_to_trusted_quick.md").exists()
    assert row["cpu_s"] > 0.0  # the process's CPU seconds, as the parent counted them


def test_cold_phases_smoke(tmp_path):
    """``cold_phases.py --smoke`` times the stages of one fresh process's call (N = 2000): the chain's trace and
    XLA's compile in the compile thread, the set-up's parts, the wait for the chain, and the interpreter's exit."""
    cmd = [sys.executable, os.path.join(BENCH, "cold_phases.py"), "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = json.loads((tmp_path / "cold_phases.json").read_text())["runs"]
    stages = {(e["stage"], e["thread"]) for e in run["events"]}
    assert {("trace", "tallmh-compile"), ("XLA compile", "tallmh-compile"), ("set-up", "MainThread"),
            ("wait for the chain", "MainThread")} <= stages, stages
    s = run["summary"]
    assert 0 < s["trace_start_s"] < s["chain_ready_s"] <= s["call_s"] and 0 < s["setup_end_s"] <= s["call_s"]
    assert run["exit_s"] > 0 and run["process_s"] > run["call_end"] - run["call_start"] and run["draws_per_chain"] > 0


def test_host_pass_blas_smoke(tmp_path):
    """``host_pass_blas.py`` times the host pass with OpenBLAS's threads and with one, and says which sums keep
    their bits (the value and the line search's sum do: their products ``X theta`` give each row to one thread;
    the gradient's may differ in its last bits)."""
    cmd = [sys.executable, os.path.join(BENCH, "host_pass_blas.py"), "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "host_pass_blas.json").read_text())
    assert {(r["blas"], r["pass_"]) for r in res["rows"]} == {(b, p) for b in ("default threads", "one thread")
                                                              for p in ("sums", "diff")}
    assert all(r["wall_s"] > 0 and r["cpu_s"] >= 0 for r in res["rows"])
    assert res["same_bits"]["value"] and res["same_bits"]["line search"]
    assert res["same_bits"]["gradient max relative difference"] < 1e-12


def test_exact_pass_smoke():
    """``exact_pass.py`` times the exact decision's sums; all of them sum the same ratios (same value, to the
    float32 rounding of the plain sum)."""
    cmd = [sys.executable, os.path.join(BENCH, "exact_pass.py"), "--N", "5000", "--reps", "1"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {r["sum"] for r in res["rows"]} == {"plain sum", "df_sum", "df_reduce", "exact oracle", "audit pass"}
    values = [r["value"] for r in res["rows"]]
    assert max(values) - min(values) <= 1e-4 * max(1.0, abs(values[0]))
    assert all(r["ns_per_item_chain"] > 0 for r in res["rows"])


@pytest.mark.parametrize("name", ["certified_bound", "certified_audit"])
def test_certificate_scripts_smoke(tmp_path, name):
    """``certified_bound.py``: every exact remainder within its bound; ``certified_audit.py``: the certified runs
    settle some audited decisions and read fewer items than the runs without, on the same audits."""
    cmd = [sys.executable, os.path.join(BENCH, f"{name}.py"), "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / f"{name}_smoke.json").read_text())["rows"]
    if name == "certified_bound":
        assert rows and all(r["all_within"] for r in rows)
        return
    on, off = (next(r for r in rows if r["certify"] == c) for c in ("on", "off"))
    assert on["certified"] > 0 and off["certified"] == 0 and on["audited"] == off["audited"] > 0
    assert on["audit_items"] < off["audit_items"] and on["B"] > 0 and on["R"] > 0


def test_stratified_austerity_smoke(tmp_path):
    """``stratified_austerity.py`` runs exact MH, unstratified and stratified austerity and writes every run."""
    cmd = [sys.executable, os.path.join(BENCH, "stratified_austerity.py"), "--smoke", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3 * TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "stratified_austerity_smoke.json").read_text())
    assert [r["method"] for r in res["runs"]] == ["exact", "austerity", "stratified"]
    strat = res["runs"][-1]
    assert strat["exact_rows"] == 30 and strat["items_per_step"] >= 30  # the rare feature's rows
