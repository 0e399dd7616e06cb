"""One MH step as a pure function: combine a model, a proposal and an acceptance test.

``build_kernel(model, proposal, test, n, unravel, ...) -> Kernel(init, step)`` in the style of BlackJAX:
``init(theta, data) -> KernelState`` and ``step(key, state, data, step_index, adapt) -> (KernelState,
StepInfo)``. The data (and the model's set-up statistics) are *arguments* of the step, never constants
closed over: a compiled chain serves any data of the same shape, and lowering does not copy the data
into the program (DESIGN.md, "Performance habits"). ``adapt`` (a Python or traced bool) turns on the
proposal's adaptation; ``audit`` (a Python or traced bool, the same for every chain of a step) makes the
step also take the exact decision with the same u and record whether the two agree (the self-audit).
With ``defer_audit=True`` the step takes no exact decision and returns what one would need
(:class:`AuditArgs`); ``Kernel.audit_pass`` takes it afterwards, for many steps in one program, outside
the chain's loop (the decision does not steer the chain: it is recorded, never used).

Parameters are carried as flat vectors (``jax.flatten_util.ravel_pytree``); the model sees its pytree.

A test may bring its own kernel (for example informed sub-sampling, whose subset is part of the chain's
state): if it has ``build_kernel(model, proposal, n, unravel, stats, cv_order)``, that is used instead.
Such kernels keep the same ``init``/``step`` signatures and may keep their own state in
``KernelState.extra``.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .acceptance.base import Problem, draw_u
from .storage.data import take
from .model import own_method
from .setup_passes import closed_form

__all__ = ["KernelState", "StepInfo", "Kernel", "AuditArgs", "build_kernel", "make_problem", "oracle_of"]


class KernelState(NamedTuple):
    theta: jax.Array  # flat parameter vector
    log_prior: jax.Array
    log_lik: Any  # the exact test's record of the full-data log-likelihood at theta (its own pytree); else 0
    proposal: Any
    cv: Any = None  # CVState of the control variates, or None
    extra: Any = None  # state a test-specific kernel keeps (e.g. the subset of informed sub-sampling)


class StepInfo(NamedTuple):
    accepted: jax.Array  # bool: the decision the chain took
    n_data: jax.Array  # int32: items read to decide (audit passes excluded)
    rounds: jax.Array  # int32: looks / minibatch rounds
    nonfinite: jax.Array  # int32: items read whose log-likelihood ratio was NaN or infinite
    excess_error: jax.Array  # float: the test's estimated error inflation at its stopping look (0: none)
    audited: jax.Array  # bool: the exact decision was also taken at this step
    audit_exact: jax.Array  # bool: the exact oracle's decision with the same key (False if not audited)
    audit_items: jax.Array  # int32: items the audit read (N when audited)

    @staticmethod
    def empty(dtype=jnp.float32):
        # (transfers of NumPy zeros: outside a trace, jnp.zeros compiles a program per dtype)
        z, f = jax.device_put(np.zeros((), np.int32)), jax.device_put(np.bool_(False))
        return StepInfo(f, z, z, z, jax.device_put(np.zeros((), jnp.dtype(dtype))), f, f, z)


class Kernel(NamedTuple):
    init: Callable
    step: Callable
    full_log_lik: Callable
    grad_estimate: Callable  # (data, cv) -> grad_fn(theta, idx): minibatch estimate of grad log posterior
    empty_info: Optional[Callable] = None  # (dtype) -> the statistics of a step not taken; None: StepInfo.empty
    map_chains: bool = False  # run the chains one after another (lax.map) rather than side by side (vmap)
    # (key, theta, theta', log_base, data, stats) -> (exact decision, items read): the self-audit's exact pass
    # for a step whose audit ``step(..., defer_audit=True)`` left to the caller; None: the kernel cannot defer
    audit_pass: Optional[Callable] = None


class AuditArgs(NamedTuple):
    """What a deferred self-audit needs to take a step's exact decision later (:func:`build_kernel`)."""

    key: jax.Array  # the test's key at the step: the oracle draws the same u from it
    theta: jax.Array  # the state before the step
    theta_p: jax.Array  # the proposal
    log_base: jax.Array  # log prior ratio + log proposal ratio (-inf: out of the support)
    u: jax.Array  # the uniform the exact oracle draws from ``key`` (acceptance.base.draw_u), for tallmh.certify


