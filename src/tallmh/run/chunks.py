"""Stage 6, the chunks: set-up, compile, then each phase in time-sized compiled calls.

In: a configured, restored :class:`~.runstate.Run`. Out: its draws and statistics (``run.collected`` or the
draw store), ``run.states`` at the end, ``run.done`` per phase, timings; a checkpoint every
``checkpoint_every_s``; a progress bar; Ctrl-C, SIGTERM/SIGHUP and changed data files end it with
``run.partial`` set and the draws kept.
"""

from __future__ import annotations

import signal
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from .. import control_variates as cvm
from ..storage import datasource as ds
from .. import distributed
from .._memory import release
from ..errors import DataChanged, Stopped
from . import configure, data_notes, finish, programs, proposal_choice, rng, runstate, selfaudit, start, threads

# an approximate test without control variates that reads more than this fraction of the data per step in
# its first chunk is told about control variates (at N = 10^5-2.4*10^5 logistic regressions such runs read
# 71-74% per step, slower than exact MH; with them ~300 items)
CV_ADVICE_FRACTION = 0.25


def files_changed(fingerprint):
    """Why the run must stop (a data file's size or modification time is not what it was at the start), or
    None. Checked before every chunk: a file truncated under a memory map would otherwise end the process
    with SIGBUS at the next read of a lost page, and one changed in place would mix two data sets."""
    import os

    for leaf in fingerprint["data"]["leaves"]:
        f = leaf.get("file")
        if not f or f.get("size") is None:
            continue
        try:
            st = os.stat(f["path"])
        except OSError as e:
            return f"the data file {f['path']} cannot be read any more ({e.strerror or e}); the run stopped"
        if st.st_size != f["size"]:
            return (f"the data file {f['path']} changed size during the run ({f['size']:,} -> {st.st_size:,} "
                    "bytes); the run stopped")
        if st.st_mtime_ns != f["mtime_ns"]:
            return f"the data file {f['path']} was modified during the run; the run stopped"
    return None


class Bar:
    """A tqdm progress bar over all steps of a chain (warmup + sampling), with acceptance and data fraction."""

    def __init__(self, total, initial, name):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=f"tallmh[{name}]", unit="step", file=sys.stderr,
                        dynamic_ncols=True, mininterval=0.5, smoothing=0.1)

    def update(self, k, phase, info, n):
        acc = float(np.mean(info["accepted"])) if np.size(info["accepted"]) else float("nan")
        frac = float(np.mean(info["n_data"])) / n if np.size(info["n_data"]) else float("nan")
        self.bar.set_postfix_str(f"{phase}, accept {acc:.2f}, data/step {frac:.3g}", refresh=False)
        self.bar.update(k)

    def close(self):
        self.bar.close()


# ---- the run --------------------------------------------------------------------------------------


def go(run, init, init_jitter, progress):
    """Set-up, compile and the chunks; Ctrl-C, SIGTERM/SIGHUP and changed data files end it with the
    draws made so far (``partial``)."""
    run.bar = None
    run.changed_error = None
    run.auto_stop = None
    signals = threads.stop_signals()
    signals.__enter__()
    try:
        early = None
        if run.states is None:
            # the audit's rates first (the chunk's program depends on whether it audits), then the chunk
            # compiles in a thread while the set-up runs; the rates (which depend on the warmup the set-up
            # settles, num_warmup="auto") and their notes are made again after the set-up's notes, as before
            n0 = len(run.notes)
            selfaudit.audit_rates(run)
            del run.notes[n0:]
            early = programs.compile_early(run)
            ts = time.perf_counter()
            run.states = threads.wait(start.set_up(run, init_jitter, early))
            start.resolve_stats(run)
            start.factor_table(run)
            run.timings["setup_s"] = run.timings.get("setup_s", 0.0) + time.perf_counter() - ts  # (+ the program's)
            start.warmup_of_start(run)
        start.resolve_stats(run)
        start.factor_table(run)  # (the exact subsampled test's: also for a resumed run)
        selfaudit.audit_rates(run)
        release()  # (the set-up's freed temporaries, before the compile's own: see tallmh._memory)
        programs.compile_chunk(run, early)
        release()
        data_notes.name_degenerate(run)  # (its check ran beside the set-up and the compile)
        if progress is None:
            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        if progress:
            run.bar = Bar(None if run.auto_draws else run.num_warmup + run.num_samples,
                            run.done["warmup"] + run.done["sampling"], getattr(run.test, "name", "mcmc"))
        run.last_ckpt = time.perf_counter()
        run.next_check = 100
        if run.done["warmup"] < run.num_warmup:
            run_phase(run, "warmup", run.num_warmup, 0)
        proposal_choice.choose(run, run_phase)  # (the default exact test's proposal: a MALA pilot, if needed)
        if run.done["sampling"] < run.num_samples:
            run_phase(run, "sampling", run.num_samples, 1)
        ta = time.perf_counter()  # (the audits still running after the last chunk: sampling's time)
        selfaudit.settle_audits(run)
        run.timings["sampling_s"] += time.perf_counter() - ta
    except DataChanged as e:
        run.partial = True
        run.changed_error = e
        run.notes.append(f"stopped: {e}")
    except KeyboardInterrupt as e:
        run.partial = True
        what = f"stopped by {signal.Signals(e.signum).name}" if isinstance(e, Stopped) else "interrupted"
        try:  # (never raises: after a hang-up the terminal's writes fail, and the draws matter more)
            print(f"\ntallmh: {what}; returning the draws made so far (result.partial = True)", file=sys.stderr)
        except OSError:
            pass
    finally:
        signals.__exit__(None, None, None)
        programs.wait_stored()  # (the compiled chunk's entry, written beside the first chunks)
        ds.advise(run.data, "normal")  # the files' default read-ahead again, for whatever reads them next
        if run.bar is not None:
            try:
                run.bar.close()
            except OSError:  # the terminal is gone
                pass


