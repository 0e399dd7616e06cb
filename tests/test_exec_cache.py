"""Compiled chains kept on disk by tallmh's own key (tallmh.run._exec_cache): a later call loads the executable
without tracing and gives the same draws; objects tallmh cannot name are never keyed."""

import dataclasses

import jax
import numpy as np

import tallmh as tm
from tallmh.run import _exec_cache, programs, start as run_start, threads


def _run(**kw):
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=3)
    kw.setdefault("test", tm.acceptance.Exact())  # (the smallest chain to compile)
    return tm.sample(tm.models.LogisticRegression(), data, num_samples=60, num_warmup=40, num_chains=2, seed=5,
                     chunk_size=20, progress=False, **kw)


def test_a_second_call_loads_the_chain_and_draws_the_same(tmp_path, monkeypatch):
    previous = jax.config.jax_compilation_cache_dir
    tm.set_compilation_cache(str(tmp_path))
    loaded = []
    real_load = _exec_cache.load
    monkeypatch.setattr(_exec_cache, "load", lambda key: loaded.append(real_load(key)) or loaded[-1])
    try:
        programs.RUNNERS.clear()
        first = _run()
        assert loaded == [None]  # nothing stored yet: compiled, then stored
        assert len(list((tmp_path / "tallmh-executables").glob("*.pkl"))) == 1
        programs.RUNNERS.clear()  # as in a new process
        second = _run()
        assert loaded[-1] is not None  # read from disk, not traced
        np.testing.assert_array_equal(first.flat_samples, second.flat_samples)
        np.testing.assert_array_equal(first.stats["n_data"], second.stats["n_data"])
        np.testing.assert_array_equal(first.stats["accepted"], second.stats["accepted"])
        # another proposal setting is another program
        programs.RUNNERS.clear()
        _run(proposal=tm.proposals.AdaptiveMetropolis(kappa=0.7))
        assert loaded[-1] is None
    finally:
        programs.RUNNERS.clear()
        tm.set_compilation_cache(previous)


def test_an_edited_tallmh_stores_its_chain_again(tmp_path, monkeypatch):
    """After tallmh's source changes (an upgrade) the chain's HLO may be the same: JAX's own cache must not
    answer for it, or the new key is never stored and every later process traces the chain again."""
    previous = jax.config.jax_compilation_cache_dir
    tm.set_compilation_cache(str(tmp_path))
    stored = []
    real_store = _exec_cache.store
    monkeypatch.setattr(_exec_cache, "store", lambda key, c: stored.append(key) or real_store(key, c))
    try:
        programs.RUNNERS.clear()
        _run()
        programs.RUNNERS.clear()
        monkeypatch.setattr(_exec_cache, "_SOURCE_HASH", ["an edited tallmh"])  # as after an upgrade
        _run()
        assert len(stored) == 2 and stored[0] != stored[1]
        assert len(list((tmp_path / "tallmh-executables").glob("*.pkl"))) == 2
    finally:
        programs.RUNNERS.clear()
        tm.set_compilation_cache(previous)


def test_the_source_hash_reads_every_module_of_the_package(monkeypatch):
    """The key's source hash covers the whole package (an edit to an acceptance test or a proposal changes the chain's
    program as much as one to the runner): every module is read, not only those beside the cache's own."""
    import builtins
    import os

    import tallmh

    read = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: read.append(os.path.abspath(p)) or real_open(p, *a, **k))
    monkeypatch.setattr(_exec_cache, "_SOURCE_HASH", [])
    _exec_cache._source_hash()
    root = os.path.dirname(os.path.abspath(tallmh.__file__))
    for mod in ("acceptance/thinning.py", "proposals/laplace.py", "factor_bounds.py", "run/programs.py"):
        assert os.path.join(root, mod) in read, mod


def test_with_the_cache_off_nothing_is_kept(tmp_path):
    previous = jax.config.jax_compilation_cache_dir
    tm.set_compilation_cache(None)
    try:
        assert _exec_cache.program_key("chain", 1) is None
        assert _exec_cache.load(None) is None and not _exec_cache.store(None, object())
    finally:
        tm.set_compilation_cache(previous)


