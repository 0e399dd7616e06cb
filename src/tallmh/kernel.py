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


class StepInfo(NamedTuple):
    accepted: jax.Array
    n_data: jax.Array
    rounds: jax.Array


class Kernel(NamedTuple):
    init: Callable
    step: Callable
    full_log_lik: Callable


def make_problem(model, data, n, unravel, stats, theta, theta_p, log_base, log_lik_current=None) -> Problem:
    """The :class:`~tallmh.acceptance.base.Problem` of deciding between flat ``theta`` and ``theta_p``."""
    th = unravel(theta)
    thp = unravel(theta_p)

    def lik_ratio(idx):
        batch = take(data, idx)
        return model.log_lik(thp, batch) - model.log_lik(th, batch)

    def log_lik_prop(idx):
        return model.log_lik(thp, take(data, idx))

    bound = None
    if callable(model.lik_ratio_bound):

        def bound():
            return model.lik_ratio_bound(th, thp, stats)

    base = jnp.where(jnp.isnan(log_base), -jnp.inf, log_base)
    return Problem(n, base, lik_ratio, log_lik_prop, bound, log_lik_current)


def build_kernel(model, proposal, test, data, n: int, unravel, stats=None) -> Kernel:
    """Compose ``model``, ``proposal`` and ``test`` into an MH kernel over ``data`` (N = ``n`` items)."""
    tracks = bool(getattr(test, "tracks_log_lik", False))

    def full_log_lik(theta):
        from .acceptance.base import Moments, StreamReader

        th = unravel(theta)
        reader = StreamReader(n, 4096, lambda idx: model.log_lik(th, take(data, idx)), permuted=False)
        acc = reader.advance(None, Moments.zero(theta.dtype), n)
        return acc.mean * n

    def init(theta) -> KernelState:
        lp = jnp.asarray(model.log_prior(unravel(theta)), theta.dtype)
        ll = full_log_lik(theta) if tracks else jnp.zeros((), theta.dtype)
        return KernelState(theta, lp, ll, proposal.init(theta, n))

    def step(key, state: KernelState, step_index, adapt: bool):
        k_prop, k_test = jax.random.split(key)
        theta_p, log_q = proposal.propose(k_prop, state.theta, state.proposal)
        lp_p = jnp.asarray(model.log_prior(unravel(theta_p)), state.theta.dtype)
        log_base = lp_p - state.log_prior + log_q
        problem = make_problem(model, data, n, unravel, stats, state.theta, theta_p, log_base,
                               state.log_lik if tracks else None)
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
        return KernelState(theta, lp, ll, pstate), StepInfo(acc, dec.n_data, dec.rounds)

    return Kernel(init, step, full_log_lik)
