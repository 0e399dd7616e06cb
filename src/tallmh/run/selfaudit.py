"""Stage 5, the self-audit: its plan, its deferred exact passes, certificates and the two-stage design.

In: a :class:`~.runstate.Run` (its test, sizes and the chunks' outputs). Out: ``run.rates`` (the audit rate
of each phase), ``run.audit_design`` (the two-stage plan), and each chunk's ``audited``, ``audit_exact`` and
``audit_items`` filled in by exact passes taken in a worker thread beside the next chunks (or settled from a
certified bound on the Taylor remainder, :mod:`tallmh.certify`), with the notes that say what was audited.
"""

from __future__ import annotations

import math
import queue
import threading

import numpy as np

from .. import certify
from ..storage import datasource as ds
from ..storage.data import to_device
from ..kernel import AuditArgs, oracle_of
from ..reporting.results import audit_first_stage, audit_power, audits_for_power, error_target
from . import configure, programs, runstate, threads

# Default self-audit: enough audited chain-steps (spread over warmup and sampling) that a true wrong-decision
# rate of twice the test's target is flagged with probability AUDIT_POWER (198 at a target of 0.05), at most
# MAX_AUDIT_RATE of the steps, and at most DEFAULT_AUDIT_ITEMS items read by the audits.
AUDIT_POWER = 0.8
MAX_AUDIT_RATE = 0.05
# ... and a two-stage design: once results.audit_first_stage(target) sampling steps are audited with no wrong
# decision in any audit so far, the rest of the planned audits are skipped. A true rate of twice the target
# passes that first stage with probability (1 - 2 target)^m1 <= AUDIT_CLEAR_LOSS, so the design's power drops by
# at most that much (0.01); a run whose audits find a wrong decision keeps its whole plan.
AUDIT_CLEAR_LOSS = 0.01
DEFAULT_AUDIT_ITEMS = 4 * 10**8  # ... and no more than this many items read by them (each reads all N)
# Audited decisions that a certified bound on the control variates' Taylor remainder settles are taken without
# reading data (tallmh.certify), where the audit plans at least CERTIFY_MIN_AUDITS audited chain-steps (the
# certificate's one host pass costs about as much as an audited step of 4 chains)
CERTIFY = True
CERTIFY_MIN_AUDITS = 8
# ... and at most this many rows: the certificate's host pass (float64 NumPy, ~1.3 s per 10^7 rows on 2 cores,
# beside the chain) costs more than the audits it saves above (at 10^8 the capped default audits ~4 chain-steps,
# one pass of ~3.6 s); there the audits read all N items as before
CERTIFY_MAX_ROWS = 2**24


def audit_rates(run):
    """Self-audit rate per phase (warmup, sampling): see ``audit`` in :func:`.sampling.sample`."""
    n, test = run.n, run.test
    if run.audit is not None or run.is_exact:
        rate = 0.0 if run.is_exact else float(run.audit or 0.0)
        run.rates = (rate, rate)
        run.audit_on = rate > 0
        return
    tgt = error_target(test) or 0.05
    wanted = audits_for_power(tgt, AUDIT_POWER)
    planned = configure.AUTO_PLANNED_SAMPLES if run.auto_draws else run.num_samples  # ("auto": a typical run's draws)
    steps = max(1, run.num_chains * (run.num_warmup + planned))
    passes = test.audit_passes() if callable(getattr(test, "audit_passes", None)) else 1  # (a program's blocks)
    by_items = DEFAULT_AUDIT_ITEMS // max(1, n * passes)
    # where audited decisions can be certified without reading the data, the items are counted as they are
    # read (audit_chunk stops the audit at the budget) instead of cutting the plan to N items per audit
    run.audit_budget = DEFAULT_AUDIT_ITEMS if by_items < wanted and certifiable(run) else None
    n_audits = wanted if run.audit_budget is not None else min(wanted, by_items)
    rate = min(MAX_AUDIT_RATE, n_audits / steps)
    run.rates = (rate, rate)
    run.audit_on = rate > 0
    got = int(round(rate * steps))
    first = audit_first_stage(error_target(test), AUDIT_CLEAR_LOSS)
    if first is not None and got > first and run.plan is None and run.program is None \
            and getattr(test, "name", "") != "barker":
        run.audit_design = {"planned": got, "first_stage": first, "cleared_after": None, "rate": rate}
    if got < wanted:
        each = f"all N = {n:,} items" if passes == 1 else f"all N = {n:,} items {passes} times"
        why = (f"each reads {each} and the default reads at most {DEFAULT_AUDIT_ITEMS:.0e}"
               if n_audits < wanted else f"at most {MAX_AUDIT_RATE:g} of the {steps:,} chain-steps")
        msg = (f"self-audit: about {got} audited chain-step(s) by default ({why}); they flag a wrong-decision "
               f"rate of twice the target with probability {audit_power(got, tgt):.2f} (pass audit=rate "
               f"for more: {wanted} give {AUDIT_POWER:g})")
        if msg not in run.notes:  # (a resumed run carries its notes already)
            run.notes.append(msg)


