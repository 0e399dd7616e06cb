"""A warmup stage: the exact subsampled default's proposal chosen by estimated ESS per second.

In: a :class:`~.runstate.Run` whose proposal selects (:class:`tallmh.proposals.LaplaceChoice`), after its
Crank-Nicolson warmup. Out: the chains' proposal mode fixed for the draws kept (0 Crank-Nicolson, 1 MALA on the
surrogate), ``run.num_warmup`` grown by the MALA pilot's steps when one ran, ``run.choice`` (the estimates),
``run.timings["choice_s"]`` and a note saying which proposal and why.

How it decides. An independence sampler's autocorrelation is all in its repeats: its proposals do not depend
on the state, and a state is held for a time whose mean grows with its importance weight ``pi / q`` (Tierney
1994; Mengersen & Tweedie 1996). Over the second half of the Crank-Nicolson warmup the stage measures

- the *stickiness* ``S = sum L_j^2 / sum L_j`` of the visits' lengths ``L_j`` (the mean length of the visit a
  random step falls in; for the independence sampler it grows with the weights' second moment
  ``E_q[w^2] / E_q[w]^2 = 1 + chi^2(pi || q)``), and
- the visits' autocorrelation time ``tau_f = sum L_j^2 (f_j - mean)^2 / (sum L_j var f)`` of each coordinate
  (the variance of a mean of held values, visits taken as independent), and the multi-chain ESS's,

and takes the independence sampler's ``tau`` as the largest of the three: each is an underestimate when the
weights are heavy-tailed (a short run has not yet met the heaviest), so the largest is the least optimistic.
When that ``tau`` is at most ``FINE_TAU`` the independence sampler is kept without a pilot (the cheap test:
no data read, a few milliseconds). Otherwise the chains run ``PILOT_STEPS`` more warmup steps with MALA, whose
``tau`` is the larger of its own stickiness and its multi-chain ESS's, and MALA is chosen when its ESS per
second is at least the independence sampler's. Where the warmup's longest hold is too long for holds of one
rate (the chains' acceptance; :func:`hold_p_value` below ``HOLD_P``), the weights are seen to spread: the
independence sampler's ``tau`` is then gauged for its slowest function by that hold, ``2 L_max - 1`` (its spectral
gap is ``1 / w*``, the largest normalised weight: Liu 1996, *Metropolized independent sampling with comparisons
to rejection sampling and importance sampling*, Statist. Comput. 6; a state held ``L`` steps has a weight of order ``L``), and MALA needs only ``CLEAR`` (1/2) of its ESS per
second: there the independence sampler's estimates are optimistic and, with unbounded weights, it is not
geometrically ergodic (Mengersen & Tweedie 1996), so a near tie goes to MALA. The two proposals run in one
compiled step, so their seconds per step are the warmup's pooled mean. The
pilot's steps are warmup: its draws are not kept, and its time is counted in ``timings["choice_s"]`` (and in
``warmup_s``).
"""

from __future__ import annotations

import time

import jax
import numpy as np

from .. import distributed
from ..reporting.diagnostics import ess_all
from . import runstate

FINE_TAU = 2.0  # the independence sampler's estimated tau at or below which it is kept without a pilot (MALA's ESS
# per step on a Gaussian target, its best case, is far below 1 / 2 beyond one dimension: 0.13-0.24 measured at d = 11)
PILOT_STEPS = 300  # MALA's pilot, per chain (warmup steps)
# where the weights are seen to spread, MALA is chosen unless its estimated ESS per second is below CLEAR times the
# independence sampler's: there the latter's estimate is optimistic (a short run underestimates tau when the
# weights are heavy-tailed) and an independence sampler with unbounded weights is not geometrically ergodic
# (Mengersen & Tweedie 1996): a near tie goes to MALA
CLEAR = 0.5
HOLD_P = 0.001  # a longest hold this unlikely under one acceptance rate is taken as a weight spread


def selects(run) -> bool:
    return bool(getattr(run.proposal, "selects", False)) and run.program is None


def visits(accepted):
    """Lengths of the runs of held states of each chain (a visit starts at an accepted step or the first step),
    and the index of each visit's first step: ``[(lengths, starts), ...]`` per chain."""
    out = []
    for acc in np.asarray(accepted, bool):
        starts = np.flatnonzero(np.r_[True, acc[1:]])
        out.append((np.diff(np.r_[starts, acc.shape[0]]), starts))
    return out


def stickiness(accepted) -> float:
    """``S = sum L^2 / sum L`` over the visits of all chains (1 when every step moved)."""
    v = visits(accepted)
    return float(sum((L.astype(float) ** 2).sum() for L, _ in v) / max(1, sum(L.sum() for L, _ in v)))


def longest_visit(accepted) -> int:
    """The longest run of held states over all chains."""
    return int(max((L.max() for L, _ in visits(accepted) if L.size), default=1))


