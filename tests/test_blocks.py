"""Inference programs (tallmh.blocks): each block leaves its target invariant, checked exactly on small
conjugate cases with MCSE-based tolerances, with negative controls that must fail the same check."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import tallmh as tm
from tallmh.blocks import Members, build_members
from tallmh.blocks.models import (JointDPM, LinearGaussianSSM, StochasticVolatility, TwoComponentMixture,
                                  kalman_smoother)
from tallmh.errors import ConfigError, ModelError

X_MIX = np.array([-1.5, -0.3, 0.4, 1.8, 2.5, 0.9], np.float32)
Z_CRIT = 4.0  # |estimate - exact| / MCSE, over ~10 quantities per check (two-sided p ~ 6e-5 each)


def _mcse(draws):
    """Monte Carlo standard error of the mean of ``draws`` (chain, draw) from ArviZ's bulk ESS."""
    import arviz as az

    draws = np.asarray(draws, float)
    if np.all(draws == draws.flat[0]):
        return 0.0
    ess = float(az.ess(draws[None] if draws.ndim == 1 else draws))
    return float(np.std(draws) / np.sqrt(max(ess, 1.0)))


def _z_scores(result, exact):
    s = result.samples
    out = {"pi": abs(s["pi"].mean() - exact["pi"]) / _mcse(s["pi"])}
    for k in range(2):
        out[f"mu{k}"] = abs(s["mu"][..., k].mean() - exact["mu"][k]) / _mcse(s["mu"][..., k])
    for i in range(len(X_MIX)):
        out[f"z{i}"] = abs(s["z"][..., i].mean() - exact["z"][i]) / _mcse(s["z"][..., i])
    return out


def _mixture_program(test=None):
    return tm.Cycle([
        tm.blocks.MH("pi", scale=1.0),
        tm.blocks.Gibbs("z", items_per_step=len(X_MIX)),
        tm.blocks.SubsampledMH("mu", test=test or tm.acceptance.Exact(chunk=8), scale=1.5, group_by="z"),
    ])


def test_members_move_and_build():
    rng = np.random.default_rng(0)
    z = rng.integers(0, 4, 50)
    mem = build_members(jnp.asarray(z), 4)
    move = jax.jit(Members.move)
    for _ in range(200):
        i = int(rng.integers(50))
        k = int(rng.integers(4))
        mem = move(mem, i, int(z[i]), k)
        z[i] = k
    counts = np.asarray(mem.counts)
    np.testing.assert_array_equal(counts, np.bincount(z, minlength=4))
    lists, pos = np.asarray(mem.lists), np.asarray(mem.pos)
    for k in range(4):
        members = lists[k, :counts[k]]
        assert sorted(members) == sorted(np.flatnonzero(z == k))
        np.testing.assert_array_equal(pos[members], np.arange(counts[k]))


@pytest.mark.slow
def test_cycle_mixture_matches_enumeration():
    """MH on pi + Gibbs on z + per-cluster MH on mu (exact test over each cluster's members): the
    marginals of pi, mu and every z_i match the exact posterior computed by enumerating 2^6 assignments."""
    model = TwoComponentMixture()
    res = tm.sample_program(_mixture_program(), model, X_MIX, num_samples=6000, num_chains=4, seed=0)
    z = _z_scores(res, model.exact(X_MIX))
    assert max(z.values()) < Z_CRIT, z
    assert res.items_per_step()["subsampled_mh(mu, exact)"] == pytest.approx(len(X_MIX))


@pytest.mark.slow
def test_cycle_mixture_negative_control():
    """The same check must fail for a Gibbs block that ignores the likelihood (a wrong conditional)."""
    model = TwoComponentMixture(wrong_gibbs=True)
    res = tm.sample_program(_mixture_program(), model, X_MIX, num_samples=3000, num_chains=4, seed=0)
    z = _z_scores(res, TwoComponentMixture().exact(X_MIX))
    assert max(z.values()) > 3 * Z_CRIT, z


@pytest.mark.slow
def test_cycle_mixture_austerity_members():
    """The same cycle with the austerity test (tiny epsilon, batch 2) on each cluster's members."""
    model = TwoComponentMixture()
    prog = _mixture_program(tm.acceptance.Austerity(epsilon=1e-4, batch_size=2))
    res = tm.sample_program(prog, model, X_MIX, num_samples=6000, num_chains=4, seed=1)
    z = _z_scores(res, model.exact(X_MIX))
    assert max(z.values()) < Z_CRIT, z


def _pg_check(block, num_samples, seed=0):
    model = LinearGaussianSSM()
    rng = np.random.default_rng(3)
    s, t = 3, 8
    y = (np.cumsum(rng.normal(size=(s, t)), axis=1) * 0.5 + rng.normal(size=(s, t))).astype(np.float32)
    res = tm.sample_program(tm.Cycle([block]), model, y, num_samples=num_samples, num_chains=4, seed=seed)
    h = res.samples["h"]  # (chain, draw, S, T)
    zs = []
    for i in range(s):
        m, v = kalman_smoother(y[i], model.a, model.q, model.r, model.q0)
        for j in range(t):
            zs.append(abs(h[:, :, i, j].mean() - m[j]) / _mcse(h[:, :, i, j]))
    return np.array(zs)


