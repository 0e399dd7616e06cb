"""Inference programs run through ``tm.sample(model, data, program=...)`` with everything the runner gives:
chunks, progress, Ctrl-C with the draws kept, checkpoints, bit-exact resume, a verdict, ArviZ by site name."""

import os
import sys

import numpy as np
import pytest

import tallmh as tm
from tallmh.blocks.kernel import block_stats
from tallmh.blocks.models import TwoComponentMixture
from tallmh.errors import ConfigError

X = np.array([-1.5, -0.3, 0.4, 1.8, 2.5, 0.9, 1.1, -0.7], np.float32)


def _program():
    return tm.Cycle([
        tm.blocks.MH("pi", scale=1.0),
        tm.blocks.Gibbs("z", items_per_step=len(X)),
        tm.blocks.SubsampledMH("mu", test=tm.acceptance.Exact(chunk=8), scale=1.5, group_by="z"),
    ])


def _run(**kw):
    base = dict(program=_program(), num_samples=120, num_warmup=30, num_chains=2, seed=3, progress=False,
                chunk_size=16)
    base.update(kw)
    return tm.sample(TwoComponentMixture(), X, **base)


def test_program_runs_interrupts_and_resumes_bit_exactly(tmp_path):
    full = _run()
    assert full.samples["mu"].shape == (2, 120, 2) and full.samples["z"].shape == (2, 120, len(X))
    assert full.samples["z"].dtype.kind == "i"
    stats = block_stats(full.stats, full.test.labels)
    assert set(stats) == {"mh(pi)", "gibbs(z)", "subsampled_mh(mu, exact)"}
    # every step: MH on pi reads no data (its conditional is the counts), Gibbs reads all 8 items, the
    # grouped subsampled block reads each cluster's members: 8 in all
    np.testing.assert_array_equal(full.stats["n_data"], 16)
    assert full.verdict.startswith(("trusted", "NOT trusted"))
    assert full.audit["audit_steps"] == 0  # (every decision here is exact: nothing to audit)
    idata = full.to_arviz()
    assert {"pi", "mu", "z"} <= set(idata.posterior.data_vars)

    seen = []

    def stop_after_two(info):
        seen.append(info)
        if info["phase"] == "sampling" and info["done"] >= 32:
            raise KeyboardInterrupt

    cut = _run(callback=stop_after_two)
    assert cut.partial and cut.flat_samples.shape[1] == 32
    np.testing.assert_array_equal(cut.flat_samples, full.flat_samples[:, :32])
    path = os.fspath(tmp_path / "prog.npz")
    cut.save(path)
    loaded = tm.load_result(path)
    assert set(loaded.samples) == {"pi", "mu", "z"}
    resumed = tm.sample(TwoComponentMixture(), X, resume=loaded, num_samples=120, num_warmup=30, progress=False)
    assert not resumed.partial
    np.testing.assert_array_equal(resumed.flat_samples, full.flat_samples)
    np.testing.assert_array_equal(resumed.stats["block2_n_data"], full.stats["block2_n_data"])


def test_program_checkpoint_and_progress(tmp_path, capsys):
    path = os.fspath(tmp_path / "ck.npz")
    r = _run(checkpoint=path, progress=True, num_samples=40)
    err = capsys.readouterr().err
    assert "tallmh[program]" in err
    loaded = tm.load_result(path)
    np.testing.assert_array_equal(loaded.flat_samples, r.flat_samples)
    assert loaded.label == r.label and r.label.startswith("cycle(mh(pi)")


def test_program_refuses_what_belongs_to_the_blocks():
    with pytest.raises(ConfigError, match="blocks carry their own tests"):
        _run(test=tm.acceptance.Exact())
    with pytest.raises(ConfigError, match="not its rows"):
        _run(mesh=_rows_mesh())


def _rows_mesh():
    import jax
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:1] * 2, dtype=object).reshape(1, 2), ("chains", "rows"))


def test_program_on_a_one_device_mesh_takes_the_sharded_path_and_matches():
    """A 1 x 1 mesh runs the program through shard_map (chains one after another inside): the same draws."""
    plain = _run(num_samples=24, num_warmup=8, mesh=False)
    meshed = _run(num_samples=24, num_warmup=8, mesh=tm.distributed.make_mesh(chains=1, rows=1))
    assert any(n.startswith("layout") for n in meshed.notes)
    np.testing.assert_array_equal(plain.flat_samples, meshed.flat_samples)
    np.testing.assert_array_equal(plain.stats["block2_n_data"], meshed.stats["block2_n_data"])
    other = _run(num_samples=24, num_warmup=8, mesh=tm.distributed.make_mesh(chains=1, rows=1), seed=4)
    assert not np.array_equal(plain.flat_samples, other.flat_samples)  # (the comparison can fail)


def test_sample_program_alias_thins_and_sums_stats():
    res = tm.sample_program(_program(), TwoComponentMixture(), X, num_samples=30, num_chains=2, seed=0, thin=3)
    assert res.samples["mu"].shape == (2, 30, 2)
    assert res.stats["gibbs(z)"]["n_data"].shape == (2, 30)
    np.testing.assert_array_equal(res.stats["gibbs(z)"]["n_data"], 3 * len(X))
    assert res.items_per_step()["gibbs(z)"] == len(X)
    np.testing.assert_array_equal(res.samples["mu"], res.run.samples["mu"][:, 2::3])


