"""Automatic blocking of models with group-level terms (tallmh.hierarchical): which parameters go to the data-free
block and which to the subsampled one, for a Bambi, a PyMC and a NumPyro model; ``tm.sample(..., program="auto")`` builds the program (the default call
does where the effects' likelihood is a recognised GLM); a small hierarchical posterior against its quadrature reference."""

import numpy as np
import pytest

import tallmh as tm
from tallmh import hierarchical

pm = pytest.importorskip("pymc")


def _logistic_groups(n=600, groups=8, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    x = rng.normal(size=n)
    a = rng.normal(0, 0.5, groups)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-0.3 + 0.8 * x + a[g])))).astype(int)
    return g, x, y


def test_blocks_of_a_centred_pymc_model():
    g, x, y = _logistic_groups()
    with pm.Model(coords={"grp": range(8)}) as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("mu", 0, 5)
        b = pm.Normal("b", 0, 5)
        s = pm.HalfNormal("s", 1)
        a = pm.Normal("a", 0, s, dims="grp")
        pm.Bernoulli("y", logit_p=mu + b * x + a[gi], observed=y)
    model, data = tm.from_pymc(m)
    bm, program, note = hierarchical.auto_program(model, data)
    assert bm.hyper_keys == ["s_log__"]
    assert sorted(bm.effect_keys) == ["a", "b", "mu"]
    # (a logistic GLM: the effects by the exact block of tallmh.glm_effects; tests/test_glm_effects.py)
    assert [type(getattr(b, "block", b)).__name__ for b in program.blocks] == ["MH", "GLMEffects"]
    assert "s_log__" in note and "automatic blocks" in note


def test_blocks_of_a_bambi_model():
    bmb = pytest.importorskip("bambi")
    import pandas as pd

    g, x, y = _logistic_groups()
    df = pd.DataFrame({"y": y, "x": x, "g": pd.Categorical([f"g{j:03d}" for j in g])})
    model, data = tm.from_bambi(bmb.Model("y ~ x + (1|g)", df, family="bernoulli"))
    bm, program, _ = hierarchical.auto_program(model, data)
    # the group scale is data-free given the centred effects; the offsets' keys hold those effects
    assert bm.hyper_keys == ["1|g_sigma_log__"]
    assert sorted(bm.effect_keys) == ["1|g_centred__", "Intercept", "x"]
    assert np.all(bm.model.weights["1|g_centred__"] == 1.0)
    # draws keep Bambi's names and levels
    rec = bm.record(*bm.init(__import__("jax").random.PRNGKey(0), data))
    assert {"1|g", "1|g_sigma", "Intercept", "x"} <= set(rec) and bm.coords["1|g"][0][:2] == ["g000", "g001"]


def test_blocks_of_a_numpyro_model():
    numpyro = pytest.importorskip("numpyro")
    import numpyro.distributions as dist

    g, x, y = _logistic_groups()

    def nmodel(x, g, y=None):
        mu = numpyro.sample("mu", dist.Normal(0, 5))
        b = numpyro.sample("b", dist.Normal(0, 5))
        s = numpyro.sample("s", dist.HalfNormal(1))
        with numpyro.plate("groups", 8):
            a = numpyro.sample("a", dist.Normal(0, s))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=mu + b * x + a[g]), obs=y)

    model, data = tm.from_numpyro(nmodel, x, g, y)
    bm, program, _ = hierarchical.auto_program(model, data)
    assert bm.hyper_keys == ["s"]
    assert sorted(bm.effect_keys) == ["a", "b", "mu"]
    assert [type(getattr(b, "block", b)).__name__ for b in program.blocks] == ["MH", "GLMEffects"]
    # the default call builds the same blocks (a logistic likelihood, recognised)
    got, prog, note = hierarchical.default_program(model, data, None, None, None, None, None)
    assert isinstance(got, hierarchical.BlockedModel) and got.hyper_keys == ["s"]
    assert note.startswith("default for a group-level logistic GLM (exact effects step)")
    assert type(prog.blocks[-1]).__name__ == "GLMEffects"


def test_model_without_hyperparameters_is_not_blocked():
    g, x, y = _logistic_groups()
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        b = pm.Normal("b", 0, 5)
        pm.Bernoulli("y", logit_p=mu + b * x, observed=y)
    model, data = tm.from_pymc(m)
    assert hierarchical.auto_program(model, data) is None


def _run_and_z(model, data, g, y, n_j, **kw):
    from tests.test_pymc import _group_reference

    r = tm.sample(model, data, seed=3, progress=False, num_samples=4000, num_warmup=500, **kw)
    mean, sd = _group_reference(g, y, n_j)
    draws = np.concatenate([r.samples["1|g_sigma"][..., None], r.samples["Intercept"][..., None],
                            r.samples["1|g"]], axis=-1)
    z = np.array([(draws[..., j].mean() - mean[j]) / float(tm.diagnostics.mcse_mean(draws[..., j]))
                  for j in range(len(mean))])
    return r, z


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_auto_program_matches_the_reference():
    from tests.test_pymc import bambi_style_groups

    m, g, y, n_j = bambi_style_groups()
    model, data = tm.from_pymc(m)
    r, z = _run_and_z(model, data, g, y, n_j, program="auto")
    assert any(s.startswith("automatic blocks") for s in r.notes)
    assert "block0_n_data" in r.stats and int(np.sum(r.stats["block0_n_data"])) == 0  # the hyper block reads nothing
    # every coordinate within 4 Monte Carlo standard errors of the quadrature reference (12 coordinates)
    assert np.max(np.abs(z)) < 4.0, z
    # a user's program wins: here the exact test on one block of everything
    own = tm.Cycle([tm.blocks.SubsampledMH("effects", test=tm.acceptance.Exact(), scale=0.01)])
    bm, _, _ = hierarchical.auto_program(model, data)
    r2 = tm.sample(bm, data, program=own, seed=0, progress=False, num_samples=10, num_warmup=0)
    assert not any(s.startswith("automatic blocks") for s in r2.notes)


