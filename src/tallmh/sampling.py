"""The runner: ``sample`` compiles the chain and runs it, and ``decide`` makes one decision.

How a run is organised (issues 8, 9 and 12):

- **Data is an argument** of every compiled program (the chain, the kernel's init), never a constant, so
  lowering does not copy it and one compiled chain serves every call with data of the same shape: the
  compiled runners are cached by (model, proposal, test, shapes), see ``_RUNNERS``.
- **A good start**: unless ``init`` is given, each run first finds the posterior mode by damped Newton
  (full passes, counted in ``setup_items``), and takes the Laplace covariance as the adaptive proposal's
  starting covariance; chains start dispersed around the mode (drawn from the Laplace approximation with
  its sd inflated 1.5 times) so that R-hat can see chains that have not mixed.
- **Chunks sized by time**: the chain runs in compiled chunks of a count of steps chosen so that a chunk
  takes about ``chunk_seconds`` (1 s); the host waits for each chunk in short sleeps, so Ctrl-C returns
  every completed step within about a second (also during compile and set-up).
- **Resume**: ``sample(..., resume=result)`` continues every chain from where ``result`` stopped; each
  step's key depends only on (seed, chain, phase, step), so a resumed run gives the same draws, bit for
  bit, as one long run.
- **Many devices, many hosts** (``mesh=``, :mod:`tallmh.distributed`): the compiled chunk is a
  ``shard_map`` over a ``(chains, rows)`` mesh; chains split over devices, the data's rows too (one
  ``psum`` per chunk read), with the single-device draws; several processes (``jax.distributed``) follow
  process 0's chunk sizes.
- **Self-audit**: at random steps (the same steps for all chains) the exact test also decides with the
  same u; the disagreements estimate the approximate test's wrong-decision rate (``Result.audit``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import queue
import signal
import sys
import threading
import time
import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from . import certify
from . import checkpoint as ckpt
from . import _cache
from . import _exec_cache
from . import control_variates as cvm
from . import setup_passes as setup
from . import datasource as ds
from . import distributed
from .acceptance import Exact
from .data import num_items, to_device, validate_data
from .errors import ConfigError, DataChanged, ModelError, Stopped
from .kernel import AuditArgs, StepInfo, build_kernel, make_problem, oracle_of, tracks_log_lik
from .model import check_model
from .proposals import AdaptiveMetropolis
from .cache_keys import shape_key as _shape_key, value_key as _value_key
from .console import first_line
from .results import Result, audit_first_stage, audit_power, audits_for_power, error_target, method_label

_cache.setup_default()  # JAX's persistent compilation cache, before the runner first compiles

__all__ = ["sample", "decide", "decision_fn"]

INIT_SPREAD = 1.5  # chains start at mode + INIT_SPREAD * (Laplace sd) * z
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
AUDIT_SLOTS = 8  # slots of num_chains audited chain-steps per call of the deferred audit's program (_audit_runner)
_RUNNERS: dict = {}
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
# an approximate test without control variates that reads more than this fraction of the data per step in
# its first chunk is told about control variates (at N = 10^5-2.4*10^5 logistic regressions such runs read
# 71-74% per step, slower than exact MH; with them ~300 items)
CV_ADVICE_FRACTION = 0.25


_TEST_NAMES = ("exact", "austerity", "confidence", "barker")


def _as_test(test):
    """A test object from ``test``: an object with ``decide`` (as given), a name (its default settings), or
    None (the recommended default, chosen once the data and model are known)."""
    if test is None or callable(getattr(test, "decide", None)):
        return test
    if isinstance(test, str) and test.lower() in _TEST_NAMES:
        from . import acceptance

        return getattr(acceptance, test.capitalize())()
    raise ConfigError(f"test must be a test from tm.acceptance (e.g. tm.acceptance.Austerity(error=0.05)) or one of "
                      f"{', '.join(repr(t) for t in _TEST_NAMES)}; got {test!r}")


def differentiable(model, data, n, init) -> bool:
    """Whether the model's log-density has a finite gradient and Hessian-vector product at ``init`` on its
    first rows (what Taylor control variates and Langevin proposals need)."""
    flat, unravel = ravel_pytree(init)
    host = _host_derivatives(model, data, n, unravel, flat)
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


def _host_derivatives(model, data, n, unravel, flat):
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


def recommended(model, data, n, init):
    """The default configuration: ``(test, control_variates, reason)``.

    A differentiable model gets the error-targeted austerity test (per-step error 0.05, batch chosen
    automatically) with second-order Taylor control variates (and, through them, the preconditioned Langevin
    proposal): the fast configuration that keeps its promise. A model without gradients gets exact MH.
    """
    from .control_variates import ControlVariates
    from .acceptance import Austerity

    if differentiable(model, data, n, init):
        return Austerity(error=0.05), ControlVariates(order=2), "differentiable model"
    return Exact(), None, "the model has no finite gradient at the start: exact MH"


def _data_mistake(data, e) -> str:
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


def _auto_reached(parts, min_ess):
    """``(min bulk ESS, max R-hat)`` of the draws so far when both meet the goal, else None."""
    from . import diagnostics

    x = np.concatenate([p[0] for p in parts], axis=1)
    if x.shape[1] < 50:
        return None
    ess = float(np.min(diagnostics.ess_all(x)))  # NaN (a NaN draw) fails the test below
    if not (ess >= min_ess):
        return None
    rhat = float(np.max(diagnostics.rhat_all(x))) if x.shape[0] > 1 else 1.0
    return (ess, rhat) if rhat <= AUTO_RHAT else None


def _avals(tree):
    """The tree structure and each leaf's shape, dtype and weak type: what a compiled program is made for."""
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return treedef, [(tuple(np.shape(a)), str(a.dtype), bool(getattr(a, "weak_type", False))) for a in leaves]


def _prepare(model, data, test, init, check_finite=True, cv_center=None, tap_stats=False):
    """Validated data, N, the start, the model's set-up statistics and the items they read, and (with
    ``tap_stats``, for data in files of more than ``setup_passes.HOST_MAX_ROWS`` rows) a
    :class:`~tallmh.datasource.StatsTap`: then the statistics returned are its ``probe`` (their shapes) and the
    set-up's first full pass makes them (:meth:`_Run._resolve_stats`)."""
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
            raise ConfigError(_data_mistake(data, e)) from None
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
    # on-disk data (tallmh.datasource): the model is checked on its first rows, set-up streams in blocks
    check_model(model, ds.read_rows(data, 0, min(n, 16)) if ds.is_out_of_core(data) else data, init, n)
    tap = ds.stats_tap(model, data, n, setup.HOST_MAX_ROWS, unchecked) if tap_stats else None
    if tap is not None:
        return data, n, init, tap.probe, 0, tap
    ds.check_leaves(data, unchecked)
    stats = ds.setup_stats(model, data, n)
    setup_items = n if stats is not None else 0
    return data, n, init, stats, setup_items, None


def _wait(x):
    """Block until ``x`` is computed, sleeping in short steps so Ctrl-C is seen at once."""
    leaves = jax.tree_util.tree_leaves(x)
    for leaf in leaves:
        is_ready = getattr(leaf, "is_ready", None)
        if is_ready is None:
            continue
        delay = 1e-4
        while not is_ready():
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
    return x


def _full_float32(fn):
    """``fn`` traced with full float32 matrix products: on GPUs JAX's default lets float32 products run in
    TF32 (a 10-bit mantissa), which would leave the control variates' remainders and the exact sums with
    errors of ~1e-3 of each item's log-likelihood; the CPU computes float32 either way. (A config context
    does not follow a thread: each thread that traces for tallmh enters it, see :func:`_in_thread` and
    :func:`tallmh._exec_cache.compile_and_store`.)"""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.default_matmul_precision("float32"):
            return fn(*args, **kwargs)

    return wrapper


# JAX settings that a ``with`` block may set for the calling thread only (``with jax.enable_x64(True):``), and
# that change what a traced program computes: carried into tallmh's own threads by :func:`_as_caller`
_CARRIED = ("enable_x64", "default_device", "threefry_partitionable", "default_prng_impl")