def hold_p_value(accepted) -> float:
    """How unlikely the longest hold is were every state's acceptance the chains' mean ``a``: the chance that the
    longest of ``V`` geometric holds of rate ``a`` is at least as long, ``1 - (1 - (1 - a)^(L_max - 1))^V``."""
    acc = np.asarray(accepted, bool)
    a = float(acc.mean())
    lengths = [L for L, _ in visits(acc)]
    v, lmax = sum(L.size for L in lengths), longest_visit(acc)
    if a >= 1.0 or lmax <= 1:
        return 1.0
    tail = (1.0 - a) ** (lmax - 1)
    return float(-np.expm1(v * np.log1p(-tail))) if tail < 1.0 else 1.0


def visit_tau(accepted, draws) -> float:
    """The largest over coordinates of ``sum L_j^2 (f_j - mean)^2 / (sum L_j var f)``: the autocorrelation time of
    a chain whose only dependence is holding its state (an independence sampler), visits taken as independent."""
    x = np.asarray(draws, float)
    flat = x.reshape(-1, x.shape[-1])
    mu, var = flat.mean(axis=0), flat.var(axis=0)
    num, den = np.zeros(x.shape[-1]), 0.0
    for (L, starts), xc in zip(visits(accepted), x):
        num += ((L.astype(float) ** 2)[:, None] * (xc[starts] - mu) ** 2).sum(axis=0)
        den += L.sum()
    ok = var > 0
    return float(np.max(num[ok] / (den * var[ok]))) if ok.any() else 1.0


def ess_tau(draws) -> float:
    """Draws per effective draw of the worst coordinate (multi-chain bulk ESS)."""
    x = np.asarray(draws, float)
    e = ess_all(x)
    e = e[np.isfinite(e)]
    return float(x.shape[0] * x.shape[1] / max(1e-9, e.min())) if e.size else float("inf")


def _segment(run, lo, hi):
    """``(draws, accepted, items per step)`` of warmup steps ``lo:hi`` (all chains)."""
    parts = runstate.parts(run, "warmup")
    theta = np.concatenate([p[0] for p in parts], axis=1)[:, lo:hi]
    acc = np.concatenate([np.asarray(p[1]["accepted"]) for p in parts], axis=1)[:, lo:hi]
    nd = np.concatenate([np.asarray(p[1]["n_data"]) for p in parts], axis=1)[:, lo:hi]
    return theta, acc, float(nd.mean())


def _set_mode(run, mode):
    ps = run.states.proposal
    # (a host array put on the device: jnp.full_like here compiled two small programs, ~0.1-0.4 s between the
    # warmup and the draws of a fresh process)
    run.states = run.states._replace(proposal=ps._replace(
        mode=jax.device_put(np.full(np.shape(ps.mode), mode, np.dtype(ps.mode.dtype)))))
    if run.plan is not None:
        run.states = distributed.place_inputs(run.plan, run.states, run.chain_keys, run.k_audit, None, None)[0]


