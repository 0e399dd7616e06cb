"""The exact default's set-up in one full pass (:mod:`tallmh.one_pass`): the control variates' centre left at the
first pass's point (a sub-sample's mode), the chains and Laplace proposals at that pass's Newton point, the table's
region widened to reach them. The chain is still exact (against exact MH; a shrunk bound fails the same check),
the search stops or goes on as forced, and the rule picks each side on constructed inputs."""

import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import factor_bounds as fbm
from tallmh import fused_table, one_pass
from tallmh import setup_passes as setup

sys.path.insert(0, str(Path(__file__).parent))
from test_fused_table import exact_and_shrunk, rare_feature  # noqa: E402


def small_ladder(monkeypatch, mode):
    """A warm start of 256 rows whose Hessian serves the first full pass (as the larger sub-samples do at N >=
    10^8), the compiled passes (as for data in files), and the one-pass rule forced to ``mode``."""
    monkeypatch.setattr(setup, "HOST_MAX_ROWS", 0)
    monkeypatch.setattr(setup, "WARM_ROWS", 256)
    monkeypatch.setattr(setup, "WARM_MIN_N", 1024)
    monkeypatch.setattr(setup, "WARM_TARGET", 0.5)
    monkeypatch.setattr(one_pass, "MODE", mode)


def search(data, steps=1000):
    model = tm.models.LogisticRegression()
    jd = jax.tree_util.tree_map(jnp.asarray, data)
    flat0, unravel = ravel_pytree(model.init(jd))
    n = data["y"].shape[0]
    with fused_table.requesting(jd, model.factor_bound(), one_pass.OnePassPlan(steps, jd)) as req:
        found = setup.mode_search(model, jd, n, unravel, flat0, tol=setup.centre_tol(flat0.shape[0]))
    return found, req


def test_forced_one_pass_stops_at_the_first_pass_with_the_chains_at_its_newton_point(monkeypatch):
    data, _ = tm.models.LogisticRegression.simulate(20000, d=3, seed=1)
    small_ladder(monkeypatch, "always")
    found, req = search(data)
    assert found.passes == 1 and req.prediction is not None and req.prediction.one_pass
    assert found.mean is not None and found.hess_sum is not None
    # the offset is the Newton decrement's root, well above the centre's tolerance (a second pass would move it)
    assert req.prediction.offset ** 2 > setup.centre_tol(np.shape(found.center)[0])
    assert req.prediction.reads_one > req.prediction.reads_two
    # the table from that pass belongs to the centre (no separate pass), its region widened
    small_ladder(monkeypatch, "never")
    two, req2 = search(data)
    assert two.passes >= 2 and two.mean is None and req2.prediction is None
    # the surrogate's mode from one pass is much nearer the mode than the first pass's point
    d = np.shape(two.center)[0]
    H = -np.asarray(two.hess_sum, np.float64) + np.eye(d) / 100.0
    dist = lambda a: float(np.sqrt((a - np.asarray(two.center)) @ H @ (a - np.asarray(two.center))))  # noqa: E731
    assert dist(found.mean) < 0.5 * dist(np.asarray(found.center))




@pytest.mark.slow
def test_chain_with_a_one_pass_centre_matches_exact_mh(monkeypatch):
    """The default with its centre left at a sub-sample's mode (forced; 8.8 posterior sd from the mode here) against
    exact MH on a rare feature: every mean within 4 combined MCSE and sd within 4 of its MCSE; negative control:
    the same run with the fused weights shrunk 50x (too small a bound) fails the check."""
    small_ladder(monkeypatch, "always")
    exact_and_shrunk(monkeypatch, rare_feature(), "set-up in one full pass (forced)")


def _table(n=20000, d=4, seed=0):
    """A TableBuilder of ``n`` weights like a logistic table's (rho^3 with rho ~ 1/sqrt(n))."""
    rng = np.random.default_rng(seed)
    tb = fbm.TableBuilder(n)
    tb.add(0, (np.abs(rng.normal(size=n)) + 0.5) ** 3 * n**-1.5)
    return tb


@pytest.mark.parametrize("pass_s, steps, one", [(100.0, 1000, True), (1e-4, 100_000, False)])
def test_the_rule_weighs_the_extra_reads_against_the_pass(monkeypatch, pass_s, steps, one):
    monkeypatch.setattr(one_pass, "MODE", "auto")
    d, n = 4, 20000
    bound = tm.models.LogisticRegression().factor_bound()
    tb = _table(n, d)
    s = one_pass.whitening_scale(bound, d, 3 * 8.0)
    at = s * np.eye(d)  # (whitened at the centre by the identity precision, the region widened as the set-up does)
    step = np.zeros(d)
    step[0] = 8.0  # 8 posterior sd from the centre
    data = {"X": np.zeros((n, d), np.float32)}  # (in memory: the loop's read cost)
    p = one_pass.keep_one_pass(one_pass.OnePassPlan(steps, data), bound, tb, at, np.zeros(d), step, np.eye(d), n,
                               pass_s)
    assert p.offset == pytest.approx(8.0) and not p.forced
    assert p.reads_one > 5 * p.reads_two  # (the offset squared times the step)
    assert p.one_pass is one
    assert p.read_s == one_pass.LOOP_READ_S