def certifiable(run) -> bool:
    """Whether the deferred audit will certify decisions (:func:`certificate`), as far as is known before the
    set-up: the built-in logistic regression with second-order control variates on data in host memory or in
    a file, one device, no inference program."""
    got = {k: getattr(run, k, None) for k in ("program", "plan", "cv_order", "data", "test")}
    return bool(CERTIFY and run.n <= CERTIFY_MAX_ROWS and got["program"] is None and got["plan"] is None
                and got["cv_order"] == 2 and certify.eligible(run.model, oracle_of(got["test"]))
                and ds.host_reader(got["data"]) is not None)


def audit_clear(run):
    """The audit's first stage (``AUDIT_CLEAR_LOSS``): after a sampling chunk (or, for audits deferred out of
    the chain, before a chunk's audited steps are picked), when at least ``first_stage`` sampling steps have
    been audited and no audit so far found a wrong decision, the remaining sampling chunks audit nothing
    (their audit rate is a run-time argument: nothing recompiles)."""
    design = run.audit_design
    if design is None or design["cleared_after"] is not None or design.get("wrong_seen") or run.rates[1] == 0:
        return
    wrong, m_sampling = audit_counts(run)
    if m_sampling >= design["first_stage"] and not wrong and run.audit_pending:
        # (audits still waiting for their pass count as agreeing until then: the stage would clear, so they
        # are taken now)
        flush_audits(run)
        wrong, m_sampling = audit_counts(run)
    if wrong is None:
        return
    if wrong:  # the whole plan stands: no need to look again
        design["wrong_seen"] = True
        return
    design["audited_sampling"] = m_sampling
    if m_sampling < design["first_stage"]:
        return
    run.rates = (run.rates[0], 0.0)
    design["cleared_after"] = m_sampling
    tgt = error_target(run.test)
    msg = (f"self-audit: no wrong decision in the first {m_sampling} audited sampling steps (nor in warmup's), so "
           f"the rest of the {design['planned']} planned audits were skipped (a true rate of twice the target, "
           f"{2 * tgt:g}, passes {design['first_stage']} audits unflagged with probability "
           f"{(1 - 2 * tgt) ** design['first_stage']:.3f}; audit=rate audits every planned step)")
    if not any(n.startswith("self-audit: no wrong decision in the first") for n in run.notes):
        run.notes.append(msg)


def audit_counts(run):
    """``(wrong decisions, audited sampling steps)`` over the run's chunks so far (``(None, 0)`` while a chunk's
    audits are not recorded yet); an audited step still waiting for its pass counts as agreeing."""
    wrong, m_sampling = 0, 0
    for pname in ("warmup", "sampling"):
        for _, info in runstate.parts(run, pname):
            if "audited" not in info or "audit_exact" not in info:
                return None, 0
            aud = np.asarray(info["audited"], bool)
            differs = np.asarray(info["accepted"], bool) != np.asarray(info["audit_exact"], bool)
            wrong += int(np.sum(aud & differs))
            if pname == "sampling":
                m_sampling += int(aud.sum())
    return wrong, m_sampling


