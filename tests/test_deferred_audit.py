"""The self-audit taken after each chunk by its own program (``programs.audit_runner``) records what the chain's
inline audit records: the same audited steps, the same exact decisions (the same key, so the same u) and the
same items, and the draws do not change. The negative control feeds the deferred pass another key: the
comparison then fails, so it can tell a wrong u from the right one."""

import jax
import numpy as np
import pytest

import tallmh as tm
from tallmh.run import _exec_cache, programs


def _run(monkeypatch, defer=True, other_key=False):
    programs.RUNNERS.clear()
    if not defer:
        monkeypatch.setattr(programs, "defer_audit", lambda run: False)
    if other_key:
        real = programs.audit_runner

        def shifted(kernel, slots):
            fn = real(kernel, slots)
            return jax.jit(lambda args, *rest: fn(args._replace(key=jax.vmap(jax.vmap(
                lambda k: jax.random.fold_in(k, 1)))(args.key)), *rest))

        monkeypatch.setattr(programs, "audit_runner", shifted)
        # (neither the right program from the disk, nor this one left there for later runs)
        monkeypatch.setattr(_exec_cache, "load", lambda key: None)
        monkeypatch.setattr(_exec_cache, "store", lambda key, compiled: None)
    data, _ = tm.models.LogisticRegression.simulate(3000, d=3, seed=3)
    r = tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Austerity(error=0.1, batch_size=100),
                  proposal=tm.proposals.RandomWalk(0.05), num_samples=200, num_warmup=40, num_chains=3, audit=0.25,
                  seed=2, progress=False)
    monkeypatch.undo()
    programs.RUNNERS.clear()
    return r


def _audits(r):
    return {k: np.concatenate([np.asarray(r.warmup_stats[k]), np.asarray(r.stats[k])], axis=1)
            for k in ("audited", "audit_exact", "audit_items", "accepted")}


def test_deferred_audit_records_what_the_inline_audit_does(monkeypatch):
    inline = _run(monkeypatch, defer=False)
    deferred = _run(monkeypatch)
    a, b = _audits(inline), _audits(deferred)
    assert 20 < a["audited"].sum() < a["audited"].size  # audited and unaudited steps, in every chain
    aud = a["audited"]
    assert 0 < a["audit_exact"][aud].sum() < aud.sum()  # both exact decisions among the audited steps
    for k in a:
        np.testing.assert_array_equal(b[k], a[k], err_msg=k)
    np.testing.assert_array_equal(np.asarray(deferred.flat_samples), np.asarray(inline.flat_samples))
    assert deferred.audit["audit_steps"] == inline.audit["audit_steps"]
    assert deferred.audit["audit_wrong"] == inline.audit["audit_wrong"]


def test_deferred_audit_with_another_key_is_told_apart(monkeypatch):
    """Negative control: the deferred pass given another key (another u) disagrees with the inline audit."""
    inline = _run(monkeypatch, defer=False)
    wrong = _run(monkeypatch, other_key=True)
    a, b = _audits(inline), _audits(wrong)
    np.testing.assert_array_equal(b["audited"], a["audited"])  # the same steps audited
    with pytest.raises(AssertionError):
        np.testing.assert_array_equal(b["audit_exact"], a["audit_exact"])


def test_deferred_audit_with_64_bit_jax():
    """With JAX's 64-bit mode on (as the PyMC front end runs), the chain with its audits left to the audit's
    program compiles and audits (the audit uniform is float64 there, the parameters float32 or float64)."""
    programs.RUNNERS.clear()
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=4)
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)  # (the global switch; a context: the test below)
    try:
        r = tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Austerity(error=0.1, batch_size=100),
                      num_samples=60, num_warmup=30, num_chains=2, audit=0.3, seed=1, progress=False)
    finally:
        jax.config.update("jax_enable_x64", before)
        programs.RUNNERS.clear()
    assert r.audit["audit_steps"] > 5


@pytest.mark.parametrize("setting, value", [("enable_x64", True), ("threefry_partitionable", None)])
def test_a_call_inside_a_jax_context_runs_with_it_in_every_thread(setting, value):
    """``with jax.enable_x64(True): tm.sample(...)`` (or another of JAX's per-thread settings): the set-up,
    the chain's compile and the audits run in tallmh's own threads, where the caller's context does not hold
    unless carried there; the run is the same, draw for draw, as with the global switch (before, a 64-bit
    context's run made its start points and chain in float32)."""
    name = "jax_" + setting
    before = getattr(jax.config, name)
    if value is None:
        value = not before  # (the setting away from its default)
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=4)
    data = {k: np.asarray(v, np.float64) for k, v in data.items()}
    kw = dict(test=tm.acceptance.Austerity(error=0.1, batch_size=100), num_samples=60, num_warmup=30, num_chains=2,
              audit=0.3, seed=1, progress=False)
    programs.RUNNERS.clear()
    jax.config.update(name, value)
    try:
        ref = tm.sample(tm.models.LogisticRegression(), data, **kw)
    finally:
        jax.config.update(name, before)
        programs.RUNNERS.clear()
    try:
        with getattr(jax, setting)(value):
            r = tm.sample(tm.models.LogisticRegression(), data, **kw)
    finally:
        programs.RUNNERS.clear()
    plain = tm.sample(tm.models.LogisticRegression(), data, **kw)  # negative control: the setting matters here
    programs.RUNNERS.clear()
    assert r.flat_samples.dtype == ref.flat_samples.dtype
    np.testing.assert_array_equal(r.flat_samples, ref.flat_samples)
    assert r.audit["audit_steps"] == ref.audit["audit_steps"] > 5
    assert plain.flat_samples.dtype != ref.flat_samples.dtype or not np.array_equal(plain.flat_samples,
                                                                                     ref.flat_samples)
