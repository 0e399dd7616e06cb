"""The runner: reproducibility, chain streams, pytree parameters, interruption, ArviZ output."""

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm


@pytest.fixture(scope="module")
def problem():
    data, _ = tm.models.LogisticRegression.simulate(2000, d=2, seed=1)
    return tm.models.LogisticRegression(), data


def _run(model, data, **kw):
    base = dict(test=tm.acceptance.Austerity(epsilon=0.05, batch_size=200), num_samples=200, num_warmup=100,
                num_chains=3, seed=0, progress=False)
    base.update(kw)
    return tm.sample(model, data, **base)


@pytest.mark.slow
def test_same_seed_same_draws_and_chains_differ(problem):
    model, data = problem
    a = _run(model, data)
    b = _run(model, data)
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.stats["n_data"], b.stats["n_data"])
    assert not np.array_equal(a.samples[0], a.samples[1])
    c = _run(model, data, seed=1)
    assert not np.array_equal(a.samples, c.samples)
    # draws do not depend on how the run is chunked
    d = _run(model, data, chunk_size=37)
    np.testing.assert_array_equal(a.samples, d.samples)


def test_shapes_stats_and_summary(problem):
    model, data = problem
    r = _run(model, data)
    assert r.samples.shape == (3, 200, 3)
    for k in ("accepted", "n_data", "rounds"):
        assert r.stats[k].shape == (3, 200)
    assert np.all(r.stats["n_data"] >= 200) and np.all(r.stats["n_data"] <= 2000)
    s = r.summary()
    assert list(s.table.index) == ["theta[0]", "theta[1]", "theta[2]"]
    assert 0 < s.overall["acceptance_rate"] < 1
    assert 0 < s.overall["data_fraction"] <= 1
    assert "ESS" in str(s)


def test_to_arviz(problem):
    model, data = problem
    idata = _run(model, data).to_arviz()
    assert idata.posterior["theta"].shape == (3, 200, 3)
    for k in ("is_accepted", "acceptance_rate", "n_data", "data_fraction"):
        assert k in idata.sample_stats
    assert idata.sample_stats["data_fraction"].values.max() <= 1.0
    assert "warmup_posterior" in tm.diagnostics.group_names(idata)


@pytest.mark.slow
def test_pytree_parameters():
    rng = np.random.default_rng(0)
    data = {"x": 1.0 + 2.0 * rng.standard_normal(3000)}

    def log_lik(th, b):
        return -0.5 * ((b["x"] - th["mu"]) / jnp.exp(th["log_sd"])) ** 2 - th["log_sd"]

    model = tm.Model(log_prior=lambda th: 0.0 * th["mu"], log_lik=log_lik)
    r = tm.sample(model, data, test=tm.acceptance.Austerity(0.05, 300), num_samples=300, num_warmup=300,
                  num_chains=2, init={"mu": 0.9, "log_sd": 0.7}, progress=False)
    assert set(r.samples) == {"mu", "log_sd"}
    assert r.samples["mu"].shape == (2, 300)
    assert abs(r.samples["mu"].mean() - 1.0) < 0.2
    assert set(r.to_arviz().posterior.data_vars) == {"mu", "log_sd"}
    assert r.param_names == ["log_sd", "mu"]


def test_interrupt_returns_partial_draws(problem):
    model, data = problem
    calls = {"n": 0}

    def ctrl_c_on_third_chunk(info):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt

    r = _run(model, data, num_warmup=40, num_samples=200, chunk_size=40, callback=ctrl_c_on_third_chunk)
    assert r.partial
    assert r.num_draws == 80  # warmup chunk, then two sampling chunks completed before Ctrl-C
    assert r.samples.shape == (3, 80, 3)
    assert r.summary().overall["partial"]


