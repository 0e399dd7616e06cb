"""The runner's face: :func:`sample` runs the stages in order, and :func:`decide` makes one decision.

``sample`` reads as its stages, each a module of this package with a docstring saying what goes in and out:

1. :mod:`.configure`: the options, the method (test, control variates, proposal, kernel) or the inference
   program, the run's keys and the device layout;
2. :mod:`.restore`: the run's fingerprint, a resumed run's draws and states, draws streamed to disk;
3. :mod:`.start` (inside :func:`.chunks.go`): the set-up passes (mode, Laplace covariance, control variates)
   and the chains' start states;
4. :mod:`.programs`: the compiled chunk (traced in a thread during the set-up, cached on disk);
5. :mod:`.selfaudit`: the self-audit's plan, its deferred exact passes and certificates;
6. :mod:`.chunks`: phases in time-sized compiled chunks, checkpoints, signals, progress;
7. :mod:`.finish`: the :class:`~tallmh.reporting.results.Result` and its verdict.

How a run is organised:

- **Data is an argument** of every compiled program (the chain, the kernel's init), never a constant, so
  lowering does not copy it and one compiled chain serves every call with data of the same shape.
- **A good start**: unless ``init`` is given, each run first finds the posterior mode by damped Newton
  (full passes, counted in ``setup_items``), and takes the Laplace covariance as the adaptive proposal's
  starting covariance; chains start dispersed around the mode.
- **Chunks sized by time**: Ctrl-C returns every completed step within about a second (also during compile
  and set-up).
- **Resume**: each step's key depends only on (seed, chain, phase, step), so a resumed run gives the same
  draws, bit for bit, as one long run.
- **Many devices, many hosts** (``mesh=``, :mod:`tallmh.distributed`): the compiled chunk is a ``shard_map``
  over a ``(chains, rows)`` mesh, with the single-device draws.
- **Self-audit**: at random steps (the same steps for all chains) the exact test also decides with the
  same u; the disagreements estimate the approximate test's wrong-decision rate (``Result.audit``).
"""

from __future__ import annotations

import time
from typing import Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .. import _cache, _gc
from ..storage import datasource as ds
from ..storage.data import num_items, validate_data
from ..kernel import make_problem
from ..reporting.results import Result

from .. import hierarchical, setup_reads
from . import chunks, configure, data_notes, finish, restore, runstate, threads

_cache.setup_default()  # JAX's persistent compilation cache, before the runner first compiles

__all__ = ["sample", "decide", "decision_fn"]


