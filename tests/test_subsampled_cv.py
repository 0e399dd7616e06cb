"""Control variates in a grouped :class:`tallmh.blocks.SubsampledMH` (K logistic regressions whose items move
between clusters by Gibbs): the per-cluster sums stay equal to the current population's (so decisions are
those of exact MH up to float error), a step reads O(batch) items, the refresh cost is counted apart, the
chains vectorise without a per-step copy of the data, and what cannot be kept exact is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh.blocks.kernel import block_stats, build_program_kernel
from tallmh.blocks.models import GroupedLogistic, StochasticVolatility
from tallmh.blocks.subsampled import SubsampledMH, _SiteProblem
from tallmh.errors import ConfigError
from tallmh.kernel import make_problem

W = np.array([[1.0, -0.5, 0.3], [-0.8, 1.2, -0.2], [0.5, 0.5, 0.0]], np.float32)


def _data(n, model=GroupedLogistic(), seed=0):
    data, _ = model.simulate(n, W, seed=seed)
    return {k: jnp.asarray(v) for k, v in data.items()}


def _block(test=None, cv=True, **kw):
    return SubsampledMH("w", test=test or tm.acceptance.Austerity(epsilon=0.05, batch_size=50), scale=0.05,
                        group_by="z", control_variates=tm.ControlVariates(**kw) if cv else None)


def _chain_after(model, data, block, steps, gibbs=200):
    """(state at the start, state after ``steps`` steps, the last step's statistics) of one chain."""
    n = data["y"].shape[0]
    prog = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=gibbs), block])
    kern, init_states, *_ = build_program_kernel(prog, model, data, n)
    st0 = jax.tree_util.tree_map(lambda a: a[0], init_states(jax.random.split(jax.random.PRNGKey(0), 1)))

    @jax.jit
    def run(st, data):
        def body(s, i):
            return kern.step(jax.random.PRNGKey(i), s, data, jnp.int32(0), False)

        st, infos = jax.lax.scan(body, st, jnp.arange(steps))
        return st, jax.tree_util.tree_map(lambda a: a[-1], infos)

    return (st0, *run(st0, data))


@jax.jit
def _log_ratios(data, st, key):
    """Per cluster: the full-population log acceptance ratio (less the proposal and prior) of a random move of
    its row, computed without control variates and with the block's current sums (members past a cluster's
    count are masked out)."""
    model = GroupedLogistic()
    vals = st.program.values
    cvs = st.program.blocks[1][1]
    mem = st.program.members["z"]
    out = []
    n = mem.lists.shape[1]
    for k in range(W.shape[0]):
        problem = _SiteProblem(model, "w", lambda v: v, vals, (), data)
        th = vals["w"][k]
        thp = th + 0.05 * jax.random.normal(jax.random.fold_in(key, k), th.shape)
        cv = cvm.CVState(cvs.center[k], cvs.grad_sum[k], cvs.hess_sum[k])
        args = (problem, data, mem.counts[k], lambda v: v, None, th, thp, jnp.float32(0.0))
        reader = dict(reader=lambda _, pos, k=k: mem.lists[k, pos])
        pos = jnp.arange(n)
        mask = pos < mem.counts[k]
        plain = make_problem(*args, **reader)
        with_cv = make_problem(*args, cv=cv, **reader)
        out.append(jnp.stack([jnp.sum(jnp.where(mask, plain.lik_ratio(pos), 0.0)) + plain.log_base,
                              jnp.sum(jnp.where(mask, with_cv.lik_ratio(pos), 0.0)) + with_cv.log_base]))
    return jnp.stack(out)


