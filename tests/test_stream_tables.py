"""CSV and Parquet tables streamed into the on-disk design cache (tallmh run --stream): read once in row
blocks, never whole; the same design as the in-memory reader; a second run reuses the cache; and the same
posterior from the command line."""

import argparse
import json

import numpy as np
import pandas as pd
import pytest

import tallmh.frontends.design_cache as dc
from tallmh.frontends.design import load_design
from tallmh.errors import DataError

from .stats_helpers import posterior_check


def _args(path, **kw):
    base = dict(data=str(path), target="late", features=None, model="logistic", test="auto", batch_size="auto",
                initial_batch=100, barker_batch=1000, no_intercept=False, no_standardize=False, formula=None,
                stream=True)
    base.update(kw)
    return argparse.Namespace(**base)


def _table(tmp_path, n=3000, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"dist": rng.normal(1500.0, 400.0, n), "hour": rng.integers(5, 23, n),
                       "year": np.full(n, 2013) + rng.integers(0, 2, n)})
    eta = -0.5 + 0.002 * (df["dist"] - 1500) + 0.1 * (df["hour"] - 14)
    df["late"] = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int)
    df.to_csv(tmp_path / "t.csv", index=False)
    df.to_parquet(tmp_path / "t.parquet")
    return df


@pytest.fixture
def spies(monkeypatch, tmp_path):
    """Rows of every block the streamed reader yields, and every pandas.read_csv call's row limit."""
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dc, "BLOCK_BYTES", 8 * 4 * 256)  # 256 rows of 4 columns per block
    blocks, csv_calls = [], []
    real_blocks, real_csv = dc.table_blocks, pd.read_csv

    def count_blocks(*a, **k):
        for b in real_blocks(*a, **k):
            blocks.append(len(b))
            yield b

    def count_csv(*a, **k):
        csv_calls.append(k.get("chunksize", k.get("nrows", "whole table")))
        return real_csv(*a, **k)

    monkeypatch.setattr(dc, "table_blocks", count_blocks)
    monkeypatch.setattr(pd, "read_csv", count_csv)
    return blocks, csv_calls


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_table_streams_in_blocks_into_the_cache(tmp_path, spies, suffix):
    df = _table(tmp_path)
    blocks, csv_calls = spies
    path = tmp_path / f"t.{suffix}"
    said = []
    data, on_disk, names, scaling, digest = dc.streamed_design(_args(path), said.append)
    # read once, in blocks of at most 256 rows, never whole
    assert sum(blocks) == len(df) and max(blocks) == 256 and len(blocks) == -(-len(df) // 256)
    assert "whole table" not in csv_calls
    assert any("pass 2 of 2" in s for s in said) and any(f"{len(df):,} rows read" in s for s in said)
    # the design the in-memory reader builds (which rounds the raw table to float32 first: hence 1e-6)
    X, y, names_mem, scaling_mem = load_design(_args(path, stream=False))
    assert names == names_mem == ["intercept", "dist", "hour", "year"]
    np.testing.assert_allclose(np.asarray(on_disk["X"]), X, rtol=0, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(on_disk["y"]), y)
    np.testing.assert_allclose(scaling["center"], df[["dist", "hour", "year"]].mean().to_numpy(), rtol=1e-12)
    np.testing.assert_allclose(scaling["scale"], df[["dist", "hour", "year"]].std(ddof=0).to_numpy(), rtol=1e-12)
    assert scaling["out_of_core"] and data["X"].shape == X.shape
    # a second run reuses the cache: no block read
    blocks.clear()
    again = dc.streamed_design(_args(path), said.append)
    assert blocks == [] and again[4] == digest and "cached" in said[-1]


def test_negative_control_the_in_memory_reader_reads_the_whole_table(tmp_path, spies):
    _table(tmp_path)
    blocks, csv_calls = spies
    load_design(_args(tmp_path / "t.csv", stream=False))
    assert blocks == [] and csv_calls == ["whole table"]


def test_streamed_refusals_name_the_row_and_column(tmp_path, spies):
    df = _table(tmp_path)
    df.loc[700, "hour"] = np.nan
    df.to_csv(tmp_path / "nan.csv", index=False)
    with pytest.raises(DataError, match="column 'hour' has NaN or missing value.*row 700"):
        dc.streamed_design(_args(tmp_path / "nan.csv"), lambda m: None)
    df = _table(tmp_path)
    df["late"] = df["late"] * 2
    df.to_csv(tmp_path / "two.csv", index=False)
    with pytest.raises(DataError, match="not binary"):
        dc.streamed_design(_args(tmp_path / "two.csv"), lambda m: None)
    df = _table(tmp_path)
    df["hour"] = df["hour"].astype(str) + "h"
    df.to_csv(tmp_path / "text.csv", index=False)
    with pytest.raises(DataError, match="feature column 'hour' is not numeric"):
        dc.streamed_design(_args(tmp_path / "text.csv"), lambda m: None)
    assert not list((tmp_path / "cache" / "tables").glob("*tmp*"))  # nothing half-made left behind


def test_threshold_streams_only_tables_large_for_the_memory(tmp_path, monkeypatch):
    _table(tmp_path)
    args = _args(tmp_path / "t.csv", stream=None)
    monkeypatch.setattr(dc, "_available_memory", lambda: 10**12)
    assert not dc.should_stream(args)
    monkeypatch.setattr(dc, "_available_memory", lambda: 10**4)  # a table over 1/8 of the memory
    assert dc.should_stream(args)
    assert not dc.should_stream(_args(tmp_path / "t.csv", stream=False))


@pytest.mark.slow  # two CLI runs (compilation): about a minute on a loaded 2-core machine
def test_cli_streamed_csv_gives_the_in_memory_posterior(tmp_path, capsys, monkeypatch):
    from tallmh.cli import main
    import tallmh as tm

    _table(tmp_path)
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dc, "BLOCK_BYTES", 8 * 4 * 500)
    common = ["run", tmp_path / "t.csv", "--target", "late", "--test", "exact", "--proposal", "adaptive",
              "--samples", 2000, "--warmup", 500, "--chains", 2, "--quiet"]
    draws = {}
    for flag in ("--stream", "--no-stream"):
        out = tmp_path / flag.strip("-")
        rc = main(common + [flag, "--out", out])
        assert rc == 0, capsys.readouterr().err[-2000:]
        draws[flag] = tm.diagnostics.read_netcdf(str(out / "posterior.nc")).posterior["beta"].values
        saved = json.loads((out / "run.json").read_text())["settings"]
        assert saved["stream"] is (flag == "--stream")
    ref = draws["--no-stream"].reshape(-1, draws["--no-stream"].shape[-1])
    ok, rep = posterior_check(draws["--stream"], ref.mean(axis=0), ref.std(axis=0))
    assert ok, rep
    ok_bad, _ = posterior_check(draws["--stream"], ref.mean(axis=0) + 3 * ref.std(axis=0), ref.std(axis=0))
    assert not ok_bad  # negative control: a posterior 3 sd away fails the same check


def test_stream_is_refused_for_a_table_it_cannot_stream(tmp_path, capsys):
    from tallmh.cli import main

    np.savez(tmp_path / "x.npz", y=np.zeros(10), a=np.arange(10.0))
    rc = main(["run", tmp_path / "x.npz", "--target", "y", "--stream", "--out", tmp_path / "o"])
    assert rc == 2 and "--stream reads CSV and Parquet tables" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