def oracle_of(test):
    """The exact test an approximate test is audited against (same key, same u).

    Metropolis-type tests (austerity, confidence) answer to ``Exact()``; the minibatch Barker test to
    ``Exact(kind="barker", temperature=T)``. A test may name its own with an ``oracle`` attribute.
    """
    from .acceptance import Barker, Exact

    own = getattr(test, "oracle", None)
    if own is not None:
        return own
    if isinstance(test, Barker):
        return Exact(kind="barker", temperature=test.temperature)
    return Exact()


def make_problem(model, data, n, unravel, stats, theta, theta_p, log_base, log_lik_current=None,
                 cv=None, cv_order=2, reader=take) -> Problem:
    """The :class:`~tallmh.acceptance.base.Problem` of deciding between flat ``theta`` and ``theta_p``.

    With control variates (``cv``, a :class:`~tallmh.control_variates.CVState`), the per-item ratios
    are the Taylor remainders and the exact proxy sum moves into ``log_base``
    (:mod:`tallmh.control_variates`); the bound is then the model's ``cv_remainder_bound`` if it has one.
    ``reader(data, idx)`` gives the model the items ``idx`` (default: their rows, :func:`tallmh.storage.data.take`).
    """
    from . import control_variates as cvm

    th = unravel(theta)
    thp = unravel(theta_p)
    own_ratio = own_method(model, "log_lik_ratio")
    own_bound, own_cv_bound = own_method(model, "lik_ratio_bound"), own_method(model, "cv_remainder_bound")

    def ratio(batch):
        if callable(own_ratio):  # computed without cancellation by the model
            return own_ratio(th, thp, batch)
        return model.log_lik(thp, batch) - model.log_lik(th, batch)

    if cv is None:

        def lik_ratio(idx):
            return ratio(reader(data, idx))

    else:
        a, ap = theta - cv.center, theta_p - cv.center

        def lik_ratio(idx):
            batch = reader(data, idx)
            l = ratio(batch)
            return l - (cvm.proxy_terms(model, unravel, cv, batch, ap, cv_order)
                        - cvm.proxy_terms(model, unravel, cv, batch, a, cv_order))

        log_base = log_base + cvm.proxy_sum_diff(cv, theta, theta_p, cv_order)

    def log_lik_prop(idx):
        return model.log_lik(thp, reader(data, idx))

    bound = None
    if cv is None and own_bound is not None:

        def bound():
            return own_bound(th, thp, stats)

    elif cv is not None and own_cv_bound is not None:

        def bound():
            return own_cv_bound(theta, theta_p, cv.center, stats, cv_order)

    rows = None
    if cv is None and reader is take and _plain_rows(data):

        def rows(start, size):
            return ratio(jax.tree_util.tree_map(lambda a: jax.lax.dynamic_slice_in_dim(a, start, size), data))

    base = jnp.where(jnp.isnan(log_base), -jnp.inf, log_base)
    factors = _factor_view(model, data, unravel, stats, cv, theta, theta_p, reader)
    strat = getattr(cv, "exact_rows", None) if cv is not None else None
    return Problem(n, base, lik_ratio, log_lik_prop, bound, log_lik_current, rows, factors=factors, exact_rows=strat)


def _factor_view(model, data, unravel, stats, cv, theta, theta_p, reader):
    """The remainder bound's view at ``(theta, theta')`` for the exact subsampled test: where control variates
    are on, the model states a bound (``factor_bound``) and the statistics hold its table; else None."""
    from . import factor_bounds as fbm

    own = own_method(model, "factor_bound")
    if cv is None or own is None or not isinstance(stats, dict) or fbm.FACTOR_KEY not in stats:
        return None
    bound = own()
    table = stats[fbm.FACTOR_KEY]

    def remainder(idx):  # (the bound's methods take flat parameter vectors)
        return bound.remainder(theta, theta_p, table.center, reader(data, idx))

    v = fbm.view(bound, table, theta, theta_p, remainder)
    # the table's whitening and the remainders belong to its centre; the surrogate's sums to the control
    # variates': should they ever differ (a recentred run), the bound is not used and the step is exact MH
    return v._replace(region=v.region & jnp.all(table.center == cv.center))


def _plain_rows(data) -> bool:
    """Whether every leaf of ``data`` is an array in memory whose rows a slice reads (not one read by host
    gathers or in place: :mod:`tallmh.storage.datasource`)."""
    from .storage.datasource import HostArray, InPlaceArray

    special = (HostArray, InPlaceArray)
    leaves = jax.tree_util.tree_leaves(data, is_leaf=lambda a: isinstance(a, special))
    return bool(leaves) and all(isinstance(a, (jax.Array, np.ndarray)) and not isinstance(a, special)
                                and np.ndim(a) >= 1 for a in leaves)


