"""Stage 2, resume and storage: the run's fingerprint, a resumed run's state, draws streamed to disk.

In: a :class:`~.runstate.Run` after :mod:`.configure`, and the ``resume`` Result (or None). Out: the run's
``fingerprint`` (a resumed one refused when it differs), the resumed draws, states, counts, timings and notes;
with ``stream_draws``, a :class:`~tallmh.storage.drawstore.DrawStore` that takes the draws instead of memory.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from ..storage import checkpoint as ckpt
from ..errors import ConfigError
from . import runstate


def restore(run, resume):
    """The fingerprint of this run; a resumed run's draws, states, counts and notes."""
    saved_fp = resume.resume_info.get("fingerprint") if resume is not None else None
    run.fingerprint = ckpt.run_fingerprint(run.model, run.data, run.n, run.test, run.proposal,
                                            run.control_variates, run.num_chains, run.seed, run.d, run.dtype,
                                            salt=(saved_fp or {}).get("data", {}).get("salt"))
    if saved_fp:
        why = ckpt.mismatch(saved_fp, run.fingerprint)
        if why is not None:
            raise ConfigError(f"resume: refused: {why}")
    if resume is None:
        return
    if resume.n != run.n:
        raise ConfigError(f"resume: the run had N = {resume.n} items; this data has N = {run.n}")
    if resume.flat_samples.shape[-1] != run.d:
        raise ConfigError(f"resume: the run's parameter has {resume.flat_samples.shape[-1]} coordinates; "
                          f"this model's has {run.d}")
    info = resume.resume_info
    run.states = jax.tree_util.tree_map(jnp.asarray, resume.final_state)
    done = run.done = {"warmup": int(info["warmup_done"]), "sampling": int(info["sampling_done"])}
    run.pilot_from = info.get("pilot_from")
    if run.pilot_from is not None:  # cut in (or after) the proposal choice's MALA pilot, which then goes on
        total = int(info["num_warmup"])  # (the warmup asked for and the pilot's steps)
        if not run.auto_warmup and run.num_warmup not in (run.pilot_from, total):
            raise ConfigError(f"resume: the run's MALA pilot started after its {run.pilot_from} warmup steps; resume "
                              f"with num_warmup={run.pilot_from} (as asked before) or {total} (with the pilot)")
        run.num_warmup = total
    elif run.auto_warmup:  # the warmup the run chose when it started
        run.num_warmup = int(info.get("num_warmup", run.num_warmup))
    if done["warmup"] > run.num_warmup or done["sampling"] > run.num_samples:
        raise ConfigError(f"resume: the run already has {done['warmup']} warmup steps and {done['sampling']} "
                          f"draws; ask for at least as many (num_warmup={run.num_warmup}, "
                          f"num_samples={run.num_samples})")
    if done["sampling"] > 0 and done["warmup"] < run.num_warmup:
        raise ConfigError("resume: sampling had started; the warmup cannot be extended")
    run.collected = {
        "warmup": [(resume.flat_warmup, resume.warmup_stats)] if resume.flat_warmup.shape[1] else [],
        "sampling": [(resume.flat_samples, resume.stats)] if resume.flat_samples.shape[1] else []}
    # model.setup ran again (or will, from a StatsTap: counted when it resolves)
    run.setup_items = resume.setup_items + (run.n if run.stats is not None and run.stats_tap is None else 0)
    run.timings = {k: float(v) for k, v in resume.timings.items() if k != "total_s"}
    run.timings["_before_s"] = float(resume.timings.get("total_s", 0.0))  # wall time of the earlier run(s)
    run.notes[:] = list(resume.notes)
    run.start_info = dict(info.get("start_info", {}))


def open_store(run, resume):
    """Draws appended to files beside the checkpoint (:mod:`tallmh.storage.drawstore`) instead of memory."""
    from ..storage.drawstore import SUFFIX, DrawStore

    store = DrawStore(os.fspath(run.checkpoint) + SUFFIX, run.num_chains, run.d, run.dtype)
    stat_dtypes = {k: np.asarray(v).dtype for k, v in runstate.empty_stats(run).items()}
    mine = resume is not None and resume.flat_samples.shape[1] + resume.flat_warmup.shape[1] > 0 and all(
        isinstance(a, np.memmap) and os.path.dirname(os.path.abspath(a.filename)) == store.folder
        for a in (resume.flat_samples, resume.flat_warmup) if a.shape[1] > 0)
    try:
        store.start({p: int(c) for p, c in run.done.items()}, stat_dtypes, keep=mine)
    except OSError as e:
        raise ConfigError(f"resume: {e}") from None
    if not mine:
        for pname in ("warmup", "sampling"):
            for th, st in run.collected[pname]:
                store.add(pname, th, st)
    run.collected = {"warmup": [], "sampling": []}
    run.store = store
