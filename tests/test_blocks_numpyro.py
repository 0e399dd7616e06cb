"""Inference programs on NumPyro models (tallmh.blocks.from_numpyro): the same blocks, addressing NumPyro
sites by name, leave the target invariant. Checked exactly on small cases (enumeration, Kalman smoother)
with MCSE-based tolerances and negative controls, and against the hand-written models of blocks.models."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import tallmh as tm
from tallmh.blocks.models import LinearGaussianSSM, StochasticVolatility, TwoComponentMixture, kalman_smoother
from tallmh.blocks import numpyro_models as npm
from tallmh.errors import ConfigError, ModelError

pytest.importorskip("numpyro")

X_MIX = np.array([-1.5, -0.3, 0.4, 1.8, 2.5, 0.9], np.float32)
Z_CRIT = 4.0  # |estimate - exact| / MCSE over ~10 quantities per check


def _mcse(draws):
    import arviz as az

    draws = np.asarray(draws, float)
    if np.all(draws == draws.flat[0]):
        return 0.0
    return float(np.std(draws) / np.sqrt(max(float(az.ess(draws)), 1.0)))


def _quantities(samples):
    s = samples
    out = {"pi": s["pi"], "mu0": s["mu"][..., 0], "mu1": s["mu"][..., 1]}
    for i in range(len(X_MIX)):
        out[f"z{i}"] = s["z"][..., i]
    return out


def _exact_quantities(ex):
    out = {"pi": ex["pi"], "mu0": ex["mu"][0], "mu1": ex["mu"][1]}
    for i in range(len(X_MIX)):
        out[f"z{i}"] = ex["z"][i]
    return out


def _program():
    # the same program for both versions: the sites have the same names and unconstrained scales
    return tm.Cycle([
        tm.blocks.MH("pi", scale=1.0),
        tm.blocks.Gibbs("z", items_per_step=len(X_MIX)),
        tm.blocks.SubsampledMH("mu", test=tm.acceptance.Exact(chunk=8), scale=1.5, group_by="z"),
    ])


def _np_mixture(prior_only=False):
    model, data = tm.blocks.from_numpyro(npm.mixture, X_MIX, state=("z",), record=("z",))
    if prior_only:
        model._gibbs_prior_only = True
    return model, data


@pytest.mark.slow  # ~20 s on the loaded 2-core CPU (two programs compiled)
def test_numpyro_mixture_matches_enumeration_and_hand_written():
    """The cycle MH(pi) + Gibbs(z) + per-cluster MH(mu) on the NumPyro mixture matches the exact posterior
    (2^6 assignments enumerated) within MCSE, and matches the same program on the hand-written class."""
    model, data = _np_mixture()
    assert model.global_sites == ["pi", "mu"] and model.state_sites == ["z"]
    res = tm.sample_program(_program(), model, data, num_samples=4000, num_chains=4, seed=0)
    hand = tm.sample_program(_program(), TwoComponentMixture(), X_MIX, num_samples=4000, num_chains=4, seed=0)
    exact = _exact_quantities(TwoComponentMixture().exact(X_MIX))
    q_np, q_hw = _quantities(res.samples), _quantities(hand.samples)
    z_exact = {k: abs(q_np[k].mean() - exact[k]) / _mcse(q_np[k]) for k in exact}
    z_pair = {k: abs(q_np[k].mean() - q_hw[k].mean()) / np.hypot(_mcse(q_np[k]), _mcse(q_hw[k])) for k in exact}
    assert max(z_exact.values()) < Z_CRIT, z_exact
    assert max(z_pair.values()) < Z_CRIT, z_pair
    items = res.items_per_step()
    assert items["gibbs(z)"] == len(X_MIX)
    assert items["subsampled_mh(mu, exact)"] == pytest.approx(len(X_MIX))  # each item once, in its cluster
    assert items["mh(pi)"] == 2 * len(X_MIX)  # pi has local sections (z_i ~ Bernoulli(pi)): O(N), counted


@pytest.mark.slow
def test_numpyro_mixture_negative_control():
    """A Gibbs conditional that ignores the likelihood must fail the same check."""
    model, data = _np_mixture(prior_only=True)
    res = tm.sample_program(_program(), model, data, num_samples=2000, num_chains=4, seed=0)
    exact = _exact_quantities(TwoComponentMixture().exact(X_MIX))
    q = _quantities(res.samples)
    z = {k: abs(q[k].mean() - exact[k]) / _mcse(q[k]) for k in exact}
    assert max(z.values()) > 3 * Z_CRIT, z


def _pg_numpyro(block, num_samples, seed=0):
    base = LinearGaussianSSM()
    rng = np.random.default_rng(3)
    s, t = 3, 8
    y = (np.cumsum(rng.normal(size=(s, t)), axis=1) * 0.5 + rng.normal(size=(s, t))).astype(np.float32)
    # c (the model's one global) stays at its start (the prior median, found from a few prior draws): the
    # program only moves eps, so the target is the smoothing law of y - c
    model, data = tm.blocks.from_numpyro(npm.linear_gaussian_ssm, y, record=("eps",), init_globals="median")
    res = tm.sample_program(tm.Cycle([block]), model, data, num_samples=num_samples, num_chains=4, seed=seed)
    c = res.samples["c"]
    assert np.all(c == c.flat[0])
    c = float(c.flat[0])
    eps = res.samples["eps"]
    h = np.asarray(npm.ar1(jnp.asarray(eps), base.a, np.sqrt(base.q), init_scale=np.sqrt(base.q0)))
    zs = []
    for i in range(s):
        m, _ = kalman_smoother(y[i] - c, base.a, base.q, base.r, base.q0)
        for j in range(t):
            zs.append(abs(h[:, :, i, j].mean() - m[j]) / _mcse(h[:, :, i, j]))
    return np.array(zs)


@pytest.mark.slow
def test_numpyro_particle_gibbs_matches_kalman_smoother():
    """Conditional SMC over windows of the non-centred innovations eps (paths carried whole) leaves the
    smoothing law invariant: the posterior means of h = AR(eps) match the Kalman-RTS smoother."""
    zs = _pg_numpyro(tm.blocks.ParticleGibbs("eps", particles=8, window=3), 2500)
    assert zs.max() < Z_CRIT, zs


@pytest.mark.slow
def test_numpyro_particle_gibbs_negative_control():
    """Dropping the later times' dependence on the window from its last weight breaks invariance."""
    zs = _pg_numpyro(tm.blocks.ParticleGibbs("eps", particles=8, window=3, _ignore_future=True), 2500)
    assert zs.max() > 2 * Z_CRIT, zs


