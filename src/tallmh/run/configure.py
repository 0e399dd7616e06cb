"""Stage 1, the plan of a run: options, method (or inference program), keys and devices.

In: the arguments of :func:`tallmh.sample` and the data. Out, on the :class:`~.runstate.Run`: the checked
options (``num_samples``, ``num_warmup``, ``auto_draws``, ...), the validated data and ``n``, the test, control
variates, proposal and kernel (or the program's kernel and its ``init_states``), the flat start and ``unravel``,
the run's keys (:mod:`.rng`) and the device ``plan`` (:mod:`tallmh.distributed`). Also the default method
(:func:`recommended`) and the ``num_samples="auto"`` goal (:func:`auto_reached`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from .. import setup_passes as setup
from ..storage import datasource as ds
from .. import distributed
from ..acceptance import Exact
from ..storage.data import num_items, validate_data
from ..errors import ConfigError, ModelError
from ..kernel_choice import build_kernel
from ..model import check_model
from ..proposals import AdaptiveMetropolis
from ..reporting.results import method_label
from . import rng

# num_samples="auto": the most draws per chain, the default sampling budget, and the draws the self-audit
# plans for (its rate is fixed before sampling)
AUTO_MAX_SAMPLES = 200_000
# num_warmup="auto": the warmup steps per chain. Preconditioned Langevin started from the Laplace approximation at
# the mode only tunes its step size (a Robbins-Monro search from the optimal-scaling guess): 300 steps; at
# N = 10^6 (logistic, d = 11) its ESS per draw was within 8% of a 1,000-step warmup's. Every other start or
# proposal (adaptive Metropolis learns a covariance; no mode) keeps 1,000.
AUTO_WARMUP = 1000
AUTO_WARMUP_LAPLACE = 300
AUTO_BUDGET_S = 600.0
AUTO_PLANNED_SAMPLES = 2000


TEST_NAMES = ("exact", "austerity", "confidence", "barker")


def as_test(test):
    """A test object from ``test``: an object with ``decide`` (as given), a name (its default settings), or
    None (the recommended default, chosen once the data and model are known)."""
    if test is None or callable(getattr(test, "decide", None)):
        return test
    if isinstance(test, str) and test.lower() in TEST_NAMES:
        from .. import acceptance

        return getattr(acceptance, test.capitalize())()
    raise ConfigError(f"test must be a test from tm.acceptance (e.g. tm.acceptance.Austerity(error=0.05)) or one of "
                      f"{', '.join(repr(t) for t in TEST_NAMES)}; got {test!r}")


def differentiable(model, data, n, init) -> bool:
    """Whether the model's log-density has a finite gradient and Hessian-vector product at ``init`` on its
    first rows (what Taylor control variates and Langevin proposals need)."""
    flat, unravel = ravel_pytree(init)
    host = host_derivatives(model, data, n, unravel, flat)
    if host is not None:  # the model's NumPy closed forms (the built-in logistic regression): nothing to compile
        return host
    rows = ds.read_rows(data, 0, min(n, 16)) if ds.is_out_of_core(data) else \
        jax.tree_util.tree_map(lambda a: a[:min(n, 16)], data)

    def total(t, rows):
        th = unravel(t)
        return jnp.sum(model.log_lik(th, rows)) + jnp.asarray(model.log_prior(th), t.dtype)

    def grad_and_hvp(t, rows):  # one compiled program (the rows an argument: cached across processes)
        return jax.jvp(lambda u: jax.grad(total)(u, rows), (t,), (jnp.ones_like(t),))

    try:
        try:
            g, hv = jax.jit(grad_and_hvp)(flat, rows)
        except Exception:  # noqa: BLE001 - a model that only runs eagerly: as before
            g, hv = grad_and_hvp(flat, rows)
        return bool(np.all(np.isfinite(np.asarray(g))) and np.all(np.isfinite(np.asarray(hv))))
    except Exception:  # noqa: BLE001 - any failure to differentiate means: not differentiable
        return False


def host_derivatives(model, data, n, unravel, flat):
    """:func:`differentiable` by the model's NumPy closed forms where it has them for both its likelihood and its
    prior (:class:`tallmh.setup_passes.HostPasses`; their derivatives are autodiff's, checked in the tests):
    finite gradient and Hessian-vector product on the first rows. None where it has not."""
    hp = setup.HostPasses.of(model, data, n, unravel, flat)
    prior = setup.closed_form(model, "log_prior_vgh_host", "log_prior", unravel, flat)
    if hp is None or prior is None:
        return None
    try:
        t = np.asarray(flat, np.float64)
        _, g, h = model.lik_value_grad_hess_host(t, hp.read(0, min(n, 16)))
        _, pg, ph = prior(t)
        g, hv = np.asarray(g) + np.asarray(pg), (np.asarray(h) + np.asarray(ph)) @ np.ones_like(t)
        return bool(np.all(np.isfinite(g)) and np.all(np.isfinite(hv)))
    except Exception:  # noqa: BLE001 - the compiled check decides
        return None


def recommended(model, data, n, init, cv_given=None):
    """The default configuration: ``(test, control_variates, reason)``.

    A differentiable model that bounds its Taylor remainders (``factor_bound()``: the built-in logistic, Poisson,
    NB2 and fixed-noise linear regressions, the Gaussian mean) gets the exact subsampled test
    (:class:`~tallmh.acceptance.PoissonThinning`, Cornish et al. 2019) with second-order Taylor control variates:
    the chain targets the exact posterior and reads O(1) items per step. Any other differentiable model gets the
    error-targeted austerity test (per-step error 0.05, batch chosen automatically) with second-order control
    variates (and, through them, the preconditioned Langevin proposal), audited as it runs. A model without
    gradients gets exact MH. Control variates the exact test cannot use (``cv_given``: turned off, first order,
    stratified) and data read from files below :data:`tallmh.factor_bounds.BULK_MIN_N` rows whose item table (6 bytes
    per item while it is made, 4 in the chain: :func:`tallmh.factor_bounds.table_fits`) would take more than half
    the memory available keep austerity (from that N on the table's memory does not grow with N).
    With rows sharded over devices the exact test reads each drawn row on the device that holds it.
    """
    from .. import factor_bounds as fbm
    from ..control_variates import ControlVariates
    from ..acceptance import Austerity, PoissonThinning
    from ..model import own_method

    cv_usable = cv_given is None or (cv_given is not False and getattr(cv_given, "order", 2) == 2
                                     and not cv_given.exact_row_cap(n))
    if differentiable(model, data, n, init):
        fits = not ds.in_files(data) or fbm.uses_bulk(n) or fbm.table_fits(n)
        if own_method(model, "factor_bound") is not None and fits and n < 2**31 and cv_usable:
            return PoissonThinning(), ControlVariates(order=2), \
                "the model bounds its Taylor remainders: exact subsampled MH"
        reason = getattr(model, "factor_bound_reason", None)  # (a front end's reading of the model, if any)
        why = ((f"the model has no bound on its Taylor remainders ({reason})" if isinstance(reason, str) and reason
                else "the model has no bound on its Taylor remainders")
               if own_method(model, "factor_bound") is None else
               f"data read from files whose exact test's item table ({fbm.TABLE_BYTES_PER_ITEM * n / 1e9:.1f} GB) "
               "would take more than half the memory available" if not fits else
               "control variates given that the exact test cannot use" if not cv_usable else "N >= 2^31")
        return Austerity(error=0.05), ControlVariates(order=2), f"differentiable model; {why}"
    return Exact(), None, "the model has no finite gradient at the start: exact MH"


def data_mistake(data, e) -> str:
    """One line on data the model cannot read (a tuple for a dict, other key names)."""
    if isinstance(data, dict):
        have = ", ".join(map(repr, data))
        if isinstance(e, KeyError):
            return (f"data: the model reads data[{e.args[0]!r}], which this data does not have (it has {have}); "
                    f"pass a dict of arrays with the model's keys")
        return f"data: the model could not read it ({type(e).__name__}: {e}); it has keys {have}"
    return (f"data must be a dict of arrays with leading axis N and the model's keys (e.g. {{'X': X, 'y': y}}); "
            f"got a {type(data).__name__}")


AUTO_RHAT = 1.01


AUTO_CONFIRM_COLUMNS, AUTO_CONFIRM_MARGIN = 32, 0.005  # columns the thinned check confirms on all draws
AUTO_CHECK_DRAWS = 4096  # draws a chain the num_samples="auto" check reads (evenly thinned beyond)


def auto_reached(parts, min_ess):
    """``(min bulk ESS, max R-hat)`` of the draws so far when both meet the goal, else None.

    Beyond ``AUTO_CHECK_DRAWS`` draws a chain the check reads them evenly thinned to that many (every ``s``-th draw
    of the run), in memory and time independent of the run's length: thinning a positively autocorrelated chain can
    only lower its ESS estimate, so the run stops no earlier than on all draws (later only where 4 chains x 4,096
    thinned draws hold less ESS than the goal, far above the default 400); the result's verdict is computed on all
    of them."""
    from ..reporting import diagnostics

    total = sum(int(p[0].shape[1]) for p in parts)
    if total < 50:
        return None
    step = max(1, -(-total // AUTO_CHECK_DRAWS))
    pieces, start = [], 0
    for p in parts:  # (draws step apart over the whole run, without first joining all of them)
        pieces.append(p[0][:, (-start) % step::step])
        start += int(p[0].shape[1])
    x = np.concatenate(pieces, axis=1)
    # (one rank normalisation for both; R-hat only once the ESS is reached)
    ess_k, rhat_k = diagnostics.bulk_ess_and_rhat(x, min_ess)
    ess = float(np.min(ess_k))  # NaN (a NaN draw) fails the test below
    if not (ess >= min_ess) or rhat_k is None:
        return None
    rhat = float(np.max(rhat_k)) if x.shape[0] > 1 else 1.0
    if rhat > AUTO_RHAT:
        return None
    if step > 1 and x.shape[0] > 1:  # the thinned draws pass: confirm the columns nearest the limit on all draws
        rhat = max(rhat, _rhat_on_all_draws(parts, np.asarray(rhat_k), min_ess))
    return (ess, rhat) if rhat <= AUTO_RHAT else None


def _rhat_on_all_draws(parts, rhat_k, min_ess):
    """Max R-hat on all draws of the columns whose thinned R-hat is within ``AUTO_CONFIRM_MARGIN`` of the limit, or
    among the ``AUTO_CONFIRM_COLUMNS`` largest (the thinned estimate of a column near 1.01 can fall on either
    side of the one on all draws the verdict uses; a run stopped on the thinned value alone could end untrusted)."""
    from ..reporting import diagnostics

    top = np.argsort(rhat_k)[max(0, rhat_k.size - AUTO_CONFIRM_COLUMNS):]
    cols = np.union1d(top, np.flatnonzero(rhat_k > AUTO_RHAT - AUTO_CONFIRM_MARGIN)).astype(int)
    if cols.size == 0:
        return 1.0
    x = np.concatenate([p[0][:, :, cols] for p in parts], axis=1)
    return float(np.max(diagnostics.rhat_all(x)))


def prepare(model, data, test, init, check_finite=True, cv_center=None, tap_stats=False):
    """Validated data, N, the start, the model's set-up statistics and the items they read, and (with
    ``tap_stats``, for data in files of more than ``setup_passes.HOST_MAX_ROWS`` rows) a
    :class:`~tallmh.storage.datasource.StatsTap`: then the statistics returned are its ``probe`` (their shapes) and the
    set-up's first full pass makes them (:func:`.start.resolve_stats`)."""
    # no copy of in-memory data; the finiteness of files from_npy left unchecked: checked below
    data = validate_data(data, check_finite=check_finite, in_place=True, defer_files=bool(check_finite))
    n = num_items(data)
    test.check(n)
    unchecked = ds.unchecked_leaves(data) if check_finite else []
    ds.check_head(data, unchecked)  # (the rows the model is first evaluated on, below)
    if init is None and cv_center is not None:
        init = cv_center
    default = None
    # the model's own start: the start, or (in memory) the shape a given init must have; for data on disk a
    # given init is not checked this way (a model's init may read the data)
    on_disk = any(isinstance(a, (ds.HostArray, np.memmap)) for a in ds.leaves_of(data))
    if callable(getattr(model, "init", None)) and (init is None or not on_disk):
        try:
            default = model.init(data)
        except (KeyError, TypeError, IndexError) as e:
            raise ConfigError(data_mistake(data, e)) from None
    if init is None:
        if default is None:
            raise ModelError("the model has no default init(data); pass init=... to sample()")
        init = default
    elif default is not None:
        want = [np.shape(a) for a in jax.tree_util.tree_leaves(default)]
        got = [np.shape(a) for a in jax.tree_util.tree_leaves(init)]
        if want != got:
            show = lambda s: s[0] if len(s) == 1 else s
            raise ConfigError(f"init has shape {show(got)}; this model's parameter has shape {show(want)}")
    init = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(float)), init)
    # on-disk data (tallmh.storage.datasource): the model is checked on its first rows, set-up streams in blocks
    try:
        check_model(model, ds.read_rows(data, 0, min(n, 16)) if ds.is_out_of_core(data) else data, init, n)
    except ModelError as e:  # a key the data does not have: the keys it has, in one line
        if isinstance(e.__cause__, KeyError) and isinstance(data, dict):
            raise ConfigError(data_mistake(data, e.__cause__)) from None
        raise
    tap = ds.stats_tap(model, data, n, setup.HOST_MAX_ROWS, unchecked) if tap_stats else None
    if tap is not None:
        return data, n, init, tap.probe, 0, tap
    ds.check_leaves(data, unchecked)
    stats = ds.setup_stats(model, data, n)
    setup_items = n if stats is not None else 0
    return data, n, init, stats, setup_items, None