def tracks_log_lik(test, model) -> bool:
    """Whether the kernel keeps the full log-likelihood for ``test``: the exact test does, unless the model
    computes per-item ratios without cancellation (``log_lik_ratio``), which the test then sums instead."""
    return bool(getattr(test, "tracks_log_lik", False)) and own_method(model, "log_lik_ratio") is None


def _initial_log_lik(test, n, fn, dtype):
    """The exact test's record of the full log-likelihood (its own representation, if it has one)."""
    own = getattr(test, "initial_log_lik", None)
    if callable(own):
        return own(n, fn, dtype)
    from .acceptance.base import Moments, StreamReader

    reader = StreamReader(n, 4096, fn, permuted=False)
    acc = reader.advance(None, Moments.zero(dtype), n)
    return acc.mean * n


def _grad_estimator(model, unravel, n, cv_order, reader):
    """``grad_estimate(data, cv) -> grad_fn(theta, idx)``: a minibatch estimate of grad log posterior, with the
    control variates' exact gradient sum and Taylor correction when they are on (the Langevin proposal's drift).
    A model with a closed form ``lik_grad_remainder(theta, center, batch, order)`` of the minibatch sums (its own,
    for a flat parameter: :func:`tallmh.setup_passes.closed_form`) gives them instead of autodiff."""

    def grad_estimate(data, cv):
        def grad_fn(theta, idx):
            batch = reader(data, idx)
            scale = n / idx.shape[0]

            def batch_sum(t):
                return jnp.sum(model.log_lik(unravel(t), batch))

            gp = jax.grad(lambda t: jnp.asarray(model.log_prior(unravel(t)), theta.dtype))(theta)
            own = closed_form(model, "lik_grad_remainder", "log_lik", unravel, theta)
            if own is not None:  # the model's closed form of the sums below (e.g. the logistic regression)
                if cv is None:
                    return gp + scale * own(unravel(theta), None, batch, 0)
                exact = cv.grad_sum + (cv.hess_sum @ (theta - cv.center) if cv_order == 2 else 0.0)
                return gp + exact + scale * own(unravel(theta), unravel(cv.center), batch, cv_order)
            g = jax.grad(batch_sum)(theta)
            if cv is None:
                return gp + scale * g
            a = theta - cv.center
            if cv_order == 1:
                return gp + cv.grad_sum + scale * (g - jax.grad(batch_sum)(cv.center))
            g_c, h_a = jax.jvp(jax.grad(batch_sum), (cv.center,), (a,))
            return gp + cv.grad_sum + cv.hess_sum @ a + scale * (g - g_c - h_a)

        return grad_fn

    return grad_estimate


def _run_test(test, key, problem, tracks, current_log_lik, dtype):
    """The test's decision on ``problem`` as (accept, n_data, rounds, nonfinite, excess_error, log_lik at theta')."""
    dec = test.decide(key, problem)
    nf = dec.n_nonfinite if dec.n_nonfinite is not None else jnp.zeros((), jnp.int32)
    ce = dec.excess_error if dec.excess_error is not None else jnp.zeros((), dtype)
    llp = dec.log_lik_prop if tracks else current_log_lik
    return dec.accept, dec.n_data.astype(jnp.int32), dec.rounds.astype(jnp.int32), \
        nf.astype(jnp.int32), jnp.asarray(ce, dtype), llp


def _decision(problem_of, run, per_chain, key, data, stats, *args):
    """``(problem, run(key, problem, log_lik))`` for ``problem = problem_of(data, stats, *args)`` (``args``: theta,
    theta', log_base, the recorded log-likelihood, the control variates' state). ``per_chain``: the decision traced
    for one chain and, under ``vmap`` over chains, taken chain after chain (``jax.custom_batching.sequential_vmap``
    of its ``jax.jit``: one trace, the batched arguments looped over and the others shared) instead of batched, whose
    tracing of a test's while loops took most of the chain's; the problem is then not returned (None)."""
    if not per_chain:
        problem = problem_of(data, stats, *args)
        return problem, run(key, problem, args[3])

    def one(key, data, stats, *args):
        return run(key, problem_of(data, stats, *args), args[3])

    return None, jax.custom_batching.sequential_vmap(jax.jit(one))(key, data, stats, *args)