def _many_groups_model(groups, n=20_000, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    x = rng.normal(size=n)
    y = (rng.random(n) < 1 / (1 + np.exp(-(0.8 * x + rng.normal(0, 0.5, groups)[g])))).astype(int)
    with pm.Model(coords={"grp": [f"g{j:05d}" for j in range(groups)]}) as m:
        gi = pm.Data("g_idx", g)
        b = pm.Normal("b", 0, 5)
        s = pm.HalfNormal("s", 1)
        a = pm.Normal("a", 0, s, dims="grp")
        pm.Bernoulli("y", logit_p=b * x + a[gi], observed=y)
    return tm.from_pymc(m, check_full_max=0)


class _Counting:
    """Counts the Python-level calls of a model's log_prior and log_lik (each a trace or an eager call)."""

    def __init__(self, model):
        self.calls = {"log_prior": 0, "log_lik": 0}
        for name in self.calls:
            fn = getattr(model, name)

            def counted(*a, _fn=fn, _name=name):
                self.calls[_name] += 1
                return _fn(*a)

            setattr(model, name, counted)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
@pytest.mark.parametrize("exact_glm", [False, True])
def test_ten_thousand_groups_set_up_without_a_loop_over_levels(exact_glm, monkeypatch):
    monkeypatch.setattr(hierarchical, "EXACT_GLM", exact_glm)
    counts = {}
    for groups in (2_000, 10_000):  # (both above DENSE_MAX: the same code path)
        model, data = _many_groups_model(groups)
        c = _Counting(model)
        bm, program, _ = hierarchical.auto_program(model, data)
        assert bm.hyper_keys == ["s_log__"] and bm.start["effects"].shape == (groups + 1,)
        r = tm.sample(bm, hierarchical.data_for(bm, data), program=program, seed=0, progress=False, num_samples=5,
                      num_warmup=0, num_chains=2)
        assert r.samples["a"].shape == (2, 5, groups)
        counts[groups] = dict(c.calls)
    # the model is called (traced) as often with 10,000 levels as with 2,000: no Python loop over the levels
    assert counts[2_000] == counts[10_000], counts
    # above DENSE_MAX effects the proposal is diagonal (no d x d array) and there are no d x d control variates
    eff = program.blocks[1]
    if exact_glm:  # the exact block: arrays of rows, groups and buckets, none groups x groups
        # (its steps repeated, one draw recorded per ceil(effects / RECORD_VALUES) of them: 79 at 10,001 effects)
        assert type(eff).__name__ == "Repeat" and eff.times == hierarchical.glm_steps(groups + 1) == 79
        eff = eff.block
        assert type(eff).__name__ == "GLMEffects" and eff.setup.P.B.shape == (1, groups)
    else:
        assert isinstance(eff.proposal, hierarchical.DiagonalRandomWalk) and eff.control_variates is None


def test_a_coefficient_read_by_few_rows_is_not_data_free():
    g, x, y = _logistic_groups()
    rare = np.zeros(len(x))
    rare[-3:] = 1.0  # a predictor that only three rows (of 600) have
    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("mu", 0, 5)
        c = pm.Normal("c", 0, 5)
        s = pm.HalfNormal("s", 1)
        a = pm.Normal("a", 0, s, shape=8)
        pm.Bernoulli("y", logit_p=mu + c * rare + a[gi], observed=y)
    model, data = tm.from_pymc(m)
    hyper, effects, _ = hierarchical.split_sites(model, data)
    assert hyper == ["s_log__"] and "c" in effects


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_automatic_program_resumes_bit_for_bit(tmp_path):
    from tests.test_pymc import bambi_style_groups

    m, g, y, n_j = bambi_style_groups(n_j=(300,) * 5 + (10,))
    model, data = tm.from_pymc(m)
    full = tm.sample(model, data, seed=0, progress=False, num_samples=200, num_warmup=100, program="auto")
    part = tm.sample(model, data, seed=0, progress=False, num_samples=100, num_warmup=100, program="auto")
    part.save(str(tmp_path / "part.npz"))
    model2, data2 = tm.from_pymc(m)
    res = tm.sample(model2, data2, seed=0, progress=False, num_samples=200, num_warmup=100,
                    resume=tm.load_result(str(tmp_path / "part.npz")))
    assert np.array_equal(res.flat_samples, full.flat_samples)


def test_auto_program_is_asked_for_and_refuses_a_method_beside_it():
    from tests.test_pymc import bambi_style_groups

    m, g, y, n_j = bambi_style_groups(n_j=(30,) * 4)
    model, data = tm.from_pymc(m)
    with pytest.raises(tm.ConfigError, match="pass no test"):
        tm.sample(model, data, program="auto", test=tm.acceptance.Exact(), progress=False)
    with pytest.raises(tm.ConfigError, match="'auto'"):
        tm.sample(model, data, program="blocks", progress=False)
    # the default call: this Gaussian likelihood with a known noise sd is a recognised GLM, so the blocks with the
    # exact effects step (tests/test_glm_families.py); with a method given, the single-block method
    got, program, note = hierarchical.default_program(model, data, None, None, None, None, None)
    assert isinstance(got, hierarchical.BlockedModel) and program.blocks[-1].family == "gaussian"
    assert note.startswith("default for a group-level Gaussian (known noise sd) GLM")
    got, program, note = hierarchical.default_program(model, data, tm.acceptance.Exact(), None, None, None, None)
    assert got is model and program is None and note is None