@pytest.mark.slow
def test_exact_counts_setup_pass(problem):
    model, data = problem
    r = _run(model, data, test=tm.acceptance.Exact(), num_samples=20, num_warmup=0)
    assert np.all(r.stats["n_data"] == 2000)
    passes = r.resume_info["start_info"]["newton_passes"]  # the mode search and the Laplace sums
    assert passes >= 2
    # model set-up pass + Newton passes + the pass naming degenerate columns; LogisticRegression gives log_lik_ratio, so the exact test sums
    # per-item ratios and keeps no full log-likelihood (no initial pass per chain)
    assert r.setup_items == 2000 + passes * 2000 + 2000  # (+ the check of X for degenerate columns)
    # a model without log_lik_ratio: the exact test tracks the log-likelihood, one initial pass per chain
    plain = tm.Model(log_prior=model.log_prior, log_lik=model.log_lik, init=model.init)
    r2 = _run(plain, data, test=tm.acceptance.Exact(), num_samples=20, num_warmup=0)
    passes2 = r2.resume_info["start_info"]["newton_passes"]
    assert r2.setup_items == passes2 * 2000 + 3 * 2000
    np.testing.assert_allclose(r2.flat_samples.mean(axis=(0, 1)), r.flat_samples.mean(axis=(0, 1)), atol=0.2)


def test_decide_matches_decision_fn(problem):
    model, data = problem
    import jax

    th = jnp.array([0.1, 0.2, -0.1])
    thp = th + 0.05
    key = jax.random.PRNGKey(3)
    acc, nd = tm.decide(tm.acceptance.Exact(), model, data, th, thp, key)
    assert isinstance(acc, bool) and nd == 2000
    acc2, _ = tm.decision_fn(tm.acceptance.Exact(), model, data)(th, thp, key)
    assert acc == bool(acc2)


def test_an_approximate_test_without_control_variates_is_told_while_it_runs():
    import warnings

    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=2)
    kw = dict(test=tm.acceptance.Austerity(error=0.05), num_samples=20, num_warmup=20, num_chains=2,
              progress=False, audit=0)
    with pytest.warns(RuntimeWarning, match="without control variates read"):
        r = tm.sample(tm.models.LogisticRegression(), data, **kw)
    assert any("control_variates=tm.ControlVariates()" in n for n in r.notes)
    # with control variates it reads a few hundred items a step and says nothing of the kind
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        r = tm.sample(tm.models.LogisticRegression(), data, control_variates=tm.ControlVariates(), **kw)
    assert not any("without control variates" in str(w.message) for w in seen)
    assert not any("without control variates" in n for n in r.notes)


def test_auto_warmup_is_short_only_where_only_a_step_size_is_tuned(tmp_path):
    """num_warmup="auto": 300 steps for preconditioned Langevin from the Laplace approximation at the mode (said in
    the notes; kept by a resumed run); 1,000 for adaptive Metropolis, which learns a covariance."""
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=2)
    model = tm.models.LogisticRegression()
    kw = dict(num_samples=10, num_chains=2, progress=False, audit=0, seed=1)
    r = tm.sample(model, data, **kw)
    assert r.flat_warmup.shape[1] == 300 and any(n.startswith("num_warmup='auto': 300") for n in r.notes)
    am = tm.sample(model, data, test=tm.acceptance.Austerity(error=0.05), proposal=tm.proposals.AdaptiveMetropolis(),
                   **kw)
    assert am.flat_warmup.shape[1] == 1000 and not any(n.startswith("num_warmup=") for n in am.notes)

    def stop(info):
        if info["phase"] == "warmup" and info["done"] >= 100:
            raise KeyboardInterrupt

    cut = tm.sample(model, data, callback=stop, chunk_size=50, **kw)
    assert cut.partial and cut.flat_samples.shape[1] == 0
    path = str(tmp_path / "ck.npz")
    cut.save(path)
    resumed = tm.sample(model, data, resume=tm.load_result(path), chunk_size=50, **kw)
    assert resumed.flat_warmup.shape[1] == 300 and resumed.flat_samples.shape[1] == 10
    with pytest.raises(tm.errors.ConfigError, match="num_warmup"):
        tm.sample(model, data, num_warmup="long", **kw)


