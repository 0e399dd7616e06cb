"""The exact effects block of a hierarchical logistic GLM (tallmh.glm_effects): recognised from the model's
likelihood (and not for another link), and its posterior against exact MH on the model's own likelihood in the
same program, with a shrunk bound as the negative control."""

import jax
import numpy as np
import pytest

import tallmh as tm
from tallmh import glm_effects as ge
from tallmh import hierarchical

pm = pytest.importorskip("pymc")


def _groups_model(n_j=(3, 4, 5, 6, 8, 12), link="logit", seed=1):
    """A hierarchical logistic regression on few, small groups (rare positives: a skewed likelihood, whose
    Taylor remainders matter)."""
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(len(n_j)), n_j)
    x = rng.normal(size=g.size)
    a = rng.normal(0, 0.7, len(n_j))
    y = (rng.random(g.size) < 1 / (1 + np.exp(-(-2.5 + 0.8 * x + a[g])))).astype(int)
    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("mu", 0, 2)
        b = pm.Normal("b", 0, 2)
        s = pm.HalfNormal("s", 1)
        u = pm.Normal("u", 0, s, shape=len(n_j))
        eta = mu + b * x + u[gi]
        if link == "logit":
            pm.Bernoulli("y", logit_p=eta, observed=y)
        else:
            pm.Bernoulli("y", p=pm.math.invprobit(eta), observed=y)
    return tm.from_pymc(m)


@pytest.mark.slow
def test_a_logistic_glm_is_recognised_and_a_probit_one_is_not():
    model, data = _groups_model()
    bm, program, note = hierarchical.auto_program(model, data)
    eff = program.blocks[1]
    assert isinstance(eff, ge.GLMEffects) and "glm_effects" in note
    # the reconstruction: the design's group index follows the data's, one coefficient per row
    g = np.asarray(data["g_idx"])
    assert np.array_equal(np.asarray(bm.extra_data["_glm_g"]), g)
    assert np.allclose(np.abs(bm.extra_data["_glm_c"]), 1.0, atol=1e-5)
    model_p, data_p = _groups_model(link="probit")
    _, program_p, _ = hierarchical.auto_program(model_p, data_p)
    assert type(program_p.blocks[1]).__name__ == "SubsampledMH"  # not a logistic GLM: the approximate block


def _means_and_mcse(r, keys=("mu", "b", "s", "u")):
    cols = [np.asarray(r.samples[k]).reshape(r.samples[k].shape[:2] + (-1,)) for k in keys]
    d = np.concatenate(cols, axis=-1)
    mean = d.mean(axis=(0, 1))
    mcse = np.array([float(tm.diagnostics.mcse_mean(d[..., j])) for j in range(d.shape[-1])])
    return mean, mcse


def _run(bm, data, block, hyper_block, seed, samples):
    prog = tm.Cycle([hyper_block, block])
    return tm.sample(bm, hierarchical.data_for(bm, data), program=prog, seed=seed, progress=False,
                     num_samples=samples, num_warmup=500, num_chains=4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_exact_block_matches_exact_mh_and_a_shrunk_bound_does_not():
    model, data = _groups_model()
    bm, program, _ = hierarchical.auto_program(model, data)
    hyper_block, eff = program.blocks
    # the reference: exact MH on the model's own likelihood (every row), the same hyperparameter block
    sd = np.asarray(bm.jitter["effects"])
    ref_block = tm.blocks.SubsampledMH("effects", test=tm.acceptance.Exact(),
                                       proposal=tm.proposals.RandomWalk(np.diag(0.9 * sd)))
    ref = _run(bm, data, ref_block, hyper_block, 11, 20_000)
    m_ref, e_ref = _means_and_mcse(ref)
    got = _run(bm, data, eff, hyper_block, 12, 5_000)
    m, e = _means_and_mcse(got)
    z = (m - m_ref) / np.sqrt(e**2 + e_ref**2)
    print("z exact block vs exact MH", np.round(z, 2))
    assert np.max(np.abs(z)) < 4.0, z
    # the negative control: the bound shrunk to zero, so no point is drawn and the step samples the surrogate (a
    # wrong sampler: the likelihood's Taylor expansion at the centre)
    bad = _run(bm, data, ge.GLMEffects(eff.setup, eff.fixed, eff.group, r=eff.r, shrink=0.0), hyper_block, 12,
               10_000)
    mb, eb = _means_and_mcse(bad)
    zb = (mb - m_ref) / np.sqrt(eb**2 + e_ref**2)
    print("z shrunk bound vs exact MH", np.round(zb, 2))
    assert np.max(np.abs(zb)) > 4.0, zb


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_the_blocks_are_the_default_for_a_logistic_glm_only():
    """tm.sample(model, data) on a PyMC model with a group-level term runs the automatic blocks with the exact
    effects step when the effects' likelihood is a logistic GLM (said in the notes); the probit model keeps the
    single-block default, and an explicit test does too."""
    model, data = _groups_model()
    # (no bound over all parameters: its scale enters the prior of the effects the likelihood reads)
    assert "does not read enter the prior" in model.factor_bound_reason
    r = tm.sample(model, data, num_samples=200, num_warmup=200, num_chains=2, seed=0, progress=False)
    assert r.label.startswith("cycle(") and "glm_effects" in r.label
    assert any(m.startswith("default for a group-level logistic GLM (exact effects step)") for m in r.notes)
    model_p, data_p = _groups_model(link="probit")
    p = tm.sample(model_p, data_p, num_samples=50, num_warmup=50, num_chains=2, seed=0, progress=False)
    assert not p.label.startswith("cycle(")
    e = tm.sample(model, data, test=tm.acceptance.Exact(), num_samples=50, num_warmup=50, num_chains=2, seed=0,
                  progress=False)
    assert e.label == "exact"
