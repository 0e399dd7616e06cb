"""Formulas over streamed tables (the design built block by block into the on-disk cache) and the negative
binomial family (NB2, log link, dispersion on the log scale)."""

import argparse

import numpy as np
import pandas as pd
import pytest
from scipy import optimize, special, stats

pytest.importorskip("formulaic", reason="formulaic is not installed (pip install 'tallmh[formula]')")

import jax.numpy as jnp  # noqa: E402

import tallmh.frontends.design_cache as dc  # noqa: E402
import tallmh.frontends.tables as tables  # noqa: E402
from tallmh.frontends.design import load_design  # noqa: E402
from tallmh.errors import DataError  # noqa: E402
from tallmh.frontends.formula import NegativeBinomialRegression  # noqa: E402

from .stats_helpers import posterior_check  # noqa: E402


def _args(path, formula, family="poisson", **kw):
    base = dict(data=str(path), target=None, features=None, model=family, test="exact", batch_size="auto",
                initial_batch=100, barker_batch=1000, no_intercept=False, no_standardize=False, formula=formula,
                family=family, stream=True)
    base.update(kw)
    return argparse.Namespace(**base)


def _table(tmp_path, n=3000, seed=0, alpha=0.5):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(2.0, 3.0, n), "g": rng.choice(["a", "b", "c"], n),
                       "h": rng.integers(0, 3, n)})
    df.loc[: n // 2, "g"] = "a"  # the first blocks see one level of g only
    mu = np.exp(0.5 + 0.1 * df["x"] + df["g"].map({"a": 0.0, "b": 0.4, "c": -0.3}))
    r = 1.0 / alpha
    df["k"] = rng.negative_binomial(r, r / (r + mu))
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    return df, path


@pytest.fixture
def blocks(monkeypatch, tmp_path):
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dc, "BLOCK_BYTES", 8 * 4 * 256)  # 256 rows per block (4 columns)
    seen = []
    real = tables.table_frames

    def count(*a, **k):
        for f in real(*a, **k):
            seen.append((tuple(f.columns), len(f)))
            yield f

    monkeypatch.setattr(tables, "table_frames", count)
    return seen


def test_streamed_formula_design_equals_the_in_memory_one(tmp_path, blocks):
    df, path = _table(tmp_path)
    args = _args(path, "k ~ x + C(g) + C(h)")
    data, on_disk, names, scaling, digest = dc.streamed_design(args, lambda m: None)
    X, y, names_mem, _ = load_design(args)
    assert names == names_mem == ["intercept", "x", "C(g)[T.b]", "C(g)[T.c]", "C(h)[T.1]", "C(h)[T.2]"]
    np.testing.assert_array_equal(np.asarray(on_disk["X"]), X)  # float64 throughout on both paths
    np.testing.assert_array_equal(np.asarray(on_disk["y"]), y)
    # the levels' pass reads the categorical columns only; the design's pass every needed column; in blocks
    levels = [rows for cols, rows in blocks if set(cols) == {"g", "h"}]
    design = [rows for cols, rows in blocks if set(cols) == {"g", "h", "k", "x"}]
    assert sum(levels) == sum(design) == len(df) and max(levels + design) == 256
    blocks.clear()
    assert dc.streamed_design(args, lambda m: None)[2] == names and blocks == []  # the cache, reused


def test_streamed_formula_refusals(tmp_path, blocks):
    df, path = _table(tmp_path)
    df.loc[2900, "x"] = np.nan  # in the last block
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match="column 'x' has missing values"):
        dc.streamed_design(_args(path, "k ~ x"), lambda m: None)
    df, path = _table(tmp_path)
    df.loc[2000, "k"] = -1
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match="negativebinomial needs a response 'k' of non-negative whole counts"):
        dc.streamed_design(_args(path, "k ~ x", "negativebinomial"), lambda m: None)
    with pytest.raises(DataError, match="bernoulli needs a response 'k' of 0 and 1"):
        dc.streamed_design(_args(path, "k ~ x", "bernoulli"), lambda m: None)


def _nb_loglik(beta, log_alpha, X, y):
    r = np.exp(-log_alpha)
    mu = np.exp(X @ beta)
    return special.gammaln(y + r) - special.gammaln(r) - special.gammaln(y + 1) + r * np.log(r / (r + mu)) \
        + y * np.log(mu / (r + mu))


def test_negative_binomial_log_lik_is_the_nb2_log_pmf():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3))
    y = rng.negative_binomial(2, 0.3, 50).astype(float)
    th = np.array([0.3, -0.2, 0.1, np.log(0.7)])
    mu, r = np.exp(X @ th[:3]), 1 / 0.7
    want = stats.nbinom.logpmf(y, r, r / (r + mu))  # NB2: mean mu, variance mu + 0.7 mu^2
    got = np.asarray(NegativeBinomialRegression().log_lik(jnp.asarray(th), {"X": jnp.asarray(X), "y": jnp.asarray(y)}))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # negative control: the Poisson log pmf with the same mean is not it
    assert np.max(np.abs(stats.poisson.logpmf(y, mu) - got)) > 0.1


@pytest.mark.slow  # one CLI run (compilation): about 40 s on a loaded 2-core machine
def test_cli_negative_binomial_formula_streamed_matches_the_mle(tmp_path, capsys, monkeypatch):
    import tallmh as tm
    from tallmh.cli import main

    df, path = _table(tmp_path)
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    rc = main(["run", path, "--formula", "k ~ x + C(g)", "--family", "negativebinomial", "--stream",
               "--test", "exact", "--proposal", "adaptive", "--samples", 2500, "--warmup", 1000, "--chains", 2,
               "--out", out, "--quiet"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    post = tm.diagnostics.read_netcdf(str(out / "posterior.nc")).posterior
    draws = np.concatenate([post["beta"].values, np.log(post["alpha"].values)[..., None]], axis=-1)
    # the maximum-likelihood fit (scipy) and its Laplace sd: with N = 3000 and a flat-ish prior the
    # posterior is close to N(MLE, inverse observed information)
    X = np.column_stack([np.ones(len(df)), df["x"], df["g"] == "b", df["g"] == "c"]).astype(float)
    y = df["k"].to_numpy(float)

    def nll(p):
        return -np.sum(_nb_loglik(p[:-1], p[-1], X, y))

    fit = optimize.minimize(nll, np.zeros(5), method="BFGS", options={"gtol": 1e-8})
    h = 1e-4
    H = np.empty((5, 5))
    for i in range(5):
        for j in range(5):
            e_i, e_j = np.eye(5)[i] * h, np.eye(5)[j] * h
            H[i, j] = (nll(fit.x + e_i + e_j) - nll(fit.x + e_i - e_j) - nll(fit.x - e_i + e_j)
                       + nll(fit.x - e_i - e_j)) / (4 * h * h)
    sd = np.sqrt(np.diag(np.linalg.inv(H)))
    ok, rep = posterior_check(draws, fit.x, sd)
    assert ok, rep
    ok_bad, _ = posterior_check(draws, fit.x + 4 * sd, sd)
    assert not ok_bad  # negative control: a posterior 4 sd away fails the same check