def audit_chunk_cap(run, count: int) -> int:
    """While the audit's first stage is open, a sampling chunk of at most the steps expected to bring half
    of the audited sampling steps still missing to ``first_stage`` (all of them when one audited step
    would do): the stage is checked between chunks, and a chunk that ran on past it would audit steps
    (each a full pass) that the cleared design skips. The chunks stay short only until the stage closes.
    (Audits deferred out of the chain need no cap: their stage closes at the step that completes it.)"""
    design = run.audit_design
    if design is None or design["cleared_after"] is not None or design.get("wrong_seen") or run.rates[1] == 0:
        return count
    left = design["first_stage"] - design.get("audited_sampling", 0)
    if left <= 0:
        return count
    if left > run.num_chains:
        left = left / 2
    return int(max(1, min(count, math.ceil(left / (run.num_chains * run.rates[1])))))


def audit_design_as_run(run):
    """The two-stage audit's record for the result: ``planned`` becomes the audits that the run's own steps
    would have had at the planned rate (fewer than the plan when the draws stopped early), so that the
    power reported for a cleared audit is that of the run as it went."""
    if not run.audit_design:
        return None
    design = dict(run.audit_design)
    steps = run.num_chains * (run.done["warmup"] + run.done["sampling"])
    design["planned"] = int(round(design.pop("rate") * steps))
    return design


def audits_of_chunk(run, phase, info, args, ua):
    """Hand the chunk's audits to the audit worker (:func:`audit_chunk`, chunks in the order they ran).

    The chain does not steer by its audits, so which of its steps are audited, and their exact passes,
    can come after it: a worker thread takes the chunks in order while the next chunks run (the chain's
    loop keeps about one core busy, the pass both), and sees every earlier chunk's audits done, as the
    two-stage design wants. Until the worker reaches a chunk its statistics show no audit; the result,
    a checkpoint and draws streamed to disk (a chunk is written once) wait for it (:func:`settle_audits`)."""
    info["audited"] = np.zeros(np.shape(ua), bool)
    info["audit_exact"] = np.zeros(np.shape(ua), bool)
    info["audit_items"] = np.zeros(np.shape(ua), np.int32)
    if run.store is not None:
        settle_audits(run)
        audit_chunk(run, phase, info, args, ua)
        flush_audits(run)
        return
    if getattr(run, "audit_queue", None) is None:
        run.audit_queue, run.audit_errors = queue.Queue(), []
        threading.Thread(target=threads.as_caller(audit_worker), args=(run, run.audit_queue), daemon=True,
                         name="tallmh-audit").start()
    run.audit_queue.put((phase, info, args, ua))


def audit_worker(run, q):
    while True:
        item = q.get()
        try:
            if item is None:
                return
            if not run.audit_errors:  # (after a failure the rest is not audited: the run raises it)
                audit_chunk(run, *item)
        except BaseException as e:  # noqa: BLE001 - raised where the run waits for its audits
            run.audit_errors.append(e)
        finally:
            q.task_done()


def settle_audits(run):
    """Wait until the audit worker has done every chunk handed to it (then it stops; a later chunk starts
    another), and raise what it failed with."""
    q = getattr(run, "audit_queue", None)
    if q is None:
        return
    with q.all_tasks_done:
        while q.unfinished_tasks:  # (short waits: Ctrl-C stays responsive)
            q.all_tasks_done.wait(0.05)
    q.put(None)
    run.audit_queue = None
    if run.audit_errors:
        raise run.audit_errors[0]
    flush_audits(run)


def audit_chunk(run, phase, info, args, ua):
    """A chunk's audits, after those of every chunk before it: the first stage checked on those
    (:func:`audit_clear`), then the steps whose audit uniform is below the phase's rate (and whose proposal
    is in the support) audited, in order; while the first stage is open only until it has its
    ``first_stage`` audited sampling steps (the rest of the chunk's are audited too if one of those finds
    a wrong decision: the whole plan then stands)."""
    if phase == 1:
        audit_clear(run)
    cand = (np.asarray(ua) < run.rates[phase]) & (np.asarray(args.log_base) > -np.inf)
    sel, rest = cand, None
    design = run.audit_design
    if phase == 1 and design is not None and design["cleared_after"] is None and not design.get("wrong_seen"):
        need = design["first_stage"] - design.get("audited_sampling", 0)
        reach = np.flatnonzero(np.cumsum(cand.sum(axis=0)) >= need)
        if reach.size:  # the stage has its audits at this step: the later ones wait on their outcome
            sel = cand.copy()
            sel[:, reach[0] + 1:] = False
            rest = cand & ~sel
    if not cand.any():
        return
    info["audited"] = sel
    info["audit_items"] = np.where(sel, run.n, 0).astype(np.int32)
    take_audits(run, info, args, sel)
    if rest is not None and rest.any():
        flush_audits(run)
        wrong = info["audited"] & (np.asarray(info["accepted"], bool) != info["audit_exact"])
        if wrong.any():
            take_audits(run, info, args, rest)