@pytest.mark.slow
def test_particle_gibbs_matches_kalman_smoother():
    """Conditional SMC on random windows of length 3 (8 particles) leaves the smoothing law invariant: the
    posterior means of all 24 h[s, t] match the Kalman-RTS smoother within MCSE."""
    zs = _pg_check(tm.blocks.ParticleGibbs("h", particles=8, window=3), 2500)
    assert zs.max() < Z_CRIT, zs


@pytest.mark.slow
def test_particle_gibbs_negative_control():
    """Dropping the next state's transition density from the window's last weight breaks invariance."""
    zs = _pg_check(tm.blocks.ParticleGibbs("h", particles=8, window=3, _ignore_future=True), 2500)
    assert zs.max() > 2 * Z_CRIT, zs


@pytest.mark.slow
def test_sv_program_runs_and_reads_a_subsample():
    x, _ = StochasticVolatility.simulate(400, 5, seed=0)
    prog = tm.Cycle([
        tm.blocks.ParticleGibbs("h", particles=8, window=5, series_per_step=100),
        tm.blocks.SubsampledMH("phi", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=50), scale=0.3),
        tm.blocks.SubsampledMH("sigma2", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=50), scale=0.3),
    ])
    res = tm.sample_program(prog, StochasticVolatility(), x, num_samples=50, num_chains=2, seed=0)
    assert np.all(np.isfinite(res.samples["phi"])) and np.all((res.samples["phi"] > 0) & (res.samples["phi"] < 1))
    items = res.items_per_step()
    assert 50 <= items["subsampled_mh(phi, austerity)"] <= 400
    assert items["pgibbs(h)"] == pytest.approx(500)
    idata = res.to_arviz()
    assert "phi" in idata.posterior and "sigma" in idata.posterior


@pytest.mark.slow  # ~10 s on a loaded 2-core CPU (compilation)
def test_jointdpm_program_runs():
    train, test = JointDPM.simulate(300, n_test=50, seed=0)
    model = JointDPM(max_clusters=8)
    prog = tm.Cycle([
        tm.blocks.MH("alpha", scale=0.5),
        tm.blocks.Gibbs("z", items_per_step=50),
        tm.blocks.SubsampledMH("w", test=tm.acceptance.Austerity(epsilon=0.3, batch_size=20), scale=0.2, group_by="z"),
    ])
    res = tm.sample_program(prog, model, train, num_samples=20, num_chains=2, seed=0)
    st = res.final_state
    z = np.asarray(st.values["z"])
    mem = st.members["z"]
    for c in range(2):
        np.testing.assert_array_equal(np.asarray(mem.counts[c]), np.bincount(z[c], minlength=8))
        np.testing.assert_allclose(np.asarray(st.aux["n"][c]), np.bincount(z[c], minlength=8))
    assert res.items_per_step()["gibbs(z)"] == 50
    assert res.items_per_step()["subsampled_mh(w, austerity)"] <= 300
    vals0 = jax.tree_util.tree_map(lambda a: a[0], st.values)
    aux0 = jax.tree_util.tree_map(lambda a: a[0], st.aux)
    p = np.asarray(model.predict(vals0, aux0, jnp.asarray(test["X"])))
    assert np.all((p >= 0) & (p <= 1))


def test_jointdpm_t_predictive_is_a_ratio_of_marginals():
    """The collapsed NIW predictive used by the z update integrates to one (a 2-D grid sum)."""
    model = JointDPM()
    xs = np.stack(np.meshgrid(np.linspace(-8, 8, 321), np.linspace(-8, 8, 321)), -1).reshape(-1, 2)
    pts = np.random.default_rng(0).normal(1.0, 0.5, size=(5, 2))
    n = jnp.asarray(5.0)
    sx = jnp.asarray(pts.sum(0))
    sxx = jnp.asarray(pts.T @ pts)
    lp = jax.vmap(lambda x: model._t_logpdf(x, n, sx, sxx))(jnp.asarray(xs))
    mass = float(np.sum(np.exp(np.asarray(lp, float))) * (16 / 320) ** 2)
    assert mass == pytest.approx(1.0, abs=0.01)


def test_config_errors():
    model = TwoComponentMixture()
    with pytest.raises(ConfigError):
        tm.sample_program(tm.Cycle([tm.blocks.MH("nope")]), model, X_MIX, num_samples=2)
    with pytest.raises(ConfigError):
        tm.blocks.SubsampledMH("mu", groups="some")
    with pytest.raises(ConfigError):
        tm.Cycle([])
    with pytest.raises(ModelError):
        tm.sample_program(tm.Cycle([tm.blocks.ParticleGibbs("z")]), model, X_MIX, num_samples=2)
    with pytest.raises(ConfigError):
        x, _ = StochasticVolatility.simulate(4, 5)
        tm.sample_program(tm.Cycle([tm.blocks.ParticleGibbs("h", window=9)]), StochasticVolatility(), x,
                          num_samples=2)
