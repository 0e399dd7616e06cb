"""A Bambi model's intercept as Bambi's own fit reports it (on the data's scale), for both from_bambi routes."""

import numpy as np
import pytest

import tallmh as tm

from .stats_helpers import means_agree

bmb = pytest.importorskip("bambi")
pd = pytest.importorskip("pandas")


def _frame(n=300, seed=0):
    """Predictors far from 0 (x around 5), a categorical term and a grouping column."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"x": rng.normal(5.0, 1.0, n), "z": rng.normal(-3.0, 0.5, n),
                       "g": rng.choice(list("abc"), n), "h": rng.choice(list("pqrs"), n)})
    eta = -1.0 + 0.4 * (df["x"] - 5.0) + df["g"].map({"a": 0.0, "b": 0.6, "c": -0.4})
    df["y"] = eta + 0.5 * rng.normal(size=n)
    df["yb"] = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int)
    return df


def _points(model, k=3, seed=1):
    rng = np.random.default_rng(seed)
    base = model.init()
    return [{key: v + 0.3 * rng.standard_normal(np.shape(v)).astype(np.asarray(v).dtype) for key, v in base.items()}
            for _ in range(k)]


def _bambi_clean(bm, out):
    """Bambi's own results clean-up (the one its ``fit`` applies) on one draw of the sampled (centred) parameters."""
    import arviz as az

    post = {"Intercept": np.asarray(out["Intercept_centred"], float)[None, None],
            "x": np.asarray(out["x"], float)[None, None], "C(g)": np.asarray(out["C(g)"], float)[None, None]}
    idata = az.from_dict(posterior=post, coords={"C(g)_dim": ["b", "c"]}, dims={"C(g)": ["C(g)_dim"]})
    idata = bm.backend._clean_results(idata, omit_offsets=False, include_response_params=False)
    return float(idata.posterior["Intercept"].values.reshape(-1)[0])


def test_intercept_is_bambis_with_categorical_terms_and_group_slopes():
    df = _frame()
    bm = bmb.Model("y ~ x + C(g) + (x|h)", df)
    model, data = tm.from_bambi(bm)
    names = model.output_names
    assert names.index("Intercept_centred") == names.index("Intercept") + 1
    assert any("data's scale" in m and "Intercept_centred" in m for m in model.notes)
    # the sampler's coordinates are Bambi's PyMC model's: the centred intercept is what MH moves
    assert "Intercept" in model.init() and "Intercept_centred" not in model.init()
    shares = [np.mean(df["g"] == lv) for lv in ("b", "c")]
    form, _ = tm.from_bambi("y ~ x + C(g) + (x|h)", df)
    for th in _points(model):
        out = {k: np.asarray(v, float) for k, v in model.constrain(th).items()}
        want = out["Intercept_centred"] - df["x"].mean() * out["x"] - np.dot(shares, out["C(g)"])
        assert abs(out["Intercept"] - want) < 1e-4 * (1 + abs(want))
        assert abs(out["Intercept"] - _bambi_clean(bm, out)) < 1e-4 * (1 + abs(want))
        # negative control: the centred intercept is far from Bambi's here (the predictors' means are far from 0)
        assert abs(out["Intercept_centred"] - _bambi_clean(bm, out)) > 0.5
        # the formula-and-data route reports the same at the same point
        out_f = {k: np.asarray(v, float) for k, v in form.constrain(th).items()}
        assert abs(out_f["Intercept"] - out["Intercept"]) < 1e-4 * (1 + abs(want))


@pytest.mark.parametrize("formula, kwargs", [("y ~ 0 + x + C(g)", {}), ("y ~ x + C(g)", {"center_predictors": False}),
                                             ("y ~ 1 + (1|h)", {})])
def test_models_bambi_does_not_shift_are_left_as_they_are(formula, kwargs):
    df = _frame()
    bm = bmb.Model(formula, df, **kwargs)
    model, _ = tm.from_bambi(bm, centre_groups=False)
    assert not any(k.endswith("_centred") for k in model.output_names)
    assert not any("data's scale" in m for m in (getattr(model, "notes", None) or []))
    th = model.init()
    out = model.constrain(th)
    if "Intercept" in out:  # the sampled intercept, as Bambi reports it for these models
        assert float(out["Intercept"]) == pytest.approx(float(th["Intercept"]))


def test_a_distributional_component_intercept():
    df = _frame()
    bm = bmb.Model(bmb.Formula("y ~ x", "sigma ~ z"), df)
    model, _ = tm.from_bambi(bm)
    assert {"Intercept_centred", "sigma_Intercept_centred"} <= set(model.output_names)
    out = {k: np.asarray(v, float) for k, v in model.constrain(_points(model)[0]).items()}
    assert out["Intercept"] == pytest.approx(out["Intercept_centred"] - df["x"].mean() * out["x"], rel=1e-4)
    assert out["sigma_Intercept"] == pytest.approx(
        out["sigma_Intercept_centred"] - df["z"].mean() * out["sigma_z"], rel=1e-4, abs=1e-5)