# ---- options -----------------------------------------------------------------------------------


def options(run, test, proposal, num_samples, num_warmup, control_variates, audit, resume, program):
    """Check the arguments; a resumed run's test, proposal, chains, seed and control variates are kept."""
    if resume is not None:
        if program is None and resume.resume_info.get("program"):
            program = resume.test
        for what, given, kept in (("test", test if program is None else program, resume.test),
                                  ("proposal", proposal, resume.proposal)):
            if given is None and kept is None and not (what == "proposal" and program is not None):
                raise ConfigError(f"resume: the checkpoint could not store its {what} (not one of tallmh's "
                                  f"own classes); pass {what}=... again")
        if program is None:
            test = resume.test if test is None else test
            proposal = resume.proposal if proposal is None else proposal
        run.num_chains = resume.num_chains
        run.seed = resume.resume_info["seed"]
        control_variates = resume.resume_info.get("control_variates") if control_variates is None \
            else control_variates
    # whether the test and the proposal are tallmh.sample's own choice (a resumed run keeps its run's): a
    # front end that saved "auto" checks a checkpoint against it
    run.chosen = dict(resume.resume_info.get("chosen") or {}) if resume is not None else \
        {"test": test is None and program is None, "proposal": proposal is None and program is None}
    run.program = program
    if program is not None and (test is not None or proposal is not None or control_variates):
        raise ConfigError("with program=..., the blocks carry their own tests and proposals: pass no test, "
                          "proposal or control_variates")
    run.test = as_test(test)
    run.auto_test = run.test is None and program is None
    run.auto_draws = isinstance(num_samples, str)
    if run.auto_draws:
        if num_samples != "auto":
            raise ConfigError(f"num_samples must be an integer >= 0 or 'auto'; got {num_samples!r}")
        # (a resumed run goes on until the goal is met by all its draws, the earlier ones included)
        num_samples = AUTO_MAX_SAMPLES
        run.budget_s = AUTO_BUDGET_S if run.budget_s is None else run.budget_s
        if not (run.min_ess > 0):
            raise ConfigError(f"min_ess must be positive; got {run.min_ess}")
    run.auto_warmup = isinstance(num_warmup, str)
    if run.auto_warmup:
        if num_warmup != "auto":
            raise ConfigError(f"num_warmup must be an integer >= 0 or 'auto'; got {num_warmup!r}")
        num_warmup = AUTO_WARMUP  # (until the set-up shows what the start is: see start.warmup_of_start)
    for name, v, lo in (("num_samples", num_samples, 0), ("num_warmup", num_warmup, 0),
                        ("num_chains", run.num_chains, 1)):
        if int(v) != v or v < lo:
            raise ConfigError(f"{name} must be an integer >= {lo}; got {v}")
    if num_samples + num_warmup == 0:
        raise ConfigError("num_samples + num_warmup must be positive")
    if run.budget_s is not None and not (run.budget_s > 0):
        raise ConfigError(f"budget_s must be positive; got {run.budget_s}")
    if run.chunk_size is not None and int(run.chunk_size) < 1:
        raise ConfigError(f"chunk_size must be a positive integer; got {run.chunk_size}")
    if audit is not None and not (0.0 <= float(audit) <= 1.0):
        raise ConfigError(f"audit must be a rate in [0, 1]; got {audit}")
    run.proposal, run.num_samples, run.num_warmup = proposal, num_samples, num_warmup
    run.control_variates, run.audit = control_variates, audit