def test_only_tallmh_objects_have_stable_keys():
    a = _exec_cache.stable_key(tm.acceptance.Austerity(error=0.05))
    assert a == _exec_cache.stable_key(tm.acceptance.Austerity(error=0.05))
    assert a != _exec_cache.stable_key(tm.acceptance.Austerity(error=0.04))
    assert _exec_cache.stable_key(tm.models.LogisticRegression(prior_scale=2.0)) != \
        _exec_cache.stable_key(tm.models.LogisticRegression(prior_scale=3.0))

    @dataclasses.dataclass(frozen=True)
    class Mine:  # a user's class: its code is not tallmh's, so it has no key
        scale: float = 1.0

    assert _exec_cache.stable_key(Mine()) is None
    assert _exec_cache.stable_key(lambda x: x) is None


def test_only_the_mh_chain_lowers_threefry_unrolled(monkeypatch):
    """tm.sample's chain lowers Threefry unrolled (cheaper to compile); an inference program lowers it as JAX
    does: jax 0.12's CPU compiler took over 10 minutes on a stochastic-volatility program lowered unrolled."""
    import contextlib

    from tallmh import _lowering
    from tallmh.blocks.models import TwoComponentMixture

    entered = []
    real = _lowering.unrolled_threefry

    @contextlib.contextmanager
    def spy():
        entered.append(1)
        with real():
            yield

    monkeypatch.setattr(_lowering, "unrolled_threefry", spy)
    monkeypatch.setattr(_exec_cache, "load", lambda key: None)  # compiled here, whatever earlier runs stored
    programs.RUNNERS.clear()
    _run()
    assert entered, "the MH chain was not lowered with the unrolled rule"
    entered.clear()
    X = np.array([-1.5, -0.3, 0.4, 1.8, 2.5, 0.9, 1.1, -0.7], np.float32)
    prog = tm.Cycle([tm.blocks.MH("pi", scale=1.0), tm.blocks.Gibbs("z", items_per_step=len(X)),
                     tm.blocks.SubsampledMH("mu", test=tm.acceptance.Exact(chunk=8), scale=1.5, group_by="z")])
    tm.sample_program(prog, TwoComponentMixture(), X, num_samples=10, num_chains=2, seed=0, progress=False)
    assert not entered


def test_the_chain_asks_for_full_float32_products(monkeypatch):
    """The chain tm.sample compiles, the kernel's init and the self-audit's program beside it ask for full float32 matrix
    products (on GPUs JAX's default lets float32 products run in TF32, with errors of ~1e-3 of each item's
    log-likelihood); the same functions lowered outside tallmh's context ask for the default (the negative
    control: the check tells them apart)."""
    seen = []
    real = _exec_cache.compile_and_store

    def spy(key, lower_fn, unrolled=True, **kw):
        got = {"lower_fn": lower_fn}
        seen.append(got)
        return real(key, lambda: got.setdefault("lowered", lower_fn()), unrolled, **kw)

    monkeypatch.setattr(_exec_cache, "load", lambda key: None)
    monkeypatch.setattr(_exec_cache, "compile_and_store", spy)
    programs.RUNNERS.clear()
    _run(test=tm.acceptance.Austerity(error=0.05), control_variates=tm.ControlVariates())  # (an audited chain)

    def dots(text):
        return [ln for ln in text.splitlines() if "stablehlo.dot_general" in ln and "f32" in ln]

    assert len(seen) == 3  # the chain, the kernel's init (with the chain's CPU options) and the audit's program
    with_dots = 0
    for got in seen:
        inside = dots(got["lowered"].as_text())
        assert all("precision = [HIGHEST, HIGHEST]" in ln for ln in inside), inside[:3]
        if inside:  # (the chain and the audit's program; this proposal's init makes no product)
            with_dots += 1
            outside = dots(got["lower_fn"]().as_text())  # this thread, no precision context
            assert outside and not any("HIGHEST" in ln for ln in outside)
    assert with_dots >= 2