@pytest.mark.slow  # compile-heavy (~40 s on the loaded 2-core CPU)
def test_numpyro_sv_program_costs():
    """The SV program on the NumPyro model: the subsampled tests read a subsample of the series, MH on a
    site with no local sections reads nothing, draws come back constrained by site name."""
    x, _ = StochasticVolatility.simulate(400, 5, seed=0)
    model, data = tm.blocks.from_numpyro(npm.stochastic_volatility, x)
    assert model.state_sites == ["eps"] and model.has_local_sections("phi")
    test = tm.acceptance.Austerity(epsilon=0.05, batch_size=50)
    prog = tm.Cycle([
        tm.blocks.ParticleGibbs("eps", particles=8, window=3, series_per_step=100),
        tm.blocks.SubsampledMH("phi", test=test, scale=0.3),
        tm.blocks.SubsampledMH("sigma2", test=test, scale=0.3),
    ])
    res = tm.sample_program(prog, model, data, num_samples=30, num_chains=1, seed=0)
    phi = res.samples["phi"]
    assert np.all((phi > 0) & (phi < 1)) and "sigma" in res.samples
    items = res.items_per_step()
    assert 50 <= items["subsampled_mh(phi, austerity)"] <= 400
    assert items["pgibbs(eps)"] == 300  # 100 series x window 3


def _anticausal(x):
    import numpyro
    import numpyro.distributions as dist

    phi = numpyro.sample("phi", dist.Beta(5.0, 1.0))
    with numpyro.plate("series", x.shape[0], dim=-2):
        with numpyro.plate("time", x.shape[1], dim=-1):
            eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
            h = phi * jnp.roll(eps, -1, axis=-1)  # x_t depends on eps_{t+1}
            numpyro.sample("x", dist.Normal(h, 1.0), obs=x)


@pytest.mark.slow
def test_numpyro_blocks_config_errors():
    with pytest.raises(ConfigError):
        tm.blocks.from_numpyro(npm.mixture, X_MIX, state=("z",), record=("pi",))
    with pytest.raises(ModelError):
        tm.blocks.from_numpyro(npm.mixture, X_MIX, state=("nope",))


@pytest.mark.slow  # ~30 s on the loaded 2-core CPU
def test_numpyro_blocks_causality_and_dependencies():
    x, _ = StochasticVolatility.simulate(20, 4, seed=0)
    model, data = tm.blocks.from_numpyro(_anticausal, x)
    with pytest.raises(ModelError, match="causal"):
        tm.sample_program(tm.Cycle([tm.blocks.ParticleGibbs("eps", particles=4)]), model, data, num_samples=2)
    train = {"X": np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32),
             "y": (np.arange(30) % 2).astype(np.float32)}
    dpm, _ = tm.blocks.from_numpyro(npm.joint_dpm, train["X"], train["y"], K=4, state=("z",))
    # alpha only enters pi's prior: MH on it reads no data; pi, mu, w have local sections
    assert not dpm.has_local_sections("alpha")
    assert all(dpm.has_local_sections(s) for s in ("pi", "mu", "sd", "w"))


@pytest.mark.slow
def test_numpyro_gibbs_needs_a_discrete_state_site():
    x, _ = StochasticVolatility.simulate(10, 4, seed=0)
    model, data = tm.blocks.from_numpyro(npm.stochastic_volatility, x)
    with pytest.raises(ModelError, match="discrete"):
        tm.sample_program(tm.Cycle([tm.blocks.Gibbs("eps")]), model, data, num_samples=2)