def choose(run, run_phase):
    """After the Crank-Nicolson warmup: keep it, or pilot MALA and choose by ESS per second (module docstring).
    ``run_phase(run, "warmup", total, 0)`` runs warmup steps up to ``total``."""
    if not selects(run) or getattr(run, "choice", None) is not None or run.done["sampling"] > 0 \
            or run.proposal.chosen is not None:  # (a resumed run keeps its choice)
        return
    # a run cut in its MALA pilot and resumed: the Crank-Nicolson warmup ended where the pilot started (its steps
    # after are MALA's); the pilot goes on from where it was cut, not again from its start
    pilot_from = getattr(run, "pilot_from", None)
    w = run.done["warmup"] if pilot_from is None else int(pilot_from)
    if w < 20:  # (a warmup too short to measure anything: the independence sampler stays)
        _set_mode(run, 0)
        run.choice = {"proposal": "crank-nicolson", "why": "warmup too short to compare"}
        run.proposal._chosen = "crank-nicolson"
        run.notes.append(f"proposal: Crank-Nicolson from the Laplace approximation, kept: {w} warmup steps are too "
                         "few to compare it with MALA")
        return
    t0 = time.perf_counter()
    cn_s = run.timings["warmup_s"] / w
    draws, acc, cn_items = _segment(run, w // 2, w)
    rho = float(-np.expm1(np.asarray(run.states.proposal.lap.log_gap)).mean())
    s_cn, v_cn, e_cn = stickiness(acc), visit_tau(acc, draws), ess_tau(draws)
    tau_cn = max(s_cn, v_cn, e_cn, 1.0)
    whole = _segment(run, 0, w)[1]  # (the longest hold is a rare event: looked for over the whole warmup)
    longest, p_hold = longest_visit(whole), hold_p_value(whole)
    c = {"cn_tau": tau_cn, "cn_stickiness": s_cn, "cn_visit_tau": v_cn, "cn_ess_tau": e_cn, "cn_rho": rho,
         "cn_longest_visit": longest, "cn_hold_p": p_hold,
         "cn_accept": float(acc.mean()), "cn_s_per_step": cn_s, "cn_items": cn_items}
    name_cn = "independence (Crank-Nicolson rho 0)" if rho < 1e-3 else f"Crank-Nicolson (rho {rho:.2f})"
    if tau_cn <= FINE_TAU and pilot_from is None:
        c.update(proposal="crank-nicolson", pilot_steps=0)
        _set_mode(run, 0)  # (as it started; also after a pilot cut short by an interruption and resumed)
        run.choice = c
        run.proposal._chosen = c["proposal"]
        run.timings["choice_s"] = time.perf_counter() - t0
        run.notes.append(f"proposal: {name_cn}, kept without a MALA pilot: its estimated autocorrelation time in "
                         f"warmup is {tau_cn:.2f} steps (at most {FINE_TAU}; acceptance {c['cn_accept']:.2f}, "
                         f"stickiness {s_cn:.2f})")
        return
    _set_mode(run, 1)
    t_host = time.perf_counter() - t0
    tw = run.timings["warmup_s"]
    run.pilot_from = w  # (saved with a result cut during the pilot: restore.restore, above)
    if run.bar is not None and run.bar.bar.total is not None:
        run.bar.bar.total += w + PILOT_STEPS - run.num_warmup
    run.num_warmup = w + PILOT_STEPS
    run_phase(run, "warmup", run.num_warmup, 0)
    t1 = time.perf_counter()
    pilot_s = run.timings["warmup_s"] - tw
    m_draws, m_acc, m_items = _segment(run, w, run.done["warmup"])
    steps = max(1, run.done["warmup"] - w)
    s_m, e_m = stickiness(m_acc), ess_tau(m_draws)
    tau_m = max(s_m, e_m, 1.0)
    m_s = pilot_s / steps
    # the independence sampler's slowest function: its spectral gap is 1 / w* (the largest normalised weight,
    # Liu 1996), so tau = 2 w* - 1 for the indicator of the heaviest state; a state held L steps has a
    # normalised weight of order L, so the longest visit gauges w* from below where it is longer than holds of one
    # rate (the acceptance's) would make it: a weight spread, seen
    heavy = rho <= 0.5 and p_hold < HOLD_P
    tau_cn_worst = max(tau_cn, 2.0 * longest - 1.0) if heavy else tau_cn
    # both proposals run in the one compiled step (both are computed, one is used) and differ only in the rows
    # the test reads (a few per step, against a per-step overhead that dominates: benchmarks/README.md); their
    # seconds per step are taken as the warmup's pooled mean, not as the two segments' own timings, which on a
    # shared machine differ by their noise more than by their cost (and would make the choice depend on load)
    per_step = (run.timings["warmup_s"]) / max(1, run.done["warmup"])
    rate_cn, rate_m = 1.0 / (tau_cn_worst * per_step), 1.0 / (tau_m * per_step)
    mala = rate_m >= (CLEAR if heavy else 1.0) * rate_cn
    c.update(cn_tau_worst=tau_cn_worst, mala_tau=tau_m, mala_stickiness=s_m, mala_ess_tau=e_m, mala_accept=float(m_acc.mean()),
             mala_s_per_step=m_s, mala_items=m_items, pilot_steps=steps, pilot_s=pilot_s, s_per_step=per_step,
             cn_ess_per_s=rate_cn, mala_ess_per_s=rate_m,
             proposal="surrogate-mala" if mala else "crank-nicolson")
    _set_mode(run, 1 if mala else 0)
    run.choice = c
    run.proposal._chosen = c["proposal"]
    run.timings["choice_s"] = t_host + pilot_s + (time.perf_counter() - t1)
    chosen = "MALA on the surrogate" if mala else name_cn
    run.notes.append(
        f"proposal: {chosen}, chosen in warmup by estimated ESS per second: {name_cn} autocorrelation time "
        f"{tau_cn:.1f} steps, {tau_cn_worst:.1f} for its slowest function (stickiness {s_cn:.1f}, longest visit "
        f"{longest} steps{', too long for one acceptance rate' if heavy else ''}, acceptance {c['cn_accept']:.2f}, "
        f"{cn_items:.2g} rows per step); MALA's {steps}-step "
        f"pilot {tau_m:.1f} steps (acceptance {c['mala_accept']:.2f}, {m_items:.2g} rows per step); "
        f"{1e3 * per_step:.3f} ms per step: ESS per second {rate_cn:.3g} against {rate_m:.3g}; the pilot took "
        f"{pilot_s:.2f} s of warmup" + ("" if run.auto_warmup else
                                         f" (its {steps} steps came after the {w} warmup steps asked for: "
                                         f"{run.num_warmup} warmup steps in all)"))