def test_cv_sums_follow_the_moves_and_decide_as_exact_mh():
    """After Gibbs moves on z (random start: most items move), each cluster's sums equal those made afresh over
    its current members, and the log acceptance ratio through the control variates equals the plain one.
    Negative control: the same state with the sums as they were before the moves (not refreshed) is off by
    far more."""
    model = GroupedLogistic(init_z="random")
    data = _data(2000, model)
    block = _block(center=W, recenter=False)
    st0, st, info = _chain_after(model, data, block, 5)
    cvs = st.program.blocks[1][1]
    assert int(st.program.members["z"].journal.total) == 5 * 200 == int(cvs.seen)
    assert int(info["block1_refresh_items"]) == 200  # this step's 200 moves, read once each
    g, h = jax.jit(lambda v, c: block._full_sums(model, v, (), data, 2000, c))(st.program.values, cvs.center)
    scale = float(jnp.max(jnp.abs(g)))
    stale = st._replace(program=st.program._replace(blocks=(st.program.blocks[0], st0.program.blocks[1])))
    errs = {}
    for name, s in (("fresh", st), ("stale", stale)):
        ratios = np.asarray(_log_ratios(data, s, jax.random.PRNGKey(9)))
        errs[name] = (float(jnp.max(jnp.abs(g - s.program.blocks[1][1].grad_sum))) / scale,
                      np.max(np.abs(np.diff(ratios, axis=1))))
    np.testing.assert_allclose(h, cvs.hess_sum, atol=1e-5 * float(jnp.max(jnp.abs(h))))
    assert errs["fresh"][0] < 1e-5 and errs["fresh"][1] < 0.02  # float error (ratios are O(10)-O(100) here)
    assert errs["stale"][0] > 0.1 and errs["stale"][1] > 5.0


def test_cv_reads_a_batch_per_decision_and_counts_its_refreshes():
    """N = 20,000 items in 3 clusters, Gibbs moving 100 items per step: with control variates a decision reads
    about one batch (100) of its cluster's ~6,700 items; without, the same test at the same epsilon reads
    over ten times more. The refresh cost is counted apart and in n_data: the set-up pass and 4 warmup
    recentrings (N each) and the 100 moves of each step."""
    n, batch, warm = 20_000, 100, 70
    model = GroupedLogistic()
    data = _data(n, model)
    z0 = jnp.argmin(jnp.sum((data["X"][:, None] - jnp.asarray(model.means)[None]) ** 2, -1), -1).astype(jnp.int32)
    start = ({"w": jnp.asarray(W), "z": z0}, ())  # near the posterior: the claim is about steps there
    per_decision, refresh = {}, {}
    for cv in (True, False):
        block = SubsampledMH("w", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=batch), scale=0.03,
                             group_by="z", control_variates=tm.ControlVariates() if cv else None)
        prog = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=100), block])
        r = tm.sample(model, data, program=prog, num_samples=40, num_warmup=warm, num_chains=1, seed=0,
                      init=start, progress=False)
        st = block_stats(r.stats, r.test.labels)[block.label]
        rf = np.asarray(st["refresh_items"]) if cv else 0
        per_decision[cv] = float(np.mean(np.asarray(st["n_data"]) - rf)) / 3
        np.testing.assert_array_equal(r.stats["n_data"], r.stats["block0_n_data"] + r.stats["block1_n_data"])
        assert r.verdict.startswith(("trusted", "NOT trusted"))
        if cv:
            refresh = (np.asarray(st["refresh_items"]), np.asarray(r.warmup_stats["block1_refresh_items"]))
    assert per_decision[True] < 2 * batch
    assert per_decision[False] > 10 * per_decision[True]
    np.testing.assert_array_equal(refresh[0], 100)
    assert int(refresh[1].sum()) == 5 * n + warm * 100
    assert int(refresh[1][0, 0]) == n + 100 and int(refresh[1][0, 7]) == n + 100  # set-up; first recentring


def _chain_sized_ops(jaxpr, shapes, out):
    """Equations whose output has one of ``shapes`` (chains x a data leaf's shape), outside branches of a
    ``cond`` (a cond left in a vmapped program has a predicate shared by the chains: it runs rarely)."""
    for eqn in jaxpr.eqns:
        out += [(eqn.primitive.name, tuple(v.aval.shape)) for v in eqn.outvars
                if (tuple(v.aval.shape), str(v.aval.dtype)) in shapes]
        if eqn.primitive.name == "cond":
            continue
        for p in eqn.params.values():
            for sub in (p if isinstance(p, (list, tuple)) else [p]):
                inner = sub if hasattr(sub, "eqns") else getattr(sub, "jaxpr", None)
                if inner is not None and hasattr(inner, "eqns"):
                    _chain_sized_ops(inner, shapes, out)
    return out