# ---- the method: test, control variates, proposal, kernel ----------------------------------------


def method(run, data, init):
    model, notes = run.model, run.notes
    run.init_given = init
    test = run.test
    run.data, n, init, run.stats, run.setup_items, run.stats_tap = prepare(
        model, data, Exact() if run.auto_test else test, init, tap_stats=True)
    control_variates = run.control_variates
    for msg in getattr(model, "notes", None) or ():  # what the front end did to the model (e.g. recentred)
        if isinstance(msg, str) and msg not in notes:
            notes.append(msg)
    conv = int(getattr(model, "conversion_items", 0) or 0)
    if conv and not getattr(model, "conversion_counted", False):  # (once per converted model: a later call read none)
        run.setup_items += conv
        model.conversion_counted = True
        notes.append(f"the front end read {conv:,} rows while converting the model (its checks, fits and the "
                     "reading of its design; counted in the set-up's items of this first run)")
    if run.auto_test:
        test, cv_auto, why = recommended(model, run.data, n, init, cv_given=control_variates)
        test.check(n)
        control_variates = cv_auto if control_variates is None else (control_variates or None)
        notes.append(f"default method: {method_label(test, control_variates)} ({why}); "
                     f"test=tm.acceptance.Exact() is the oracle")
    elif control_variates is False:
        control_variates = None
    if getattr(test, "needs_factor_table", False):
        control_variates = factor_test_settings(run, model, test, control_variates)
    run.is_exact = bool(getattr(test, "tracks_log_lik", False)) or getattr(test, "name", "") == "none" \
        or bool(getattr(test, "needs_factor_table", False))  # (the exact subsampled test: nothing to audit)
    if control_variates is not None and getattr(test, "tracks_log_lik", False) \
            and not (run.proposal is None or getattr(run.proposal, "needs_data", False)):
        raise ConfigError("with the exact test, control variates serve only the Langevin proposal's gradient "
                          "(the test reads all data); use proposal=tm.proposals.Langevin() or drop them")
    if control_variates is not None and control_variates.exact_row_cap(n) and getattr(test, "name", "") != "austerity":
        raise ConfigError(f"ControlVariates(exact_rows=...) stratifies the austerity test; the "
                          f"{getattr(test, 'name', type(test).__name__)} test does not read a stratum")
    if getattr(test, "batch_auto", False):
        notes.append(f"batch_size='auto': {min(test.batch_size, n)} items per look (the skewness-corrected "
                     f"boundary keeps the error promise at any batch; where the items need more, it reads more)")
    proposal = run.proposal
    if proposal is None:
        # with control variates the model is differentiable (their Taylor terms need its gradient and
        # Hessian) and the minibatch gradient is nearly exact near the mode: preconditioned adaptive MALA
        # gives 14-38x the ESS per step of adaptive Metropolis there (README, "Which proposal")
        from ..proposals import Langevin

        proposal = Langevin(batch_size=min(100, n)) if control_variates is not None else AdaptiveMetropolis()
    run.flat0, run.unravel = ravel_pytree(init)
    run.init_tree = init
    # an approximate test without control variates on a model that could have them: said after the first
    # chunk, with the fraction of the data it measured per step (see chunks.warn_without_cv)
    run.cv_advice = (not run.is_exact and control_variates is None and getattr(test, "name", "") in
                      ("austerity", "confidence", "barker") and differentiable(model, run.data, n, init))
    run.n, run.test, run.proposal, run.control_variates = n, test, proposal, control_variates
    run.cv_order = control_variates.order if control_variates is not None else None
    run.kernel = build_kernel(model, proposal, test, n, run.unravel, None, run.cv_order)
    set_keys(run, run.flat0.dtype, run.flat0.shape[0])


