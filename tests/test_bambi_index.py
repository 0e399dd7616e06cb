"""tm.from_bambi(formula, df): the Bambi model built with an integer index for the group terms is the one
bmb.Model(formula, df) builds (same variables, coordinates, priors and log density)."""

import numpy as np
import pytest

pd = pytest.importorskip("pandas")
bmb = pytest.importorskip("bambi")

from tallmh.errors import ConfigError  # noqa: E402
from tallmh.frontends.bambi_index import indexed_bambi_model  # noqa: E402


def _frame(n=400, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.choice([30, 10, 70, 50, 20], n)  # integers: formulae sorts them
    h = pd.Categorical(rng.choice(["b", "a", "c"], n), categories=["c", "b", "a", "z"], ordered=True)  # unused level
    x1 = rng.normal(size=n)
    eta = 0.3 + 0.5 * x1 + (g / 50.0 - 0.5)
    return pd.DataFrame({"y": (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int), "x1": x1, "x2": rng.normal(size=n),
                         "z": eta + rng.normal(size=n), "g": g, "h": h})


def _logp_fn(m):
    import pymc as pm  # noqa: F401

    return m.compile_logp(sum=True)


@pytest.mark.parametrize("formula,family", [("y ~ x1 + x2 + (1|g)", "bernoulli"),
                                            ("z ~ x1 + (x1|h) + (1|g)", "gaussian")])
def test_indexed_model_equals_bambis(formula, family):
    df = _frame()
    dense = bmb.Model(formula, df, family=family)
    dense.build()
    light = indexed_bambi_model(formula, df, family=family)
    md, ml = dense.backend.model, light.backend.model
    assert [v.name for v in md.value_vars] == [v.name for v in ml.value_vars]
    assert {k: list(v) for k, v in md.coords.items()} == {k: list(v) for k, v in ml.coords.items()}
    assert [d.name for d in md.deterministics] == [d.name for d in ml.deterministics]
    fd, fl = _logp_fn(md), _logp_fn(ml)
    rng = np.random.default_rng(1)
    ip = md.initial_point()
    for _ in range(5):
        pt = {k: v + rng.normal(size=np.shape(v)) for k, v in ip.items()}
        a, b = float(fd(pt)), float(fl(pt))
        assert np.isfinite(a) and a == pytest.approx(b, rel=1e-10, abs=1e-8)
    # a control: the same point with the group effects permuted gives another density (the index is read)
    key = next(k for k in ip if k.startswith("1|g_offset"))
    pt = {k: v + rng.normal(size=np.shape(v)) for k, v in ip.items()}
    pt2 = dict(pt, **{key: pt[key][::-1]})
    assert float(fd(pt2)) != pytest.approx(float(fl(pt)), rel=1e-6)


def test_from_bambi_formula_route_names():
    import tallmh as tm

    df = _frame()
    m1, d1 = tm.from_bambi(bmb.Model("y ~ x1 + (1|g)", df, family="bernoulli"), check=False, centre_groups=False)
    m2, d2 = tm.from_bambi("y ~ x1 + (1|g)", df, family="bernoulli", check=False, centre_groups=False)
    assert m1.value_names == m2.value_names and m1.output_names == m2.output_names
    rng = np.random.default_rng(2)
    th = {k: v + 0.3 * rng.standard_normal(np.shape(v)) for k, v in m1.init().items()}
    assert float(m1.log_prior(th)) == pytest.approx(float(m2.log_prior(th)), rel=1e-6)
    assert np.allclose(np.asarray(m1.log_lik(th, d1)), np.asarray(m2.log_lik(th, d2)), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("formula", ["y ~ x1 + (1|g:h)", "y ~ x1 + C(g) + (1|g)", "y ~ x1 + (1|C(g))"])
def test_unsupported_formulas_are_refused(formula):
    with pytest.raises(ConfigError):
        indexed_bambi_model(formula, _frame(), family="bernoulli")


def test_rows_dropped_by_bambi_are_refused():
    df = _frame()
    df.loc[3, "x1"] = np.nan
    with pytest.raises(ConfigError, match="missing values"):
        indexed_bambi_model("y ~ x1 + (1|g)", df, family="bernoulli", dropna=True)


def test_from_bambi_arguments_are_checked():
    import tallmh as tm

    df = _frame(60)
    with pytest.raises(ConfigError, match="data frame is missing"):
        tm.from_bambi("y ~ x1 + (1|g)", family="bernoulli")
    with pytest.raises(ConfigError, match="already has its data"):
        tm.from_bambi(bmb.Model("y ~ x1", df, family="bernoulli"), df)


def test_a_large_indicator_matrix_names_the_index_route(monkeypatch):
    import tallmh as tm
    from tallmh.frontends import pymc_model

    bm = bmb.Model("y ~ x1 + (1|g)", _frame(), family="bernoulli")
    monkeypatch.setattr(pymc_model, "DENSE_GROUPS_WARN", 1000)  # 400 rows x 5 levels x 8 bytes = 16,000
    with pytest.warns(UserWarning, match="with an index instead"):
        tm.from_bambi(bm, check=False, centre_groups=False)
