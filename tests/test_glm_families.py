"""The exact effects block's other families (tallmh.glm_families): a Poisson-log and a known-sd Gaussian group-level
GLM recognised from the model's likelihood (and a Gaussian whose sd is a parameter, a Student-t and a negative
binomial not: they keep the approximate block); the Poisson block's posterior against exact MH (every row's
remainder in each decision) with a shrunk bound as the negative control; the Gaussian block's against quadrature over the group scale, with a
block on the wrong noise variance as the negative control."""

import numpy as np
import pytest

import tallmh as tm
from tallmh import glm_effects as ge
from tallmh import hierarchical

pm = pytest.importorskip("pymc")


def _groups_model(family, n_j=(3, 4, 5, 6, 8, 12), seed=1):
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(len(n_j)), n_j)
    x = rng.normal(size=g.size)
    eta = 0.5 + 0.8 * x + rng.normal(0, 0.7, len(n_j))[g]
    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("mu", 0, 2)
        b = pm.Normal("b", 0, 2)
        s = pm.HalfNormal("s", 1)
        u = pm.Normal("u", 0, s, shape=len(n_j))
        e = mu + b * x + u[gi]
        if family == "poisson":
            pm.Poisson("y", pm.math.exp(e), observed=rng.poisson(np.exp(eta)))
        elif family == "gaussian":
            pm.Normal("y", e, 0.7, observed=eta + 0.7 * rng.normal(size=g.size))
        elif family == "gaussian-sd":
            pm.Normal("y", e, pm.HalfNormal("sd", 1), observed=eta + 0.7 * rng.normal(size=g.size))
        elif family == "student":
            pm.StudentT("y", nu=4, mu=e, sigma=0.7, observed=eta + 0.7 * rng.standard_t(4, size=g.size))
        else:
            pm.NegativeBinomial("y", mu=pm.math.exp(e), alpha=3.0, observed=rng.poisson(np.exp(eta)))
    return tm.from_pymc(m)


@pytest.mark.parametrize("family", ["poisson", "gaussian", "gaussian-sd", pytest.param("student", marks=pytest.mark.slow),
                                    pytest.param("negbin", marks=pytest.mark.slow)])
def test_which_families_are_recognised(family):
    model, data = _groups_model(family)
    bm, program, note = hierarchical.auto_program(model, data)
    eff = program.blocks[1]
    if family in ("poisson", "gaussian"):
        assert isinstance(eff, ge.GLMEffects) and eff.family == family
        # the design read from the likelihood: the data's group index, one coefficient per row (1 for the Poisson's
        # log rate, 1 / 0.7 for the Gaussian's unit-noise form, up to the sign)
        assert np.array_equal(np.asarray(bm.extra_data["_glm_g"]), np.asarray(data["g_idx"]))
        c = 1.0 if family == "poisson" else 1 / 0.7
        assert np.allclose(np.abs(bm.extra_data["_glm_c"]), c, rtol=1e-4)
    else:  # not a recognised GLM: the approximate block
        assert type(eff).__name__ == "SubsampledMH", family
        assert "glm_effects" not in note


def _means_and_mcse(r, keys=("mu", "b", "s", "u")):
    cols = [np.asarray(r.samples[k]).reshape(r.samples[k].shape[:2] + (-1,)) for k in keys]
    d = np.concatenate(cols, axis=-1)
    mcse = np.array([float(tm.diagnostics.mcse_mean(d[..., j])) for j in range(d.shape[-1])])
    return d.mean(axis=(0, 1)), mcse


