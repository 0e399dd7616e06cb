"""Formulas in the CLI (tallmh run --formula ... --family ...): the design formulaic builds, the Poisson model,
refusals, and a Gaussian run against its closed-form posterior."""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

pytest.importorskip("formulaic", reason="formulaic is not installed (pip install 'tallmh[formula]')")

import jax.numpy as jnp  # noqa: E402

from tallmh.cli import main  # noqa: E402
from tallmh.errors import ConfigError, DataError  # noqa: E402
from tallmh.frontends.formula import PoissonRegression, load_design  # noqa: E402

from .stats_helpers import posterior_check  # noqa: E402


def _table(tmp_path, n=2000, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(2.0, 3.0, n), "g": rng.choice(["a", "b", "c"], n)})
    df["y"] = 1.0 + 0.5 * df["x"] + df["g"].map({"a": 0.0, "b": 1.0, "c": -2.0}) + rng.normal(size=n)
    df["k"] = rng.poisson(np.exp(0.2 + 0.3 * df["x"] / 3))
    path = tmp_path / "t.csv"
    df.to_csv(path, index=False)
    return df, str(path)


def test_design_codes_categories_and_names_columns(tmp_path):
    df, path = _table(tmp_path, 50)
    d = load_design(path, "y ~ x + C(g)", "gaussian")
    assert d.names == ["x", "C(g)[T.b]", "C(g)[T.c]"] and d.intercept and d.target == "y"
    np.testing.assert_array_equal(d.X[:, 1], (df["g"] == "b").to_numpy(float))
    np.testing.assert_allclose(d.y, df["y"].to_numpy())
    assert not load_design(path, "y ~ 0 + x", "gaussian").intercept


def test_design_refusals(tmp_path):
    df, path = _table(tmp_path, 50)
    with pytest.raises(ConfigError, match="no response"):
        load_design(path, "x + C(g)", "gaussian")
    with pytest.raises(DataError, match="no column 'z'"):
        load_design(path, "y ~ z", "gaussian")
    with pytest.raises(DataError, match="0 and 1"):
        load_design(path, "y ~ x", "bernoulli")
    with pytest.raises(DataError, match="counts"):
        load_design(path, "y ~ x", "poisson")
    df.loc[3, "x"] = np.nan
    df.to_csv(path, index=False)
    with pytest.raises(DataError, match="missing values"):
        load_design(path, "y ~ x", "gaussian")


def test_poisson_log_lik_is_the_poisson_log_pmf():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, 3))
    y = rng.poisson(2.0, 20).astype(float)
    th = jnp.asarray([0.1, -0.2, 0.3])
    want = stats.poisson.logpmf(y, np.exp(X @ np.asarray(th)))
    got = PoissonRegression().log_lik(th, {"X": jnp.asarray(X), "y": jnp.asarray(y)})
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.slow  # one CLI run (compilation): about 30 s on a loaded 2-core machine
def test_cli_gaussian_formula_matches_the_closed_form(tmp_path, capsys):
    import tallmh as tm

    df, path = _table(tmp_path)
    out = tmp_path / "out"
    rc = main(["run", path, "--formula", "y ~ x + C(g)", "--family", "gaussian", "--noise-sd", "1",
               "--samples", 1500, "--warmup", 500, "--chains", 2, "--out", out, "--quiet"])
    assert rc == 0, capsys.readouterr().err[-2000:]
    idata = tm.diagnostics.read_netcdf(str(out / "posterior.nc"))
    names = ["intercept", "x", "C(g)[T.b]", "C(g)[T.c]"]
    assert list(idata.posterior["beta"]["coefficient"].values) == names
    # closed form on the sampler's (standardised) scale: b ~ N(0, 10^2 I), y | b ~ N(Z b, 1)
    X = np.column_stack([df["x"], df["g"] == "b", df["g"] == "c"]).astype(float)
    Z = np.column_stack([np.ones(len(X)), (X - X.mean(axis=0)) / X.std(axis=0)])
    prec = Z.T @ Z + np.eye(4) / 100.0
    cov = np.linalg.inv(prec)
    mean = cov @ Z.T @ df["y"].to_numpy()
    theta = idata.posterior["theta"].values.astype(float)
    ok, rep = posterior_check(theta, mean, np.sqrt(np.diag(cov)))
    assert ok, rep
    ok_bad, _ = posterior_check(theta, mean + 5 * np.sqrt(np.diag(cov)), np.sqrt(np.diag(cov)))
    assert not ok_bad  # negative control: a posterior 5 sd away fails the same check


@pytest.mark.parametrize("which", ["poisson", "negativebinomial"])
def test_count_models_closed_form_derivatives_equal_autodiff(which):
    """The closed-form value, gradient and Hessian sums the set-up passes use for the Poisson and NB2 regressions
    equal autodiff of the masked log-likelihood sum (float64, over-dispersed counts with zeros and a large one);
    a wrong Hessian (the NB2 cross term with its sign flipped) is told apart by the same comparison."""
    import jax
    from jax import enable_x64

    from tallmh.frontends.formula import NegativeBinomialRegression

    model = PoissonRegression() if which == "poisson" else NegativeBinomialRegression()
    rng = np.random.default_rng(4)
    X = np.c_[np.ones(300), rng.standard_normal((300, 3)) * np.array([0.3, 1.0, 2.0])]
    y = rng.negative_binomial(1.5, 0.4, size=300).astype(float)
    y[0] = 250.0
    mask = rng.random(300) < 0.8
    theta = np.r_[0.5, rng.standard_normal(3) * 0.2, [] if which == "poisson" else [-0.7]]
    with enable_x64(True):
        batch, m, th = {"X": jnp.asarray(X), "y": jnp.asarray(y)}, jnp.asarray(mask), jnp.asarray(theta)

        def total(t):
            return jnp.sum(jnp.where(m, model.log_lik(t, batch), 0.0))

        v, g, h = model.lik_value_grad_hess(th, batch, m)
        np.testing.assert_allclose(float(v), float(total(th)), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(total)(th)), rtol=1e-9, atol=1e-9)
        auto_h = np.asarray(jax.hessian(total)(th))
        np.testing.assert_allclose(np.asarray(h), auto_h, rtol=1e-9, atol=1e-8)
        if which == "negativebinomial":
            wrong = np.asarray(h).copy()
            wrong[:-1, -1] *= -1
            wrong[-1, :-1] *= -1
            assert not np.allclose(wrong, auto_h, rtol=1e-6, atol=1e-6)
