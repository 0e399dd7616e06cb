"""Stage 4, the compiled programs: the chain's chunk, the deferred audit's exact passes, their caches.

In: a :class:`~.runstate.Run` with its kernel (and, for :func:`compile_early`, before its states exist). Out:
``run.compiled`` (the chunk: ``length`` scan steps of the kernel, vectorised over chains or sharded over a
mesh), ``run.entry`` (its in-process cache entry, :data:`RUNNERS`), and the audit's program
(:func:`audit_compiled`); compiled in a thread during the set-up where the states' shapes are known before
it, and stored in tallmh's on-disk executable cache (:mod:`._exec_cache`) where everything the trace depends
on can be named.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
from . import _exec_cache
from .. import control_variates as cvm
from ..storage import datasource as ds
from .. import distributed
from ..storage.data import to_device
from ..kernel import AuditArgs, StepInfo
from ..kernel_choice import build_kernel
from ..proposals import AdaptiveMetropolis
from ..cache_keys import shape_key as _shape_key, value_key as _value_key
from . import rng, runstate, threads

AUDIT_SLOTS = 8  # slots of num_chains audited chain-steps per call of the deferred audit's program (audit_runner)
RUNNERS: dict = {}
# The exact subsampled test's chain compiled first without its fallback's full pass (about a quarter of its compile,
# rarely taken); the whole program only once a step needs it (:func:`whole_chunk`). False: the whole from the start.
FULL_PASS_LATER = True


def avals(tree):
    """The tree structure and each leaf's shape, dtype and weak type: what a compiled program is made for."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, [(tuple(np.shape(a)), str(a.dtype), bool(getattr(a, "weak_type", False))) for a in leaves]


def runner(kernel, key, num_chains, length, audit_on, plan=None, kernel_of=None, model=None, n=None, defer=False):
    """The compiled chunk: ``length`` scan steps of which the first ``count`` are made.

    Cached by ``key`` (model, proposal and test by value where they are tallmh's own, shapes, options):
    a second call with data of the same shape reuses the compiled program. Returns the cache entry, a
    dict with ``fn`` (the jitted function) and ``compiled`` (filled on first use). With a ``plan``
    (:mod:`tallmh.distributed`) the chains (and the data's rows) are split over the plan's mesh;
    ``kernel_of(model)`` then builds the kernel on the (row-sharded view of the) model. ``defer``: the audits
    are taken after the chunk (:func:`chain_run`; chains side by side on one device only).
    """
    if key in RUNNERS:
        return RUNNERS[key]
    if plan is not None:
        fn = distributed.sharded_runner(lambda m: chain_run(kernel_of(m), length, audit_on), plan, model, n,
                                        map_chains=getattr(kernel, "map_chains", False))
    elif getattr(kernel, "map_chains", False):  # chains one after another (a program's member lists)
        chain = chain_run(kernel, length, audit_on)

        def chains(states, keys, akey, *rest):
            return jax.lax.map(lambda sk: chain(sk[0], sk[1], akey, *rest), (states, keys))

        fn = jax.jit(chains)
    else:
        fn = jax.jit(chains_run(kernel, length, audit_on, defer))
    if len(RUNNERS) >= 16:
        RUNNERS.pop(next(iter(RUNNERS)))
    RUNNERS[key] = {"fn": fn, "compiled": None, "kernel": kernel}
    return RUNNERS[key]


