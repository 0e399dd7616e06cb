"""Stage 3, the set-up: the posterior mode, the Laplace covariance, the control variates and the chains' starts.

In: a configured :class:`~.runstate.Run` (and, with ``early``, the chain compiling beside it). Out: the chains'
start ``states`` (the kernel's init, vectorised over chains), ``setup_items`` counted, ``start_info`` (mode
found, Laplace start, Newton's passes), the model's set-up statistics resolved, and ``num_warmup="auto"`` settled.
The passes themselves are :mod:`tallmh.setup_passes`'.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import control_variates as cvm
from .. import fused_table, one_pass
from .. import setup_passes as setup
from .. import strata
from ..storage import datasource as ds
from ..storage.data import to_device
from ..kernel import tracks_log_lik
from ..proposals import AdaptiveMetropolis
from ..console import first_line
from ..errors import ConfigError
from . import configure, rng, threads


INIT_SPREAD = 1.5  # chains start at mode + INIT_SPREAD * (Laplace sd) * z


def fixed_mask(model, unravel, flat0):
    """The flat mask of the parameters a model asks the mode search to hold at its start (its attribute
    ``mode_fixed``: keys of its parameter dict), or None."""
    keys = getattr(model, "mode_fixed", None)
    if not keys:
        return None
    pos = unravel(jnp.arange(flat0.shape[0]))
    if not isinstance(pos, dict) or any(k not in pos for k in keys):
        return None
    mask = np.zeros(flat0.shape[0], bool)
    for k in keys:
        mask[np.asarray(pos[k]).astype(int).reshape(-1)] = True
    return mask


def start_points(model, data, n, unravel, flat0, control_variates, num_chains, init_given, init_jitter,
                 key, dtype, notes):
    """Mode, Laplace covariance, control-variate state and chain starts; returns a dict (passes counted)."""
    out = {"center": None, "cov": None, "cv": None, "passes": 0, "extra_items": 0, "starts": None, "mean": None}
    want_mode = init_given is None
    center = None
    sums = None
    if want_mode:
        try:
            fixed = fixed_mask(model, unravel, flat0)
            found = setup.mode_search(model, data, n, unravel, flat0,
                                      control_variates.max_newton if control_variates is not None else 30,
                                      tol=setup.centre_tol(flat0.shape[0]), fixed=fixed)
            center = found.center
            out["mean"] = found.mean  # (the surrogate's mode where the search stopped a Newton step short of it)
            out["passes"] += found.passes
            out["extra_items"] += found.warm_items
            sums = cvm.state_at_mode(found)  # the search's last pass made them at the mode, unless it ended on a step
            if sums is None:
                sums = cvm.proxy_sums(model, data, n, unravel, center, 2)
                out["passes"] += 1
            out["sums"] = sums
            out["cov"], laplace = setup.start_cov(model, unravel, sums)
            if not laplace and fixed is not None:
                notes.append("the mode search held " + ", ".join(model.mode_fixed) + " at the model's start "
                             "(conditional mode of the rest); the Hessian there is not negative definite, so "
                             "chains start dispersed by its positive part")
            elif not laplace:
                notes.append("the Hessian at the end of the mode search is not negative definite (no mode found): "
                             + ("chains start dispersed by its positive part, not by the Laplace approximation"
                                if out["cov"] is not None else "no Laplace start"))
        except KeyboardInterrupt:
            raise
        except Exception as e:  # noqa: BLE001 - a model Newton cannot handle: start at init
            notes.append(f"posterior mode not found ({type(e).__name__}: {first_line(e, 120)}); "
                         "chains start at the model's init")
            center = None
        if center is not None and not bool(np.all(np.isfinite(np.asarray(center)))):
            notes.append("posterior mode search diverged; chains start at the model's init")
            center, out["cov"] = None, None
        out["center"] = center
    if control_variates is not None:
        if control_variates.center is None and center is not None:
            if control_variates.order == 2 and sums is not None:
                cv0 = sums
            else:
                cv0 = cvm.proxy_sums(model, data, n, unravel, center, control_variates.order)
                out["passes"] += 1
        else:
            cv0, passes, extra = cvm.prepare(control_variates, model, data, n, unravel, flat0)
            out["passes"] += passes
            out["extra_items"] += extra
        if out["cov"] is None and control_variates.order == 2:
            out["cov"] = setup.laplace_cov(model, unravel, cv0)
        cv0, passes = strata.attach(control_variates, model, data, n, unravel, cv0, out["cov"], notes)
        out["passes"] += passes
        out["cv"] = cv0
        if init_given is None and center is None:
            center = cv0.center
        elif center is not None and out.get("mean") is None and not np.array_equal(np.asarray(cv0.center),
                                                                                   np.asarray(center)):
            out["mean"] = center  # (control variates centred elsewhere: the Laplace proposals at the mode found)
    if out.get("mean") is not None:
        center = out["mean"]
    base = center if (init_given is None and center is not None) else flat0
    # on the host: each eager device operation here compiled a program of its own (~0.5 s on a cold cache)
    base_h = np.asarray(base)
    starts = np.broadcast_to(base_h, (num_chains,) + base_h.shape)
    if init_jitter is not None:
        if init_jitter > 0:
            starts = (starts + init_jitter * rng.start_normals(key, starts.shape)).astype(dtype)
    elif init_given is None and out["cov"] is not None:
        chol = np.linalg.cholesky(np.asarray(out["cov"], float))
        z = rng.start_normals(key, starts.shape)
        starts = (base_h.astype(float)[None, :] + INIT_SPREAD * z @ chol.T).astype(dtype)
    starts = to_device(starts, dtype)
    if num_chains > 1 and bool(np.all(np.asarray(starts) == np.asarray(starts)[0])):
        notes.append("all chains started at the same point, so R-hat cannot detect chains that have not "
                     "mixed (pass init_jitter > 0, or no init, to disperse them)")
    out["starts"] = starts
    return out


def set_up(run, init_jitter, early=None):
    """The chains' start states: for a program, its blocks' init from the model's; else the mode, the
    Laplace covariance, the control variates (:func:`start_points`) and the kernel's init. With ``early``
    (the chain compiling beside the set-up), the kernel's init is traced once the chain's trace is done:
    two traces at once share one interpreter, and the chain's is the longer wait."""
    if run.program is not None:
        return run.init_states(jax.random.split(run.k_jit, run.num_chains))
    model, data, n, test, proposal = run.model, run.data, run.n, run.test, run.proposal
    try:
        with ds.tapping(data, run.stats_tap), fused_table.requesting(data, _fused_bound(run), _plan(run)) as fused:
            # (the model's statistics from the first full pass's blocks; the exact test's weights from the last)
            st = threads.in_thread(lambda: start_points(model, data, n, run.unravel, run.flat0,
                                                  run.control_variates, run.num_chains, run.init_given,
                                                  init_jitter, run.k_jit, run.dtype, run.notes))
    except ds.StatsFailed:
        resolve_stats(run)  # raises the model's own error on the block it could not take
        raise
    run.setup_items += st["passes"] * n + st["extra_items"]
    cv0 = st["cv"]
    if cv0 is None and getattr(test, "wants_mode", False):  # informed sub-sampling's default statistic
        cv0 = st.get("sums")
    hint = st["cov"] if (isinstance(proposal, AdaptiveMetropolis) or getattr(proposal, "uses_cov_hint", False)) \
        else None
    run.start_info = {"mode_found": st["center"] is not None, "laplace": st["cov"] is not None,
                       "newton_passes": int(st["passes"])}
    run.setup_items += sum(getattr(fused, "probed", ()))  # (the prescreen's rows timed to price a read)
    pred = getattr(fused, "prediction", None)
    if pred is not None:  # (the one-pass rule was asked: tallmh.one_pass)
        run.start_info["one_pass"] = bool(pred.one_pass)
        run.setup_items += pred.probed  # (the rows timed to price a read)
        run.notes.append(one_pass.note(pred))
    mean = st["mean"] if st.get("mean") is not None and cv0 is not None else None
    if cv0 is not None and getattr(test, "needs_factor_table", False):
        # the exact subsampled test's table from the same centre, made beside the kernel's init (its compile)
        # (as the chains' states hold it: the init's compiled program takes its arrays in JAX's dtypes)
        cv_h = jax.tree_util.tree_map(lambda a: np.asarray(a, jax.dtypes.canonicalize_dtype(np.asarray(a).dtype)), cv0)
        run.table_job = threads.started(lambda: (fused is not None and fused.table(model, run.unravel, cv_h))
                                        or _table(run, cv_h, mean))
    if early is not None and "traced" in early:
        while not early["traced"].wait(0.05) and early["thread"].is_alive():
            pass  # (short waits: Ctrl-C stays responsive)
    args = (st["starts"], data, cv0, hint) + ((to_device(np.asarray(mean), run.dtype),) if mean is not None else ())
    states = threads.wait(init_program(run, args)(*args))
    if tracks_log_lik(test, model):
        run.setup_items += n * run.num_chains  # the exact test's initial full pass, one per chain
    if callable(getattr(test, "setup_items_of", None)):  # a test's own kernel's set-up passes
        run.setup_items += test.setup_items_of(states, n)
    return states