@pytest.mark.slow
@pytest.mark.parametrize("which", ["sv", "jointdpm"])
def test_numpyro_programs_through_sample_resume_bit_exactly(which, tmp_path):
    """The NumPyro stochastic-volatility and JointDPM programs: Ctrl-C, checkpoint, bit-exact resume, names."""
    from tallmh.blocks import numpyro_models as nm
    from tallmh.blocks.models import JointDPM, StochasticVolatility

    if which == "sv":
        x, _ = StochasticVolatility.simulate(40, 5, phi=0.95, sigma=0.1, seed=0)
        model, data = tm.blocks.from_numpyro(nm.stochastic_volatility, x)
        test = tm.acceptance.Austerity(epsilon=0.05, batch_size=20)
        program = tm.Cycle([tm.blocks.ParticleGibbs("eps", particles=4, window=3, series_per_step=10),
                            tm.blocks.SubsampledMH("phi", test=test, scale=0.3),
                            tm.blocks.SubsampledMH("sigma2", test=test, scale=0.3)])
        names = {"phi", "sigma2"}
    else:
        train, _ = JointDPM.simulate(200, n_test=10, seed=0)
        model, data = tm.blocks.from_numpyro(nm.joint_dpm, train["X"], train["y"], K=4, state=("z",))
        program = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=50),
                            tm.blocks.SubsampledMH("w", test=tm.acceptance.Austerity(epsilon=0.3, batch_size=20),
                                                   scale=0.2, group_by="z")])
        names = {"w"}
    kw = dict(program=program, num_samples=40, num_warmup=8, num_chains=2, seed=1, progress=False, chunk_size=8)
    full = tm.sample(model, data, **kw)

    def stop(info):
        if info["phase"] == "sampling" and info["done"] >= 16:
            raise KeyboardInterrupt

    path = os.fspath(tmp_path / "run.npz")
    cut = tm.sample(model, data, callback=stop, checkpoint=path, **kw)
    assert cut.partial and cut.flat_samples.shape[1] == 16
    resumed = tm.sample(model, data, resume=tm.load_result(path), num_samples=40, num_warmup=8, progress=False)
    np.testing.assert_array_equal(resumed.flat_samples, full.flat_samples)
    assert names <= set(resumed.to_arviz().posterior.data_vars)
    assert resumed.verdict



def test_a_program_audits_its_approximate_blocks():
    """Audited steps take the exact decision beside every approximate one (same u); the chain is unchanged.
    Negative control: a sloppy test (two items per look, epsilon 0.45) disagrees with exact MH far more often."""
    rng = np.random.default_rng(0)
    x = np.where(rng.random(400) < 0.3, rng.normal(-1, 1, 400), rng.normal(1.5, 1, 400)).astype(np.float32)

    def prog(test):
        return tm.Cycle([tm.blocks.MH("pi", scale=0.5), tm.blocks.Gibbs("z", items_per_step=100),
                         tm.blocks.SubsampledMH("mu", test=test, scale=0.3, group_by="z")])

    kw = dict(num_samples=150, num_warmup=0, num_chains=2, seed=5, progress=False)
    good = prog(tm.acceptance.Austerity(epsilon=0.01, batch_size=40))
    a = tm.sample(TwoComponentMixture(), x, program=good, audit=1.0, **kw)
    b = tm.sample(TwoComponentMixture(), x, program=good, audit=0.0, **kw)
    np.testing.assert_array_equal(a.flat_samples, b.flat_samples)  # the audit does not touch the chain
    au = a.audit
    assert au["audit_steps"] == 2 * 150 * 2  # every step, both clusters' decisions, both chains
    assert au["audit_items"] > 0 and b.audit["audit_steps"] == 0
    sloppy = tm.sample(TwoComponentMixture(), x, program=prog(tm.acceptance.Austerity(epsilon=0.45, batch_size=2)),
                       audit=1.0, **kw)
    bad = sloppy.audit
    assert bad["audit_rate"] > 0.1 and bad["audit_ci"][0] > au["audit_ci"][1]
    assert "self-audit" in str(sloppy.summary())


def test_the_default_audit_budget_counts_each_repeat_of_an_approximate_block():
    """An audited program step reads the data once per approximate block and per repeat: the default audit count
    divides the item cap by that, so a repeated block gets proportionally fewer audited steps."""
    from tallmh.run import runstate, selfaudit

    aust = tm.acceptance.Austerity(epsilon=0.05, batch_size=4)
    one = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=len(X)),
                    tm.blocks.SubsampledMH("mu", test=aust, scale=1.0, group_by="z")])
    three = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=len(X)),
                      tm.blocks.Repeat(tm.blocks.SubsampledMH("mu", test=aust, scale=1.0, group_by="z"), 3)])
    assert one.audit_passes() == 1 and three.audit_passes() == 3 and _program().audit_passes() == 0

    def rate(program, n):
        run = runstate.Run.__new__(runstate.Run)
        run.n, run.test, run.audit, run.is_exact, run.auto_draws = n, program, None, False, False
        run.num_chains, run.num_warmup, run.num_samples, run.notes = 2, 1000, 10**6, []
        selfaudit.audit_rates(run)
        return run.rates[0], run.notes

    r1, _ = rate(one, 10**7)
    r3, notes = rate(three, 10**7)
    steps = 2 * (1000 + 10**6)
    cap = selfaudit.DEFAULT_AUDIT_ITEMS
    assert round(r1 * steps) == cap // 10**7 and round(r3 * steps) == cap // (3 * 10**7) < round(r1 * steps)
    assert any("3 times" in n for n in notes)