def audit_stop(run):
    """The default audit has read its budget of items (``DEFAULT_AUDIT_ITEMS``, counted as read where decisions
    are certified): the rest of the run audits nothing, and a note gives the power of what was audited."""
    run.rates = (0.0, 0.0)
    m = sum(int(np.sum(info["audited"])) for pname in ("warmup", "sampling") for _, info in runstate.parts(run, pname)
            if "audited" in info)
    tgt = error_target(run.test) or 0.05
    run.notes.append(f"self-audit: stopped at its budget of {DEFAULT_AUDIT_ITEMS:,} items read, after about {m} "
                      f"audited chain-step(s), {run.audit_certified} of them certified without reading the data; "
                      f"they flag a wrong-decision rate of twice the target with probability "
                      f"{audit_power(m, tgt):.2f} (pass audit=rate for more)")


def take_audits(run, info, args, mask):
    """The exact decisions of the chunk's audited steps ``mask`` (chains first; ``info`` and ``args`` on the
    host), written into ``info`` as the chain's own audit would have: ``audit_exact``, ``audit_items`` (N,
    or 0 for a proposal out of the support, which reads nothing) and ``audited``.

    Where a certified bound on the control variates' Taylor remainder settles a decision (:mod:`tallmh.certify`,
    :func:`certificate`) it is taken without reading data (``audit_items`` 0; the certificate's one pass, N
    items, is counted at the first audited step after it); the other audited chain-steps are packed side by
    side, ``num_chains`` to a slot of the audit's program, whichever chain and step each comes from."""
    asked = np.asarray(mask, bool)
    if not asked.any():
        return
    exact = np.array(info["audit_exact"], bool)
    leaves = [np.asarray(v) for v in args]
    certified = np.zeros_like(asked)
    cert = certificate(run)
    if cert is not None:
        oracle = run.kernel_oracle
        sel = np.nonzero(asked)
        t, size = certify.thresholds(leaves[4][sel], leaves[3][sel], oracle.kind, oracle.temperature)
        ok, acc = certify.settle(cert, leaves[1][sel], leaves[2][sel], t, size)
        certified[sel] = ok
        exact[sel] = ok & acc
    mask = asked
    if run.audit_budget is not None:  # whole steps in order, each while the items read before it are within budget
        per_step = (asked & ~certified).sum(axis=0) * run.n
        keep = np.cumsum(per_step) - per_step < run.audit_budget - run.audit_items_read
        mask, certified = asked & keep, certified & keep
    waiting = mask & ~certified
    run.audit_certified += int(certified.sum())
    items = np.where(asked, 0, np.asarray(info["audit_items"], np.int32))  # (the passes add theirs)
    if run.cert_items and not run.cert_counted:  # the certificate's pass, once (counted if it failed)
        first = np.argwhere(mask if mask.any() else asked)[0]
        items[first[0], first[1]] += np.int32(run.n)
        run.cert_counted = True
    audited = (np.asarray(info["audited"], bool) & ~asked) | certified | waiting
    # (a step waiting for its pass agrees with the chain until then: audit_counts)
    now = np.where(certified, exact, waiting & np.asarray(info["accepted"], bool))
    info["audit_exact"], info["audit_items"], info["audited"] = np.where(asked, now, exact), items, audited
    pairs = np.argwhere(waiting)  # (chain, step): their exact passes wait in audit_pending
    run.audit_items_read += run.n * len(pairs)
    if pairs.size:
        run.audit_pending.append((info, pairs, [v[pairs[:, 0], pairs[:, 1]] for v in leaves]))
        if sum(len(p[1]) for p in run.audit_pending) >= run.num_chains:
            flush_audits(run, whole=True)
    if run.audit_budget is not None and run.audit_items_read >= run.audit_budget and any(run.rates):
        audit_stop(run)