def _step_fns(kernel, audit_on, defer):
    """``(do, skip)``: one chain's step at scan index ``g`` (made, or not: the first ``count`` of a chunk are), each
    ``(st, k_step, k_audit, g, adapt, audit_rate, data, stats) -> (st, info, *deferred)``."""
    empty = getattr(kernel, "empty_info", None) or StepInfo.empty

    def do(st, k_step, k_audit, g, adapt, audit_rate, data, stats):
        if audit_on:
            ua = jax.random.uniform(k_audit)
            audit = ua < audit_rate
        else:
            audit = False
        if defer:  # (the host picks the audited steps afterwards: ua < the rate it settles)
            return (*kernel.step(k_step, st, data, g, adapt, stats, False, defer_audit=True), ua)
        return kernel.step(k_step, st, data, g, adapt, stats, audit)

    def skip(st, k_step, k_audit, g, adapt, audit_rate, data, stats):
        if defer:  # (the step's own key stands in for the test's, which is split from it: never read,
            # the step is never audited; no split here, whose unrolled hash would be compiled for nothing)
            one = jnp.ones((), jax.dtypes.canonicalize_dtype(jnp.float64))  # (a uniform's dtype: x64 or not)
            return st, empty(st.theta.dtype), AuditArgs(k_step, st.theta, st.theta,
                                                        jnp.full((), -jnp.inf, st.theta.dtype), one), one
        return st, empty(st.theta.dtype)

    return do, skip


def chain_run(kernel, length, audit_on, defer=False):
    """One chain's chunk: ``length`` scan steps of ``kernel``, of which the first ``count`` are made.

    ``defer``: no exact pass in the chain; each step's :class:`~tallmh.kernel.AuditArgs` and its audit
    uniform (the step is audited when it is below the phase's rate) are further outputs beside the draws and
    statistics, and :func:`audit_runner` takes the audited steps' exact decisions after the chunk."""
    do, skip = _step_fns(kernel, audit_on, defer)

    def chain_run(state, skeys, akeys, start, count, phase, audit_rate, data, stats):
        # skeys, akeys: the chunk's step keys, fold_in(fold_in(chain key, phase), step) and the same of the audit
        # key (:func:`.rng.step_keys`, hashed outside the program)
        adapt = phase == 0

        def body(st, xs):
            i, k_step, k_audit = xs
            rest = (k_step, k_audit, start + i, adapt, audit_rate, data, stats)
            st, info, *deferred = jax.lax.cond(i < count, lambda s: do(s, *rest), lambda s: skip(s, *rest), st)
            return st, (st.theta, runstate.info_dict(info), *deferred)

        return jax.lax.scan(body, state, (jnp.arange(length, dtype=jnp.int32), skeys, akeys))

    return chain_run


def chains_run(kernel, length, audit_on, defer=False):
    """The chunk of chains side by side on one device: what ``vmap`` of :func:`chain_run` over the chains (states
    and step keys; the audit's keys and the rest shared) computes, with the chains' axis inside the scan and the
    ``cond`` (their steps vectorised) instead of outside: JAX then batches the step once as it traces it,
    instead of tracing it and batching the scan's and the cond's traced bodies (fixed-point passes over the
    whole step), which took most of the chain's tracing. The draws and statistics come out ``(chains, length,
    ...)``, as from the ``vmap``."""
    do, skip = _step_fns(kernel, audit_on, defer)
    axes = (0, 0, None, None, None, None, None, None)
    do_v, skip_v = jax.vmap(do, in_axes=axes), jax.vmap(skip, in_axes=axes)

    def chain_run(states, skeys, akeys, start, count, phase, audit_rate, data, stats):
        adapt = phase == 0

        def body(st, xs):
            i, k_step, k_audit = xs
            rest = (k_step, k_audit, start + i, adapt, audit_rate, data, stats)
            st, info, *deferred = jax.lax.cond(i < count, lambda s: do_v(s, *rest), lambda s: skip_v(s, *rest), st)
            return st, (st.theta, runstate.info_dict(info), *deferred)

        k_steps = jnp.swapaxes(skeys, 0, 1)  # (length, chains, ...): the scan's axis first
        states, out = jax.lax.scan(body, states, (jnp.arange(length, dtype=jnp.int32), k_steps, akeys))
        return states, jax.tree_util.tree_map(lambda a: jnp.swapaxes(a, 0, 1), out)

    return chain_run