@_gc.fewer_collections()  # (tracing's short-lived objects: see tallmh._gc)
@threads.full_float32
def sample(
           model,
           data,
           test=None,
           proposal=None,
           num_samples="auto",
           num_warmup="auto",
           num_chains: int = 4,
           seed: int = 0,
           init=None,
           init_jitter: Optional[float] = None,
           progress: Optional[bool] = None,
           chunk_size: Optional[int] = None,
           callback=None,
           control_variates=None,
           audit=None,
           budget_s: Optional[float] = None,
           resume: Optional[Result] = None,
           checkpoint: Optional[str] = None,
           checkpoint_every_s: float = 300.0,
           chunk_seconds: float = 1.0,
           mesh=None,
           stream_draws: bool = False,
           min_ess: float = 400.0,
           program=None,
) -> Result:
    """Run ``num_chains`` MH chains on the posterior of ``model`` given ``data``.

    Parameters
    ----------
    model : :class:`tallmh.Model`
    data : pytree of arrays with leading axis N
    test : an acceptance test from :mod:`tallmh.acceptance`, or its name (``"exact"``, ``"austerity"``,
        ``"confidence"``, ``"barker"``: default settings). Default: for a differentiable model, the
        recommended ``Austerity(error=0.05)`` (per-step error 0.05, batch chosen automatically) with
        ``ControlVariates(order=2)`` (unless ``control_variates=False``); for a model without finite
        gradients, ``Exact()``. ``test=tm.acceptance.Exact()`` is the exact oracle.
    proposal : a proposal from :mod:`tallmh.proposals`. Default: with ``control_variates``,
        ``Langevin(batch_size=min(100, N))`` (preconditioned adaptive MALA with the control-variate
        gradient; the model is differentiable, since the control variates need its gradient and
        Hessian); without them, ``AdaptiveMetropolis()``
    num_samples : draws kept per chain, or ``"auto"`` (the default): sample until the smallest bulk ESS is at
        least ``min_ess`` (400) and the largest R-hat at most 1.01, checked as the draws grow, within
        ``budget_s`` (default 600 s of sampling) and at most ``AUTO_MAX_SAMPLES`` draws per chain;
        ``result.notes`` says which was reached. The checks are spaced by their measured cost (at most about a
        fifth of sampling's time), so two runs of the same seed can stop at different lengths: their draws are
        the same sequence, one a prefix of the other. An integer gives a run of repeatable length
    num_warmup : warmup steps per chain (adaptation happens in warmup only), or ``"auto"`` (the default):
        ``AUTO_WARMUP_LAPLACE`` (300) when preconditioned adaptive Langevin starts from the Laplace
        approximation at the mode (only its step size is tuned), else ``AUTO_WARMUP`` (1,000); said in
        ``result.notes``. With the exact default's proposal choice, a MALA pilot of ``PILOT_STEPS`` (300) warmup steps
        may follow these (:mod:`tallmh.run.proposal_choice`), also after a ``num_warmup`` given: the notes say so
    num_chains : chains run side by side (``jax.vmap``)
    seed : integer seed; chain c at step k of phase p uses ``fold_in(fold_in(split(PRNGKey(seed))[c], p),
        k)``, so the same seed gives the same draws, however the run is cut into chunks or resumed (with
        ``num_samples="auto"``, the same sequence up to where its checks stop it: see ``num_samples``)
    init : starting point (a pytree like the model's parameter). By default the posterior mode, found by
        damped Newton on the full data (its passes counted in ``result.setup_items``; the model's
        ``init(data)`` is Newton's start, and the fallback when Newton fails), with chains dispersed
        around it (Laplace approximation, sd inflated 1.5 times) and the Laplace covariance as the
        adaptive proposal's starting covariance
    init_jitter : sd of Gaussian noise added to each chain's start (overrides the Laplace dispersion;
        0: all chains start at the same point)
    progress : a progress bar on stderr (rate, ETA, acceptance, data fraction); default: when stderr is
        a terminal
    chunk_size : fixed steps per compiled call (default: sized so that a call takes ``chunk_seconds``)
    control_variates : a :class:`tallmh.ControlVariates` to use Taylor control variates in the
        approximate tests (:mod:`tallmh.control_variates`); its full passes are counted in
        ``result.setup_items``. With the exact test they serve only the Langevin proposal's minibatch
        gradient (exact MH with a nearly exact MALA drift); the test still reads all N items. None: on with the default test, off with a test you chose; False: off
    audit : self-audit rate: the fraction of steps at which the exact test also decides with the same u
        (each audit reads all N items, counted apart in ``stats["audit_items"]``; for the built-in logistic
        regression with control variates, an audited decision that a certified bound on the Taylor remainder
        settles reads none, :mod:`tallmh.certify`, after one pass of N items counted there). Default (approximate
        tests; none for ``Exact``): enough audited chain-steps, spread over warmup and sampling, to flag a
        true wrong-decision rate of twice the test's target with probability 0.8 (198 at a target of 0.05:
        :func:`tallmh.reporting.results.audits_for_power`), at most 5% of the steps and at most
        ``DEFAULT_AUDIT_ITEMS`` = 4·10^8 items (40 at N = 10^7, none at N >= 4·10^8); when these caps
        cut the audit, a note in ``result.notes`` gives its power. In two stages: once
        :func:`tallmh.reporting.results.audit_first_stage` sampling steps (44 at 0.05) have been audited and no audit so
        far found a wrong decision, the rest of the plan is skipped (the power drops by at most 0.01: a doubled
        rate passes that stage with probability at most 0.01). ``summary()`` shows the audited rate, its
        interval and the power. A float applies to warmup and sampling alike, every planned step; 0 turns it
        off. (The exact passes run outside the chain's loop, in a thread beside the next chunks: they never
        change the draws.)
    budget_s : optional wall-clock budget (seconds) of the sampling phase: sampling stops when it is spent
        (``num_samples`` is then a cap; the run is not marked partial)
    resume : a :class:`Result` (complete, partial or loaded with :func:`tallmh.load_result`) to continue:
        ``num_warmup`` and ``num_samples`` are the totals of the combined run, which the returned Result
        holds whole; the test, proposal, chains and seed are the resumed run's. Refused (``ConfigError``,
        one line) when the data, model, test or proposal given is not the run's: other data of the same
        shape (a keyed sample of rows differs), a data file modified since, another model or test
    checkpoint : a path; the run so far is saved there (atomically, :meth:`Result.save`) every
        ``checkpoint_every_s`` seconds and at the end. A checkpoint saved while the run goes on is marked
        partial; a write that fails (a full disk) warns, keeps the draws in memory and is retried a
        minute later
    stream_draws : with ``checkpoint``, append each chunk's draws and statistics to files beside it
        (``<checkpoint>.draws``, :mod:`tallmh.storage.drawstore`) instead of holding them in memory: memory and
        checkpoint size then stay flat however long the run; the returned Result's arrays are read-only
        memory maps of those files
    callback : optional ``f(info: dict)`` called after each chunk with ``phase``, ``done``, ``total``,
        ``seconds``; it may raise ``KeyboardInterrupt`` to stop the run like Ctrl-C
    mesh : how the chains and the data are laid out over devices (:mod:`tallmh.distributed`): a
        :class:`jax.sharding.Mesh` with axes ``"chains"`` and/or ``"rows"``, e.g.
        ``tallmh.distributed.make_mesh(chains=2, rows=2)``: the chains are split over the ``"chains"``
        devices and the data's N items over the ``"rows"`` devices (one ``psum`` per chunk read). Same
        draws as on one device. Default (None): when several devices are visible (all processes' after
        ``tallmh.distributed.initialize``), the chains are split over as many of them as evenly divide
        ``num_chains``, data replicated; ``False``: one device, as without JAX devices to spare

    program : an inference program (:class:`tallmh.Cycle` of blocks, :mod:`tallmh.blocks`) for a model
        written to the blocks' protocol (``tm.blocks.from_numpyro(...)`` or a hand-written one): the
        program is the kernel, and the run has everything above (chunks, progress, Ctrl-C, resume,
        checkpoints, self-audit, verdict, ArviZ output by site name; ``mesh`` splits the chains over devices,
        not the rows, since the blocks read items by index over the whole data). Chains start
        from the model's ``init(key, data)`` (one key per chain) or ``init=(values, aux)``; each draw is
        ``model.record(values, aux)`` (or every site). ``test``, ``proposal`` and ``control_variates``
        belong to the blocks and are not taken here.

    Returns a :class:`tallmh.reporting.results.Result`. Ctrl-C (at any time, compile and set-up included) returns
    every completed step within about a second, with ``result.partial = True``; such a result can be
    resumed. SIGTERM and SIGHUP do the same when ``sample`` runs in the main thread and their handlers are
    the default ones (the previous handlers are restored on return).
    """
    # a model with group-level terms and nothing about the method chosen: its blocked program (hierarchical.py)
    # (its analysis reads the data: timed and counted as the run's set-up)
    t_auto = time.perf_counter()
    with setup_reads.counting() as auto_reads:
        model, program, auto_note = hierarchical.default_program(model, data, test, proposal, control_variates,
                                                                 program, resume)
    auto_s = time.perf_counter() - t_auto
    data = hierarchical.data_for(model, data)
    run = runstate.Run(model, num_chains=num_chains, seed=seed, callback=callback, checkpoint=checkpoint,
                       checkpoint_every_s=checkpoint_every_s, chunk_seconds=chunk_seconds, chunk_size=chunk_size,
                       budget_s=budget_s, min_ess=min_ess)
    configure.options(run, test, proposal, num_samples, num_warmup, control_variates, audit, resume, program)
    if auto_note is not None:
        run.notes.extend([m for m in model.notes if m not in run.notes] + [auto_note])
    run.t0 = t_auto
    run.mesh = mesh
    if run.program is not None:
        configure.method_of_program(run, data, init)
    else:
        configure.method(run, data, init)
        if resume is None:
            data_notes.start(run)  # collinear or separating columns of a built-in regression's X (a thread)
    configure.plan_devices(run, mesh)
    restore.restore(run, resume)
    run.setup_items += auto_reads[0]
    run.timings["setup_s"] = run.timings.get("setup_s", 0.0) + auto_s
    if stream_draws and checkpoint is not None:
        restore.open_store(run, resume)
    chunks.go(run, init, init_jitter, progress)  # set-up, compile, warmup and sampling in chunks, the audits
    return finish.finish(run)