def flush_audits(run, whole=False):
    """The exact passes of the audited chain-steps that :func:`take_audits` left waiting, ``num_chains`` to a
    slot of the audit's program whichever chain, step or chunk each comes from, written into their chunks'
    ``info``. ``whole``: only as many as fill whole slots (the rest wait for company): called so as soon as
    a slot's worth waits (while the chain runs on); all of them before anything reads the audits' outcomes
    (the first stage, a chunk's later audits) and when the run settles its audits."""
    pending, run.audit_pending = run.audit_pending, []
    if not pending:
        return
    c = run.num_chains
    owner = np.concatenate([np.full(len(p[1]), k) for k, p in enumerate(pending)])
    pairs = np.concatenate([p[1] for p in pending])
    vals = [np.concatenate([p[2][j] for p in pending]) for j in range(len(pending[0][2]))]
    take = (len(pairs) // c) * c if whole else len(pairs)
    for k, (info, _, _) in enumerate(pending):  # (those left wait again, in order)
        left = np.flatnonzero(owner == k)
        left = left[left >= take]
        if left.size:
            run.audit_pending.append((info, pairs[left], [v[left] for v in vals]))
    if take == 0:
        return
    owner, pairs, vals = owner[:take], pairs[:take], [v[:take] for v in vals]
    prog = programs.audit_compiled(run, run.entry, run.states)
    per_call = programs.AUDIT_SLOTS * c
    ex_all, it_all = np.zeros(len(pairs), bool), np.zeros(len(pairs), np.int32)
    for k in range(0, len(pairs), per_call):
        j = np.arange(k, min(len(pairs), k + per_call))
        pad = np.concatenate([j, np.full(per_call - len(j), j[0])])  # (the padding is never read back)
        args = AuditArgs(*(to_device(v[pad].reshape((programs.AUDIT_SLOTS, c) + v.shape[1:])) for v in vals))
        ex, it = prog(args, to_device(np.int32(-(-len(j) // c))), run.run_data, run.run_stats)
        ex_all[j], it_all[j] = np.asarray(ex).reshape(-1)[:len(j)], np.asarray(it).reshape(-1)[:len(j)]
    for k, (info, _, _) in enumerate(pending):
        sel = owner == k
        if not sel.any():
            continue
        ci, si = pairs[sel, 0], pairs[sel, 1]
        info["audit_items"][ci, si] += it_all[sel]
        info["audited"][ci, si] = it_all[sel] > 0  # (none for a proposal out of the support: never picked)
        info["audit_exact"][ci, si] = ex_all[sel] & (it_all[sel] > 0)


def certificate(run):
    """The certified Taylor bound of the deferred audit (:mod:`tallmh.certify`), made by one host pass the first
    time an audit is taken, or None: for the built-in logistic regression with control variates (their centre
    and Hessian sum give the certificate's centre and whitening) on data in host memory or in a file, with
    the exact test (Metropolis or Barker) as oracle, N at most ``CERTIFY_MAX_ROWS``, when the audit plans at
    least ``CERTIFY_MIN_AUDITS`` audited chain-steps (the pass costs about one audited step of a few chains)."""
    if run.cert_state is not None:
        return run.cert_state or None
    run.cert_state = False
    cv = getattr(run.states, "cv", None)
    if cv is None or not certifiable(run):
        return None
    run.kernel_oracle = oracle_of(run.test)
    planned = configure.AUTO_PLANNED_SAMPLES if run.auto_draws else run.num_samples
    expected = run.num_chains * (run.rates[0] * run.num_warmup + run.rates[1] * planned)
    if run.audit_design:
        expected = min(expected, run.audit_design["planned"])
    read = ds.host_reader(run.run_data)
    if expected < CERTIFY_MIN_AUDITS or read is None:
        return None
    center = np.asarray(cv.center)[0]
    hess = np.asarray(cv.hess_sum)[0]
    if not np.any(hess):  # (first-order control variates keep no Hessian sum)
        return None
    prior = getattr(run.model, "log_prior_vgh_host", None)
    ph = prior(center.astype(np.float64))[2] if callable(prior) else np.zeros_like(hess)
    cert, run.cert_items = certify.build(run.model, read, run.n, center, hess, ph, run.dtype)
    run.audit_items_read += run.cert_items
    run.cert_state = cert or False
    return cert