def recenter(run):
    """Control variates re-centred at the warmup's mean before sampling (``ControlVariates(recenter=True)``)."""
    cvo = run.control_variates
    warm = np.concatenate([p[0] for p in runstate.parts(run, "warmup")], axis=1)
    center = jnp.asarray(warm[:, warm.shape[1] // 2:].reshape(-1, warm.shape[-1]).mean(axis=0))
    cv_new = cvm.proxy_sums(run.model, run.data, run.n, run.unravel, center, cvo.order)
    run.setup_items += run.n
    rows = run.states.cv.exact_rows  # the stratum stays (chosen at the mode's Laplace approximation)
    run.states = run.states._replace(cv=jax.tree_util.tree_map(
        lambda a: jnp.broadcast_to(a, (run.num_chains,) + a.shape), cv_new)._replace(exact_rows=rows))
    if run.plan is not None:
        run.states = distributed.place_inputs(run.plan, run.states, run.chain_keys, run.k_audit,
                                               None, None)[0]


def run_phase(run, pname, total, phase) -> bool:
    """Run phase ``pname`` in chunks until ``total`` steps; True when ``num_samples='auto'`` met its goal."""
    cvo = run.control_variates
    if pname == "sampling" and cvo is not None and cvo.recenter and runstate.parts(run, "warmup") \
            and run.done["sampling"] == 0:
        recenter(run)
    # on-disk data: rows are read at random, unless this phase's audits read all of them in order
    ds.advise(run.data, "random" if run.rates[phase] == 0 else "normal")
    tp = time.perf_counter()
    base_s = run.timings[f"{pname}_s"]
    done, length = run.done, run.length
    count = min(length, total - done[pname], 4 if run.chunk_size is None else length)
    while done[pname] < total:
        changed = files_changed(run.fingerprint)  # (before each chunk reads the files again)
        if changed is not None:
            raise DataChanged(changed)
        stop = pname == "sampling" and run.budget_s is not None and run.timings["sampling_s"] >= run.budget_s
        if run.plan is not None:  # several processes: all make the chunks and stop that process 0 chose
            count, stop = distributed.agree(count, stop)
        if stop:
            break
        dt = run_chunk(run, pname, phase, count)
        if pname == "sampling" and not programs.defer_audit(run):  # (deferred: checked before the chunk's audits)
            selfaudit.audit_clear(run)
        run.timings[f"{pname}_s"] = base_s + time.perf_counter() - tp
        # (a step's wall time, for the next convergence check; not with several processes, which must check alike)
        run.last_step_s = dt / max(count, 1) if run.plan is None else 0.0
        if after_chunk(run, pname, total):
            return True
        if run.chunk_size is None:  # next chunk: about chunk_seconds long
            per_step = max(dt / count, 1e-7)
            want = run.chunk_seconds / per_step
            if pname == "sampling" and run.budget_s is not None:
                want = min(want, max(1.0, (run.budget_s - run.timings["sampling_s"]) / per_step))
            count = int(max(1, min(length, want, 4 * count)))
        if pname == "sampling" and not programs.defer_audit(run):  # (deferred: the stage closes at its step)
            count = selfaudit.audit_chunk_cap(run, count)
        if pname == "sampling" and run.auto_draws and done[pname] < run.next_check:
            # num_samples="auto": a chunk ends where the ESS is looked at next (draws 25% apart), so the run
            # stops at most about a quarter past where the goal was met, not a whole growing chunk past it
            count = max(1, min(count, run.next_check - done[pname]))
        count = min(count, length, total - done[pname]) if done[pname] < total else count
    return False


def run_chunk(run, pname, phase, count) -> float:
    """One compiled call of ``count`` steps; its draws and statistics kept. Returns its wall time."""
    arg = run.arg
    tcall = time.perf_counter()
    new_states, out = programs.run_checked(run, (run.states, *rng.chunk_keys(run, phase, run.done[pname]),
                                                 arg(run.done[pname], jnp.int32), arg(count, jnp.int32),
                                                 arg(phase, jnp.int32), arg(run.rates[phase], jnp.float32),
                                                 run.run_data, run.run_stats))
    threads.wait(new_states)
    # the chunk's outputs are buffers of ``run.length`` steps; a view of their first ``count`` would keep each
    # whole buffer alive (on a CPU, NumPy's view of a JAX array holds its buffer): copied, memory grows with
    # the draws kept, not with the number of chunks times the buffer
    theta, info, *deferred = jax.tree_util.tree_map(lambda a: np.array(distributed.to_host(a)[:, :count]), out)
    info = dict(info)
    if deferred:
        selfaudit.audits_of_chunk(run, phase, info, *deferred)
    dt = time.perf_counter() - tcall - run.__dict__.pop("recompile_s", 0.0)
    run.states = new_states
    if run.store is not None:
        run.store.append(pname, theta, info)
    else:
        run.collected[pname].append((theta, info))
    run.done[pname] += count
    if run.bar is not None:
        run.bar.update(count, pname, info, run.n)
    if getattr(run, "cv_advice", False):
        warn_without_cv(run, info)
    return dt


def warn_without_cv(run, info):
    """Once, after the first chunk: an approximate test reading much of the data for lack of control
    variates is told so while it runs, with the fraction it measured."""
    run.cv_advice = False
    frac = float(np.mean(info["n_data"])) / run.n if np.size(info["n_data"]) else 0.0
    if frac < CV_ADVICE_FRACTION:
        return
    msg = (f"{getattr(run.test, 'name', 'the test')} without control variates read {100 * frac:.0f}% of the "
           f"data per step in the first {np.shape(info['n_data'])[1]} steps (the log-likelihood ratios vary "
           f"too much for a small sample); this model is differentiable: control_variates=tm.ControlVariates() "
           f"(or the default test=None) reads a few hundred items per step")
    run.notes.append(msg)
    warnings.warn(f"tallmh: {msg}", RuntimeWarning, stacklevel=5)


AUTO_CHECK_SHARE = 0.2  # num_samples="auto": the convergence checks take at most about this share of sampling's time


def next_check(done: int, check_s: float, step_s: float) -> int:
    """The draws at which ``num_samples="auto"`` looks at the ESS next: 25% more than now, or, where a check costs
    more than that many steps (many parameters, cheap steps: at 10^7 rows x 1,000 groups 23 checks took 495 of 541
    s of sampling), as many steps as take ``check_s / AUTO_CHECK_SHARE``, so that checking stays a bounded share."""
    more = int(check_s / AUTO_CHECK_SHARE / step_s) if step_s > 0 else 0
    return max(int(done * 1.25) + 1, done + more)


def after_chunk(run, pname, total) -> bool:
    """Callback, checkpoint and the ``num_samples='auto'`` check after a chunk; True to stop sampling."""
    done = run.done
    if run.callback is not None:
        run.callback({"phase": pname, "done": done[pname], "total": total,
                       "seconds": run.timings[f"{pname}_s"]})
    due = run.checkpoint is not None and time.perf_counter() - run.last_ckpt >= run.checkpoint_every_s
    if run.plan is not None and run.checkpoint is not None:  # gathering the states is collective
        (due,) = distributed.agree(due)
    if due:
        # the run is not finished: a checkpoint left by a kill loads as partial
        run.last_ckpt = finish.save_checkpoint(finish.make_result(run), run.checkpoint, in_progress=True,
                                          every=run.checkpoint_every_s, store=run.store)
    if run.auto_draws and pname == "sampling" and done[pname] >= run.next_check:
        tc = time.perf_counter()
        reached = configure.auto_reached(runstate.parts(run, "sampling"), run.min_ess)
        run.next_check = next_check(done[pname], time.perf_counter() - tc, getattr(run, "last_step_s", 0.0))
        if reached is not None:
            run.auto_stop = reached
            return True
    return False