def test_the_set_up_thread_traces_full_float32_products():
    """The set-up (mode search, control variates) runs in a thread of its own: it traces with full float32
    products too; a plain thread started in the same context does not (the negative control)."""
    import threading

    import jax.numpy as jnp

    def dot_text():
        return jax.jit(lambda a: a @ a).lower(jnp.ones((3, 3), jnp.float32)).as_text()

    with jax.default_matmul_precision("float32"):
        plain = {}
        t = threading.Thread(target=lambda: plain.setdefault("text", dot_text()))
        t.start()
        t.join()
    assert "HIGHEST" not in plain["text"]
    assert "precision = [HIGHEST, HIGHEST]" in threads.in_thread(dot_text)


def _spy_compile(monkeypatch):
    """The compiler options of every ``Lowered.compile`` from here on (a list, filled as programs compile) and the
    real ``compile``."""
    import jax.stages

    seen = []
    real = jax.stages.Lowered.compile

    def spy(self, compiler_options=None, **kw):
        seen.append(dict(compiler_options or {}))
        return real(self, compiler_options=compiler_options, **kw)

    monkeypatch.setattr(jax.stages.Lowered, "compile", spy)
    return seen, real


def test_the_chain_compiles_with_the_cpu_emitter_option_and_without_it_where_unknown(monkeypatch):
    """On the CPU the chain compiles with ``_CPU_OPTIONS`` (XLA's elemental emitters: a cheaper compile, the same
    draws: tests/test_same_draws.py) and ``_CPU_QUICK`` (LLVM's level 1), and so does the audit's program with
    ``_CPU_QUICK``; an XLA that does not know an option compiles without it, and draws the same."""
    seen, real = _spy_compile(monkeypatch)
    monkeypatch.setattr(_exec_cache, "load", lambda key: None)
    monkeypatch.setattr(_exec_cache, "_REFUSED", {})  # (asked afresh, whatever earlier tests learned)
    programs.RUNNERS.clear()
    a = _run()
    assert jax.default_backend() == "cpu"
    assert seen and seen[0].get("xla_cpu_use_fusion_emitters") is False
    assert all(o.get("xla_backend_optimization_level") == 1 for o in seen)  # the chain's and the audit's
    try:  # (jax 0.12's XLA no longer has the option: the chain then compiles without it)
        real(jax.jit(lambda x: x + 1).lower(np.ones(2, np.float32)), compiler_options=dict(_exec_cache._CPU_OPTIONS))
        known = True
    except Exception:  # noqa: BLE001
        known = False
    assert (seen[-1].get("xla_cpu_use_fusion_emitters") is False) == known
    seen.clear()
    monkeypatch.setattr(_exec_cache, "_CPU_OPTIONS", {"xla_cpu_no_such_option_anywhere": True})
    programs.RUNNERS.clear()
    b = _run()
    assert any("xla_cpu_no_such_option_anywhere" in o for o in seen)  # asked, refused, compiled without it
    assert "xla_cpu_no_such_option_anywhere" not in seen[-1]
    np.testing.assert_array_equal(a.flat_samples, b.flat_samples)
    # a model whose chain was not measured with the option (a subclass: its own likelihood) is compiled as JAX does
    seen.clear()

    class Tempered(tm.models.LogisticRegression):
        def log_lik(self, theta, batch):
            return 0.5 * super().log_lik(theta, batch)

    programs.RUNNERS.clear()
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=3)
    tm.sample(Tempered(), data, test=tm.acceptance.Exact(), num_samples=20, num_warmup=10, num_chains=2, seed=5,
              progress=False)
    assert seen and not any(k.startswith("xla_cpu") or k == "xla_backend_optimization_level" for o in seen for k in o)


