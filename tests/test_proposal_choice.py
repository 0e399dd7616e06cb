"""The exact subsampled default's proposal, chosen in warmup (tallmh.run.proposal_choice, LaplaceChoice): its two
modes are the two proposals, its statistics measure what they say, and the choice is MALA on the rare feature and
the independence sampler on a near-Gaussian posterior; the chosen kernel's draws match exact MH."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.proposals.laplace_choice import ChoiceState
from tallmh.run import proposal_choice as pc

sys.path.insert(0, str(Path(__file__).parent / "acceptance"))
from test_thinning import rare_feature, unequal_logistic  # noqa: E402
from thinning_helpers import compare, exact_mh_case  # noqa: E402


def _laplace(d=4, seed=0):
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(d, d))
    cov = A @ A.T + d * np.eye(d)
    return rng.normal(size=d), cov


@pytest.mark.parametrize("mode", [0, 1])
def test_each_mode_is_its_proposal(mode):
    """Mode 0 proposes as CrankNicolson (same rho), mode 1 as SurrogateLangevin (same step): the same theta' and
    log q ratio from the same key."""
    c, cov = _laplace()
    L = np.linalg.cholesky(cov)
    theta = jnp.asarray(c + 0.7, jnp.float32)
    key = jax.random.PRNGKey(3)
    choice = tm.proposals.LaplaceChoice(rho=0.3, mala_step=0.8)
    st = choice.init(theta, 100, jnp.asarray(cov, jnp.float32), jnp.asarray(c, jnp.float32))
    st = st._replace(mode=jnp.int32(mode))
    other = tm.proposals.CrankNicolson(c, L, rho=0.3) if mode == 0 else tm.proposals.SurrogateLangevin(c, L, step=0.8)
    ost = other.init(theta, 100)
    tp, lq = choice.propose(key, theta, st)
    tp2, lq2 = other.propose(key, theta, ost)
    np.testing.assert_allclose(np.asarray(tp), np.asarray(tp2), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(float(lq), float(lq2), rtol=1e-3, atol=1e-3)


def test_only_crank_nicolson_adapts():
    c, cov = _laplace()
    theta = jnp.asarray(c, jnp.float32)
    choice = tm.proposals.LaplaceChoice()
    st = choice.init(theta, 100, jnp.asarray(cov, jnp.float32), jnp.asarray(c, jnp.float32))
    rejected = jnp.bool_(False)
    moved = choice.update(st, theta, rejected, jnp.int32(0))
    assert float(moved.lap.log_gap) < float(st.lap.log_gap)  # rejections push rho up
    held = choice.update(st._replace(mode=jnp.int32(1)), theta, rejected, jnp.int32(0))
    assert float(held.lap.log_gap) == float(st.lap.log_gap)
    assert isinstance(held, ChoiceState)


def test_visit_statistics():
    """Stickiness sum L^2 / sum L and the visits' autocorrelation time on hand-made chains."""
    moving = np.ones((2, 50), bool)
    assert pc.stickiness(moving) == 1.0 and pc.longest_visit(moving) == 1
    acc = np.ones((1, 10), bool)
    acc[0, 1:4] = False  # visits of lengths 4 and 6 (the first step starts one, the accepted step 4 another)
    acc[0, 5:10] = False
    L = np.array([4, 6])
    assert pc.stickiness(acc) == pytest.approx((L ** 2).sum() / L.sum())
    assert pc.longest_visit(acc) == 6
    # i.i.d. values held for geometric times: the visits' tau is about the stickiness, far above 1
    rng = np.random.default_rng(0)
    acc = rng.random((4, 4000)) < 0.3
    held = np.zeros((4, 4000, 1))
    for ch in range(4):
        v = 0.0
        for t in range(4000):
            v = rng.normal() if acc[ch, t] or t == 0 else v
            held[ch, t, 0] = v
    s, tau = pc.stickiness(acc), pc.visit_tau(acc, held)
    assert s == pytest.approx((2 - 0.3) / 0.3, rel=0.1)  # geometric holds: E[L^2] / E[L] = (2 - a) / a
    assert tau == pytest.approx(s, rel=0.15)
    assert pc.visit_tau(np.ones((4, 4000), bool), rng.normal(size=(4, 4000, 1))) == pytest.approx(1.0, abs=0.1)


KW = dict(progress=False, num_samples=400, seed=1)