def test_a_response_with_levels_and_draws_of_another_sampler():
    """A categorical response: an intercept and coefficients per response level, shifted level by level as Bambi's
    clean-up does; and the same map applied on the host to another sampler's draws (``shift_draws``)."""
    import arviz as az

    from tallmh.frontends.bambi_intercept import intercept_shifts, shift_draws

    df = _frame().assign(r=lambda d: pd.Categorical(np.random.default_rng(3).choice(list("PQR"), len(d))))
    bm = bmb.Model("r ~ x + C(g)", df, family="categorical")
    # (the output map only: this family's per-row log-likelihood does not yet take a batch, so no checks)
    model, _ = tm.from_bambi(bm, centre_groups=False, check=False)
    pts = _points(model, k=4)
    outs = [{k: np.asarray(v, float) for k, v in model.constrain(th).items()} for th in pts]
    dims = bm.backend.model.named_vars_to_dims
    raw = {k: np.stack([o[k if k != "Intercept" else "Intercept_centred"] for o in outs])[None] for k in
           ("Intercept", "x", "C(g)")}
    coords = {d: list(bm.backend.model.coords[d]) for k in raw for d in dims[k]}
    idata = az.from_dict(posterior=dict(raw), coords=coords, dims={k: list(dims[k]) for k in raw})
    idata = bm.backend._clean_results(idata, omit_offsets=False, include_response_params=False)
    ours = np.stack([o["Intercept"] for o in outs])[None]
    assert ours.shape == (1, 4, 2)
    assert np.allclose(ours, idata.posterior["Intercept"].values, atol=1e-5)
    host = shift_draws(raw, intercept_shifts(bm))
    assert np.allclose(host["Intercept"], ours, atol=1e-5) and np.array_equal(host["Intercept_centred"], raw["Intercept"])


def test_a_response_with_levels_and_group_terms_labels_both_intercepts_by_level():
    """With a group term the model is recentred after the intercept map is made; the sampled intercept keeps the
    response's levels as its labels (it was labelled by index)."""
    df = _frame().assign(r=lambda d: pd.Categorical(np.random.default_rng(3).choice(list("PQR"), len(d))))
    model, _ = tm.from_bambi(bmb.Model("r ~ x + (1|g)", df, family="categorical"), check=False)
    assert type(model).__name__ == "RecentredPyMCModel"
    assert model.coords["Intercept_centred"] == model.coords["Intercept"] == [["Q", "R"]]


def test_summary_and_arviz_carry_both_intercepts(tmp_path):
    df = _frame()
    model, data = tm.from_bambi(bmb.Model("yb ~ x + C(g)", df, family="bernoulli"))
    r = tm.sample(model, data, num_samples=50, num_warmup=50, num_chains=1, seed=0, progress=False)
    s = r.samples
    x_mean, shares = df["x"].mean(), [np.mean(df["g"] == lv) for lv in ("b", "c")]
    want = s["Intercept_centred"] - x_mean * s["x"] - s["C(g)"] @ np.asarray(shares, np.float32)
    assert np.allclose(s["Intercept"], want, atol=1e-4)
    rows = list(r.summary().table.index)
    assert rows.index("Intercept_centred") == rows.index("Intercept") + 1
    mean = float(r.summary().table.loc["Intercept", "mean"])
    assert mean == pytest.approx(float(np.mean(s["Intercept"])), rel=1e-3)
    idata = r.to_arviz()
    assert np.allclose(idata.posterior["Intercept"].values, s["Intercept"])
    assert np.allclose(idata.posterior["Intercept_centred"].values, s["Intercept_centred"])
    loaded = tm.load_result(r.save(str(tmp_path / "run")))  # a saved run keeps the reported draws
    assert np.allclose(loaded.samples["Intercept"], s["Intercept"])
    assert list(loaded.summary().table.index) == rows


@pytest.mark.slow  # Bambi's own fit (NumPyro's NUTS) and tallmh on a 400-row logistic regression: about a minute
def test_intercept_against_bambis_own_fit():
    pytest.importorskip("numpyro")
    df = _frame(n=400, seed=2)
    formula = "yb ~ x + C(g)"
    idata = bmb.Model(formula, df, family="bernoulli").fit(draws=1000, tune=500, chains=2, random_seed=0,
                                                            inference_method="numpyro", progressbar=False)
    post = idata.posterior
    nuts = np.concatenate([post["Intercept"].values[..., None], post["x"].values[..., None], post["C(g)"].values], -1)
    for route in ("model", "formula"):
        if route == "model":
            model, data = tm.from_bambi(bmb.Model(formula, df, family="bernoulli"))
        else:
            model, data = tm.from_bambi(formula, df, family="bernoulli")
        r = tm.sample(model, data, test=tm.acceptance.Exact(), num_samples=2000, num_warmup=500, num_chains=2,
                      seed=0, progress=False)
        s = r.samples
        ours = np.concatenate([s["Intercept"][..., None], s["x"][..., None], s["C(g)"]], -1).astype(float)
        ok, z = means_agree(ours, nuts)
        assert ok, (route, z)
        # negative control: the sampled (centred) intercept, reported as before, fails the same comparison
        centred = np.concatenate([s["Intercept_centred"][..., None], s["x"][..., None], s["C(g)"]], -1).astype(float)
        ok_bad, z_bad = means_agree(centred, nuts)
        assert not ok_bad, (route, z_bad)
