"""The runner: ``sample`` compiles the chain and runs it, and ``decide`` makes one decision."""

from __future__ import annotations

import math
import sys
import time
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from . import control_variates as cvm
from .acceptance import Exact
from .data import num_items, validate_data
from .errors import ConfigError, ModelError
from .kernel import StepInfo, build_kernel, make_problem
from .model import check_model
from .proposals import AdaptiveMetropolis
from .results import Result

__all__ = ["sample", "decide", "decision_fn"]


def _prepare(model, data, test, init, check_finite=True, cv_center=None):
    data = validate_data(data, check_finite=check_finite)
    n = num_items(data)
    test.check(n)
    if init is None and cv_center is not None:
        init = cv_center
    if init is None:
        if not callable(getattr(model, "init", None)):
            raise ModelError("the model has no default init(data); pass init=... to sample()")
        init = model.init(data)
    init = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(float)), init)
    check_model(model, data, init, n)
    stats = model.setup(data) if callable(getattr(model, "setup", None)) else None
    setup_items = n if stats is not None else 0
    return data, n, init, stats, setup_items


def sample(
    model,
    data,
    test=None,
    proposal=None,
    num_samples: int = 1000,
    num_warmup: int = 1000,
    num_chains: int = 4,
    seed: int = 0,
    init=None,
    init_jitter: float = 0.0,
    progress: Optional[bool] = None,
    chunk_size: Optional[int] = None,
    callback=None,
    control_variates=None,
) -> Result:
    """Run ``num_chains`` MH chains on the posterior of ``model`` given ``data``.

    Parameters
    ----------
    model : :class:`tallmh.Model`
    data : pytree of arrays with leading axis N
    test : an acceptance test from :mod:`tallmh.acceptance` (default ``Exact()``)
    proposal : a proposal from :mod:`tallmh.proposals` (default ``AdaptiveMetropolis()``)
    num_samples, num_warmup : draws kept per chain, and warmup steps (adaptation happens in warmup only)
    num_chains : chains run side by side (``jax.vmap``)
    seed : integer seed; chain c at step k uses ``fold_in(fold_in(split(PRNGKey(seed))[c], phase), k)``, so
        the same seed gives the same draws and chains use different streams
    init : starting point (a pytree like the model's parameter); default ``model.init(data)``, or the
        control variates' centre when ``control_variates`` is given
    init_jitter : sd of Gaussian noise added to the start of each chain (0: all chains start at ``init``)
    progress : print progress to stderr (default: when more than 2000 steps per chain)
    chunk_size : steps per compiled call between progress reports (default: about a tenth of a phase)
    control_variates : a :class:`tallmh.ControlVariates` to use Taylor control variates in the
        approximate tests (:mod:`tallmh.control_variates`); the full passes it makes (finding the centre,
        the sums, an optional re-centring after warmup) are counted in ``result.setup_items``
    callback : optional ``f(info: dict)`` called after each chunk with ``phase``, ``done``, ``total``,
        ``seconds``; it may raise ``KeyboardInterrupt`` to stop the run like Ctrl-C

    Returns a :class:`tallmh.results.Result`. Ctrl-C during a run returns the draws of the chunks that
    completed, with ``result.partial = True``.
    """
    test = Exact() if test is None else test
    proposal = AdaptiveMetropolis() if proposal is None else proposal
    for name, v, lo in (("num_samples", num_samples, 0), ("num_warmup", num_warmup, 0), ("num_chains", num_chains, 1)):
        if int(v) != v or v < lo:
            raise ConfigError(f"{name} must be an integer >= {lo}; got {v}")
    if num_samples + num_warmup == 0:
        raise ConfigError("num_samples + num_warmup must be positive")
    init_given = init
    data, n, init, stats, setup_items = _prepare(model, data, test, init)
    flat0, unravel = ravel_pytree(init)
    cv0 = None
    if control_variates is not None:
        if getattr(test, "tracks_log_lik", False):
            raise ConfigError("control variates are for the approximate tests; the exact test reads all data")
        cv0, passes = cvm.prepare(control_variates, model, data, n, unravel, flat0)
        setup_items += passes * n
        if init_given is None:  # start at the centre (the posterior mode unless the user gave one)
            flat0 = cv0.center
    cv_order = control_variates.order if control_variates is not None else None
    kernel = build_kernel(model, proposal, test, data, n, unravel, stats, cv_order)
    if progress is None:
        progress = (num_samples + num_warmup) > 2000

    key = jax.random.PRNGKey(seed)
    k_chains, k_jit = jax.random.split(key)
    chain_keys = jax.random.split(k_chains, num_chains)
    starts = jnp.broadcast_to(flat0, (num_chains,) + flat0.shape)
    if init_jitter > 0:
        starts = starts + init_jitter * jax.random.normal(k_jit, starts.shape, flat0.dtype)
    t0 = time.perf_counter()
    if cv0 is not None:
        hint = cvm.laplace_cov(model, unravel, cv0) if isinstance(proposal, AdaptiveMetropolis) else None
        states = jax.jit(jax.vmap(kernel.init, in_axes=(0, None, None)))(starts, cv0, hint)
    else:
        states = jax.jit(jax.vmap(kernel.init))(starts)
    init_items = n * num_chains if getattr(test, "tracks_log_lik", False) else 0  # one pass per chain
    setup_items += init_items

    def make_runner(length: int):
        # One compiled function for both phases: the phase and the adapt flag are traced, unbatched
        # arguments, so the step's lax.cond stays a real branch under vmap.
        def chain_run(state, ckey, start, total, phase):
            pkey = jax.random.fold_in(ckey, phase)
            adapt = phase == 0

            def body(st, i):
                g = start + i

                def do(st):
                    return kernel.step(jax.random.fold_in(pkey, g), st, g, adapt)

                def skip(st):
                    z = jnp.zeros((), jnp.int32)
                    return st, StepInfo(jnp.bool_(False), z, z)

                st, info = jax.lax.cond(g < total, do, skip, st)
                return st, (st.theta, info)

            return jax.lax.scan(body, state, jnp.arange(length, dtype=jnp.int32))

        return jax.jit(jax.vmap(chain_run, in_axes=(0, 0, None, None, None)))

    timings = {"compile_s": 0.0, "warmup_s": 0.0, "sampling_s": 0.0}
    phases = [("warmup", num_warmup, True, 0), ("sampling", num_samples, False, 1)]
    collected = {"warmup": [], "sampling": []}
    partial = False
    last_print = 0.0
    totals = [t for _, t, _, _ in phases if t > 0]
    length = int(chunk_size) if chunk_size else max(1, math.ceil(max(totals) / 10))
    length = max(1, min(length, max(totals)))
    compiled = None
    try:
        for pname, total, adapt, phase in phases:
            if total == 0:
                continue
            if pname == "sampling" and control_variates is not None and control_variates.recenter \
                    and collected["warmup"]:
                warm = np.concatenate([p[0] for p in collected["warmup"]], axis=1)
                center = jnp.asarray(warm[:, warm.shape[1] // 2:].reshape(-1, warm.shape[-1]).mean(axis=0))
                cv_new = cvm.proxy_sums(model, data, n, unravel, center, control_variates.order)
                setup_items += n
                states = states._replace(cv=jax.tree_util.tree_map(
                    lambda a: jnp.broadcast_to(a, (num_chains,) + a.shape), cv_new))
            if compiled is None:
                tc = time.perf_counter()
                compiled = make_runner(length).lower(
                    states, chain_keys, jnp.int32(0), jnp.int32(total), jnp.int32(phase)).compile()
                timings["compile_s"] += time.perf_counter() - tc
            tp = time.perf_counter()
            done = 0
            while done < total:
                states, out = compiled(states, chain_keys, jnp.int32(done), jnp.int32(total), jnp.int32(phase))
                jax.block_until_ready(states)
                take_n = min(length, total - done)
                out = jax.tree_util.tree_map(lambda a: np.asarray(a[:, :take_n]), out)
                collected[pname].append(out)
                done += take_n
                timings[f"{pname}_s"] = time.perf_counter() - tp
                if callback is not None:
                    callback({"phase": pname, "done": done, "total": total, "seconds": timings[f"{pname}_s"]})
                if progress and (time.perf_counter() - last_print > 0.5 or done == total):
                    last_print = time.perf_counter()
                    _report(test, pname, done, total, timings[f"{pname}_s"], out, n)
    except KeyboardInterrupt:
        partial = True
        print("\ntallmh: interrupted; returning the draws made so far (result.partial = True)", file=sys.stderr)

    def stack(parts, d):
        if not parts:
            z = np.zeros((num_chains, 0), np.int32)
            return np.zeros((num_chains, 0, d), np.asarray(flat0).dtype), {
                "accepted": z.astype(bool), "n_data": z, "rounds": z}
        theta = np.concatenate([p[0] for p in parts], axis=1)
        info = parts[0][1]
        st = {k: np.concatenate([getattr(p[1], k) for p in parts], axis=1) for k in info._fields}
        return theta, st

    d = flat0.shape[0]
    flat_samples, sstats = stack(collected["sampling"], d)
    flat_warm, wstats = stack(collected["warmup"], d)
    timings["total_s"] = time.perf_counter() - t0
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
        final_state=states,
    )


def _report(test, phase, done, total, secs, out, n):
    info = out[1]
    frac = float(np.mean(info.n_data)) / n
    acc = float(np.mean(info.accepted))
    rate = done / max(secs, 1e-9)
    print(
        f"tallmh [{getattr(test, 'name', 'test')}] {phase} {done}/{total} "
        f"({rate:.0f} steps/s per chain; last chunk: acceptance {acc:.2f}, data fraction {frac:.3g})",
        file=sys.stderr,
        flush=True,
    )


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
    stats = model.setup(data) if callable(getattr(model, "setup", None)) else None

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
