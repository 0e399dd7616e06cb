"""Stage 7, the result: the draws assembled into a :class:`~tallmh.reporting.results.Result`, saved, warned about.

In: a :class:`~.runstate.Run` after :mod:`.chunks`. Out: the Result (its verdict, notes and
``resume_info``), saved to the checkpoint if one is kept; a ``DataChanged`` error carrying the Result when a
data file changed; a :class:`~tallmh.errors.TrustWarning` for each reason not to trust it.
"""

from __future__ import annotations

import dataclasses
import time
import warnings

import jax
import numpy as np

from .. import distributed
from ..errors import DataChanged
from ..kernel import StepInfo
from ..reporting.results import Result
from . import configure, runstate, selfaudit


CHECKPOINT_RETRY_S = 60.0  # a checkpoint that could not be written is tried again this much later


def save_checkpoint(result, path, in_progress=False, every=None, store=None):
    """Save ``result`` to ``path``; a failed write (a full disk, an I/O error) warns in one line and loses
    nothing: the draws stay in memory and the write is tried again. Returns the time to count the next
    checkpoint from (``perf_counter``), earlier after a failure so that the retry comes sooner."""
    now = time.perf_counter()
    try:
        if in_progress and not result.partial:
            result = dataclasses.replace(result, partial=True)
        if store is not None:
            store.sync()  # the draws on disk before the checkpoint that refers to them
        result.save(path)
        return now
    except OSError as e:
        retry = CHECKPOINT_RETRY_S if every is None else min(CHECKPOINT_RETRY_S, every)
        why = " ".join(str(e).split())
        if str(path) not in why:
            why += f": {path}"
        kept = f"the draws are kept on disk in {store.folder}" if store is not None else "the draws are kept in memory"
        warnings.warn(f"tallmh: checkpoint not saved ({why}); {kept}"
                      + (f" and the checkpoint is tried again in {retry:.0f} s" if in_progress else ""),
                      RuntimeWarning, stacklevel=3)
        return now - (every if every is not None else 0.0) + retry


def trust_warning():
    from ..reporting.results import TrustWarning

    return TrustWarning


def assemble(collected, num_chains, d, dtype, unravel, n, test, proposal, timings, setup_items, partial,
             states, notes, resume_info, t0, control_variates, constrain=None, empty=None):
    empty = runstate.info_dict(StepInfo.empty(dtype)) if empty is None else empty
    fields = tuple(empty)

    def stack(parts):
        if not parts:
            st = {k: np.zeros((num_chains, 0), np.asarray(v).dtype) for k, v in empty.items()}
            return np.zeros((num_chains, 0, d), np.dtype(str(dtype))), st
        def join(vals):  # (one part, e.g. draws streamed to disk: as it is, not copied)
            return vals[0] if len(vals) == 1 and isinstance(vals[0], np.memmap) else np.concatenate(vals, axis=1)

        theta = join([p[0] for p in parts])
        st = {}
        for k in fields:
            vals = [p[1].get(k) for p in parts]
            if any(v is None for v in vals):  # an older result without this statistic
                vals = [v if v is not None else np.zeros(p[0].shape[:2], np.int32) for v, p in zip(vals, parts)]
            st[k] = join(vals)
        return theta, st

    flat_samples, sstats = stack(collected["sampling"])
    flat_warm, wstats = stack(collected["warmup"])
    timings = dict(timings)
    timings["total_s"] = timings.pop("_before_s", 0.0) + time.perf_counter() - t0
    final = jax.tree_util.tree_map(np.asarray, states) if states is not None else None
    return Result(
        flat_samples=flat_samples,
        stats=sstats,
        flat_warmup=flat_warm,
        warmup_stats=wstats,
        unravel=unravel,
        n=n,
        method=getattr(test, "name", type(test).__name__),
        test=test,
        proposal=proposal,
        timings=timings,
        setup_items=setup_items,
        partial=partial,
        final_state=final,
        notes=list(notes),
        resume_info=resume_info,
        control_variates=control_variates,
        constrain=constrain if callable(constrain) else None,
    )


def make_result(run):
    selfaudit.settle_audits(run)
    if run.audit_certified:
        note = (f"self-audit: {run.audit_certified} audited decision(s) certified without reading the data (a "
                f"bound on the control variates' Taylor remainder, tallmh.certify; one extra pass of N = "
                f"{run.n:,} items, counted in the audit's items); the others read all N items")
        run.notes[:] = [m for m in run.notes if not (m.startswith("self-audit: ") and "tallmh.certify;" in m)] \
            + [note]
    states = run.states
    host_states = states if run.plan is None or states is None else \
        jax.tree_util.tree_map(distributed.to_host, states)
    info = dict(seed=run.seed, warmup_done=run.done["warmup"], sampling_done=run.done["sampling"],
                num_warmup=run.num_warmup, num_samples=run.num_samples,
                control_variates=run.control_variates, start_info=run.start_info,
                fingerprint=run.fingerprint, program=run.program is not None, chosen=run.chosen,
                audit_design=selfaudit.audit_design_as_run(run), pilot_from=getattr(run, "pilot_from", None))
    result = assemble({p: runstate.parts(run, p) for p in ("warmup", "sampling")}, run.num_chains, run.d, run.dtype,
                      run.unravel, run.n, run.test, run.proposal, run.timings, run.setup_items,
                      run.partial, host_states, run.notes, info, run.t0, run.control_variates,
                      run.constrain, runstate.empty_stats(run))
    result.coords = getattr(run.model, "coords", None) or None  # labels of a site's entries (a group's levels)
    return result


def finish(run) -> Result:
    """The Result (saved to the checkpoint), with ``num_samples='auto'``'s note and the trust warnings."""
    done = run.done
    if run.auto_draws:
        if run.auto_stop is not None:
            run.notes.append(f"num_samples='auto': stopped after {done['sampling']:,} draws per chain, with min "
                              f"bulk ESS {run.auto_stop[0]:.0f} >= {run.min_ess:g} and max R-hat "
                              f"{run.auto_stop[1]:.3f} <= {configure.AUTO_RHAT}")
        elif not run.partial:
            why = (f"the sampling budget ({run.budget_s:g} s)" if done["sampling"] < run.num_samples
                   else f"the cap of {run.num_samples:,} draws per chain")
            run.notes.append(f"num_samples='auto': {why} ran out before the check made after each chunk found "
                              f"min bulk ESS {run.min_ess:g} and R-hat {configure.AUTO_RHAT} (the verdict is on all "
                              "the draws, the last chunk's included)")
        run.num_samples = done["sampling"]
    result = make_result(run)
    if run.checkpoint is not None and run.states is not None:
        save_checkpoint(result, run.checkpoint, store=run.store)
    if run.store is not None:
        run.store.close()
    if run.changed_error is not None:
        kept = (f"; the draws made before it ({done['warmup']} warmup steps, {done['sampling']} draws per chain) "
                "are in the exception's .result"
                + (f" and in {run.checkpoint}" if run.checkpoint is not None else ""))
        raise DataChanged(f"{run.changed_error}{kept}", result)
    for w in result.warnings:
        warnings.warn(trust_warning()(w), stacklevel=3)
    return result