def factor_test_settings(run, model, test, control_variates):
    """The exact subsampled test's settings (:class:`tallmh.acceptance.PoissonThinning`): second-order control
    variates (on by default), a model that states a bound on its Taylor remainders (``factor_bound``), and by
    default a proposal that reads no data (adaptive Metropolis from the Laplace covariance). Returns the control
    variates; the item table is built after the set-up (:func:`.start.factor_table`)."""
    from ..control_variates import ControlVariates
    from ..model import own_method

    name = getattr(model, "name", type(model).__name__)
    if own_method(model, "factor_bound") is None:
        raise ConfigError(f"the {test.name} test needs a model that bounds its Taylor remainders (a factor_bound() "
                          f"method: the built-in logistic, Poisson and fixed-noise linear regressions); {name!r} has none")
    if control_variates is False or run.control_variates is False:
        raise ConfigError(f"the {test.name} test decides from second-order Taylor control variates: leave "
                          "control_variates on")
    if control_variates is None:
        control_variates = ControlVariates(order=2)
    if control_variates.order != 2:
        raise ConfigError(f"the {test.name} test needs ControlVariates(order=2); got order {control_variates.order}")
    if run.proposal is None:
        from ..proposals import LaplaceChoice

        run.proposal = LaplaceChoice()
        run.notes.append(f"{test.name} test: proposals from the Laplace approximation at the mode, no data read: "
                         "Crank-Nicolson (independence proposals, rho adapted in warmup towards local moves where "
                         "they are rejected) or MALA on the surrogate, chosen in warmup by estimated ESS per second")
    return control_variates