def _audit_decision(oracle, key, problem, in_support, audit):
    """The exact oracle's decision with the same key (same u) and the items it read, when ``audit`` is on."""

    def run_audit():
        full_pass = getattr(oracle, "audit_decide", oracle.decide)
        ex = full_pass(key, problem._replace(log_lik_current=None))
        # the items the exact decision read: all N, or none for a proposal out of the support
        return ex.accept & in_support, ex.n_data.astype(jnp.int32)

    def no_audit():
        return jnp.bool_(False), jnp.int32(0)

    if isinstance(audit, bool) and not audit:
        return no_audit()
    # audit is the same for all chains of a step, so this stays a real branch under vmap
    return jax.lax.cond(audit, run_audit, no_audit)


def _adapted(proposal, pstate, theta, acc, step_index, adapt):
    """The proposal's state after the step: adapted when ``adapt`` (a Python or traced bool) is on."""
    if isinstance(adapt, bool):
        return proposal.update(pstate, theta, acc, step_index) if adapt else pstate
    # traced flag: one compiled function serves warmup and sampling
    return jax.lax.cond(adapt, lambda: proposal.update(pstate, theta, acc, step_index), lambda: pstate)


def build_kernel(model, proposal, test, n: int, unravel, stats=None, cv_order=None, reader=None) -> Kernel:
    """Compose ``model``, ``proposal`` and ``test`` into an MH kernel for N = ``n`` items.

    ``cv_order`` (1 or 2) turns on control variates; their state (centre and sums) lives in
    ``KernelState.cv`` and is given to ``init``. ``stats`` is only a default for ``step``'s ``stats``
    argument (the model's set-up statistics); pass them to ``step`` to keep them out of the program.
    ``reader(data, idx)``: what the model's ``log_lik`` is given for the items ``idx`` (default: their rows;
    a block of an inference program gives the item indices, :class:`tallmh.blocks.SubsampledMH`).
    """
    reader = take if reader is None else reader
    own = getattr(test, "build_kernel", None)
    if callable(own):
        if reader is not take:
            raise ValueError(f"the {getattr(test, 'name', type(test).__name__)} test brings its own kernel, which "
                             "reads rows itself: it cannot be given another reader")
        return own(model, proposal, n, unravel, stats, cv_order)
    tracks = tracks_log_lik(test, model)
    needs_data = bool(getattr(proposal, "needs_data", False))
    if needs_data:
        proposal.check(n)
    oracle = oracle_of(test)
    default_stats = stats
    exact_test = bool(getattr(test, "tracks_log_lik", False))
    # (not for a view of the model that holds data, a row-sharded one, nor a reader of the caller's: the loop's body
    # must close over no tracer)
    per_chain = bool(getattr(test, "per_chain", False)) and reader is take \
        and not callable(getattr(type(model), "viewed_model", None))
    grad_estimate = _grad_estimator(model, unravel, n, cv_order, reader)

    def full_log_lik(theta, data):
        th = unravel(theta)
        return _initial_log_lik(test, n, lambda idx: model.log_lik(th, reader(data, idx)), theta.dtype)

    def init(theta, data=None, cv=None, cov_hint=None, mean=None) -> KernelState:
        lp = jnp.asarray(model.log_prior(unravel(theta)), theta.dtype)
        ll = full_log_lik(theta, data) if tracks else jnp.zeros((), theta.dtype)
        if getattr(proposal, "uses_center", False):
            # the Laplace approximation's mean: ``mean`` where the set-up gives one (the surrogate's own mode, where
            # the control variates' centre is a point short of the mode: tallmh.one_pass), else their centre
            pstate = proposal.init(theta, n, cov_hint, center=mean if mean is not None
                                   else (None if cv is None else cv.center))
        else:
            pstate = proposal.init(theta, n, cov_hint) if cov_hint is not None else proposal.init(theta, n)
        return KernelState(theta, lp, ll, pstate, cv)

    def step(key, state: KernelState, data, step_index, adapt, stats=None, audit=False, defer_audit=False):
        stats = default_stats if stats is None else stats
        k_prop, k_test = jax.random.split(key)
        dtype = state.theta.dtype
        cv = state.cv if cv_order else None
        if needs_data:
            theta_p, log_q = proposal.propose_with_data(
                k_prop, state.theta, state.proposal, grad_estimate(data, cv), n)
        else:
            theta_p, log_q = proposal.propose(k_prop, state.theta, state.proposal)
        lp_p = jnp.asarray(model.log_prior(unravel(theta_p)), dtype)
        # Support: a proposal with -inf (or NaN) prior or proposal ratio, or a non-finite theta', is rejected
        # without reading data: its log_base is set to -inf, for which every test reads nothing and rejects.
        # The test always runs and its outcome is selected, not branched on: under vmap over chains a
        # lax.cond on this per-chain flag becomes a select whose operands, the data included, JAX
        # broadcasts to one copy per chain at every step (an O(N) copy per step: 2 chains at N = 10^6 ran
        # at 20-37 ms per step instead of 0.2 ms).
        in_support = jnp.isfinite(lp_p) & jnp.isfinite(log_q) & jnp.isfinite(theta_p).all()
        log_base = jnp.where(in_support, lp_p - state.log_prior + log_q, -jnp.inf)
        # the exact test decides from the full sum itself: control variates there only shape the proposal's
        # gradient (above), never the decision
        # (n_data and rounds are what the test read: nothing out of the support)
        problem, (accept, n_data, rounds, nonfinite, clt, llp) = _decision(
            lambda data, stats, theta, theta_p, log_base, log_lik, cv_t: make_problem(
                model, data, n, unravel, stats, theta, theta_p, log_base, log_lik if tracks else None, cv_t,
                cv_order or 2, reader),
            lambda k, problem, log_lik: _run_test(test, k, problem, tracks, log_lik, dtype),
            per_chain and (defer_audit or audit is False),
            k_test, data, stats, state.theta, theta_p, log_base, state.log_lik, None if exact_test else cv)
        # a proposal that read data (a minibatch gradient) and came out non-finite read a non-finite item:
        # counted (at least one), not passed off as a proposal out of the support
        grad_bad = (needs_data & ~jnp.isfinite(theta_p).all()) if needs_data else jnp.bool_(False)
        nonfinite = jnp.where(in_support, nonfinite, jnp.where(grad_bad, 1, 0))
        clt = jnp.where(in_support, clt, jnp.zeros((), dtype))
        llp = jax.tree_util.tree_map(lambda a, b: jnp.where(in_support, a, b), llp, state.log_lik)
        acc = accept & in_support & (nonfinite == 0)
        # the audit's exact decision sums the plain ratios l_i: with control variates the remainders plus the
        # proxies' exact sum are the same number, but would cost a second copy of the proxies in the compiled
        # full pass (and a rounding of that sum); so the oracle decides as Exact() itself does
        if defer_audit:  # nothing decided here: the caller picks the audited steps and calls audit_pass
            audit_exact, audit_items = jnp.bool_(False), jnp.int32(0)
            # (in the state's dtype, as a step not taken fills them: run.programs.chain_run)
            deferred = AuditArgs(k_test, state.theta, theta_p.astype(dtype), log_base.astype(dtype), draw_u(k_test)[0])
        else:
            audit_problem = problem if cv is None or exact_test else make_problem(
                model, data, n, unravel, stats, state.theta, theta_p, log_base, None, None, cv_order or 2, reader)
            audit_exact, audit_items = _audit_decision(oracle, k_test, audit_problem, in_support, audit)
        theta = jnp.where(acc, theta_p, state.theta)
        lp = jnp.where(acc, lp_p, state.log_prior)
        ll = jax.tree_util.tree_map(lambda new, old: jnp.where(acc, new, old), llp, state.log_lik) \
            if tracks else state.log_lik
        pstate = _adapted(proposal, state.proposal, theta, acc, step_index, adapt)
        n_data = n_data + (proposal.items_per_step() if needs_data else 0)
        info = StepInfo(acc, n_data, rounds, nonfinite, clt, jnp.asarray(audit, bool) & (audit_items > 0),
                        audit_exact, audit_items)
        out = KernelState(theta, lp, ll, pstate, state.cv, state.extra)
        return (out, info, deferred) if defer_audit else (out, info)

    def audit_pass(key, theta, theta_p, log_base, data, stats=None):
        """The exact oracle's decision at a step made by ``step(..., defer_audit=True)`` and the items it read:
        the same problem, key (so the same u) and full pass as the audit ``step`` takes itself."""
        stats = default_stats if stats is None else stats
        problem = make_problem(model, data, n, unravel, stats, theta, theta_p, log_base, None, None,
                               cv_order or 2, reader)
        return _audit_decision(oracle, key, problem, log_base > -jnp.inf, True)

    return Kernel(init, step, full_log_lik, grad_estimate, audit_pass=audit_pass)