def init_program(run, args):
    """The kernel's init vectorised over the chains, compiled for ``args`` with the chain's CPU compile options
    where the chain has them (:func:`tallmh.run.programs.elemental`: about 40% less CPU for this small program's
    compile, which a fresh process makes beside the chain's; the same draws, ``tests/test_same_draws.py``)."""
    from . import _exec_cache
    from .programs import elemental

    init_v = jax.jit(jax.vmap(run.kernel.init, in_axes=(0,) + (None,) * (len(args) - 1)))
    if run.plan is not None or run.program is not None or not elemental(run):
        return init_v
    return _exec_cache.compile_and_store(None, lambda: init_v.lower(*args), unrolled=False, elemental=True, quick=True)


def resolve_stats(run):
    """The model's set-up statistics over all rows where a :class:`~tallmh.storage.datasource.StatsTap` gathers
    them (rows no set-up pass fed are streamed now, and counted in ``setup_items``)."""
    tap = run.stats_tap
    if tap is None:
        return
    run.stats = tap.result()
    run.stats_tap = None
    if tap.setup is not None:
        run.setup_items += tap.n - tap.fed_rows


def warmup_of_start(run):
    """``num_warmup="auto"``: a short warmup where only a step size is left to tune (see AUTO_WARMUP_LAPLACE)."""
    if not run.auto_warmup or run.program is not None:
        return
    p, si = run.proposal, run.start_info
    if getattr(p, "uses_cov_hint", False) and getattr(p, "adapt", False) and si.get("mode_found") \
            and si.get("laplace") and run.init_given is None:
        run.num_warmup = configure.AUTO_WARMUP_LAPLACE
        what = "rho" if hasattr(p, "rho") else "step size"
        run.notes.append(f"num_warmup='auto': {configure.AUTO_WARMUP_LAPLACE} steps per chain (the {p.name} proposal "
                          f"from the Laplace approximation at the mode tunes only its {what})")


