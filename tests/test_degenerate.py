"""Degenerate designs named before sampling: exactly collinear columns and columns that separate a 0/1
target, through ``tm.sample`` for the built-in regressions (data in memory) and through ``tallmh run`` for
tables streamed or read from ``.npy`` (in the first pass of the set-up); well-conditioned data gets no note
(the negative control of each)."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

import tallmh as tm
from tallmh.cli import main
from tallmh.frontends import design_cache as dc
from tallmh.frontends.degenerate import DesignCheck, design_notes
from tallmh.run.data_notes import notes_of


def _design(n=3000, seed=0, collinear=False, separating=False):
    """Columns x (normal), g_a, g_b, g_c (one-hot of 3 levels, or only g_b, g_c when not collinear) and a
    0/1 target; with ``separating`` a column s whose rows with s = 1 all have y = 1."""
    rng = np.random.default_rng(seed)
    level = rng.integers(0, 3, n)
    hot = np.eye(3)[level]
    x = rng.normal(size=n)
    eta = 0.6 * x + np.array([0.0, 0.8, -0.4])[level]
    y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(float)
    cols = {"x": x}
    for j, nm in enumerate("abc"):
        if collinear or j > 0:
            cols[f"g_{nm}"] = hot[:, j]
    if separating:
        s = (rng.random(n) < 0.05).astype(float)
        y = np.where(s == 1, 1.0, y)
        cols["s"] = s
    return pd.DataFrame(cols), y


def test_blocks_give_the_notes_of_the_whole_table():
    df, y = _design(collinear=True, separating=True)
    Z, names = df.to_numpy(), list(df.columns)
    whole = design_notes(Z, y, names, "y", binary=True, intercept=True, block=len(Z))
    blocks = DesignCheck(names, "y", binary=True, intercept=True)
    for a in range(0, len(Z), 7):  # small blocks: the merged moments and ranges equal one pass's
        blocks.add(Z[a:a + 7], y[a:a + 7])
    assert blocks.notes() == whole and len(whole) == 2, whole
    assert whole[0].startswith("columns intercept, g_a, g_b, g_c are exactly collinear")
    assert whole[1].startswith("column 's' separates the target: every row with s = 1 has y = 1")
    # the negative control: the same design without the redundant level and the separating column
    df, y = _design()
    assert design_notes(df.to_numpy(), y, list(df.columns), "y", binary=True, intercept=True) == []


def test_a_column_with_a_large_mean_is_not_taken_as_collinear_with_the_intercept():
    """A year-like column (mean 2013, sd 0.5) beside the intercept is well conditioned once centred."""
    rng = np.random.default_rng(3)
    Z = np.column_stack([2013 + rng.integers(0, 2, 5000), rng.normal(size=5000)])
    assert design_notes(Z, None, ["year", "x"], "y", binary=False, intercept=True) == []


def test_notes_of_a_built_in_regressions_X():
    """tm.sample's check on data = {"X", "y"}: a constant column is the intercept and is named as such."""
    df, y = _design(collinear=True, separating=True)
    X = np.column_stack([np.ones(len(df)), df.to_numpy()])
    notes = notes_of(X, y, binary=True)
    assert len(notes) == 2
    assert notes[0].startswith("columns X[:, 0] (the intercept), X[:, 2], X[:, 3], X[:, 4] are exactly collinear")
    assert "column 'X[:, 5]' separates the target" in notes[1]
    assert notes_of(X[:, :5], y, binary=False)[0].startswith("columns X[:, 0] (the intercept), X[:, 2]")
    two = np.column_stack([np.ones(len(df)), np.ones(len(df)), df["x"]])
    assert "X[:, 0], X[:, 1]" in notes_of(two, y, binary=True)[0]
    df, y = _design()
    assert notes_of(np.column_stack([np.ones(len(df)), df.to_numpy()]), y, binary=True) == []