_DECIDERS: dict = {}


def decision_fn(test, model, data, check: bool = True, control_variates=None):
    """A jitted ``f(theta, theta_prop, key, log_q_ratio=0.) -> (accept, n_data)`` for repeated decisions.

    ``theta`` and ``theta_prop`` are parameter pytrees; ``f`` can be ``jax.vmap``-ed over keys or pairs.
    Under ``vmap`` each decision holds buffers for the largest chunk size of its reader (up to N/16
    items), so memory grows with the number of keys: for thousands of keys at large N use ``jax.lax.map``.
    ``control_variates``: ``(ControlVariates, CVState)`` to decide with Taylor control variates.
    """
    data = validate_data(data) if check else data
    n = num_items(data)
    test.check(n)
    stats = ds.setup_stats(model, data, n)

    def f(theta, theta_prop, key, log_q_ratio=0.0):
        flat, unravel = ravel_pytree(theta)
        flat_p, _ = ravel_pytree(theta_prop)
        log_base = model.log_prior(theta_prop) - model.log_prior(theta) + log_q_ratio
        cvs = control_variates[1] if control_variates is not None else None
        order = control_variates[0].order if control_variates is not None else 2
        problem = make_problem(model, data, n, unravel, stats, flat, flat_p, jnp.asarray(log_base, flat.dtype),
                               None, cvs, order)
        dec = test.decide(key, problem)
        return dec.accept, dec.n_data

    return jax.jit(f)


def decide(test, model, data, theta, theta_prop, key, log_q_ratio: float = 0.0):
    """One accept/reject decision of ``test`` between ``theta`` and ``theta_prop``: ``(accept, n_data)``.

    ``log_q_ratio`` is ``log q(theta|theta') - log q(theta'|theta)`` (0 for a symmetric proposal). The
    same key gives ``Exact`` and an approximate test the same u. Compiled functions are cached for the
    last few (test, model, data) triples.
    """
    ck = (test, id(model), id(data))
    if ck not in _DECIDERS:
        if len(_DECIDERS) >= 8:
            _DECIDERS.pop(next(iter(_DECIDERS)))
        # keep model and data alive with the entry so their ids stay unique
        _DECIDERS[ck] = (decision_fn(test, model, data), model, data)
    f = _DECIDERS[ck][0]
    theta = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(float)), theta)
    theta_prop = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(float)), theta_prop)
    acc, nd = f(theta, theta_prop, key, log_q_ratio)
    return bool(acc), int(nd)