def audit_runner(kernel, slots):
    """The deferred self-audit's program: the exact decisions of up to ``slots`` audited steps of all chains
    (``AuditArgs`` leaves shaped ``(slots, chains, ...)``), the first ``m`` of them, one step's chains side by
    side at a time. Out of the chain's loop it reads the rows on every core: the same pass cost ~50 ms per
    step of 4 chains inside the chain at N = 10^6 and ~29 ms here (``benchmarks/exact_pass.py``)."""
    one_step = jax.vmap(kernel.audit_pass, in_axes=(0, 0, 0, 0, None, None))

    def run(args, m, data, stats):
        c = args.theta.shape[1]
        out0 = (jnp.zeros((slots, c), bool), jnp.zeros((slots, c), jnp.int32))

        def body(j, out):
            a = jax.tree_util.tree_map(lambda v: v[j], args)
            ex, items = one_step(a.key, a.theta, a.theta_p, a.log_base, data, stats)
            return out[0].at[j].set(ex), out[1].at[j].set(items)

        return jax.lax.fori_loop(0, m, body, out0)

    return jax.jit(run)


def chunk_entry(run, states, stats=None):
    """``(cache key, cache entry)`` of the compiled chunk for chain states shaped like ``states`` (and set-up
    statistics shaped like ``stats``, default the run's)."""
    n, d, num_chains = run.n, run.d, run.num_chains
    plan, test, proposal = run.plan, run.test, run.proposal
    run.length = length = int(run.chunk_size) if run.chunk_size else \
        int(min(4096, max(16, 2**22 // max(1, num_chains * (d + 8)))))
    rkey = (_value_key(run.model), _value_key(proposal), _value_key(test), n, _shape_key(run.data),
            _shape_key(run.stats if stats is None else stats), run.cv_order, num_chains, length, run.audit_on, d, str(run.dtype),
            _shape_key(states), _shape_key(run.init_tree), plan.key() if plan is not None else None,
            defer_audit(run), full_pass_later(run))
    entry = runner(run.kernel, rkey, num_chains, length, run.audit_on, plan,
                    (lambda m: run.kernel) if run.program is not None else
                    (lambda m: build_kernel(m, proposal, test, n, run.unravel, None, run.cv_order)), run.model, n,
                    defer_audit(run))
    return rkey, entry


def defer_audit(run) -> bool:
    """Whether the chunk leaves its audits' exact passes to :func:`audit_runner` (chains side by side on
    one device, a kernel that can; not for inference programs, whose blocks audit inside their step)."""
    return bool(run.audit_on and run.plan is None and run.program is None
                and getattr(run.kernel, "audit_pass", None) is not None
                and not getattr(run.kernel, "map_chains", False))


def full_pass_later(run) -> bool:
    """Whether the chunk is compiled first without the exact subsampled test's full pass (:data:`FULL_PASS_LATER`;
    chains side by side on one device, tallmh's own test): a step that needs it is marked, and :func:`run_checked`
    makes that chunk again with the whole program."""
    from ..acceptance.thinning import PoissonThinning

    return bool(FULL_PASS_LATER and run.plan is None and run.program is None and type(run.test) is PoissonThinning
                and not getattr(run.kernel, "map_chains", False))


def _lowering(run, lower):
    """``lower`` in the context the chunk is traced in: without the full pass where :func:`full_pass_later`."""
    if not full_pass_later(run):
        return lower
    from ..acceptance.thinning import without_full_pass

    def traced():
        with without_full_pass():
            return lower()

    return traced


def _chunk_key(run, length, args0):
    return disk_key(run, length, args0, "chain-without-full-pass" if full_pass_later(run) else "chain")


def run_checked(run, args):
    """The chunk's outputs for ``args``: from ``run.compiled``, and where that program left the full pass out and a
    step needed it (``rounds == NEEDS_FULL_PASS`` among the chunk's first ``count`` steps), from the whole program
    (:func:`whole_chunk`, compiled then), which ``run.compiled`` is from then on. Both programs decide every other
    step alike, bit for bit, so the draws are those of the whole program from the start. The rows the first run of
    such a chunk read are added to ``run.setup_items``."""
    out = run.compiled(*args)
    entry = getattr(run, "entry", None)
    if entry is None or run.compiled is not entry.get("compiled") or not full_pass_later(run):
        return out
    from ..acceptance.thinning import NEEDS_FULL_PASS

    count = int(np.asarray(args[4]))
    rounds = threads.wait(runstate.info_dict(out[1][1])["rounds"])  # (Ctrl-C seen while the chunk runs)
    if not np.any(np.asarray(distributed.to_host(rounds))[:, :count] == NEEDS_FULL_PASS):
        return out
    # the rows the discarded run read are counted too, as a one-off of the set-up's kind (the chunk is made again)
    n_data = runstate.info_dict(out[1][1])["n_data"]
    run.setup_items += int(np.sum(np.asarray(distributed.to_host(n_data), np.int64)[:, :count]))
    tc = time.perf_counter()
    run.compiled = whole_chunk(run, args)
    run.recompile_s = time.perf_counter() - tc  # (compile time, not the chunk's: run.chunks.run_chunk)
    run.timings["compile_s"] += run.recompile_s
    return run.compiled(*args)


def whole_chunk(run, args):
    """The whole chunk's program (the exact subsampled test with its full pass) for the chunk's arguments ``args``:
    kept with the chunk's entry, loaded from tallmh's executable cache or compiled (and stored)."""
    entry = run.entry
    if entry.get("whole") is None:
        fn = jax.jit(chains_run(entry.get("kernel", run.kernel), run.length, run.audit_on,  # (a trace of its own)
                                defer_audit(run)))
        dkey = disk_key(run, run.length, args)
        compiled = _exec_cache.load(dkey)
        if compiled is None:
            compiled = threads.in_thread(lambda: _exec_cache.compile_and_store(
                dkey, lambda: fn.lower(*args), unrolled=True, elemental=elemental(run), quick=elemental(run),
                background=True))
        entry["whole"] = compiled
    return entry["whole"]


def compile_early(run):
    """Start compiling the chunk in a thread before the set-up, for the chain states the set-up will
    make (their shapes follow from the kernel's init on a start, the control variates' sums and the
    Laplace covariance, whatever their values): the compile then overlaps the set-up's passes. Returns
    what :func:`compile_chunk` needs to use it (it checks that the states came out as assumed), or None.
    The states' shapes (a trace of the kernel's init) are found in the thread too: the set-up starts at once."""
    if run.plan is not None or run.program is not None:
        return None
    stats0 = run.stats
    if getattr(run.test, "needs_factor_table", False):  # (its table joins the statistics after the set-up)
        if not (stats0 is None or isinstance(stats0, dict)):
            return None
        from .. import factor_bounds as fbm

        stats0 = {**(stats0 or {}), fbm.FACTOR_KEY: fbm.table_shapes(run.n, run.d, run.dtype)}
    if run.control_variates is None and getattr(run.test, "wants_mode", False):
        return None
    box = {"keyed": threading.Event(), "traced": threading.Event(), "ready": threading.Event()}

    def audit_program(entry, states):
        try:
            audit_compiled(run, entry, states)
        except BaseException:  # noqa: BLE001 - compiled at its first use instead
            pass

    def work():
        try:
            shaped = _early_shapes(run, stats0)
            if shaped is None:  # (shapes not known before the set-up, or the chunk already compiled)
                return
            rkey, entry, states, args0 = shaped
            box.update(rkey=rkey, avals=avals(args0))
            box["keyed"].set()

            traced = _lowering(run, lambda: entry["fn"].lower(*args0))

            def lower():
                try:
                    return traced()
                finally:
                    box["traced"].set()
                    if defer_audit(run):  # the audit's program traced and compiled beside the chain's XLA compile
                        threading.Thread(target=threads.as_caller(lambda: audit_program(entry, states)), daemon=True,
                                         name="tallmh-audit-compile").start()

            dkey = _chunk_key(run, run.length, args0)
            compiled = _exec_cache.load(dkey)
            if compiled is None:
                compiled = _exec_cache.compile_and_store(dkey, lower, unrolled=run.program is None,
                                                         elemental=elemental(run), quick=elemental(run),
                                                         background=True)
            else:
                box["loaded"] = (entry, states)
            box["compiled"] = compiled
        except BaseException as e:  # noqa: BLE001 - compiled again after the set-up
            box["error"] = e
        finally:
            box["keyed"].set()
            box["traced"].set()
            box["ready"].set()
        if defer_audit(run) and "loaded" in box:  # (the chain loaded from the disk: the audit's too, once it is ready)
            audit_program(*box["loaded"])

    box["thread"] = threading.Thread(target=threads.as_caller(work), daemon=True, name="tallmh-compile")
    box["thread"].start()
    return box


def _early_shapes(run, stats0):
    """``(cache key, cache entry, states' shapes, the chunk's arguments' shapes)`` of the chunk for the states the
    set-up will make (:func:`compile_early`), or None where their shapes are not known before it or the chunk is
    compiled."""
    try:
        d, dt = run.d, run.dtype
        cvo = run.control_variates
        shaped = lambda *s: jax.ShapeDtypeStruct(s, dt)  # noqa: E731
        k = 0 if cvo is None else cvo.exact_row_count(run.n)
        rows = jax.ShapeDtypeStruct((k,), jnp.int32) if k else None
        cv = None if cvo is None else cvm.CVState(shaped(d), shaped(d), shaped(d, d), rows)
        hint = shaped(d, d) if (isinstance(run.proposal, AdaptiveMetropolis)
                                or getattr(run.proposal, "uses_cov_hint", False)) else None
        init_v = jax.vmap(run.kernel.init, in_axes=(0, None, None, None))
        states = jax.eval_shape(init_v, shaped(run.num_chains, d), run.data, cv, hint)
        rkey, entry = chunk_entry(run, states, stats0)
    except Exception:  # noqa: BLE001 - shapes not known before the set-up: compiled after it, as before
        return None
    if entry["compiled"] is not None:
        return None
    i32 = to_device(np.int32(0))  # (not jnp.asarray: it compiles a conversion program)
    args0 = (states, *rng.chunk_keys(run, 0, 0), i32, i32, i32, to_device(np.float32(0.0)), run.data, stats0)
    return rkey, entry, states, args0


def wait_stored():
    """Wait for the compiled chunk's entry in tallmh's executable cache, written in the background."""
    _exec_cache.wait_stored()


def compile_chunk(run, early=None):
    """The compiled chunk (cached across calls by model, proposal, test, shapes and options); ``early``:
    the compile started before the set-up (:func:`compile_early`), used when the states match it."""
    plan = run.plan
    tc = time.perf_counter()
    while early is not None and not early["keyed"].wait(0.05) and early["thread"].is_alive():
        pass  # (its states' shapes and key, found in its thread; short waits: Ctrl-C stays responsive)
    run.timings["compile_s"] += time.perf_counter() - tc
    rkey, entry = chunk_entry(run, run.states)
    run.entry = entry
    length = run.length
    if plan is None:
        def arg(v, dt):
            return to_device(np.asarray(v, dt))  # (jnp.asarray(v, dt) compiles a conversion)

        run.run_data, run.run_stats = run.data, run.stats  # (the step keys: per chunk, rng.chunk_keys)
    else:  # lay the chains, keys and data out over the mesh (the set-up above ran on local devices)
        def arg(v, dt):
            return distributed.scalar(plan, v, dt)

        run.states, _, _, run.run_data, run.run_stats = distributed.place_inputs(
            plan, run.states, run.chain_keys, run.k_audit, run.data, run.stats)
        layout = f"layout: {distributed.describe(plan)}"
        if layout not in run.notes:
            run.notes.append(layout)
    run.arg = arg
    args0 = (run.states, *rng.chunk_keys(run, 0, 0), arg(0, jnp.int32), arg(0, jnp.int32), arg(0, jnp.int32),
             arg(0.0, jnp.float32), run.run_data, run.run_stats)
    if entry["compiled"] is None and early is not None:
        tc = time.perf_counter()
        if early.get("rkey") == rkey and early.get("avals") == avals(args0):  # (the states came out as assumed)
            while not early["ready"].wait(0.05) and early["thread"].is_alive():  # (short waits, as above)
                pass
            entry["compiled"] = early.get("compiled")
        run.timings["compile_s"] += time.perf_counter() - tc
    if entry["compiled"] is None:
        tc = time.perf_counter()
        dkey = _chunk_key(run, length, args0)
        entry["compiled"] = _exec_cache.load(dkey)  # a warm process: no tracing at all
        if entry["compiled"] is None:
            entry["compiled"] = threads.in_thread(lambda: _exec_cache.compile_and_store(
                dkey, _lowering(run, lambda: entry["fn"].lower(*args0)), unrolled=run.program is None,
                elemental=elemental(run), quick=elemental(run), background=True))
        run.timings["compile_s"] += time.perf_counter() - tc
    run.compiled = entry["compiled"]


def audit_compiled(run, entry, states):
    """The deferred self-audit's compiled program (:func:`audit_runner`) for the chunk's cache ``entry``:
    loaded from tallmh's executable cache where the chunk's is, else compiled (and stored)."""
    if entry.get("audit") is not None:
        return entry["audit"]
    with entry.setdefault("audit_lock", threading.Lock()):
        if entry.get("audit") is None:
            theta = states.theta
            c, d = theta.shape[0], theta.shape[-1]
            kd = run.chain_keys
            sd = jax.ShapeDtypeStruct
            args = AuditArgs(sd((AUDIT_SLOTS, c) + tuple(kd.shape[1:]), kd.dtype),
                             sd((AUDIT_SLOTS, c, d), theta.dtype), sd((AUDIT_SLOTS, c, d), theta.dtype),
                             sd((AUDIT_SLOTS, c), theta.dtype),
                             sd((AUDIT_SLOTS, c), jax.dtypes.canonicalize_dtype(jnp.float64)))
            m = sd((), jnp.int32)
            fn = audit_runner(run.kernel, AUDIT_SLOTS)
            lowered_args = (args, m, run.data, run.stats)
            dkey = disk_key(run, run.length, lowered_args, "audit")
            compiled = _exec_cache.load(dkey)
            if compiled is None:
                compiled = _exec_cache.compile_and_store(dkey, lambda: fn.lower(*lowered_args), unrolled=True,
                                                         quick=elemental(run))
            entry["audit"] = compiled
    return entry["audit"]


def elemental(run) -> bool:
    """Whether the chain compiles with XLA's elemental CPU emitters (``_exec_cache._CPU_OPTIONS``) and LLVM's
    level 1 (``_CPU_QUICK``; the audit's program with the latter): for the built-in models whose chains
    were measured with them (the logistic regression: about half the compile time, sampling no slower; the
    emitters keep the draws, level 1 changes them in float32's last bits), with tallmh's own proposals
    other than reversible jump, and never for an inference program (a reversible-jump chain's compile
    took over 24 GB of memory with the emitters)."""
    from ..models import LogisticRegression
    from ..proposals import ReversibleJump

    return (run.program is None and type(run.model) is LogisticRegression
            and not isinstance(run.proposal, ReversibleJump)
            and type(run.proposal).__module__.startswith("tallmh."))


def disk_key(run, length, args0, what="chain"):
    """The on-disk key of the compiled chunk (:mod:`tallmh.run._exec_cache`), or None where tallmh cannot name
    everything its tracing depends on (a model, proposal or test not of tallmh's classes; several
    devices visible; data read through host callbacks)."""
    # (one visible device only: an executable read back in a process with several devices is loaded
    # onto all of them and then expects one shard per device, even for a one-device chain)
    if run.plan is not None or run.program is not None or jax.device_count() != 1 or \
            any(isinstance(a, ds.HostArray) for a in ds.leaves_of(run.data)):
        return None
    named = [_exec_cache.stable_key(o) for o in (run.model, run.proposal, run.test)]
    if any(k is None for k in named):
        return None
    shapes = jax.tree_util.tree_structure(args0), [(tuple(np.shape(a)), str(a.dtype))
                                                   for a in jax.tree_util.tree_leaves(args0)]
    return _exec_cache.program_key(what, named, run.n, run.cv_order, run.num_chains, length,
                                   run.audit_on, run.d, str(run.dtype), str(shapes[0]), shapes[1],
                                   str(jax.tree_util.tree_structure(run.init_tree)), defer_audit(run))