def _run(bm, data, block, hyper_block, seed, samples):
    return tm.sample(bm, hierarchical.data_for(bm, data), program=tm.Cycle([hyper_block, block]), seed=seed,
                     progress=False, num_samples=samples, num_warmup=300, num_chains=4)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_poisson_block_matches_exact_mh_and_a_shrunk_bound_does_not():
    model, data = _groups_model("poisson")
    bm, program, _ = hierarchical.auto_program(model, data)
    hyper_block, eff = program.blocks
    # the reference: the same proposal with every row's exact remainder in each decision (plain MH on the likelihood
    # read from the model, which recognition checked against the model on every row)
    full = ge.GLMEffects(eff.setup, eff.fixed, eff.group, test="exact", r=eff.r, family="poisson")
    m_ref, e_ref = _means_and_mcse(_run(bm, data, full, hyper_block, 11, 8_000))
    m, e = _means_and_mcse(_run(bm, data, eff, hyper_block, 12, 3_000))
    z = (m - m_ref) / np.sqrt(e**2 + e_ref**2)
    print("z Poisson block vs exact MH", np.round(z, 2))
    assert np.max(np.abs(z)) < 4.0, z
    # the negative control: no point ever drawn, the step samples the surrogate (the likelihood's Taylor expansion
    # at the centre: a wrong sampler); the trust region's fallback turned off with it
    bad = ge.GLMEffects(eff.setup, eff.fixed, eff.group, r=eff.r, shrink=0.0, family="poisson", radius=np.inf)
    mb, eb = _means_and_mcse(_run(bm, data, bad, hyper_block, 12, 2_000))
    zb = (mb - m_ref) / np.sqrt(eb**2 + e_ref**2)
    print("z shrunk bound vs exact MH", np.round(zb, 2))
    assert np.max(np.abs(zb)) > 4.0, zb


def _gaussian_reference(n_j=(3, 4, 5, 6, 8, 12), seed=1, noise=0.7):
    """The Gaussian model's posterior means of (mu, b, s, u) by quadrature over s (given s the effects are
    Gaussian: the marginal likelihood and the conditional means in closed form)."""
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(len(n_j)), n_j)
    x = rng.normal(size=g.size)
    eta = 0.5 + 0.8 * x + rng.normal(0, 0.7, len(n_j))[g]
    y = eta + noise * rng.normal(size=g.size)  # (the same draws, in the same order, as _groups_model)
    A = np.concatenate([np.ones((g.size, 1)), x[:, None], np.eye(len(n_j))[g]], axis=1)
    grid = np.linspace(1e-4, 6.0, 6000)
    logw, means = [], []
    for sv in grid:
        d = np.array([4.0, 4.0] + [sv * sv] * len(n_j))
        cov = (A * d) @ A.T + noise**2 * np.eye(g.size)
        _, logdet = np.linalg.slogdet(cov)
        logw.append(-0.5 * (logdet + y @ np.linalg.solve(cov, y)) - 0.5 * sv * sv)  # HalfNormal(1) prior
        prec = A.T @ A / noise**2 + np.diag(1.0 / d)
        means.append(np.linalg.solve(prec, A.T @ y / noise**2))
    w = np.exp(np.array(logw) - max(logw))
    w /= w.sum()
    m = w @ np.array(means)
    return np.concatenate([m[:2], [w @ grid], m[2:]])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_gaussian_block_matches_quadrature_and_reads_no_row():
    model, data = _groups_model("gaussian")
    bm, program, _ = hierarchical.auto_program(model, data)
    hyper_block, eff = program.blocks
    m_ref = _gaussian_reference()
    r = _run(bm, data, eff, hyper_block, 12, 3_000)
    m, e = _means_and_mcse(r)
    z = (m - m_ref) / e
    print("z Gaussian block vs the reference", np.round(z, 2))
    assert np.max(np.abs(z)) < 4.0, z
    assert r.data_fraction == 0.0  # the surrogate is the likelihood: no row read by a step
    # the negative control: the same block on the likelihood of twice the noise variance (its sums halved): a
    # wrong conditional, which the same check must reject
    st = eff.setup
    half = st._replace(gl=0.5 * st.gl, P=ge.Arrow(*(0.5 * a for a in st.P)))
    bad = ge.GLMEffects(half, eff.fixed, eff.group, r=eff.r, family="gaussian")
    mb, eb = _means_and_mcse(_run(bm, data, bad, hyper_block, 12, 3_000))
    zb = (mb - m_ref) / eb
    print("z halved likelihood vs the reference", np.round(zb, 2))
    assert np.max(np.abs(zb)) > 4.0, zb