def test_keeps_the_independence_sampler_on_a_near_gaussian_posterior():
    r = tm.sample(tm.models.LogisticRegression(), unequal_logistic(20_000), **KW)
    assert r.proposal.chosen == "crank-nicolson"
    assert np.shape(r.warmup_stats["accepted"])[1] == 300  # (no pilot steps)
    note = next(m for m in r.notes if m.startswith("proposal:"))
    assert "kept without a MALA pilot" in note, note
    assert r.timings["choice_s"] < 0.5


def test_chooses_mala_on_the_rare_feature():
    r = tm.sample(tm.models.LogisticRegression(), rare_feature(), **KW)
    note = next(m for m in r.notes if m.startswith("proposal:"))
    assert r.proposal.chosen == "surrogate-mala", note
    assert "MALA on the surrogate, chosen in warmup" in note
    assert f"MALA's {pc.PILOT_STEPS}-step pilot" in note and r.timings["choice_s"] > 0
    assert np.shape(r.warmup_stats["accepted"])[1] == 300 + pc.PILOT_STEPS  # (the pilot's steps are warmup's)
    assert r.flat_samples.shape[1] == 400


@pytest.mark.slow
def test_chosen_kernel_matches_exact_mh_on_the_rare_feature():
    """The default's chosen kernel (MALA here) against exact MH: every coordinate's mean within 4 MCSE and sd ratio
    within 4 of its MCSE (the check the shrunk bound fails in acceptance/test_thinning.py)."""
    data = rare_feature()
    model = tm.models.LogisticRegression(remainder_bound="global")
    *_, ref = exact_mh_case(model, data, 3000)
    r = tm.sample(model, data, progress=False, num_samples=3000, seed=1)
    assert r.proposal.chosen == "surrogate-mala"
    ok, zm, zs, report = compare(np.asarray(r.flat_samples, np.float64), ref)
    assert ok, report


def test_a_resumed_run_keeps_the_choice(tmp_path):
    """Cut in sampling after MALA was chosen, saved and resumed: the same draws, bit for bit, as one run (the mode
    is in the chains' state; the choice is not made again)."""
    import os

    data = rare_feature()
    kw = dict(progress=False, seed=1, num_samples=300)
    full = tm.sample(tm.models.LogisticRegression(), data, **kw)
    assert full.proposal.chosen == "surrogate-mala"

    def stop(info):
        if info["phase"] == "sampling" and info["done"] >= 100:
            raise KeyboardInterrupt

    cut = tm.sample(tm.models.LogisticRegression(), data, callback=stop, chunk_size=50, **kw)
    assert cut.partial
    path = os.fspath(tmp_path / "cut.npz")
    cut.save(path)
    resumed = tm.sample(tm.models.LogisticRegression(), data, resume=tm.load_result(path), **kw)
    assert resumed.proposal.chosen == "surrogate-mala"
    np.testing.assert_array_equal(resumed.flat_samples, full.flat_samples)


def test_a_run_cut_in_its_pilot_resumes_it(tmp_path):
    """Cut during MALA's pilot (after the Crank-Nicolson warmup), saved and resumed, by the default call and with the
    warmup given: the pilot goes on from where it was cut (not again from its start), the same choice and the same
    draws, bit for bit, as one run."""
    import os

    data = rare_feature()
    kw = dict(progress=False, seed=1, num_samples=200)
    full = tm.sample(tm.models.LogisticRegression(), data, **kw)
    assert full.proposal.chosen == "surrogate-mala" and full.flat_warmup.shape[1] == 300 + pc.PILOT_STEPS

    def stop(info):
        if info["phase"] == "warmup" and info["done"] >= 300 + 100:
            raise KeyboardInterrupt

    cut = tm.sample(tm.models.LogisticRegression(), data, callback=stop, chunk_size=50, **kw)
    assert cut.partial and cut.flat_warmup.shape[1] == 400 and cut.proposal.chosen is None
    path = os.fspath(tmp_path / "cut.npz")
    cut.save(path)
    for warmup in ("auto", 300, 300 + pc.PILOT_STEPS):  # (the default; as asked before; with the pilot)
        resumed = tm.sample(tm.models.LogisticRegression(), data, resume=tm.load_result(path), num_warmup=warmup, **kw)
        assert resumed.proposal.chosen == "surrogate-mala"
        assert resumed.flat_warmup.shape == full.flat_warmup.shape
        np.testing.assert_array_equal(resumed.flat_samples, full.flat_samples)