def test_the_chain_compiles_in_as_many_llvm_modules_as_cores_and_draws_the_same(monkeypatch):
    """Where the process may use fewer cores than XLA's default count of LLVM modules (32), the chain compiles in
    one module per core (less repeated work per module); the draws are those of the default count."""
    monkeypatch.setattr(_exec_cache.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert _exec_cache._cpu_split() == {_exec_cache._SPLIT: 2}
    monkeypatch.setattr(_exec_cache.os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    assert _exec_cache._cpu_split() == {}
    seen, _ = _spy_compile(monkeypatch)
    monkeypatch.setattr(_exec_cache, "load", lambda key: None)
    monkeypatch.setattr(_exec_cache, "_REFUSED", {})
    runs = {}
    for cores in (1, 64):  # (one module; XLA's own count)
        monkeypatch.setattr(_exec_cache.os, "sched_getaffinity", lambda pid, c=cores: set(range(c)), raising=False)
        programs.RUNNERS.clear()
        seen.clear()
        runs[cores] = _run()
        split = [o.get(_exec_cache._SPLIT) for o in seen if "xla_backend_optimization_level" in o]
        assert split and all(v == (1 if cores == 1 else None) for v in split)
    np.testing.assert_array_equal(runs[1].flat_samples, runs[64].flat_samples)


def test_the_kernels_init_is_traced_after_the_chains_trace(monkeypatch):
    """With the chain compiling beside the set-up, the set-up traces the kernel's init only once the chain's
    trace is done (one interpreter: two traces at once slowed the chain's, the longer wait)."""
    import threading

    events = []

    class Recording(tm.models.LogisticRegression):
        def log_prior(self, theta):
            events.append(threading.current_thread().name)
            return super().log_prior(theta)

    real = run_start.set_up

    def set_up(self, init_jitter, early=None):
        events.append("set-up")
        assert early is not None  # (the chain compiles beside the set-up)
        return real(self, init_jitter, early)

    monkeypatch.setattr(run_start, "set_up", set_up)
    monkeypatch.setattr(_exec_cache, "load", lambda key: None)
    programs.RUNNERS.clear()
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=3)
    tm.sample(Recording(), data, num_samples=30, num_warmup=20, num_chains=2, seed=5, progress=False)
    start = events.index("set-up")
    chain = [i for i, e in enumerate(events) if e == "tallmh-compile"]
    init = [i for i, e in enumerate(events) if e == "MainThread" and i > start]
    assert chain and init and max(chain) < min(init), events


_LAPACK_CHILD = r"""
import sys
import jax, jax.numpy as jnp, numpy as np
import tallmh as tm
from tallmh.run import _exec_cache
tm.set_compilation_cache(sys.argv[1])
a = np.array([[4.0, 2.0], [2.0, 3.0]], np.float32)
key = _exec_cache.program_key("a program with a Cholesky factor", 1)
if sys.argv[2] == "store":
    _exec_cache.compile_and_store(key, lambda: jax.jit(jnp.linalg.cholesky).lower(a))
else:  # a fresh process whose first linear algebra is the program read back
    c = _exec_cache.load(key)
    assert c is not None
    np.testing.assert_allclose(np.asarray(c(a)), np.linalg.cholesky(a), rtol=1e-6)
print("done")
"""


def test_a_program_read_back_with_lapack_calls_runs_in_a_fresh_process(tmp_path):
    """A program calling LAPACK (JAX's CPU Cholesky), read back from the disk by a process that has lowered no
    linear algebra of its own, runs and gives the factor (it crashed the process with a segmentation fault before
    ``_exec_cache.load`` readied JAX's LAPACK routines)."""
    import subprocess
    import sys

    for step in ("store", "load"):
        proc = subprocess.run([sys.executable, "-c", _LAPACK_CHILD, str(tmp_path), step], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0 and "done" in proc.stdout, (step, proc.returncode, proc.stderr[-2000:])


def test_a_program_kept_here_leaves_no_entry_in_jax_cache(tmp_path):
    """A program stored under tallmh's key is not also written to JAX's persistent cache (its JAX options are that
    key's, so only a process holding tallmh's entry could read it); a program without a key still is."""
    previous = jax.config.jax_compilation_cache_dir
    tm.set_compilation_cache(str(tmp_path))

    def jax_entries():
        return sorted(p.name for p in tmp_path.iterdir() if p.is_file())

    try:
        x = np.arange(5.0, dtype=np.float32)
        before = jax_entries()
        key = _exec_cache.program_key("a test program", 1)
        _exec_cache.compile_and_store(key, lambda: jax.jit(lambda v: v * 2.5 + 1.0).lower(x))
        assert len(list((tmp_path / "tallmh-executables").glob("*.pkl"))) == 1
        assert jax_entries() == before
        _exec_cache.compile_and_store(None, lambda: jax.jit(lambda v: v * 3.5 - 1.0).lower(x))
        # (negative control: JAX's cache is on and writes what tallmh does not keep)
        assert len(jax_entries()) == len(before) + 1
    finally:
        tm.set_compilation_cache(previous)