def _fused_bound(run):
    """The bound whose weights the set-up's last Newton pass makes (:mod:`tallmh.fused_table`), or None."""
    from ..model import own_method

    fb = own_method(run.model, "factor_bound") if getattr(run.test, "needs_factor_table", False) else None
    bound = fb() if fb is not None and run.control_variates is not None else None
    return bound if getattr(bound, "any_whitening", False) else None  # (a bound that says it holds for any A)


def _plan(run):
    """The one-pass rule's plan (:mod:`tallmh.one_pass`) where the chains' proposal is centred by the set-up."""
    if not getattr(run.proposal, "uses_center", False) or run.control_variates is None \
            or run.control_variates.center is not None:
        return None
    samples = configure.AUTO_PLANNED_SAMPLES if run.auto_draws else run.num_samples
    return one_pass.OnePassPlan(int(run.num_chains * (run.num_warmup + samples)), run.data)


def _table(run, cv, mean=None):
    """The table in a pass of its own; where the chains' Laplace proposals are centred at ``mean`` away from the
    control variates' centre, its bound's region widened to reach them (:func:`tallmh.one_pass.widened`)."""
    from .. import factor_bounds as fbm

    if mean is not None:
        try:
            return fbm.prepare(run.model, run.data, run.n, run.unravel, one_pass.widened(run.model, run.unravel, cv, mean))
        except ConfigError:  # (the widened region's weights overflow: the centre's own region, its exits exact too)
            pass
    return fbm.prepare(run.model, run.data, run.n, run.unravel, cv)


def _proposal_mean(states):
    """The Laplace proposals' centre in the chains' states (the first chain's), or None."""
    p = getattr(states, "proposal", None)
    c = getattr(getattr(p, "lap", p), "center", None)
    return None if c is None else np.asarray(c)[0]


def factor_table(run):
    """The exact subsampled test's item table (:func:`tallmh.factor_bounds.prepare`: one pass of N items for the
    remainder bound's weights, counted in ``setup_items``) in the step's statistics, built from the chains'
    control-variate centre: after the set-up, and again for a resumed run (the table is not stored). Nothing
    for another test."""
    from .. import factor_bounds as fbm

    if not getattr(run.test, "needs_factor_table", False):
        return
    if run.stats is not None and not isinstance(run.stats, dict):
        raise ConfigError(f"the {run.test.name} test keeps its table in the model's set-up statistics, which must be "
                          f"a dict (this model's setup() returned a {type(run.stats).__name__})")
    if isinstance(run.stats, dict) and fbm.FACTOR_KEY in run.stats:
        return
    job = getattr(run, "table_job", None)
    run.table_job = None
    if job is not None:  # (started by the set-up from the centre the chains' states carry)
        table, items = job.result()
    else:
        cv = jax.tree_util.tree_map(lambda a: np.asarray(a)[0], run.states.cv)  # (every chain's centre is the same)
        mean = _proposal_mean(run.states)
        table, items = _table(run, cv, None if mean is None or np.array_equal(mean, np.asarray(cv.center)) else mean)
    run.stats = {**(run.stats or {}), fbm.FACTOR_KEY: table}
    run.setup_items += items
    note = (f"{run.test.name} test: its table of the items' remainder bounds made in one pass of N = {run.n:,} items "
            "(counted in the set-up's items)") if items else \
        (f"{run.test.name} test: its table of the items' remainder bounds made in the set-up's last Newton pass "
         "(weights whitened by the Hessian before it)")
    if note not in run.notes:
        run.notes.append(note)