class _PerChainRecentre(SubsampledMH):
    """Negative control: recentres when *this chain's* row has moved away from its centre -- a per-chain
    branch, which vmap turns into both branches and a select, broadcasting the data to every chain."""

    def _recenter(self, model, values, aux, data, n, cvs, mem, step_index, adapt):
        far = jnp.max(jnp.abs(self._rows_now(values, cvs.center.dtype) - cvs.center)) > 0.5

        def move():
            c = self._rows_now(values, cvs.center.dtype)
            g, h = self._full_sums(model, values, aux, data, n, c)
            return cvs._replace(center=c, grad_sum=g, hess_sum=h), jnp.asarray(n, jnp.int32)

        return jax.lax.cond(far, move, lambda: (cvs, jnp.zeros((), jnp.int32)))


@pytest.mark.parametrize("cls", [SubsampledMH, _PerChainRecentre])
def test_vmapped_chains_make_no_per_step_copy_of_the_data(cls):
    """One vmapped step (3 chains, Gibbs on z then the grouped block with control variates, in warmup so the
    recentring branch is in the program) has no operation shaped chains x N x D (or chains x N for y)
    outside a shared branch; the negative control (a per-chain recentring condition) has them."""
    n, c = 1000, 3
    model = GroupedLogistic()
    data = _data(n, model)
    block = cls("w", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=50), scale=0.05, group_by="z",
                control_variates=tm.ControlVariates())
    prog = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=50), block])
    kern, init_states, *_ = build_program_kernel(prog, model, data, n)
    states = init_states(jax.random.split(jax.random.PRNGKey(0), c))
    keys = jax.random.split(jax.random.PRNGKey(1), c)
    step = jax.vmap(lambda k, s, d, i, a: kern.step(k, s, d, i, a), in_axes=(0, 0, None, None, None))
    jx = jax.make_jaxpr(step)(keys, states, data, jnp.int32(7), jnp.bool_(True))
    shapes = {((c,) + tuple(v.shape), str(v.dtype)) for v in data.values()}
    ops = _chain_sized_ops(jx.jaxpr, shapes, [])
    if cls is SubsampledMH:
        assert ops == []
        new, info = jax.jit(step)(keys, states, data, jnp.int32(7), jnp.bool_(True))  # the recentring step runs
        np.testing.assert_array_equal(info["block1_refresh_items"], 2 * n + 50)  # set-up + recentring
    else:
        assert any(name == "broadcast_in_dim" and shape == (c, n, 2) for name, shape in ops)


class _ReadsAux(GroupedLogistic):
    def local_log_density(self, site, value, values, aux, data, idx):
        return super().local_log_density(site, value * (1.0 + 0.0 * jnp.sum(aux["n"])), values, aux, data, idx)

    def init(self, key, data):
        values, _ = super().init(key, data)
        return values, {"n": jnp.zeros((3,), jnp.float32)}


class _NotPerItem(GroupedLogistic):
    def local_log_density(self, site, value, values, aux, data, idx):
        return jnp.sum(super().local_log_density(site, value, values, aux, data, idx))


class _WhileLoop(GroupedLogistic):
    def local_log_density(self, site, value, values, aux, data, idx):
        base = super().local_log_density(site, value, values, aux, data, idx)
        return jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0] * 1.0, c[1] + 1), (base, 0))[0]


def test_cv_refusals_are_one_line_config_errors():
    data = _data(200)
    gibbs = tm.blocks.Gibbs("z", items_per_step=10)
    kw = dict(num_samples=2, num_warmup=0, num_chains=1, progress=False)
    cases = [(_ReadsAux(), [gibbs, _block()], "gradients not to read the model's aux"),
             (_NotPerItem(), [_block()], "one local density per item"),
             (_WhileLoop(), [_block()], "differentiate twice")]
    for model, blocks, msg in cases:
        with pytest.raises(ConfigError, match=msg) as e:
            tm.sample(model, data, program=tm.Cycle(blocks), **kw)
        assert "\n" not in str(e.value)
    x, _ = StochasticVolatility.simulate(20, 5, seed=0)
    prog = tm.Cycle([SubsampledMH("phi", control_variates=tm.ControlVariates()), SubsampledMH("sigma2")])
    with pytest.raises(ConfigError, match="they read 'sigma2'"):
        tm.sample(StochasticVolatility(), x, program=prog, **kw)
    with pytest.raises(ConfigError, match="tm.ControlVariates"):
        SubsampledMH("w", control_variates=2)