def test_tm_sample_names_collinear_columns_and_not_clean_ones():
    df, y = _design(n=2000, collinear=True)
    X = np.column_stack([np.ones(len(df)), df.to_numpy()]).astype(np.float32)
    kw = dict(test=tm.acceptance.Exact(), num_samples=20, num_warmup=20, num_chains=1, progress=False, seed=0)
    with pytest.warns(UserWarning, match="are exactly collinear"):
        r = tm.sample(tm.models.LogisticRegression(), {"X": X, "y": y.astype(np.float32)}, **kw)
    notes = [m for m in r.notes if m.startswith("data note: ")]
    assert len(notes) == 1 and "X[:, 0] (the intercept), X[:, 2], X[:, 3], X[:, 4]" in notes[0]
    assert notes[0] in str(r.summary()).splitlines()  # under the verdict
    # the negative control: the same data without one level
    clean = np.delete(X, 2, axis=1)
    r = tm.sample(tm.models.LogisticRegression(), {"X": clean, "y": y.astype(np.float32)}, **kw)
    assert not [m for m in r.notes if m.startswith("data note: ")]
    assert "data note" not in str(r.summary())


def _args(path, **kw):
    base = dict(data=str(path), target="y", features=None, model="logistic", test="auto", batch_size="auto",
                initial_batch=100, barker_batch=1000, no_intercept=False, no_standardize=False, formula=None,
                family=None, stream=True)
    base.update(kw)
    return argparse.Namespace(**base)


@pytest.mark.parametrize("kind", ["npy", "csv"])
def test_streamed_and_npy_tables_are_checked_in_the_first_pass(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(dc, "BLOCK_BYTES", 8 * 7 * 256)  # many blocks
    for degenerate in (True, False):
        df, y = _design(collinear=degenerate, separating=degenerate, seed=int(degenerate))
        df["y"] = y
        if kind == "npy":
            path = tmp_path / f"t{int(degenerate)}.npy"
            np.save(path, df.to_numpy())
            target = str(df.shape[1] - 1)
            _, _, _, scaling, _ = dc.npy_design(_args(path, target=target), lambda m: None)
        else:
            path = tmp_path / f"t{int(degenerate)}.csv"
            df.to_csv(path, index=False)
            _, _, _, scaling, _ = dc.streamed_design(_args(path), lambda m: None)
        notes = scaling["data_notes"]
        if degenerate:
            assert len(notes) == 2, notes
            assert "exactly collinear" in notes[0] and "separates the target" in notes[1]
        else:
            assert notes == []  # the negative control


def test_cli_names_collinear_columns_of_a_npy_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    df, y = _design(n=2000, collinear=True)
    df["y"] = y
    path = tmp_path / "t.npy"
    np.save(path, df.to_numpy())
    out = tmp_path / "o"
    assert main(["run", str(path), "--target", "-1", "--samples", "20", "--warmup", "20", "--chains", "1",
                 "--test", "exact", "--out", str(out), "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "tallmh: note: columns intercept, 1, 2, 3 are exactly collinear" in captured.err, captured.err
    assert "data note: columns intercept, 1, 2, 3" in captured.out
    assert "X[:, " not in captured.out + captured.err  # said once, by the table's names (not again by tm.sample)
    assert len(json.loads((out / "results.json").read_text())["data_notes"]) == 1


def test_tm_sample_names_collinear_columns_of_an_array_read_in_place(monkeypatch):
    """A large design read in place (no copy: an InPlaceArray or an aliasing jax.Array) is checked too."""
    from tallmh.storage import datasource as ds

    monkeypatch.setattr(ds, "_COPY_BELOW_BYTES", 0)  # (in place from any size: as above 32 MiB)
    df, y = _design(n=2000, collinear=True)
    X0 = np.column_stack([np.ones(len(df)), df.to_numpy()]).astype(np.float32)
    X = np.empty(X0.size + 1, np.float32)[1:].reshape(X0.shape)  # (4 bytes past an aligned start: InPlaceArray)
    X[:] = X0
    seen = []
    orig = ds.in_place_leaf
    monkeypatch.setattr(ds, "in_place_leaf", lambda a, **kw: seen.append(r := orig(a, **kw)) or r)
    kw = dict(test=tm.acceptance.Exact(), num_samples=20, num_warmup=20, num_chains=1, progress=False, seed=0)
    with pytest.warns(UserWarning, match="are exactly collinear"):
        r = tm.sample(tm.models.LogisticRegression(), {"X": X, "y": y.astype(np.float32)}, **kw)
    assert any(isinstance(s, ds.InPlaceArray) for s in seen)  # (the design was read in place)
    assert len([m for m in r.notes if m.startswith("data note: ")]) == 1