def method_of_program(run, data, init):
    """An inference program (:class:`tallmh.Cycle` of blocks) as the kernel: its chains start from the
    model's ``init(key, data)`` (or ``init=(values, aux)``) and record ``model.record`` (or every site)."""
    from ..blocks.kernel import build_program_kernel

    run.data = validate_data(data)
    run.n = num_items(run.data)
    run.setup_items = 0
    run.init_given = init
    run.kernel, run.init_states, run.unravel, run.init_tree, program = build_program_kernel(
        run.program, run.model, run.data, run.n, init)
    run.program = run.test = program
    run.proposal = run.control_variates = run.cv_order = None
    run.is_exact = not program.approximate_tests()  # (nothing to audit: every decision is exact)
    run.constrain = None
    run.empty_info = run.kernel.empty_info
    flat, _ = ravel_pytree(run.init_tree)
    set_keys(run, flat.dtype, flat.shape[0])


def set_keys(run, dtype, d):
    run.dtype, run.d = dtype, d
    run.chain_keys, run.k_jit, run.k_audit = rng.run_keys(run.seed, run.num_chains)

# ---- devices -------------------------------------------------------------------------------------


def plan_devices(run, mesh):
    if jax.default_backend() != "cpu":
        # measured on an H200 (benchmarks/README.md, "On the H200 again"): a step of the default chain took
        # about twice the 16-core host CPU's at N = 10^6 and about the same at 10^7; its small reads and loop
        # tests are latency-bound there
        msg = (f"the chain ran on the {jax.default_backend()} ({getattr(jax.devices()[0], 'device_kind', '?')}): "
               "tallmh's MH steps are sequential small reads, latency-bound on an accelerator (on an H200 about "
               "as fast as a 16-core CPU at N = 10^7, half as fast at 10^6); JAX_PLATFORMS=cpu runs them on the "
               "CPU")
        if msg not in run.notes:
            run.notes.append(msg)
    if mesh is None:
        mesh = distributed.default_mesh(run.num_chains)
    run.plan = distributed.plan_for(mesh, run.num_chains, run.n)
    if run.program is not None and run.plan is not None and run.plan.rows > 1:
        raise ConfigError("a program's blocks read items by index over the whole data: split its chains over "
                          "devices (make_mesh(chains=k, rows=1)), not its rows")
    reads_by_index = getattr(run.test, "own_kernel", False) or callable(getattr(run.test, "build_kernel", None))
    if run.plan is not None and run.plan.rows > 1 and reads_by_index:
        raise ConfigError(f"the {getattr(run.test, 'name', type(run.test).__name__)} test reads rows by their index "
                          "over the whole data: row sharding (a mesh with rows > 1) is not supported for it")