class _StaleSums(SubsampledMH):
    """Negative control: the moves are not applied to the sums (they keep the start's populations)."""

    def _apply_moves(self, model, values, aux, data, cvs, mem):
        return cvs._replace(seen=mem.journal.total), jnp.zeros((), jnp.int32)


def _two_sample_z(a, b):
    import arviz as az

    a, b = np.asarray(a, float), np.asarray(b, float)
    zs = []
    for j in range(a.shape[-1]):
        se = np.hypot(float(az.mcse(a[..., j], method="mean")), float(az.mcse(b[..., j], method="mean")))
        zs.append(abs(a[..., j].mean() - b[..., j].mean()) / se)
    return np.array(zs)


@pytest.mark.slow
def test_cv_posterior_matches_exact_mh_and_stale_sums_do_not():
    """Gibbs on z (random start) + the grouped block: the posterior means of the 9 weights with control
    variates (austerity, epsilon 0.01) match exact MH's within MCSE (Bonferroni at p = 0.01); the same
    program whose sums ignore the moves misses by far."""
    from scipy import stats

    model = GroupedLogistic(init_z="random")
    data = _data(3000, model, seed=1)
    kw = dict(num_samples=3000, num_warmup=300, num_chains=2, progress=False)

    def run(cls, test, cv, seed):
        block = cls("w", test=test, scale=0.08, group_by="z",
                    control_variates=tm.ControlVariates(center=W, recenter=False) if cv else None)
        r = tm.sample(model, data, program=tm.Cycle([tm.blocks.Gibbs("z", items_per_step=150), block]), seed=seed,
                      **kw)
        return r.samples["w"].reshape(2, kw["num_samples"], -1), r

    exact, _ = run(SubsampledMH, tm.acceptance.Exact(), False, 2)  # (independent seeds: independent runs)
    austerity = tm.acceptance.Austerity(epsilon=0.01, batch_size=50)
    good, r_good = run(SubsampledMH, austerity, True, 3)
    bad, _ = run(_StaleSums, austerity, True, 3)
    zcrit = stats.norm.isf(0.01 / (2 * exact.shape[-1]))
    z_good, z_bad = _two_sample_z(good, exact), _two_sample_z(bad, exact)
    print(f"z good {np.round(z_good, 2)} bad {np.round(z_bad, 2)} crit {zcrit:.2f}")
    assert z_good.max() < zcrit, z_good
    assert z_bad.max() > 3 * zcrit, z_bad
    st = block_stats(r_good.stats, r_good.test.labels)["subsampled_mh(w, austerity, cv)"]
    assert np.mean(st["n_data"] - st["refresh_items"]) < 0.5 * 3000  # it did subsample


@pytest.mark.slow
def test_cv_program_through_sample_audits_and_resumes_bit_exactly(tmp_path):
    """``tm.sample(model, data, program=...)`` with the grouped control-variate block: audited decisions
    (exact test with the same u over the cluster's members) agree at this tiny epsilon, the verdict is given,
    and an interrupted run resumes bit-exactly (sums, centres and journal are in the saved program state)."""
    import os

    model = GroupedLogistic()
    data = _data(1000, model)
    prog = tm.Cycle([tm.blocks.Gibbs("z", items_per_step=20),
                     _block(test=tm.acceptance.Austerity(epsilon=1e-3, batch_size=50))])
    kw = dict(program=prog, num_samples=40, num_warmup=20, num_chains=2, seed=4, progress=False, chunk_size=8,
              audit=1.0)
    full = tm.sample(model, data, **kw)
    assert full.audit["audit_steps"] == 2 * (20 + 40) * 3 and full.audit["audit_rate"] < 0.05
    assert full.verdict and "refresh_items" in block_stats(full.stats, full.test.labels)[prog.labels[1]]

    def stop(info):
        if info["phase"] == "sampling" and info["done"] >= 16:
            raise KeyboardInterrupt

    path = os.fspath(tmp_path / "cv.npz")
    cut = tm.sample(model, data, callback=stop, checkpoint=path, **kw)
    assert cut.partial
    resumed = tm.sample(model, data, resume=tm.load_result(path), num_samples=40, num_warmup=20, progress=False)
    np.testing.assert_array_equal(resumed.flat_samples, full.flat_samples)
    np.testing.assert_array_equal(resumed.stats["block1_refresh_items"], full.stats["block1_refresh_items"])
