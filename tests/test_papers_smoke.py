"""The papers' experiment scripts (``benchmarks/papers/``) run end to end in their smoke mode and write JSON.

Every script starts at once in its own subprocess (each spends most of its few seconds compiling), writes
into a temporary ``--out`` directory (the committed results are never touched) and must exit 0 and write
its JSON and PNG. No timing assertions. The MNIST script is skipped when the MNIST files are absent.
The smoke runs are marked ``slow`` like the other benchmark smoke runs (``python -m pytest -m slow``);
the check that the MNIST script explains where to get missing files is quick and runs by default.

The subprocesses share a persistent JAX compilation cache (the one ``tests/conftest.py`` uses), so a
second run recompiles nothing; ``JAX_DISABLE_MOST_OPTIMIZATIONS`` shortens the first compilation (the
smoke runs check that the scripts work, not how fast the compiled code is).
"""

import json
import os
import subprocess
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPERS = os.path.join(ROOT, "benchmarks", "papers")
sys.path.insert(0, PAPERS)
TIMEOUT_S = 900  # a hang guard, not a timing assertion

SCRIPTS = {
    "austerity_fig2_mnist": "austerity_fig2_mnist.json",
    "barker_mixture": "barker_mixture.json",
    "adaptive_fig4": "adaptive_fig4.json",
    "pp_fig5_sublinear": "pp_fig5_sublinear.json",
    "austerity_fig8_sgld": "austerity_fig8_sgld.json",
    "iss_mcmc": "iss_mcmc_report.json",
    "austerity_fig5_ica": "austerity_fig5_ica.json",
    "austerity_fig6_rjmcmc": "austerity_fig6_rjmcmc.json",
    "pp_fig5_numpyro": "pp_fig5_numpyro.json",
}


def _mnist_available():
    import austerity_fig2_mnist as m

    folder = m.default_mnist_dir()
    return m.find_files(folder) is not None, folder


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "tallmh-test-jax-cache"))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    env.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
    have_mnist, _ = _mnist_available()
    procs = {}
    for name in SCRIPTS:
        if name == "austerity_fig2_mnist" and not have_mnist:
            continue
        out = tmp_path_factory.mktemp(name)
        cmd = [sys.executable, os.path.join(PAPERS, f"{name}.py"), "--smoke", "--out", str(out)]
        procs[name] = (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True), out)
    runs = {}
    for name, (proc, out) in procs.items():
        try:
            text, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            text, _ = proc.communicate()
            pytest.fail(f"{name}.py --smoke did not finish in {TIMEOUT_S}s:\n{text[-3000:]}")
        runs[name] = (proc.returncode, text, out)
    return runs


def _load(runs, name):
    rc, text, out = runs[name]
    assert rc == 0, f"{name}.py --smoke exited {rc}:\n{text[-3000:]}"
    path = out / SCRIPTS[name]
    assert path.exists(), f"{name}.py --smoke did not write {SCRIPTS[name]}:\n{text[-3000:]}"
    png = out / SCRIPTS[name].replace(".json", ".png")
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{name}.py --smoke wrote no PNG"
    res = json.loads(path.read_text())
    for key in ("platform", "cpu_count", "jax_version", "date", "command"):
        assert key in res["meta"]
    assert res["config"]["smoke"] is True
    return res


@pytest.mark.slow  # runs the scripts; CI runs it with -m slow
def test_austerity_fig2_mnist_smoke(smoke_runs):
    have, folder = _mnist_available()
    if not have:
        pytest.skip(f"MNIST training files not found in {folder} (set TALLMH_MNIST to their folder)")
    res = _load(smoke_runs, "austerity_fig2_mnist")
    rows = res["rows"]
    assert [r["epsilon"] for r in rows] == res["config"]["epsilons"]
    exact = [r for r in rows if r["epsilon"] == 0]
    assert exact and exact[0]["data_fraction"] == 1.0 and exact[0]["wrong_rate"] == 0.0
    for r in rows:
        assert 0 < r["data_fraction"] <= 1 and 0 <= r["wrong_rate"] <= 1


def test_austerity_fig2_mnist_missing_files(tmp_path):
    proc = subprocess.run([sys.executable, os.path.join(PAPERS, "austerity_fig2_mnist.py"), "--mnist", str(tmp_path),
                           "--smoke", "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "train-images-idx3-ubyte.gz" in proc.stderr and "--mnist" in proc.stderr


@pytest.mark.slow  # runs the scripts; CI runs it with -m slow
def test_barker_mixture_smoke(smoke_runs):
    res = _load(smoke_runs, "barker_mixture")
    rows = {r["test"]: r for r in res["rows"]}
    assert {"exact_metropolis", "barker", "austerity", "confidence"} <= set(rows)
    for k in ("barker", "austerity", "confidence"):
        assert 100 <= rows[k]["minibatch_mean"] <= res["config"]["N"]
        assert len(rows[k]["eq22_per_chain"]) == res["config"]["chains"]
    assert res["iid_reference"]["eq22"]["mean"] < 0
    # the model's range bound is an upper bound on the naive max |l_i|
    assert res["diagnostics"]["range_bound_over_naive"]["min"] >= 1.0


@pytest.mark.slow  # runs the scripts; CI runs it with -m slow
def test_adaptive_fig4_smoke(smoke_runs):
    res = _load(smoke_runs, "adaptive_fig4")
    runs = {(r["dataset"], r["run"]) for r in res["rows"]}
    assert {("normal", "exact"), ("normal", "austerity_t2"), ("normal", "confidence_t2")} <= runs
    for r in res["rows"]:
        assert 0 < r["data_fraction"] <= 1
        if r["run"] == "exact":
            assert r["data_fraction"] == 1.0


@pytest.mark.slow  # runs the scripts; CI runs it with -m slow
def test_pp_fig5_sublinear_smoke(smoke_runs):
    res = _load(smoke_runs, "pp_fig5_sublinear")
    assert [r["N"] for r in res["rows"]] == res["config"]["sizes"]
    for r in res["rows"]:
        assert 0 < r["items_mean"] <= r["N"] and r["s_per_decision"] > 0
    assert "items_mean" in res["slopes"]


@pytest.mark.slow  # runs the scripts; CI runs it with -m slow
def test_austerity_fig8_sgld_smoke(smoke_runs):
    res = _load(smoke_runs, "austerity_fig8_sgld")
    rows = {r["sampler"]: r for r in res["rows"]}
    assert {"sgld", "exact", "austerity_0.1"} <= set(rows)
    assert rows["sgld"]["data_fraction_test"] == 0.0
    assert rows["exact"]["data_fraction_test"] == 1.0
    assert 0 < rows["austerity_0.1"]["data_fraction_test"] <= 1.0