def _as_caller(fn):
    """``fn`` to run in another thread with the calling thread's JAX settings (64-bit mode, default device,
    random-bits settings: ``_CARRIED``) and full float32 matrix products (:func:`_full_float32`): JAX's
    configuration contexts hold in the thread that entered them only, and tallmh traces in threads of its own
    (the set-up, the chain's compile, the audits); without this a run inside ``with jax.enable_x64(True):``
    made its start points and its chain in float32. Call it in the calling thread; the wrapper runs in the
    new one."""
    settings = [(state, getattr(jax.config, "jax_" + name)) for name in _CARRIED
                if (state := getattr(jax, name, None)) is not None]  # (States: callable as contexts, not truthy)
    fn32 = _full_float32(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            for state, value in settings:
                stack.enter_context(state(value))
            return fn32(*args, **kwargs)

    return wrapper


def _in_thread(fn):
    """Run ``fn()`` in a daemon thread and wait in short sleeps (Ctrl-C stays responsive), traced with the
    caller's JAX settings and full float32 matrix products as :func:`sample` is (:func:`_as_caller`)."""
    box = {}
    run = _as_caller(fn)

    def target():
        try:
            box["value"] = run()
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    while th.is_alive():
        th.join(0.05)
    if "error" in box:
        raise box["error"]
    return box["value"]


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def _stop_signals():
    """SIGTERM and SIGHUP (what schedulers, ``timeout`` and a closed terminal send) stop the run like Ctrl-C.

    Only in the main thread, and only for a signal whose handler is the default (which would kill the
    process with the draws in memory); a handler the caller installed is left alone. The previous handlers
    are restored afterwards.
    """
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            raise Stopped(signum)

        for sig in STOP_SIGNALS:
            try:
                if signal.getsignal(sig) == signal.SIG_DFL:
                    previous[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover - not settable here
                pass
    try:
        yield
    finally:
        for sig, h in previous.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):  # pragma: no cover
                pass


def _fixed_mask(model, unravel, flat0):
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


def _start_points(model, data, n, unravel, flat0, control_variates, num_chains, init_given, init_jitter,
                  key, dtype, notes):
    """Mode, Laplace covariance, control-variate state and chain starts; returns a dict (passes counted)."""
    out = {"center": None, "cov": None, "cv": None, "passes": 0, "extra_items": 0, "starts": None}
    want_mode = init_given is None
    center = None
    sums = None
    if want_mode:
        try:
            fixed = _fixed_mask(model, unravel, flat0)
            found = setup.mode_search(model, data, n, unravel, flat0,
                                      control_variates.max_newton if control_variates is not None else 30,
                                      tol=setup.centre_tol(flat0.shape[0]), fixed=fixed)
            center = found.center
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
        out["cv"] = cv0
        if out["cov"] is None and control_variates.order == 2:
            out["cov"] = setup.laplace_cov(model, unravel, cv0)
        if init_given is None and center is None:
            center = cv0.center
    base = center if (init_given is None and center is not None) else flat0
    # on the host: each eager device operation here compiled a program of its own (~0.5 s on a cold cache)
    base_h = np.asarray(base)
    starts = np.broadcast_to(base_h, (num_chains,) + base_h.shape)
    if init_jitter is not None:
        if init_jitter > 0:
            starts = (starts + init_jitter * _start_normals(key, starts.shape)).astype(dtype)
    elif init_given is None and out["cov"] is not None:
        chol = np.linalg.cholesky(np.asarray(out["cov"], float))
        z = _start_normals(key, starts.shape)
        starts = (base_h.astype(float)[None, :] + INIT_SPREAD * z @ chol.T).astype(dtype)
    starts = to_device(starts, dtype)
    if num_chains > 1 and bool(np.all(np.asarray(starts) == np.asarray(starts)[0])):
        notes.append("all chains started at the same point, so R-hat cannot detect chains that have not "
                     "mixed (pass init_jitter > 0, or no init, to disperse them)")
    out["starts"] = starts
    return out


def _threefry2x32(k0, k1, x0, x1):
    """The Threefry-2x32 hash (20 rounds; Salmon et al. 2011) of the uint32 arrays ``x0, x1`` under the key
    ``(k0, k1)``, in NumPy: the function JAX's default PRNG is built on, bit for bit."""
    u = np.uint32
    k0, k1 = np.asarray(k0, u), np.asarray(k1, u)  # (scalars, or arrays broadcasting with x0 and x1)
    ks = (k0, k1, k0 ^ k1 ^ u(0x1BD11BDA))
    x0, x1 = np.asarray(x0, u) + ks[0], np.asarray(x1, u) + ks[1]
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    with np.errstate(over="ignore"):  # (arithmetic mod 2^32, as meant; NumPy warns for 0-d operands)
        for i in range(5):
            for r in rotations[i % 2]:
                x0 = x0 + x1
                x1 = ((x1 << u(r)) | (x1 >> u(32 - r))) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + u(i + 1)
    return x0, x1


def _split_host(key, num):
    """``jax.random.split(key, num)`` of a raw Threefry key (uint32[2]) in NumPy, as JAX splits under its
    ``jax_threefry_partitionable`` setting (the hash of the counts 0..num-1 as 64-bit pairs, or of 0..2 num-1
    in two halves)."""
    if jax.config.jax_threefry_partitionable:
        a, b = _threefry2x32(key[0], key[1], np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
        return np.stack([a, b], axis=1)
    a, b = _threefry2x32(key[0], key[1], np.arange(num, dtype=np.uint32), np.arange(num, 2 * num, dtype=np.uint32))
    return np.concatenate([a, b]).reshape(num, 2)


def _fold_in_host(keys, data):
    """``jax.random.fold_in(key, d)`` of raw Threefry keys (uint32 ``(..., 2)``) and non-negative integers ``data``
    (broadcasting with ``keys[..., 0]``), in NumPy: the hash of the pair ``(0, d)`` under the key, as JAX folds
    (``tests/test_runner.py`` checks them against ``jax.random``)."""
    keys = np.asarray(keys, np.uint32)
    d = np.asarray(data, np.uint32)
    zero = np.zeros(np.broadcast_shapes(d.shape, keys.shape[:-1]), np.uint32)
    a, b = _threefry2x32(keys[..., 0], keys[..., 1], zero, d)
    return np.stack([a, b], axis=-1)


def _host_keys(keys) -> bool:
    """Whether ``keys`` are raw Threefry keys that :func:`_fold_in_host` folds as JAX does (JAX's default PRNG)."""
    return (str(jax.config.jax_default_prng_impl) == "threefry2x32" and np.dtype(keys.dtype) == np.uint32
            and keys.shape[-1:] == (2,))


_STEP_KEYS_FNS: dict = {}


def _step_keys(chain_keys, k_audit, phase: int, start: int, length: int):
    """The keys of a chunk's ``length`` steps from step ``start`` of ``phase``: ``fold_in(fold_in(chain key, phase),
    step)`` per chain (``(chains, length) + key shape``) and the same of the audit key (``(length,) + key shape``),
    the keys the chain's steps and their audit uniforms are drawn from. Hashed on the host (the chain's program
    then holds four unrolled Threefry hashes fewer: 787 of its 9,129 lines of optimised HLO at N = 10^6), or by one
    small program where the keys are not JAX's default raw Threefry keys."""
    steps = np.arange(start, start + length, dtype=np.int64)
    if _host_keys(chain_keys) and _host_keys(k_audit) and start + length < 2**32:
        ck = _fold_in_host(np.asarray(chain_keys), phase)
        ak = _fold_in_host(np.asarray(k_audit), phase)
        return _fold_in_host(ck[:, None, :], steps[None, :]), _fold_in_host(ak[None, :], steps)
    fn = _STEP_KEYS_FNS.get(length)
    if fn is None:
        def fold(keys, phase, start):
            g = start + jnp.arange(length, dtype=jnp.int32)
            per = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
            return (jax.vmap(lambda k: per(jax.random.fold_in(k, phase), g))(keys[0]),
                    per(jax.random.fold_in(keys[1], phase), g))

        fn = _STEP_KEYS_FNS[length] = jax.jit(fold)
    return fn((chain_keys, k_audit), jnp.int32(phase), jnp.int32(start))


def _run_keys(seed, num_chains):
    """``(chain keys, set-up key, audit key)`` of a run: ``split(PRNGKey(seed), 3)`` and the first split again
    into ``num_chains``. For a 32-bit seed under JAX's default (Threefry) PRNG they are hashed in NumPy
    (:func:`_threefry2x32`; no program to compile or load in a fresh process, ~0.2 s cold), the same bits as
    JAX's (``tests/test_runner.py`` checks them against ``jax.random``); otherwise by one compiled program."""
    s = int(seed)
    if not -2**31 <= s < 2**31 or jax.config.jax_enable_x64:  # (PRNGKey of a 64-bit seed: as JAX makes it)
        k_chains, k_jit, k_audit = jax.random.split(jax.random.PRNGKey(s), 3)
        return jax.random.split(k_chains, num_chains), k_jit, k_audit
    if str(jax.config.jax_default_prng_impl) == "threefry2x32":
        k3 = _split_host(np.array([0, s & 0xFFFFFFFF], np.uint32), 3)
        return to_device(_split_host(k3[0], num_chains)), to_device(k3[1]), to_device(k3[2])
    fn = _KEYS_FNS.get(num_chains)
    if fn is None:
        def keys(seed):
            k_chains, k_jit, k_audit = jax.random.split(jax.random.PRNGKey(seed), 3)
            return jax.random.split(k_chains, num_chains), k_jit, k_audit

        fn = _KEYS_FNS[num_chains] = jax.jit(keys)
    return fn(to_device(np.int32(s)))


_KEYS_FNS: dict = {}


def _start_normals(key, shape):
    """Standard normals (float64, NumPy) for the chains' start points, from the words of the JAX ``key``:
    the same key gives the same points, without compiling a program on the device for them."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):  # a typed key (jax.random.key): its bits
        key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key, np.uint32).ravel().tolist()).standard_normal(shape)


def _runner(kernel, key, num_chains, length, audit_on, plan=None, kernel_of=None, model=None, n=None, defer=False):
    """The compiled chunk: ``length`` scan steps of which the first ``count`` are made.

    Cached by ``key`` (model, proposal and test by value where they are tallmh's own, shapes, options):
    a second call with data of the same shape reuses the compiled program. Returns the cache entry, a
    dict with ``fn`` (the jitted function) and ``compiled`` (filled on first use). With a ``plan``
    (:mod:`tallmh.distributed`) the chains (and the data's rows) are split over the plan's mesh;
    ``kernel_of(model)`` then builds the kernel on the (row-sharded view of the) model. ``defer``: the audits
    are taken after the chunk (:func:`_chain_run`; chains side by side on one device only).
    """
    if key in _RUNNERS:
        return _RUNNERS[key]
    if plan is not None:
        fn = distributed.sharded_runner(lambda m: _chain_run(kernel_of(m), length, audit_on), plan, model, n,
                                        map_chains=getattr(kernel, "map_chains", False))
    elif getattr(kernel, "map_chains", False):  # chains one after another (a program's member lists)
        chain = _chain_run(kernel, length, audit_on)

        def chains(states, keys, akey, *rest):
            return jax.lax.map(lambda sk: chain(sk[0], sk[1], akey, *rest), (states, keys))

        fn = jax.jit(chains)
    else:
        fn = jax.jit(jax.vmap(_chain_run(kernel, length, audit_on, defer),
                              in_axes=(0, 0, None, None, None, None, None, None, None)))
    if len(_RUNNERS) >= 16:
        _RUNNERS.pop(next(iter(_RUNNERS)))
    _RUNNERS[key] = {"fn": fn, "compiled": None, "kernel": kernel}
    return _RUNNERS[key]


def _chain_run(kernel, length, audit_on, defer=False):
    """One chain's chunk: ``length`` scan steps of ``kernel``, of which the first ``count`` are made.

    ``defer``: no exact pass in the chain; each step's :class:`~tallmh.kernel.AuditArgs` and its audit
    uniform (the step is audited when it is below the phase's rate) are further outputs beside the draws and
    statistics, and :func:`_audit_runner` takes the audited steps' exact decisions after the chunk."""
    empty = getattr(kernel, "empty_info", None) or StepInfo.empty

    def chain_run(state, skeys, akeys, start, count, phase, audit_rate, data, stats):
        # skeys, akeys: the chunk's step keys, fold_in(fold_in(chain key, phase), step) and the same of the audit
        # key (:func:`_step_keys`, hashed outside the program)
        adapt = phase == 0

        def body(st, xs):
            i, k_step, k_audit = xs
            g = start + i

            def do(st):
                if audit_on:
                    ua = jax.random.uniform(k_audit)
                    audit = ua < audit_rate
                else:
                    audit = False
                if defer:  # (the host picks the audited steps afterwards: ua < the rate it settles)
                    return (*kernel.step(k_step, st, data, g, adapt, stats, False, defer_audit=True), ua)
                return kernel.step(k_step, st, data, g, adapt, stats, audit)

            def skip(st):
                if defer:  # (the step's own key stands in for the test's, which is split from it: never read,
                    # the step is never audited; no split here, whose unrolled hash would be compiled for nothing)
                    one = jnp.ones((), jax.dtypes.canonicalize_dtype(jnp.float64))  # (a uniform's dtype: x64 or not)
                    return st, empty(st.theta.dtype), AuditArgs(k_step, st.theta, st.theta,
                                                                jnp.full((), -jnp.inf, st.theta.dtype), one), one
                return st, empty(st.theta.dtype)

            st, info, *deferred = jax.lax.cond(i < count, do, skip, st)
            return st, (st.theta, info_dict(info), *deferred)

        return jax.lax.scan(body, state, (jnp.arange(length, dtype=jnp.int32), skeys, akeys))

    return chain_run


def _audit_runner(kernel, slots):
    """The deferred self-audit's program: the exact decisions of up to ``slots`` audited steps of all chains
    (``AuditArgs`` leaves shaped ``(slots, chains, ...)``), the first ``m`` of them, one step's chains side by
    side at a time. Out of the chain's loop it reads the rows on every core: the same pass cost ~50 ms per
    step of 4 chains inside the chain at N = 10^6 and ~29 ms here (``benchmarks/exact_pass.py``)."""
    one_step = jax.vmap(kernel.audit_pass, in_axes=(0, 0, 0, 0, None, None))

    def run(args, m, data, stats):
        c = args.theta.shape[1]
        out0 = (jnp.zeros((slots, c), bool), jnp.zeros((slots, c), jnp.int32))

        def body(j, out):
            a = jax.tree_util.tree_map(lambda v: v[j], args)
            ex, items = one_step(a.key, a.theta, a.theta_p, a.log_base, data, stats)
            return out[0].at[j].set(ex), out[1].at[j].set(items)

        return jax.lax.fori_loop(0, m, body, out0)

    return jax.jit(run)


@_full_float32
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
        ``result.notes`` says which was reached
    num_warmup : warmup steps per chain (adaptation happens in warmup only), or ``"auto"`` (the default):
        ``AUTO_WARMUP_LAPLACE`` (300) when preconditioned adaptive Langevin starts from the Laplace
        approximation at the mode (only its step size is tuned), else ``AUTO_WARMUP`` (1,000); said in
        ``result.notes``
    num_chains : chains run side by side (``jax.vmap``)
    seed : integer seed; chain c at step k of phase p uses ``fold_in(fold_in(split(PRNGKey(seed))[c], p),
        k)``, so the same seed gives the same draws, however the run is cut into chunks or resumed
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
        :func:`tallmh.results.audits_for_power`), at most 5% of the steps and at most
        ``DEFAULT_AUDIT_ITEMS`` = 4·10^8 items (40 at N = 10^7, none at N >= 4·10^8); when these caps
        cut the audit, a note in ``result.notes`` gives its power. In two stages: once
        :func:`tallmh.results.audit_first_stage` sampling steps (44 at 0.05) have been audited and no audit so
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
        (``<checkpoint>.draws``, :mod:`tallmh.drawstore`) instead of holding them in memory: memory and
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

    Returns a :class:`tallmh.results.Result`. Ctrl-C (at any time, compile and set-up included) returns
    every completed step within about a second, with ``result.partial = True``; such a result can be
    resumed. SIGTERM and SIGHUP do the same when ``sample`` runs in the main thread and their handlers are
    the default ones (the previous handlers are restored on return).
    """
    run = _Run(model, num_chains=num_chains, seed=seed, callback=callback, checkpoint=checkpoint,
               checkpoint_every_s=checkpoint_every_s, chunk_seconds=chunk_seconds, chunk_size=chunk_size,
               budget_s=budget_s, min_ess=min_ess)
    run.options(test, proposal, num_samples, num_warmup, control_variates, audit, resume, program)
    run.t0 = time.perf_counter()
    if run.program is not None:
        run.method_of_program(data, init)
    else:
        run.method(data, init)
    run.plan_devices(mesh)
    run.restore(resume)
    if stream_draws and checkpoint is not None:
        run.open_store(resume)
    run.go(init, init_jitter, progress)
    result = run.finish()
    if getattr(model, "coords", None):  # labels of a site's entries (a group term's levels): names made again
        result.coords = model.coords
        for k in ("output_names", "summary"):
            result._cache.pop(k, None)
    return result


class _Run:
    """One call of :func:`sample`, in named stages: options -> method (or program) -> devices -> restore ->
    set-up -> audit -> compile -> chunks -> result. Its attributes are what the stages hand each other."""

    def __init__(self, model, **kw):
        self.model = model
        self.__dict__.update(kw)
        self.notes: list = []
        self.timings = {"setup_s": 0.0, "compile_s": 0.0, "warmup_s": 0.0, "sampling_s": 0.0}
        self.collected = {"warmup": [], "sampling": []}
        self.done = {"warmup": 0, "sampling": 0}
        self.partial = False
        self.states = None
        self.start_info: dict = {}
        self.store = None
        self.plan = None
        self.stats = None
        self.stats_tap = None
        self.constrain = getattr(model, "constrain", None)
        self.empty_info = None
        self.audit_design = None  # the default audit's two-stage plan (_audit_rates, _audit_clear)
        # the deferred audit's certificate (_certificate: None until tried, False when none) and its count
        self.cert_state, self.cert_counted, self.audit_certified, self.kernel_oracle = None, False, 0, None
        self.cert_items = 0  # (the rows the certificate's pass read)
        self.audit_pending = []  # audited chain-steps waiting for their exact pass (_take_audits, _flush_audits)
        self.audit_items_read, self.audit_budget = 0, None  # (the default audit's items, where counted as read)

    # ---- options -----------------------------------------------------------------------------------

    def options(self, test, proposal, num_samples, num_warmup, control_variates, audit, resume, program):
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
            self.num_chains = resume.num_chains
            self.seed = resume.resume_info["seed"]
            control_variates = resume.resume_info.get("control_variates") if control_variates is None \
                else control_variates
        self.program = program
        if program is not None and (test is not None or proposal is not None or control_variates):
            raise ConfigError("with program=..., the blocks carry their own tests and proposals: pass no test, "
                              "proposal or control_variates")
        self.test = _as_test(test)
        self.auto_test = self.test is None and program is None
        self.auto_draws = isinstance(num_samples, str)
        if self.auto_draws:
            if num_samples != "auto":
                raise ConfigError(f"num_samples must be an integer >= 0 or 'auto'; got {num_samples!r}")
            # (a resumed run goes on until the goal is met by all its draws, the earlier ones included)
            num_samples = AUTO_MAX_SAMPLES
            self.budget_s = AUTO_BUDGET_S if self.budget_s is None else self.budget_s
            if not (self.min_ess > 0):
                raise ConfigError(f"min_ess must be positive; got {self.min_ess}")
        self.auto_warmup = isinstance(num_warmup, str)
        if self.auto_warmup:
            if num_warmup != "auto":
                raise ConfigError(f"num_warmup must be an integer >= 0 or 'auto'; got {num_warmup!r}")
            num_warmup = AUTO_WARMUP  # (until the set-up shows what the start is: see _warmup_of_start)
        for name, v, lo in (("num_samples", num_samples, 0), ("num_warmup", num_warmup, 0),
                            ("num_chains", self.num_chains, 1)):
            if int(v) != v or v < lo:
                raise ConfigError(f"{name} must be an integer >= {lo}; got {v}")
        if num_samples + num_warmup == 0:
            raise ConfigError("num_samples + num_warmup must be positive")
        if self.budget_s is not None and not (self.budget_s > 0):
            raise ConfigError(f"budget_s must be positive; got {self.budget_s}")
        if self.chunk_size is not None and int(self.chunk_size) < 1:
            raise ConfigError(f"chunk_size must be a positive integer; got {self.chunk_size}")
        if audit is not None and not (0.0 <= float(audit) <= 1.0):
            raise ConfigError(f"audit must be a rate in [0, 1]; got {audit}")
        self.proposal, self.num_samples, self.num_warmup = proposal, num_samples, num_warmup
        self.control_variates, self.audit = control_variates, audit

    # ---- the method: test, control variates, proposal, kernel ----------------------------------------

    def method(self, data, init):
        model, notes = self.model, self.notes
        self.init_given = init
        test = self.test
        self.data, n, init, self.stats, self.setup_items, self.stats_tap = _prepare(
            model, data, Exact() if self.auto_test else test, init, tap_stats=True)
        control_variates = self.control_variates
        for msg in getattr(model, "notes", None) or ():  # what the front end did to the model (e.g. recentred)
            if isinstance(msg, str) and msg not in notes:
                notes.append(msg)
        if self.auto_test:
            test, cv_auto, why = recommended(model, self.data, n, init)
            test.check(n)
            control_variates = cv_auto if control_variates is None else (control_variates or None)
            notes.append(f"default method: {method_label(test, control_variates)} ({why}); "
                         f"test=tm.acceptance.Exact() is the oracle")
        elif control_variates is False:
            control_variates = None
        self.is_exact = bool(getattr(test, "tracks_log_lik", False)) or getattr(test, "name", "") == "none"
        if control_variates is not None and getattr(test, "tracks_log_lik", False) \
                and not (self.proposal is None or getattr(self.proposal, "needs_data", False)):
            raise ConfigError("with the exact test, control variates serve only the Langevin proposal's gradient "
                              "(the test reads all data); use proposal=tm.proposals.Langevin() or drop them")
        if getattr(test, "batch_auto", False):
            notes.append(f"batch_size='auto': {min(test.batch_size, n)} items per look (the skewness-corrected "
                         f"boundary keeps the error promise at any batch; where the items need more, it reads more)")
        proposal = self.proposal
        if proposal is None:
            # with control variates the model is differentiable (their Taylor terms need its gradient and
            # Hessian) and the minibatch gradient is nearly exact near the mode: preconditioned adaptive MALA
            # gives 14-38x the ESS per step of adaptive Metropolis there (README, "Which proposal")
            from .proposals import Langevin

            proposal = Langevin(batch_size=min(100, n)) if control_variates is not None else AdaptiveMetropolis()
        self.flat0, self.unravel = ravel_pytree(init)
        self.init_tree = init
        # an approximate test without control variates on a model that could have them: said after the first
        # chunk, with the fraction of the data it measured per step (see _warn_without_cv)
        self.cv_advice = (not self.is_exact and control_variates is None and getattr(test, "name", "") in
                          ("austerity", "confidence", "barker") and differentiable(model, self.data, n, init))
        self.n, self.test, self.proposal, self.control_variates = n, test, proposal, control_variates
        self.cv_order = control_variates.order if control_variates is not None else None
        self.kernel = build_kernel(model, proposal, test, n, self.unravel, None, self.cv_order)
        self._keys(self.flat0.dtype, self.flat0.shape[0])

    def method_of_program(self, data, init):
        """An inference program (:class:`tallmh.Cycle` of blocks) as the kernel: its chains start from the
        model's ``init(key, data)`` (or ``init=(values, aux)``) and record ``model.record`` (or every site)."""
        from .blocks.kernel import build_program_kernel

        self.data = validate_data(data)
        self.n = num_items(self.data)
        self.setup_items = 0
        self.init_given = init
        self.kernel, self.init_states, self.unravel, self.init_tree, program = build_program_kernel(
            self.program, self.model, self.data, self.n, init)
        self.program = self.test = program
        self.proposal = self.control_variates = self.cv_order = None
        self.is_exact = not program.approximate_tests()  # (nothing to audit: every decision is exact)
        self.constrain = None
        self.empty_info = self.kernel.empty_info
        flat, _ = ravel_pytree(self.init_tree)
        self._keys(flat.dtype, flat.shape[0])

    def _keys(self, dtype, d):
        self.dtype, self.d = dtype, d
        self.chain_keys, self.k_jit, self.k_audit = _run_keys(self.seed, self.num_chains)

    # ---- devices, resume, draws on disk ---------------------------------------------------------------

    def plan_devices(self, mesh):
        if jax.default_backend() != "cpu":
            # measured on an H200 (benchmarks/README.md, "On the H200 again"): a step of the default chain took
            # about twice the 16-core host CPU's at N = 10^6 and about the same at 10^7; its small reads and loop
            # tests are latency-bound there
            msg = (f"the chain ran on the {jax.default_backend()} ({getattr(jax.devices()[0], 'device_kind', '?')}): "
                   "tallmh's MH steps are sequential small reads, latency-bound on an accelerator (on an H200 about "
                   "as fast as a 16-core CPU at N = 10^7, half as fast at 10^6); JAX_PLATFORMS=cpu runs them on the "
                   "CPU")
            if msg not in self.notes:
                self.notes.append(msg)
        if mesh is None:
            mesh = distributed.default_mesh(self.num_chains)
        self.plan = distributed.plan_for(mesh, self.num_chains, self.n)
        if self.program is not None and self.plan is not None and self.plan.rows > 1:
            raise ConfigError("a program's blocks read items by index over the whole data: split its chains over "
                              "devices (make_mesh(chains=k, rows=1)), not its rows")
        if self.plan is not None and self.plan.rows > 1 and callable(getattr(self.test, "build_kernel", None)):
            raise ConfigError(f"the {getattr(self.test, 'name', type(self.test).__name__)} test brings its own kernel, "
                              "which reads the data directly: row sharding (a mesh with rows > 1) is not supported "
                              "for it")

    def restore(self, resume):
        """The fingerprint of this run; a resumed run's draws, states, counts and notes."""
        saved_fp = resume.resume_info.get("fingerprint") if resume is not None else None
        self.fingerprint = ckpt.run_fingerprint(self.model, self.data, self.n, self.test, self.proposal,
                                                self.control_variates, self.num_chains, self.seed, self.d, self.dtype,
                                                salt=(saved_fp or {}).get("data", {}).get("salt"))
        if saved_fp:
            why = ckpt.mismatch(saved_fp, self.fingerprint)
            if why is not None:
                raise ConfigError(f"resume: refused: {why}")
        if resume is None:
            return
        if resume.n != self.n:
            raise ConfigError(f"resume: the run had N = {resume.n} items; this data has N = {self.n}")
        if resume.flat_samples.shape[-1] != self.d:
            raise ConfigError(f"resume: the run's parameter has {resume.flat_samples.shape[-1]} coordinates; "
                              f"this model's has {self.d}")
        info = resume.resume_info
        self.states = jax.tree_util.tree_map(jnp.asarray, resume.final_state)
        done = self.done = {"warmup": int(info["warmup_done"]), "sampling": int(info["sampling_done"])}
        if self.auto_warmup:  # the warmup the run chose when it started
            self.num_warmup = int(info.get("num_warmup", self.num_warmup))
        if done["warmup"] > self.num_warmup or done["sampling"] > self.num_samples:
            raise ConfigError(f"resume: the run already has {done['warmup']} warmup steps and {done['sampling']} "
                              f"draws; ask for at least as many (num_warmup={self.num_warmup}, "
                              f"num_samples={self.num_samples})")
        if done["sampling"] > 0 and done["warmup"] < self.num_warmup:
            raise ConfigError("resume: sampling had started; the warmup cannot be extended")
        self.collected = {
            "warmup": [(resume.flat_warmup, resume.warmup_stats)] if resume.flat_warmup.shape[1] else [],
            "sampling": [(resume.flat_samples, resume.stats)] if resume.flat_samples.shape[1] else []}
        # model.setup ran again (or will, from a StatsTap: counted when it resolves)
        self.setup_items = resume.setup_items + (self.n if self.stats is not None and self.stats_tap is None else 0)
        self.timings = {k: float(v) for k, v in resume.timings.items() if k != "total_s"}
        self.timings["_before_s"] = float(resume.timings.get("total_s", 0.0))  # wall time of the earlier run(s)
        self.notes[:] = list(resume.notes)
        self.start_info = dict(info.get("start_info", {}))

    def open_store(self, resume):
        """Draws appended to files beside the checkpoint (:mod:`tallmh.drawstore`) instead of memory."""
        from .drawstore import SUFFIX, DrawStore

        store = DrawStore(os.fspath(self.checkpoint) + SUFFIX, self.num_chains, self.d, self.dtype)
        stat_dtypes = {k: np.asarray(v).dtype for k, v in self._empty_info().items()}
        mine = resume is not None and resume.flat_samples.shape[1] + resume.flat_warmup.shape[1] > 0 and all(
            isinstance(a, np.memmap) and os.path.dirname(os.path.abspath(a.filename)) == store.folder
            for a in (resume.flat_samples, resume.flat_warmup) if a.shape[1] > 0)
        try:
            store.start({p: int(c) for p, c in self.done.items()}, stat_dtypes, keep=mine)
        except OSError as e:
            raise ConfigError(f"resume: {e}") from None
        if not mine:
            for pname in ("warmup", "sampling"):
                for th, st in self.collected[pname]:
                    store.add(pname, th, st)
        self.collected = {"warmup": [], "sampling": []}
        self.store = store

    def _empty_info(self) -> dict:
        return info_dict(self.empty_info(self.dtype) if self.empty_info is not None else StepInfo.empty(self.dtype))

    def parts(self, pname):
        if self.store is None:
            return self.collected[pname]
        return [self.store.view(pname)] if self.store.counts[pname] else []

    def result(self):
        self._settle_audits()
        if self.audit_certified:
            note = (f"self-audit: {self.audit_certified} audited decision(s) certified without reading the data (a "
                    f"bound on the control variates' Taylor remainder, tallmh.certify; one extra pass of N = "
                    f"{self.n:,} items, counted in the audit's items); the others read all N items")
            self.notes[:] = [m for m in self.notes if not (m.startswith("self-audit: ") and "tallmh.certify;" in m)] \
                + [note]
        states = self.states
        host_states = states if self.plan is None or states is None else \
            jax.tree_util.tree_map(distributed.to_host, states)
        info = dict(seed=self.seed, warmup_done=self.done["warmup"], sampling_done=self.done["sampling"],
                    num_warmup=self.num_warmup, num_samples=self.num_samples,
                    control_variates=self.control_variates, start_info=self.start_info,
                    fingerprint=self.fingerprint, program=self.program is not None,
                    audit_design=self._audit_design_as_run())
        return _assemble({p: self.parts(p) for p in ("warmup", "sampling")}, self.num_chains, self.d, self.dtype,
                         self.unravel, self.n, self.test, self.proposal, self.timings, self.setup_items,
                         self.partial, host_states, self.notes, info, self.t0, self.control_variates,
                         self.constrain, self._empty_info())

    # ---- the run -------------------------------------------------------------------------------------

    def go(self, init, init_jitter, progress):
        """Set-up, compile and the chunks; Ctrl-C, SIGTERM/SIGHUP and changed data files end it with the
        draws made so far (``partial``)."""
        self.bar = None
        self.changed_error = None
        self.auto_stop = None
        signals = _stop_signals()
        signals.__enter__()
        try:
            early = None
            if self.states is None:
                # the audit's rates first (the chunk's program depends on whether it audits), then the chunk
                # compiles in a thread while the set-up runs; the rates (which depend on the warmup the set-up
                # settles, num_warmup="auto") and their notes are made again after the set-up's notes, as before
                n0 = len(self.notes)
                self._audit_rates()
                del self.notes[n0:]
                early = self._compile_early()
                ts = time.perf_counter()
                self.states = _wait(self._set_up(init_jitter, early))
                self._resolve_stats()
                self.timings["setup_s"] = time.perf_counter() - ts
                self._warmup_of_start()
            self._resolve_stats()
            self._audit_rates()
            self._compile(early)
            if progress is None:
                progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
            if progress:
                self.bar = _Bar(None if self.auto_draws else self.num_warmup + self.num_samples,
                                self.done["warmup"] + self.done["sampling"], getattr(self.test, "name", "mcmc"))
            self.last_ckpt = time.perf_counter()
            self.next_check = 100
            for pname, total, phase in (("warmup", self.num_warmup, 0), ("sampling", self.num_samples, 1)):
                if self.done[pname] < total and self._phase(pname, total, phase):
                    break
            ta = time.perf_counter()  # (the audits still running after the last chunk: sampling's time)
            self._settle_audits()
            self.timings["sampling_s"] += time.perf_counter() - ta
        except DataChanged as e:
            self.partial = True
            self.changed_error = e
            self.notes.append(f"stopped: {e}")
        except KeyboardInterrupt as e:
            self.partial = True
            what = f"stopped by {signal.Signals(e.signum).name}" if isinstance(e, Stopped) else "interrupted"
            print(f"\ntallmh: {what}; returning the draws made so far (result.partial = True)", file=sys.stderr)
        finally:
            signals.__exit__(None, None, None)
            ds.advise(self.data, "normal")  # the files' default read-ahead again, for whatever reads them next
            if self.bar is not None:
                self.bar.close()

    def _set_up(self, init_jitter, early=None):
        """The chains' start states: for a program, its blocks' init from the model's; else the mode, the
        Laplace covariance, the control variates (:func:`_start_points`) and the kernel's init. With ``early``
        (the chain compiling beside the set-up), the kernel's init is traced once the chain's trace is done:
        two traces at once share one interpreter, and the chain's is the longer wait."""
        if self.program is not None:
            return self.init_states(jax.random.split(self.k_jit, self.num_chains))
        model, data, n, test, proposal = self.model, self.data, self.n, self.test, self.proposal
        try:
            with ds.tapping(data, self.stats_tap):  # the model's statistics from the first full pass's blocks
                st = _in_thread(lambda: _start_points(model, data, n, self.unravel, self.flat0,
                                                      self.control_variates, self.num_chains, self.init_given,
                                                      init_jitter, self.k_jit, self.dtype, self.notes))
        except ds.StatsFailed:
            self._resolve_stats()  # raises the model's own error on the block it could not take
            raise
        self.setup_items += st["passes"] * n + st["extra_items"]
        cv0 = st["cv"]
        if cv0 is None and getattr(test, "wants_mode", False):  # informed sub-sampling's default statistic
            cv0 = st.get("sums")
        hint = st["cov"] if (isinstance(proposal, AdaptiveMetropolis) or getattr(proposal, "uses_cov_hint", False)) \
            else None
        self.start_info = {"mode_found": st["center"] is not None, "laplace": st["cov"] is not None,
                           "newton_passes": int(st["passes"])}
        init_v = jax.jit(jax.vmap(self.kernel.init, in_axes=(0, None, None, None)))
        if early is not None and "traced" in early:
            while not early["traced"].wait(0.05) and early["thread"].is_alive():
                pass  # (short waits: Ctrl-C stays responsive)
        states = _wait(init_v(st["starts"], data, cv0, hint))
        if tracks_log_lik(test, model):
            self.setup_items += n * self.num_chains  # the exact test's initial full pass, one per chain
        if callable(getattr(test, "setup_items_of", None)):  # a test's own kernel's set-up passes
            self.setup_items += test.setup_items_of(states, n)
        return states

    def _resolve_stats(self):
        """The model's set-up statistics over all rows where a :class:`~tallmh.datasource.StatsTap` gathers
        them (rows no set-up pass fed are streamed now, and counted in ``setup_items``)."""
        tap = self.stats_tap
        if tap is None:
            return
        self.stats = tap.result()
        self.stats_tap = None
        if tap.setup is not None:
            self.setup_items += tap.n - tap.fed_rows

    def _warmup_of_start(self):
        """``num_warmup="auto"``: a short warmup where only a step size is left to tune (see AUTO_WARMUP_LAPLACE)."""
        if not self.auto_warmup or self.program is not None:
            return
        p, si = self.proposal, self.start_info
        if getattr(p, "uses_cov_hint", False) and getattr(p, "adapt", False) and si.get("mode_found") \
                and si.get("laplace") and self.init_given is None:
            self.num_warmup = AUTO_WARMUP_LAPLACE
            self.notes.append(f"num_warmup='auto': {AUTO_WARMUP_LAPLACE} steps per chain (preconditioned Langevin "
                              f"from the Laplace approximation at the mode tunes only its step size)")

    def _audit_rates(self):
        """Self-audit rate per phase (warmup, sampling): see ``audit`` in :func:`sample`."""
        n, test = self.n, self.test
        if self.audit is not None or self.is_exact:
            rate = 0.0 if self.is_exact else float(self.audit or 0.0)
            self.rates = (rate, rate)
            self.audit_on = rate > 0
            return
        tgt = error_target(test) or 0.05
        wanted = audits_for_power(tgt, AUDIT_POWER)
        planned = AUTO_PLANNED_SAMPLES if self.auto_draws else self.num_samples  # ("auto": a typical run's draws)
        steps = max(1, self.num_chains * (self.num_warmup + planned))
        passes = test.audit_passes() if callable(getattr(test, "audit_passes", None)) else 1  # (a program's blocks)
        by_items = DEFAULT_AUDIT_ITEMS // max(1, n * passes)
        # where audited decisions can be certified without reading the data, the items are counted as they are
        # read (_audit_chunk stops the audit at the budget) instead of cutting the plan to N items per audit
        self.audit_budget = DEFAULT_AUDIT_ITEMS if by_items < wanted and self._certifiable() else None
        n_audits = wanted if self.audit_budget is not None else min(wanted, by_items)
        rate = min(MAX_AUDIT_RATE, n_audits / steps)
        self.rates = (rate, rate)
        self.audit_on = rate > 0
        got = int(round(rate * steps))
        first = audit_first_stage(error_target(test), AUDIT_CLEAR_LOSS)
        if first is not None and got > first and self.plan is None and self.program is None \
                and getattr(test, "name", "") != "barker":
            self.audit_design = {"planned": got, "first_stage": first, "cleared_after": None, "rate": rate}
        if got < wanted:
            each = f"all N = {n:,} items" if passes == 1 else f"all N = {n:,} items {passes} times"
            why = (f"each reads {each} and the default reads at most {DEFAULT_AUDIT_ITEMS:.0e}"
                   if n_audits < wanted else f"at most {MAX_AUDIT_RATE:g} of the {steps:,} chain-steps")
            msg = (f"self-audit: about {got} audited chain-step(s) by default ({why}); they flag a wrong-decision "
                   f"rate of twice the target with probability {audit_power(got, tgt):.2f} (pass audit=rate "
                   f"for more: {wanted} give {AUDIT_POWER:g})")
            if msg not in self.notes:  # (a resumed run carries its notes already)
                self.notes.append(msg)

    def _certifiable(self) -> bool:
        """Whether the deferred audit will certify decisions (:meth:`_certificate`), as far as is known before the
        set-up: the built-in logistic regression with second-order control variates on data in host memory or in
        a file, one device, no inference program."""
        got = {k: getattr(self, k, None) for k in ("program", "plan", "cv_order", "data", "test")}
        return bool(CERTIFY and self.n <= CERTIFY_MAX_ROWS and got["program"] is None and got["plan"] is None
                    and got["cv_order"] == 2 and certify.eligible(self.model, oracle_of(got["test"]))
                    and ds.host_reader(got["data"]) is not None)

    def _audit_clear(self):
        """The audit's first stage (``AUDIT_CLEAR_LOSS``): after a sampling chunk (or, for audits deferred out of
        the chain, before a chunk's audited steps are picked), when at least ``first_stage`` sampling steps have
        been audited and no audit so far found a wrong decision, the remaining sampling chunks audit nothing
        (their audit rate is a run-time argument: nothing recompiles)."""
        design = self.audit_design
        if design is None or design["cleared_after"] is not None or design.get("wrong_seen") or self.rates[1] == 0:
            return
        wrong, m_sampling = self._audit_counts()
        if m_sampling >= design["first_stage"] and not wrong and self.audit_pending:
            # (audits still waiting for their pass count as agreeing until then: the stage would clear, so they
            # are taken now)
            self._flush_audits()
            wrong, m_sampling = self._audit_counts()
        if wrong is None:
            return
        if wrong:  # the whole plan stands: no need to look again
            design["wrong_seen"] = True
            return
        design["audited_sampling"] = m_sampling
        if m_sampling < design["first_stage"]:
            return
        self.rates = (self.rates[0], 0.0)
        design["cleared_after"] = m_sampling
        tgt = error_target(self.test)
        msg = (f"self-audit: no wrong decision in the first {m_sampling} audited sampling steps (nor in warmup's), so "
               f"the rest of the {design['planned']} planned audits were skipped (a true rate of twice the target, "
               f"{2 * tgt:g}, passes {design['first_stage']} audits unflagged with probability "
               f"{(1 - 2 * tgt) ** design['first_stage']:.3f}; audit=rate audits every planned step)")
        if not any(n.startswith("self-audit: no wrong decision in the first") for n in self.notes):
            self.notes.append(msg)

    def _audit_counts(self):
        """``(wrong decisions, audited sampling steps)`` over the run's chunks so far (``(None, 0)`` while a chunk's
        audits are not recorded yet); an audited step still waiting for its pass counts as agreeing."""
        wrong, m_sampling = 0, 0
        for pname in ("warmup", "sampling"):
            for _, info in self.parts(pname):
                if "audited" not in info or "audit_exact" not in info:
                    return None, 0
                aud = np.asarray(info["audited"], bool)
                differs = np.asarray(info["accepted"], bool) != np.asarray(info["audit_exact"], bool)
                wrong += int(np.sum(aud & differs))
                if pname == "sampling":
                    m_sampling += int(aud.sum())
        return wrong, m_sampling

    def _audit_chunk_cap(self, count: int) -> int:
        """While the audit's first stage is open, a sampling chunk of at most the steps expected to bring half
        of the audited sampling steps still missing to ``first_stage`` (all of them when one audited step
        would do): the stage is checked between chunks, and a chunk that ran on past it would audit steps
        (each a full pass) that the cleared design skips. The chunks stay short only until the stage closes.
        (Audits deferred out of the chain need no cap: their stage closes at the step that completes it.)"""
        design = self.audit_design
        if design is None or design["cleared_after"] is not None or design.get("wrong_seen") or self.rates[1] == 0:
            return count
        left = design["first_stage"] - design.get("audited_sampling", 0)
        if left <= 0:
            return count
        if left > self.num_chains:
            left = left / 2
        return int(max(1, min(count, math.ceil(left / (self.num_chains * self.rates[1])))))

    def _audit_design_as_run(self):
        """The two-stage audit's record for the result: ``planned`` becomes the audits that the run's own steps
        would have had at the planned rate (fewer than the plan when the draws stopped early), so that the
        power reported for a cleared audit is that of the run as it went."""
        if not self.audit_design:
            return None
        design = dict(self.audit_design)
        steps = self.num_chains * (self.done["warmup"] + self.done["sampling"])
        design["planned"] = int(round(design.pop("rate") * steps))
        return design

    def _entry(self, states):
        """``(cache key, cache entry)`` of the compiled chunk for chain states shaped like ``states``."""
        n, d, num_chains = self.n, self.d, self.num_chains
        plan, test, proposal = self.plan, self.test, self.proposal
        self.length = length = int(self.chunk_size) if self.chunk_size else \
            int(min(4096, max(16, 2**22 // max(1, num_chains * (d + 8)))))
        rkey = (_value_key(self.model), _value_key(proposal), _value_key(test), n, _shape_key(self.data),
                _shape_key(self.stats), self.cv_order, num_chains, length, self.audit_on, d, str(self.dtype),
                _shape_key(states), _shape_key(self.init_tree), plan.key() if plan is not None else None,
                self._defer_audit())
        entry = _runner(self.kernel, rkey, num_chains, length, self.audit_on, plan,
                        (lambda m: self.kernel) if self.program is not None else
                        (lambda m: build_kernel(m, proposal, test, n, self.unravel, None, self.cv_order)), self.model, n,
                        self._defer_audit())
        return rkey, entry

    def _defer_audit(self) -> bool:
        """Whether the chunk leaves its audits' exact passes to :func:`_audit_runner` (chains side by side on
        one device, a kernel that can; not for inference programs, whose blocks audit inside their step)."""
        return bool(self.audit_on and self.plan is None and self.program is None
                    and getattr(self.kernel, "audit_pass", None) is not None
                    and not getattr(self.kernel, "map_chains", False))

    def _compile_early(self):
        """Start compiling the chunk in a thread before the set-up, for the chain states the set-up will
        make (their shapes follow from the kernel's init on a start, the control variates' sums and the
        Laplace covariance, whatever their values): the compile then overlaps the set-up's passes. Returns
        what :meth:`_compile` needs to use it (it checks that the states came out as assumed), or None."""
        if self.plan is not None or self.program is not None:
            return None
        try:
            d, dt = self.d, self.dtype
            cvo = self.control_variates
            if cvo is None and getattr(self.test, "wants_mode", False):
                return None
            shaped = lambda *s: jax.ShapeDtypeStruct(s, dt)  # noqa: E731
            cv = None if cvo is None else cvm.CVState(shaped(d), shaped(d), shaped(d, d))
            hint = shaped(d, d) if (isinstance(self.proposal, AdaptiveMetropolis)
                                    or getattr(self.proposal, "uses_cov_hint", False)) else None
            init_v = jax.vmap(self.kernel.init, in_axes=(0, None, None, None))
            states = jax.eval_shape(init_v, shaped(self.num_chains, d), self.data, cv, hint)
            rkey, entry = self._entry(states)
        except Exception:  # noqa: BLE001 - shapes not known before the set-up: compiled after it, as before
            return None
        if entry["compiled"] is not None:
            return None
        i32 = to_device(np.int32(0))  # (not jnp.asarray: it compiles a conversion program)
        args0 = (states, *self._chunk_keys(0, 0), i32, i32, i32, to_device(np.float32(0.0)), self.data, self.stats)
        box = {"rkey": rkey, "avals": _avals(args0), "traced": threading.Event(), "ready": threading.Event()}
        length = self.length

        def audit_program():
            try:
                self._audit_compiled(entry, states)
            except BaseException:  # noqa: BLE001 - compiled at its first use instead
                pass

        def lower():
            try:
                return entry["fn"].lower(*args0)
            finally:
                box["traced"].set()
                if self._defer_audit():  # the audit's program traced and compiled beside the chain's XLA compile
                    threading.Thread(target=_as_caller(audit_program), daemon=True,
                                     name="tallmh-audit-compile").start()

        def work():
            try:
                dkey = self._disk_key(length, args0)
                compiled = _exec_cache.load(dkey)
                if compiled is None:
                    compiled = _exec_cache.compile_and_store(dkey, lower, unrolled=self.program is None,
                                                             elemental=self._elemental(), quick=self._elemental())
                box["compiled"] = compiled
            except BaseException as e:  # noqa: BLE001 - compiled again after the set-up
                box["error"] = e
            finally:
                box["traced"].set()
                box["ready"].set()
            if self._defer_audit() and "compiled" in box:  # (the chain loaded from the disk: the audit's too)
                audit_program()

        box["thread"] = threading.Thread(target=_as_caller(work), daemon=True, name="tallmh-compile")
        box["thread"].start()
        return box

    def _compile(self, early=None):
        """The compiled chunk (cached across calls by model, proposal, test, shapes and options); ``early``:
        the compile started before the set-up (:meth:`_compile_early`), used when the states match it."""
        plan = self.plan
        rkey, entry = self._entry(self.states)
        self.entry = entry
        length = self.length
        if plan is None:
            def arg(v, dt):
                return to_device(np.asarray(v, dt))  # (jnp.asarray(v, dt) compiles a conversion)

            self.run_data, self.run_stats = self.data, self.stats  # (the step keys: per chunk, _chunk_keys)
        else:  # lay the chains, keys and data out over the mesh (the set-up above ran on local devices)
            def arg(v, dt):
                return distributed.scalar(plan, v, dt)

            self.states, _, _, self.run_data, self.run_stats = distributed.place_inputs(
                plan, self.states, self.chain_keys, self.k_audit, self.data, self.stats)
            layout = f"layout: {distributed.describe(plan)}"
            if layout not in self.notes:
                self.notes.append(layout)
        self.arg = arg
        args0 = (self.states, *self._chunk_keys(0, 0), arg(0, jnp.int32), arg(0, jnp.int32), arg(0, jnp.int32),
                 arg(0.0, jnp.float32), self.run_data, self.run_stats)
        if entry["compiled"] is None and early is not None and early["rkey"] == rkey \
                and early["avals"] == _avals(args0):
            tc = time.perf_counter()
            while not early["ready"].wait(0.05) and early["thread"].is_alive():  # (short waits: Ctrl-C stays responsive)
                pass
            entry["compiled"] = early.get("compiled")
            self.timings["compile_s"] += time.perf_counter() - tc
        if entry["compiled"] is None:
            tc = time.perf_counter()
            dkey = self._disk_key(length, args0)
            entry["compiled"] = _exec_cache.load(dkey)  # a warm process: no tracing at all
            if entry["compiled"] is None:
                entry["compiled"] = _in_thread(lambda: _exec_cache.compile_and_store(
                    dkey, lambda: entry["fn"].lower(*args0), unrolled=self.program is None,
                    elemental=self._elemental(), quick=self._elemental()))
            self.timings["compile_s"] += time.perf_counter() - tc
        self.compiled = entry["compiled"]

    def _audit_compiled(self, entry, states):
        """The deferred self-audit's compiled program (:func:`_audit_runner`) for the chunk's cache ``entry``:
        loaded from tallmh's executable cache where the chunk's is, else compiled (and stored)."""
        if entry.get("audit") is not None:
            return entry["audit"]
        with entry.setdefault("audit_lock", threading.Lock()):
            if entry.get("audit") is None:
                theta = states.theta
                c, d = theta.shape[0], theta.shape[-1]
                kd = self.chain_keys
                sd = jax.ShapeDtypeStruct
                args = AuditArgs(sd((AUDIT_SLOTS, c) + tuple(kd.shape[1:]), kd.dtype),
                                 sd((AUDIT_SLOTS, c, d), theta.dtype), sd((AUDIT_SLOTS, c, d), theta.dtype),
                                 sd((AUDIT_SLOTS, c), theta.dtype),
                                 sd((AUDIT_SLOTS, c), jax.dtypes.canonicalize_dtype(jnp.float64)))
                m = sd((), jnp.int32)
                fn = _audit_runner(self.kernel, AUDIT_SLOTS)
                lowered_args = (args, m, self.data, self.stats)
                dkey = self._disk_key(self.length, lowered_args, "audit")
                compiled = _exec_cache.load(dkey)
                if compiled is None:
                    compiled = _exec_cache.compile_and_store(dkey, lambda: fn.lower(*lowered_args), unrolled=True,
                                                             quick=self._elemental())
                entry["audit"] = compiled
        return entry["audit"]

    def _audits_of_chunk(self, phase, info, args, ua):
        """Hand the chunk's audits to the audit worker (:meth:`_audit_chunk`, chunks in the order they ran).

        The chain does not steer by its audits, so which of its steps are audited, and their exact passes,
        can come after it: a worker thread takes the chunks in order while the next chunks run (the chain's
        loop keeps about one core busy, the pass both), and sees every earlier chunk's audits done, as the
        two-stage design wants. Until the worker reaches a chunk its statistics show no audit; the result,
        a checkpoint and draws streamed to disk (a chunk is written once) wait for it (:meth:`_settle_audits`)."""
        info["audited"] = np.zeros(np.shape(ua), bool)
        info["audit_exact"] = np.zeros(np.shape(ua), bool)
        info["audit_items"] = np.zeros(np.shape(ua), np.int32)
        if self.store is not None:
            self._settle_audits()
            self._audit_chunk(phase, info, args, ua)
            self._flush_audits()
            return
        if getattr(self, "audit_queue", None) is None:
            self.audit_queue, self.audit_errors = queue.Queue(), []
            threading.Thread(target=_as_caller(self._audit_worker), args=(self.audit_queue,), daemon=True,
                             name="tallmh-audit").start()
        self.audit_queue.put((phase, info, args, ua))

    def _audit_worker(self, q):
        while True:
            item = q.get()
            try:
                if item is None:
                    return
                if not self.audit_errors:  # (after a failure the rest is not audited: the run raises it)
                    self._audit_chunk(*item)
            except BaseException as e:  # noqa: BLE001 - raised where the run waits for its audits
                self.audit_errors.append(e)
            finally:
                q.task_done()

    def _settle_audits(self):
        """Wait until the audit worker has done every chunk handed to it (then it stops; a later chunk starts
        another), and raise what it failed with."""
        q = getattr(self, "audit_queue", None)
        if q is None:
            return
        with q.all_tasks_done:
            while q.unfinished_tasks:  # (short waits: Ctrl-C stays responsive)
                q.all_tasks_done.wait(0.05)
        q.put(None)
        self.audit_queue = None
        if self.audit_errors:
            raise self.audit_errors[0]
        self._flush_audits()

    def _audit_chunk(self, phase, info, args, ua):
        """A chunk's audits, after those of every chunk before it: the first stage checked on those
        (:meth:`_audit_clear`), then the steps whose audit uniform is below the phase's rate (and whose proposal
        is in the support) audited, in order; while the first stage is open only until it has its
        ``first_stage`` audited sampling steps (the rest of the chunk's are audited too if one of those finds
        a wrong decision: the whole plan then stands)."""
        if phase == 1:
            self._audit_clear()
        cand = (np.asarray(ua) < self.rates[phase]) & (np.asarray(args.log_base) > -np.inf)
        sel, rest = cand, None
        design = self.audit_design
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
        info["audit_items"] = np.where(sel, self.n, 0).astype(np.int32)
        self._take_audits(info, args, sel)
        if rest is not None and rest.any():
            self._flush_audits()
            wrong = info["audited"] & (np.asarray(info["accepted"], bool) != info["audit_exact"])
            if wrong.any():
                self._take_audits(info, args, rest)

    def _audit_stop(self):
        """The default audit has read its budget of items (``DEFAULT_AUDIT_ITEMS``, counted as read where decisions
        are certified): the rest of the run audits nothing, and a note gives the power of what was audited."""
        self.rates = (0.0, 0.0)
        m = sum(int(np.sum(info["audited"])) for pname in ("warmup", "sampling") for _, info in self.parts(pname)
                if "audited" in info)
        tgt = error_target(self.test) or 0.05
        self.notes.append(f"self-audit: stopped at its budget of {DEFAULT_AUDIT_ITEMS:,} items read, after about {m} "
                          f"audited chain-step(s), {self.audit_certified} of them certified without reading the data; "
                          f"they flag a wrong-decision rate of twice the target with probability "
                          f"{audit_power(m, tgt):.2f} (pass audit=rate for more)")

    def _take_audits(self, info, args, mask):
        """The exact decisions of the chunk's audited steps ``mask`` (chains first; ``info`` and ``args`` on the
        host), written into ``info`` as the chain's own audit would have: ``audit_exact``, ``audit_items`` (N,
        or 0 for a proposal out of the support, which reads nothing) and ``audited``.

        Where a certified bound on the control variates' Taylor remainder settles a decision (:mod:`tallmh.certify`,
        :meth:`_certificate`) it is taken without reading data (``audit_items`` 0; the certificate's one pass, N
        items, is counted at the first audited step after it); the other audited chain-steps are packed side by
        side, ``num_chains`` to a slot of the audit's program, whichever chain and step each comes from."""
        asked = np.asarray(mask, bool)
        if not asked.any():
            return
        exact = np.array(info["audit_exact"], bool)
        leaves = [np.asarray(v) for v in args]
        certified = np.zeros_like(asked)
        cert = self._certificate()
        if cert is not None:
            oracle = self.kernel_oracle
            sel = np.nonzero(asked)
            t, size = certify.thresholds(leaves[4][sel], leaves[3][sel], oracle.kind, oracle.temperature)
            ok, acc = certify.settle(cert, leaves[1][sel], leaves[2][sel], t, size)
            certified[sel] = ok
            exact[sel] = ok & acc
        mask = asked
        if self.audit_budget is not None:  # whole steps in order, each while the items read before it are within budget
            per_step = (asked & ~certified).sum(axis=0) * self.n
            keep = np.cumsum(per_step) - per_step < self.audit_budget - self.audit_items_read
            mask, certified = asked & keep, certified & keep
        waiting = mask & ~certified
        self.audit_certified += int(certified.sum())
        items = np.where(asked, 0, np.asarray(info["audit_items"], np.int32))  # (the passes add theirs)
        if self.cert_items and not self.cert_counted:  # the certificate's pass, once (counted if it failed)
            first = np.argwhere(mask if mask.any() else asked)[0]
            items[first[0], first[1]] += np.int32(self.n)
            self.cert_counted = True
        audited = (np.asarray(info["audited"], bool) & ~asked) | certified | waiting
        # (a step waiting for its pass agrees with the chain until then: _audit_counts)
        now = np.where(certified, exact, waiting & np.asarray(info["accepted"], bool))
        info["audit_exact"], info["audit_items"], info["audited"] = np.where(asked, now, exact), items, audited
        pairs = np.argwhere(waiting)  # (chain, step): their exact passes wait in audit_pending
        self.audit_items_read += self.n * len(pairs)
        if pairs.size:
            self.audit_pending.append((info, pairs, [v[pairs[:, 0], pairs[:, 1]] for v in leaves]))
            if sum(len(p[1]) for p in self.audit_pending) >= self.num_chains:
                self._flush_audits(whole=True)
        if self.audit_budget is not None and self.audit_items_read >= self.audit_budget and any(self.rates):
            self._audit_stop()

    def _flush_audits(self, whole=False):
        """The exact passes of the audited chain-steps that :meth:`_take_audits` left waiting, ``num_chains`` to a
        slot of the audit's program whichever chain, step or chunk each comes from, written into their chunks'
        ``info``. ``whole``: only as many as fill whole slots (the rest wait for company): called so as soon as
        a slot's worth waits (while the chain runs on); all of them before anything reads the audits' outcomes
        (the first stage, a chunk's later audits) and when the run settles its audits."""
        pending, self.audit_pending = self.audit_pending, []
        if not pending:
            return
        c = self.num_chains
        owner = np.concatenate([np.full(len(p[1]), k) for k, p in enumerate(pending)])
        pairs = np.concatenate([p[1] for p in pending])
        vals = [np.concatenate([p[2][j] for p in pending]) for j in range(len(pending[0][2]))]
        take = (len(pairs) // c) * c if whole else len(pairs)
        for k, (info, _, _) in enumerate(pending):  # (those left wait again, in order)
            left = np.flatnonzero(owner == k)
            left = left[left >= take]
            if left.size:
                self.audit_pending.append((info, pairs[left], [v[left] for v in vals]))
        if take == 0:
            return
        owner, pairs, vals = owner[:take], pairs[:take], [v[:take] for v in vals]
        prog = self._audit_compiled(self.entry, self.states)
        per_call = AUDIT_SLOTS * c
        ex_all, it_all = np.zeros(len(pairs), bool), np.zeros(len(pairs), np.int32)
        for k in range(0, len(pairs), per_call):
            j = np.arange(k, min(len(pairs), k + per_call))
            pad = np.concatenate([j, np.full(per_call - len(j), j[0])])  # (the padding is never read back)
            args = AuditArgs(*(to_device(v[pad].reshape((AUDIT_SLOTS, c) + v.shape[1:])) for v in vals))
            ex, it = prog(args, to_device(np.int32(-(-len(j) // c))), self.run_data, self.run_stats)
            ex_all[j], it_all[j] = np.asarray(ex).reshape(-1)[:len(j)], np.asarray(it).reshape(-1)[:len(j)]
        for k, (info, _, _) in enumerate(pending):
            sel = owner == k
            if not sel.any():
                continue
            ci, si = pairs[sel, 0], pairs[sel, 1]
            info["audit_items"][ci, si] += it_all[sel]
            info["audited"][ci, si] = it_all[sel] > 0  # (none for a proposal out of the support: never picked)
            info["audit_exact"][ci, si] = ex_all[sel] & (it_all[sel] > 0)

    def _certificate(self):
        """The certified Taylor bound of the deferred audit (:mod:`tallmh.certify`), made by one host pass the first
        time an audit is taken, or None: for the built-in logistic regression with control variates (their centre
        and Hessian sum give the certificate's centre and whitening) on data in host memory or in a file, with
        the exact test (Metropolis or Barker) as oracle, N at most ``CERTIFY_MAX_ROWS``, when the audit plans at
        least ``CERTIFY_MIN_AUDITS`` audited chain-steps (the pass costs about one audited step of a few chains)."""
        if self.cert_state is not None:
            return self.cert_state or None
        self.cert_state = False
        cv = getattr(self.states, "cv", None)
        if cv is None or not self._certifiable():
            return None
        self.kernel_oracle = oracle_of(self.test)
        planned = AUTO_PLANNED_SAMPLES if self.auto_draws else self.num_samples
        expected = self.num_chains * (self.rates[0] * self.num_warmup + self.rates[1] * planned)
        if self.audit_design:
            expected = min(expected, self.audit_design["planned"])
        read = ds.host_reader(self.run_data)
        if expected < CERTIFY_MIN_AUDITS or read is None:
            return None
        center = np.asarray(cv.center)[0]
        hess = np.asarray(cv.hess_sum)[0]
        if not np.any(hess):  # (first-order control variates keep no Hessian sum)
            return None
        prior = getattr(self.model, "log_prior_vgh_host", None)
        ph = prior(center.astype(np.float64))[2] if callable(prior) else np.zeros_like(hess)
        cert, self.cert_items = certify.build(self.model, read, self.n, center, hess, ph, self.dtype)
        self.audit_items_read += self.cert_items
        self.cert_state = cert or False
        return cert

    def _elemental(self) -> bool:
        """Whether the chain compiles with XLA's elemental CPU emitters (``_exec_cache._CPU_OPTIONS``) and LLVM's
        level 1 (``_CPU_QUICK``; the audit's program with the latter): for the built-in models whose chains
        were measured with them (the logistic regression: about half the compile time, sampling no slower; the
        emitters keep the draws, level 1 changes them in float32's last bits), with tallmh's own proposals
        other than reversible jump, and never for an inference program (a reversible-jump chain's compile
        took over 24 GB of memory with the emitters)."""
        from .models import LogisticRegression
        from .proposals import ReversibleJump

        return (self.program is None and type(self.model) is LogisticRegression
                and not isinstance(self.proposal, ReversibleJump)
                and type(self.proposal).__module__.startswith("tallmh."))

    def _disk_key(self, length, args0, what="chain"):
        """The on-disk key of the compiled chunk (:mod:`tallmh._exec_cache`), or None where tallmh cannot name
        everything its tracing depends on (a model, proposal or test not of tallmh's classes; several
        devices visible; data read through host callbacks)."""
        # (one visible device only: an executable read back in a process with several devices is loaded
        # onto all of them and then expects one shard per device, even for a one-device chain)
        if self.plan is not None or self.program is not None or jax.device_count() != 1 or \
                any(isinstance(a, ds.HostArray) for a in ds.leaves_of(self.data)):
            return None
        named = [_exec_cache.stable_key(o) for o in (self.model, self.proposal, self.test)]
        if any(k is None for k in named):
            return None
        shapes = jax.tree_util.tree_structure(args0), [(tuple(np.shape(a)), str(a.dtype))
                                                       for a in jax.tree_util.tree_leaves(args0)]
        return _exec_cache.program_key(what, named, self.n, self.cv_order, self.num_chains, length,
                                       self.audit_on, self.d, str(self.dtype), str(shapes[0]), shapes[1],
                                       str(jax.tree_util.tree_structure(self.init_tree)), self._defer_audit())

    def _recenter(self):
        """Control variates re-centred at the warmup's mean before sampling (``ControlVariates(recenter=True)``)."""
        cvo = self.control_variates
        warm = np.concatenate([p[0] for p in self.parts("warmup")], axis=1)
        center = jnp.asarray(warm[:, warm.shape[1] // 2:].reshape(-1, warm.shape[-1]).mean(axis=0))
        cv_new = cvm.proxy_sums(self.model, self.data, self.n, self.unravel, center, cvo.order)
        self.setup_items += self.n
        self.states = self.states._replace(cv=jax.tree_util.tree_map(
            lambda a: jnp.broadcast_to(a, (self.num_chains,) + a.shape), cv_new))
        if self.plan is not None:
            self.states = distributed.place_inputs(self.plan, self.states, self.chain_keys, self.k_audit,
                                                   None, None)[0]

    def _phase(self, pname, total, phase) -> bool:
        """Run phase ``pname`` in chunks until ``total`` steps; True when ``num_samples='auto'`` met its goal."""
        cvo = self.control_variates
        if pname == "sampling" and cvo is not None and cvo.recenter and self.parts("warmup") \
                and self.done["sampling"] == 0:
            self._recenter()
        # on-disk data: rows are read at random, unless this phase's audits read all of them in order
        ds.advise(self.data, "random" if self.rates[phase] == 0 else "normal")
        tp = time.perf_counter()
        base_s = self.timings[f"{pname}_s"]
        done, length = self.done, self.length
        count = min(length, total - done[pname], 4 if self.chunk_size is None else length)
        while done[pname] < total:
            changed = _files_changed(self.fingerprint)  # (before each chunk reads the files again)
            if changed is not None:
                raise DataChanged(changed)
            stop = pname == "sampling" and self.budget_s is not None and self.timings["sampling_s"] >= self.budget_s
            if self.plan is not None:  # several processes: all make the chunks and stop that process 0 chose
                count, stop = distributed.agree(count, stop)
            if stop:
                break
            dt = self._chunk(pname, phase, count)
            if pname == "sampling" and not self._defer_audit():  # (deferred: checked before the chunk's audits)
                self._audit_clear()
            self.timings[f"{pname}_s"] = base_s + time.perf_counter() - tp
            if self._after_chunk(pname, total):
                return True
            if self.chunk_size is None:  # next chunk: about chunk_seconds long
                per_step = max(dt / count, 1e-7)
                want = self.chunk_seconds / per_step
                if pname == "sampling" and self.budget_s is not None:
                    want = min(want, max(1.0, (self.budget_s - self.timings["sampling_s"]) / per_step))
                count = int(max(1, min(length, want, 4 * count)))
            if pname == "sampling" and not self._defer_audit():  # (deferred: the stage closes at its step)
                count = self._audit_chunk_cap(count)
            if pname == "sampling" and self.auto_draws and done[pname] < self.next_check:
                # num_samples="auto": a chunk ends where the ESS is looked at next (draws 25% apart), so the run
                # stops at most about a quarter past where the goal was met, not a whole growing chunk past it
                count = max(1, min(count, self.next_check - done[pname]))
            count = min(count, length, total - done[pname]) if done[pname] < total else count
        return False

    def _chunk_keys(self, phase: int, start: int):
        """The step keys of the chunk from step ``start`` of ``phase`` (:func:`_step_keys`), on the device (or laid
        out over the plan's mesh: chains split, the audit's replicated)."""
        ks, ka = _step_keys(self.chain_keys, self.k_audit, int(phase), int(start), self.length)
        if self.plan is None:
            return to_device(ks), to_device(ka)
        return (distributed.put(ks, self.plan.sharding(self.plan.chain_spec)),
                distributed.put(ka, self.plan.sharding(distributed.P())))

    def _chunk(self, pname, phase, count) -> float:
        """One compiled call of ``count`` steps; its draws and statistics kept. Returns its wall time."""
        arg = self.arg
        tcall = time.perf_counter()
        new_states, out = self.compiled(self.states, *self._chunk_keys(phase, self.done[pname]),
                                        arg(self.done[pname], jnp.int32), arg(count, jnp.int32), arg(phase, jnp.int32),
                                        arg(self.rates[phase], jnp.float32), self.run_data, self.run_stats)
        _wait(new_states)
        # the chunk's outputs are buffers of ``self.length`` steps; a view of their first ``count`` would keep each
        # whole buffer alive (on a CPU, NumPy's view of a JAX array holds its buffer): copied, memory grows with
        # the draws kept, not with the number of chunks times the buffer
        theta, info, *deferred = jax.tree_util.tree_map(lambda a: np.array(distributed.to_host(a)[:, :count]), out)
        info = dict(info)
        if deferred:
            self._audits_of_chunk(phase, info, *deferred)
        dt = time.perf_counter() - tcall
        self.states = new_states
        if self.store is not None:
            self.store.append(pname, theta, info)
        else:
            self.collected[pname].append((theta, info))
        self.done[pname] += count
        if self.bar is not None:
            self.bar.update(count, pname, info, self.n)
        if getattr(self, "cv_advice", False):
            self._warn_without_cv(info)
        return dt

    def _warn_without_cv(self, info):
        """Once, after the first chunk: an approximate test reading much of the data for lack of control
        variates is told so while it runs, with the fraction it measured."""
        self.cv_advice = False
        frac = float(np.mean(info["n_data"])) / self.n if np.size(info["n_data"]) else 0.0
        if frac < CV_ADVICE_FRACTION:
            return
        msg = (f"{getattr(self.test, 'name', 'the test')} without control variates read {100 * frac:.0f}% of the "
               f"data per step in the first {np.shape(info['n_data'])[1]} steps (the log-likelihood ratios vary "
               f"too much for a small sample); this model is differentiable: control_variates=tm.ControlVariates() "
               f"(or the default test=None) reads a few hundred items per step")
        self.notes.append(msg)
        warnings.warn(f"tallmh: {msg}", RuntimeWarning, stacklevel=5)

    def _after_chunk(self, pname, total) -> bool:
        """Callback, checkpoint and the ``num_samples='auto'`` check after a chunk; True to stop sampling."""
        done = self.done
        if self.callback is not None:
            self.callback({"phase": pname, "done": done[pname], "total": total,
                           "seconds": self.timings[f"{pname}_s"]})
        due = self.checkpoint is not None and time.perf_counter() - self.last_ckpt >= self.checkpoint_every_s
        if self.plan is not None and self.checkpoint is not None:  # gathering the states is collective
            (due,) = distributed.agree(due)
        if due:
            # the run is not finished: a checkpoint left by a kill loads as partial
            self.last_ckpt = _save_checkpoint(self.result(), self.checkpoint, in_progress=True,
                                              every=self.checkpoint_every_s, store=self.store)
        if self.auto_draws and pname == "sampling" and done[pname] >= self.next_check:
            reached = _auto_reached(self.parts("sampling"), self.min_ess)
            self.next_check = int(done[pname] * 1.25) + 1
            if reached is not None:
                self.auto_stop = reached
                return True
        return False

    def finish(self) -> Result:
        """The Result (saved to the checkpoint), with ``num_samples='auto'``'s note and the trust warnings."""
        done = self.done
        if self.auto_draws:
            if self.auto_stop is not None:
                self.notes.append(f"num_samples='auto': stopped after {done['sampling']:,} draws per chain, with min "
                                  f"bulk ESS {self.auto_stop[0]:.0f} >= {self.min_ess:g} and max R-hat "
                                  f"{self.auto_stop[1]:.3f} <= {AUTO_RHAT}")
            elif not self.partial:
                why = (f"the sampling budget ({self.budget_s:g} s)" if done["sampling"] < self.num_samples
                       else f"the cap of {self.num_samples:,} draws per chain")
                self.notes.append(f"num_samples='auto': {why} ran out before min bulk ESS {self.min_ess:g} and R-hat "
                                  f"{AUTO_RHAT} were reached")
            self.num_samples = done["sampling"]
        result = self.result()
        if self.checkpoint is not None and self.states is not None:
            _save_checkpoint(result, self.checkpoint, store=self.store)
        if self.store is not None:
            self.store.close()
        if self.changed_error is not None:
            kept = (f"; the draws made before it ({done['warmup']} warmup steps, {done['sampling']} draws per chain) "
                    "are in the exception's .result"
                    + (f" and in {self.checkpoint}" if self.checkpoint is not None else ""))
            raise DataChanged(f"{self.changed_error}{kept}", result)
        for w in result.warnings:
            warnings.warn(_trust_warning()(w), stacklevel=3)
        return result


def info_dict(info) -> dict:
    """A step's statistics as a dict (a kernel's :class:`StepInfo`, or a program's dict as it is)."""
    return info._asdict() if hasattr(info, "_asdict") else dict(info)


def _files_changed(fingerprint):
    """Why the run must stop (a data file's size or modification time is not what it was at the start), or
    None. Checked before every chunk: a file truncated under a memory map would otherwise end the process
    with SIGBUS at the next read of a lost page, and one changed in place would mix two data sets."""
    import os

    for leaf in fingerprint["data"]["leaves"]:
        f = leaf.get("file")
        if not f or f.get("size") is None:
            continue
        try:
            st = os.stat(f["path"])
        except OSError as e:
            return f"the data file {f['path']} cannot be read any more ({e.strerror or e}); the run stopped"
        if st.st_size != f["size"]:
            return (f"the data file {f['path']} changed size during the run ({f['size']:,} -> {st.st_size:,} "
                    "bytes); the run stopped")
        if st.st_mtime_ns != f["mtime_ns"]:
            return f"the data file {f['path']} was modified during the run; the run stopped"
    return None


CHECKPOINT_RETRY_S = 60.0  # a checkpoint that could not be written is tried again this much later


def _save_checkpoint(result, path, in_progress=False, every=None, store=None):
    """Save ``result`` to ``path``; a failed write (a full disk, an I/O error) warns in one line and loses
    nothing: the draws stay in memory and the write is tried again. Returns the time to count the next
    checkpoint from (``perf_counter``), earlier after a failure so that the retry comes sooner."""
    now = time.perf_counter()
    try:
        if in_progress and not result.partial:
            result = dataclasses.replace(result, partial=True)
        if store is not None:
            store.sync()  # the draws on disk before the checkpoint that refers to them
        result.save(path)
        return now
    except OSError as e:
        retry = CHECKPOINT_RETRY_S if every is None else min(CHECKPOINT_RETRY_S, every)
        warnings.warn(f"tallmh: checkpoint not saved ({' '.join(str(e).split())}); the draws are kept in memory"
                      + (f" and the checkpoint is tried again in {retry:.0f} s" if in_progress else ""),
                      RuntimeWarning, stacklevel=3)
        return now - (every if every is not None else 0.0) + retry


def _trust_warning():
    from .results import TrustWarning

    return TrustWarning


class _Bar:
    """A tqdm progress bar over all steps of a chain (warmup + sampling), with acceptance and data fraction."""

    def __init__(self, total, initial, name):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, initial=initial, desc=f"tallmh[{name}]", unit="step", file=sys.stderr,
                        dynamic_ncols=True, mininterval=0.5, smoothing=0.1)

    def update(self, k, phase, info, n):
        acc = float(np.mean(info["accepted"])) if np.size(info["accepted"]) else float("nan")
        frac = float(np.mean(info["n_data"])) / n if np.size(info["n_data"]) else float("nan")
        self.bar.set_postfix_str(f"{phase}, accept {acc:.2f}, data/step {frac:.3g}", refresh=False)
        self.bar.update(k)

    def close(self):
        self.bar.close()


def _assemble(collected, num_chains, d, dtype, unravel, n, test, proposal, timings, setup_items, partial,
              states, notes, resume_info, t0, control_variates, constrain=None, empty=None):
    empty = info_dict(StepInfo.empty(dtype)) if empty is None else empty
    fields = tuple(empty)

    def stack(parts):
        if not parts:
            st = {k: np.zeros((num_chains, 0), np.asarray(v).dtype) for k, v in empty.items()}
            return np.zeros((num_chains, 0, d), np.dtype(str(dtype))), st
        def join(vals):  # (one part, e.g. draws streamed to disk: as it is, not copied)
            return vals[0] if len(vals) == 1 and isinstance(vals[0], np.memmap) else np.concatenate(vals, axis=1)

        theta = join([p[0] for p in parts])
        st = {}
        for k in fields:
            vals = [p[1].get(k) for p in parts]
            if any(v is None for v in vals):  # an older result without this statistic
                vals = [v if v is not None else np.zeros(p[0].shape[:2], np.int32) for v, p in zip(vals, parts)]
            st[k] = join(vals)
        return theta, st

    flat_samples, sstats = stack(collected["sampling"])
    flat_warm, wstats = stack(collected["warmup"])
    timings = dict(timings)
    timings["total_s"] = timings.pop("_before_s", 0.0) + time.perf_counter() - t0
    final = jax.tree_util.tree_map(np.asarray, states) if states is not None else None
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
        final_state=final,
        notes=list(notes),
        resume_info=resume_info,
        control_variates=control_variates,
        constrain=constrain if callable(constrain) else None,
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