def test_an_offset_beyond_the_region_costs_full_passes(monkeypatch):
    """A centre farther than the widened region reaches: the chain would leave it (the exact fallback, N reads a
    step), so the rule takes the second pass whatever the pass costs."""
    monkeypatch.setattr(one_pass, "MODE", "auto")
    d, n = 4, 20000
    bound = tm.models.LogisticRegression().factor_bound()
    step = np.zeros(d)
    step[0] = 40.0
    at = one_pass.whitening_scale(bound, d, 10.0) * np.eye(d)  # (widened for 10 sd; the offset is 40)
    p = one_pass.keep_one_pass(one_pass.OnePassPlan(1000, {"X": np.zeros((n, d))}), bound, _table(n, d), at,
                               np.zeros(d), step, np.eye(d), n, 100.0)
    assert p.reads_one > 0.5 * n and not p.one_pass


def test_the_widened_whitening_keeps_the_bound_and_reaches_the_offset():
    """Whitening by s A (s = r / (r + reach)): a pair at the offset is inside the region, and every item's
    remainder difference there stays within its weight times phi (the bound holds for any whitening)."""
    rng = np.random.default_rng(3)
    n, d = 3000, 3
    X = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, d - 1))], axis=1).astype(np.float32)
    y = (rng.uniform(size=n) < 0.5).astype(np.float32)
    bound = tm.models.LogisticRegression().factor_bound()
    c = np.array([0.3, -0.5, 0.8])
    A = np.linalg.cholesky(X.T.astype(np.float64) @ X / 4.0)  # (about the logistic precision at this scale)
    reach = 12.0
    s = one_pass.whitening_scale(bound, d, reach)
    assert s == pytest.approx(bound.radius_for(d) / (bound.radius_for(d) + reach))
    at = (s * A).T
    w = bound.weights_host(c, np.linalg.inv(s * A), {"X": X, "y": y}) * (1 + 1e-3)
    u = rng.normal(size=d)
    off = c + np.linalg.solve(A.T, u / np.linalg.norm(u) * reach)  # reach sds from c in A's metric
    rem = jax.jit(bound.remainder)
    for _ in range(20):
        th, thp = (off + np.linalg.solve(A.T, rng.normal(size=d)) for _ in range(2))
        z, zp = (jnp.asarray(at @ (t - c), jnp.float32) for t in (th, thp))
        assert bool(bound.region(z, zp))
        dr = np.abs(np.asarray(rem(jnp.asarray(th, jnp.float32), jnp.asarray(thp, jnp.float32), jnp.asarray(c, jnp.float32),
                                   {"X": jnp.asarray(X), "y": jnp.asarray(y)}), np.float64))
        assert np.all(dr <= w * float(bound.phi(z, zp)) + 1e-7)


def test_the_rule_prices_the_acceptance_lost_to_a_far_centre():
    """With reads free (in memory), many extra items per step still cost the steps that win back the ESS the lower
    acceptance loses; none extra cost nothing."""
    assert one_pass.extra_cost(0.5, 0.5, 10_000, one_pass.LOOP_READ_S) == 0.0
    near = one_pass.extra_cost(1.0, 0.0, 10_000, 0.0)
    far = one_pass.extra_cost(30.0, 0.0, 10_000, 0.0)
    assert 0 < near < far and far > 10_000 * one_pass.STEP_S  # (more than doubling the run's steps)
    assert np.isfinite(one_pass.extra_cost(1e9, 0.0, 10_000, 1e-3))


class _Overflowing:
    """A bound whose widened weights overflow (as a Poisson trust region's exp(eta + rho r) may)."""

    any_whitening = True
    radius = 6.0

    def weights(self, center, rinv, batch):
        return jnp.full(batch["X"].shape[:1], jnp.inf, center.dtype)


def test_a_widened_table_that_overflows_leaves_the_second_pass(monkeypatch):
    """The one-pass table's weights not finite: the pass still gives its sums, no table (the search goes on to a
    second pass, whose table has the centre's own region); without the widening the error is raised as before."""
    model = tm.models.LogisticRegression()
    data, _ = tm.models.LogisticRegression.simulate(3000, d=2, seed=0)
    jd = jax.tree_util.tree_map(jnp.asarray, data)
    flat0, unravel = ravel_pytree(model.init(jd))
    chunk_vgh, _ = setup._newton_chunk_fns(model, unravel, flat0)
    req = fused_table.FusedTable(jd, _Overflowing(), one_pass.OnePassPlan(100, jd))
    d = flat0.shape[0]
    v, g, h = req.run(setup.full_pass, chunk_vgh, jd, 3000, flat0, "test", neg_h=np.eye(d) * 100.0, scale=0.5)
    assert np.isfinite(v) and np.all(np.isfinite(g)) and req.result is None
    assert not req.decide(3000, np.asarray(flat0), np.ones(d), np.eye(d), 1.0)
    with pytest.raises(tm.errors.ConfigError):
        req.run(setup.full_pass, chunk_vgh, jd, 3000, flat0, "test", neg_h=np.eye(d) * 100.0)


