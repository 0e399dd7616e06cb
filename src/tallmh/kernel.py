"""One MH step as a pure function: combine a model, a proposal and an acceptance test.

``build_kernel(model, proposal, test, data, ...) -> Kernel(init, step)`` in the style of BlackJAX:
``init(theta) -> KernelState`` and ``step(key, state, step_index, adapt) -> (KernelState, StepInfo)``; ``adapt`` (a Python or traced
bool) turns on the proposal's adaptation.
Parameters are carried as flat vectors (``jax.flatten_util.ravel_pytree``); the model sees its pytree.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from .acceptance.base import Problem
from .data import take

__all__ = ["KernelState", "StepInfo", "Kernel", "build_kernel", "make_problem"]


class KernelState(NamedTuple):
    theta: jax.Array  # flat parameter vector
    log_prior: jax.Array
    log_lik: jax.Array  # full-data log-likelihood at theta (kept for the exact test only; else 0)
    proposal: Any
    cv: Any = None  # CVState of the control variates, or None


class StepInfo(NamedTuple):
    accepted: jax.Array
    n_data: jax.Array
    rounds: jax.Array


class Kernel(NamedTuple):
    init: Callable
    step: Callable
    full_log_lik: Callable
    grad_estimate: Callable  # cv -> grad_fn(theta, idx): minibatch estimate of grad log posterior


def make_problem(model, data, n, unravel, stats, theta, theta_p, log_base, log_lik_current=None,
                 cv=None, cv_order=2) -> Problem:
    """The :class:`~tallmh.acceptance.base.Problem` of deciding between flat ``theta`` and ``theta_p``.

    With control variates (``cv``, a :class:`~tallmh.control_variates.CVState`), the per-item ratios
    are the Taylor remainders and the exact proxy sum moves into ``log_base``
    (:mod:`tallmh.control_variates`); the bound is then the model's ``cv_remainder_bound`` if it has one.
    """
    from . import control_variates as cvm

    th = unravel(theta)
    thp = unravel(theta_p)

    if cv is None:

        def lik_ratio(idx):
            batch = take(data, idx)
            return model.log_lik(thp, batch) - model.log_lik(th, batch)

    else:
        a, ap = theta - cv.center, theta_p - cv.center

        def lik_ratio(idx):
            batch = take(data, idx)
            l = model.log_lik(thp, batch) - model.log_lik(th, batch)
            return l - (cvm.proxy_terms(model, unravel, cv, batch, ap, cv_order)
                        - cvm.proxy_terms(model, unravel, cv, batch, a, cv_order))

        log_base = log_base + cvm.proxy_sum_diff(cv, theta, theta_p, cv_order)

    def log_lik_prop(idx):
        return model.log_lik(thp, take(data, idx))

    bound = None
    if cv is None and callable(model.lik_ratio_bound):

        def bound():
            return model.lik_ratio_bound(th, thp, stats)

    elif cv is not None and callable(getattr(model, "cv_remainder_bound", None)):

        def bound():
            return model.cv_remainder_bound(theta, theta_p, cv.center, stats, cv_order)

    base = jnp.where(jnp.isnan(log_base), -jnp.inf, log_base)
    return Problem(n, base, lik_ratio, log_lik_prop, bound, log_lik_current)


def build_kernel(model, proposal, test, data, n: int, unravel, stats=None, cv_order=None) -> Kernel:
    """Compose ``model``, ``proposal`` and ``test`` into an MH kernel over ``data`` (N = ``n`` items).

    ``cv_order`` (1 or 2) turns on control variates; their state (centre and sums) lives in
    ``KernelState.cv`` and is given to ``init``.
    """
    tracks = bool(getattr(test, "tracks_log_lik", False))
    needs_data = bool(getattr(proposal, "needs_data", False))
    if needs_data:
        proposal.check(n)

    def full_log_lik(theta):
        from .acceptance.base import Moments, StreamReader

        th = unravel(theta)
        reader = StreamReader(n, 4096, lambda idx: model.log_lik(th, take(data, idx)), permuted=False)
        acc = reader.advance(None, Moments.zero(theta.dtype), n)
        return acc.mean * n

    def init(theta, cv=None, cov_hint=None) -> KernelState:
        lp = jnp.asarray(model.log_prior(unravel(theta)), theta.dtype)
        ll = full_log_lik(theta) if tracks else jnp.zeros((), theta.dtype)
        pstate = proposal.init(theta, n, cov_hint) if cov_hint is not None else proposal.init(theta, n)
        return KernelState(theta, lp, ll, pstate, cv)

    def grad_estimate(cv):
        """Minibatch estimate of grad log posterior (with control variates when on)."""

        def grad_fn(theta, idx):
            batch = take(data, idx)
            scale = n / idx.shape[0]

            def batch_sum(t):
                return jnp.sum(model.log_lik(unravel(t), batch))

            gp = jax.grad(lambda t: jnp.asarray(model.log_prior(unravel(t)), theta.dtype))(theta)
            g = jax.grad(batch_sum)(theta)
            if cv is None:
                return gp + scale * g
            a = theta - cv.center
            if cv_order == 1:
                return gp + cv.grad_sum + scale * (g - jax.grad(batch_sum)(cv.center))
            g_c, h_a = jax.jvp(jax.grad(batch_sum), (cv.center,), (a,))
            return gp + cv.grad_sum + cv.hess_sum @ a + scale * (g - g_c - h_a)

        return grad_fn

    def step(key, state: KernelState, step_index, adapt: bool):
        k_prop, k_test = jax.random.split(key)
        if needs_data:
            theta_p, log_q = proposal.propose_with_data(
                k_prop, state.theta, state.proposal, grad_estimate(state.cv if cv_order else None), n)
        else:
            theta_p, log_q = proposal.propose(k_prop, state.theta, state.proposal)
        lp_p = jnp.asarray(model.log_prior(unravel(theta_p)), state.theta.dtype)
        log_base = lp_p - state.log_prior + log_q
        problem = make_problem(model, data, n, unravel, stats, state.theta, theta_p, log_base,
                               state.log_lik if tracks else None,
                               state.cv if cv_order else None, cv_order or 2)
        dec = test.decide(k_test, problem)
        acc = dec.accept & jnp.isfinite(lp_p)
        theta = jnp.where(acc, theta_p, state.theta)
        lp = jnp.where(acc, lp_p, state.log_prior)
        ll = jnp.where(acc, dec.log_lik_prop, state.log_lik) if tracks else state.log_lik
        if isinstance(adapt, bool):
            pstate = proposal.update(state.proposal, theta, acc, step_index) if adapt else state.proposal
        else:  # traced flag: one compiled function serves warmup and sampling
            pstate = jax.lax.cond(adapt, lambda: proposal.update(state.proposal, theta, acc, step_index),
                                  lambda: state.proposal)
        n_data = dec.n_data + (proposal.items_per_step() if needs_data else 0)
        return KernelState(theta, lp, ll, pstate, state.cv), StepInfo(acc, n_data, dec.rounds)

    return Kernel(init, step, full_log_lik, grad_estimate)