def test_a_chain_on_an_accelerator_says_so(problem, monkeypatch):
    """On a GPU the chain's small sequential reads are latency-bound (measured slower than the host's CPU):
    the run's notes say where it ran and how to run on the CPU; a CPU run says nothing of the kind."""
    from tallmh.run import configure

    model, data = problem
    cpu = _run(model, data, num_samples=20, num_warmup=20, num_chains=2)
    assert not any("JAX_PLATFORMS=cpu" in n for n in cpu.notes)
    monkeypatch.setattr(configure.jax, "default_backend", lambda: "gpu")
    gpu = _run(model, data, num_samples=20, num_warmup=20, num_chains=2)
    assert any("ran on the gpu" in n and "JAX_PLATFORMS=cpu" in n for n in gpu.notes)


def test_run_keys_hashed_on_the_host_are_jax_keys():
    """The run's keys, hashed in NumPy (``rng.threefry2x32``), are ``jax.random``'s bit for bit under both
    settings of ``jax_threefry_partitionable``; the negative control: the two settings' keys differ, so the
    comparison can tell one hashing from another."""
    from tallmh.run import rng

    before = jax.config.jax_threefry_partitionable
    got = {}
    try:
        for part in (True, False):
            jax.config.update("jax_threefry_partitionable", part)
            for seed in (0, 1, 42, 2**31 - 1, -1, -2**31):
                for c in (1, 3, 4, 16):
                    mine = rng.run_keys(seed, c)
                    k_chains, k_jit, k_audit = jax.random.split(jax.random.PRNGKey(seed), 3)
                    theirs = (jax.random.split(k_chains, c), k_jit, k_audit)
                    for a, b in zip(mine, theirs):
                        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
                    got[part, seed, c] = np.asarray(mine[0])
    finally:
        jax.config.update("jax_threefry_partitionable", before)
    assert not np.array_equal(got[True, 0, 4], got[False, 0, 4])


def test_step_keys_hashed_on_the_host_are_jax_fold_ins():
    """The chunk's step keys (``rng.step_keys``: ``fold_in(fold_in(key, phase), step)`` per chain and for the
    audit key), hashed in NumPy, are ``jax.random.fold_in``'s bit for bit under both settings of
    ``jax_threefry_partitionable``, and so are those of the compiled fallback (keys that are not raw Threefry keys
    take it; here forced); the negative control: a step off by one gives other keys."""
    from tallmh.run import rng as run_rng

    before = jax.config.jax_threefry_partitionable
    rng = np.random.default_rng(7)
    try:
        for part in (True, False):
            jax.config.update("jax_threefry_partitionable", part)
            chain_keys = rng.integers(0, 2**32, size=(3, 2), dtype=np.uint64).astype(np.uint32)
            k_audit = rng.integers(0, 2**32, size=2, dtype=np.uint64).astype(np.uint32)
            for phase, start, length in ((0, 0, 5), (1, 1234, 7), (1, 2**31 - 3, 2)):
                want_s = np.array([[np.asarray(jax.random.fold_in(jax.random.fold_in(k, phase), start + i))
                                    for i in range(length)] for k in chain_keys])
                want_a = np.array([np.asarray(jax.random.fold_in(jax.random.fold_in(k_audit, phase), start + i))
                                   for i in range(length)])
                ks, ka = run_rng.step_keys(chain_keys, k_audit, phase, start, length)
                np.testing.assert_array_equal(ks, want_s)
                np.testing.assert_array_equal(ka, want_a)
                if start + length < 2**31:
                    with mock.patch.object(run_rng, "host_keys", lambda keys: False):
                        ks2, ka2 = run_rng.step_keys(chain_keys, k_audit, phase, start, length)
                    np.testing.assert_array_equal(np.asarray(ks2), want_s)
                    np.testing.assert_array_equal(np.asarray(ka2), want_a)
                off, _ = run_rng.step_keys(chain_keys, k_audit, phase, start + 1, length)
                assert not np.array_equal(off, want_s)
    finally:
        jax.config.update("jax_threefry_partitionable", before)