def test_a_read_from_files_is_priced_by_random_rows_and_counted(tmp_path):
    rng = np.random.default_rng(0)
    paths = {"X": str(tmp_path / "X.npy"), "y": str(tmp_path / "y.npy")}
    np.save(paths["X"], rng.normal(size=(5000, 3)).astype(np.float32))
    np.save(paths["y"], (rng.uniform(size=5000) < 0.5).astype(np.float32))
    data = tm.data.from_npy(paths)
    s, rows = one_pass.read_cost(data, 5000)
    assert rows == one_pass.PROBE_ROWS and s > one_pass.LOOP_READ_S
    assert one_pass.read_cost({"X": np.zeros((10, 3))}, 10) == (one_pass.LOOP_READ_S, 0)


@pytest.mark.parametrize("mode", ["always", "never"])
def test_the_default_from_files_counts_one_pass_or_two(monkeypatch, tmp_path, mode):
    """The default call on data in files (the compiled passes with the table fused): the set-up's items are one
    full pass (plus the warm start's rows and the rows timed to price a read) where it stops after the first,
    two where it goes on (forced off: the set-up as before), and the notes say which."""
    small_ladder(monkeypatch, mode)
    data, _ = tm.models.LogisticRegression.simulate(20000, d=3, seed=1)
    paths = {k: str(tmp_path / f"{k}.npy") for k in data}
    for k, p in paths.items():
        np.save(p, np.asarray(data[k]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = tm.sample(tm.models.LogisticRegression(), tm.data.from_npy(paths), num_samples=200, num_warmup=100,
                        num_chains=2, seed=0, progress=False)
    full = int(res.setup_items // 20000)
    if mode == "always":
        assert res.resume_info["start_info"]["one_pass"] is True
        assert any("set-up in one full pass (forced)" in m for m in res.notes)
    else:  # (forced off: the rule is not asked, the set-up as before)
        assert "one_pass" not in res.resume_info["start_info"] and not any("full pass" in m for m in res.notes)
    assert (full == 1) if mode == "always" else (full >= 2), (res.setup_items, res.notes)


def test_a_resumed_one_pass_run_widens_its_table_to_the_chains(monkeypatch, tmp_path):
    """A one-pass run cut and resumed: the table (not stored) is made again in a pass of its own from the centre the
    chains carry, its region widened to their proposals' mean, so the resumed steps read about as many items as the
    run's own (not the fallback's N), and every chain's proposal stays at the surrogate's mode."""
    import os

    small_ladder(monkeypatch, "always")
    data, _ = tm.models.LogisticRegression.simulate(20000, d=3, seed=1)
    kw = dict(num_warmup=300, num_chains=2, seed=0, progress=False, num_samples=600)

    def stop(info):
        if info["phase"] == "sampling" and info["done"] >= 200:
            raise KeyboardInterrupt

    cut = tm.sample(tm.models.LogisticRegression(), data, callback=stop, chunk_size=100, **kw)
    assert cut.partial and any("set-up in one full pass (forced)" in m for m in cut.notes)
    path = os.fspath(tmp_path / "cut.npz")
    cut.save(path)
    kw["num_warmup"] = int(cut.resume_info["warmup_done"])  # (with the warmup's MALA pilot where it ran one)
    resumed = tm.sample(tm.models.LogisticRegression(), data, resume=tm.load_result(path), **kw)
    assert any("made in one pass of N" in m for m in resumed.notes), resumed.notes
    before = float(np.mean(np.asarray(cut.stats["n_data"])))
    after = float(np.mean(np.asarray(resumed.stats["n_data"])[:, 200:]))
    assert after < 5 * before + 5 and after < 2000  # (the fallback would read N = 20,000 a step)


@pytest.mark.parametrize("steps, attempt", [(5000, True), (10**12, False)])
def test_the_prescreen_skips_only_a_hopeless_attempt(monkeypatch, steps, attempt):
    """Before the first pass, from a warm sub-sample's rows: the one-pass table is attempted unless its predicted
    cost exceeds even a slow pass's (here made so by a run of 10^12 steps)."""
    monkeypatch.setattr(one_pass, "MODE", "auto")
    model = tm.models.LogisticRegression()
    data, _ = tm.models.LogisticRegression.simulate(20000, d=3, seed=1)
    rows = {k: np.asarray(v) for k, v in data.items()}
    flat0, unravel = ravel_pytree(model.init(jax.tree_util.tree_map(jnp.asarray, data)))
    X = rows["X"].astype(np.float64)
    h_lik = -(X.T @ X) * 0.2 * (10**8 / 20000)  # (about the logistic Hessian, the sub-sample scaled to N = 10^8)
    got = one_pass.prescreen(one_pass.OnePassPlan(steps, rows), model.factor_bound(), model, unravel, rows,
                             2**20, 10**8, np.zeros(flat0.shape[0]), h_lik)
    assert got is attempt
