"""Group-level effects keep their levels' names; the printed summary shows the fixed effects and scales row by
row and each group-level term (or a very large site) in one line (``summary().table`` keeps every row), while an
ordinary parameter vector, such as a regression's eleven coefficients, is printed entry by entry."""

import numpy as np
import pytest

import tallmh as tm
from tallmh.results import SUMMARY_LARGE, SUMMARY_LEVELS, _tree_names, group_lines



def test_tree_names_use_labels_where_they_fit():
    tpl = {"a": np.zeros(()), "b": np.zeros(3), "c": np.zeros((2, 2))}
    names = _tree_names(tpl, {"b": [["x", "y", "z"]], "c": [["p", "q"], None]})
    assert names == ["a", "b[x]", "b[y]", "b[z]", "c[p, 0]", "c[p, 1]", "c[q, 0]", "c[q, 1]"]
    # labels of the wrong length are not used (positions instead)
    assert _tree_names(tpl, {"b": [["x", "y"]]})[1:4] == ["b[0]", "b[1]", "b[2]"]


def _site_rows(site, k, label=lambda j: f"g{j:03d}"):
    return [{"param": f"{site}[{label(j)}]", "mean": (-1.0) ** j * j / 10, "sd": 0.1, "ess_bulk": 500.0 + j,
             "ess_tail": 450.0 + j, "r_hat": 1.0 + j / 1000} for j in range(k)]


def test_group_lines_summarise_group_level_terms():
    rows = [{"param": "sigma", "mean": 0.5, "sd": 0.1, "ess_bulk": 900.0, "ess_tail": 800.0, "r_hat": 1.001}]
    k = SUMMARY_LEVELS + 5
    rows += _site_rows("a", k)
    small, large = group_lines(rows, labelled={"a"})
    assert [r["param"] for r in small] == ["sigma"]
    (g,) = large
    assert g["site"] == "a" and g["levels"] == k and g["at"] == f"a[g{k - 1:03d}]"
    assert g["max_abs_mean"] == pytest.approx((k - 1) / 10) and g["r_hat_max"] == pytest.approx(1 + (k - 1) / 1000)
    assert g["ess_bulk_min"] == 500.0 and g["ess_tail_min"] == 450.0
    # negative control: the same rows, not a group-level term (no front end named its entries), are printed
    # one by one
    small, large = group_lines(rows)
    assert large == [] and [r["param"] for r in small] == [r["param"] for r in rows]
    # a group-level term of few levels is printed one by one too
    small, large = group_lines(_site_rows("b", SUMMARY_LEVELS), labelled={"b"})
    assert large == [] and len(small) == SUMMARY_LEVELS


def test_group_lines_summarise_very_large_sites_only():
    vec = _site_rows("theta", SUMMARY_LEVELS + 1, label=str)  # a regression's 11 coefficients
    big = _site_rows("w", SUMMARY_LARGE + 1, label=str)
    small, large = group_lines(vec + big)
    assert [r["param"] for r in small] == [f"theta[{j}]" for j in range(SUMMARY_LEVELS + 1)]
    assert [g["site"] for g in large] == ["w"] and large[0]["levels"] == SUMMARY_LARGE + 1
    # the largest size printed entry by entry
    assert group_lines(_site_rows("w", SUMMARY_LARGE, label=str))[1] == []


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_summary_prints_every_coefficient_of_a_plain_regression():
    """The README's ten lines: a logistic regression with an intercept and 10 features (11 coefficients, more
    than SUMMARY_LEVELS) shows each coefficient in the printed summary, and no one-line summary."""
    rng = np.random.default_rng(1)
    X = np.hstack([np.ones((300, 1)), rng.normal(size=(300, 10))]).astype(np.float32)
    y = (rng.uniform(size=300) < 0.5).astype(np.float32)
    r = tm.sample(tm.models.LogisticRegression(), {"X": X, "y": y}, test=tm.acceptance.Exact(), num_samples=40,
                  num_warmup=0, num_chains=2, seed=0, progress=False)
    sm = r.summary()
    names = list(sm.table.index)
    assert len(names) == 11 > SUMMARY_LEVELS
    text = str(sm)
    lines = text.splitlines()
    assert all(any(line.startswith(nm + " ") for line in lines) for nm in names)  # every row printed
    assert sm.groups == [] and "entries (summary().table has each)" not in text


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_pymc_levels_named_in_draws_summary_arviz_and_checkpoint(tmp_path):
    pm = pytest.importorskip("pymc")
    rng = np.random.default_rng(0)
    levels = [f"g{j:03d}" for j in range(SUMMARY_LEVELS + 2)]
    g = rng.integers(0, len(levels), 600)
    y = 0.3 + rng.normal(0, 0.5, len(levels))[g] + rng.normal(size=g.size)
    with pm.Model(coords={"grp": levels}) as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("Intercept", 0, 5)
        s = pm.HalfNormal("1|g_sigma", 1)
        z = pm.Normal("1|g_offset", 0, 1, dims="grp")
        a = pm.Deterministic("1|g", z * s, dims="grp")
        pm.Normal("y", mu + a[gi], 1.0, observed=y)
    model, data = tm.from_pymc(m)
    assert model.coords["1|g"] == [levels]
    r = tm.sample(model, data, num_samples=100, num_warmup=100, num_chains=2, seed=0, progress=False)
    names = r.output_names
    assert [f"1|g[{lv}]" for lv in levels] == [n for n in names if n.startswith("1|g[")]
    sm = r.summary()
    assert len(sm.table) == len(names) and "1|g[g003]" in sm.table.index  # every row kept
    # every column diagnosed (the effects and the offsets both), and the verdict's numbers over all of them
    x = r.flat_output
    np.testing.assert_allclose(sm.table["ess_bulk"].to_numpy(), tm.diagnostics.ess_all(x), rtol=1e-12)
    np.testing.assert_allclose(sm.table["r_hat"].to_numpy(), tm.diagnostics.rhat_all(x), rtol=1e-12)
    assert sm.overall["ess_min"] == np.nanmin(sm.table["ess_bulk"]) and sm.overall["rhat_max"] == np.nanmax(sm.table["r_hat"])
    text = str(sm)
    assert "1|g[g003]" not in text.split("\n1|g:")[0]  # the levels are not printed one by one ...
    assert f"1|g: {len(levels)} entries" in text  # ... but summarised
    tab = sm.table
    row = [x for x in sm.groups if x["site"] == "1|g"][0]
    lv = tab.loc[[f"1|g[{v}]" for v in levels]]
    assert row["r_hat_max"] == pytest.approx(lv["r_hat"].max()) and row["ess_bulk_min"] == pytest.approx(lv["ess_bulk"].min())
    assert row["max_abs_mean"] == pytest.approx(lv["mean"].abs().max()) and row["at"] == lv["mean"].abs().idxmax()
    assert text.index("Intercept") < text.index("1|g:")  # fixed effects and scales first
    idata = r.to_arviz()
    assert list(idata.posterior["1|g"].coords["1|g_dim_0"].values) == levels
    r.save(str(tmp_path / "run.npz"))
    assert tm.load_result(str(tmp_path / "run.npz")).output_names == names
