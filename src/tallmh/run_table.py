"""The workflow of ``tallmh run``: a regression's posterior for the user's own table.

Stages: the arguments checked (before anything heavy is imported) -> the ``--out`` folder taken ->
the design read (in memory, or streamed into an on-disk cache) -> the model -> a fresh run's settings
saved (or a saved run restored with ``--resume``) -> :func:`tallmh.sample` with checkpoints -> the outputs:
the summary on the terminal, ``results.json``, ``posterior.nc`` and ``report.html`` in ``--out``.
Coefficients are sampled on standardised features and reported on the data's own scale
(:mod:`tallmh.frontends.design`).
"""

from __future__ import annotations

import html
import os
import signal
import sys
import time
import types

import numpy as np

from .console import PROG, now, plural, print_line, quiet_libraries, say, use_compile_cache
from .frontends.design import extra_parameter_of, load_design, original_scale, original_scale_laplace, original_scale_run
from .errors import CLIError
from .interrupts import arm_deferred_stop, arm_second_interrupt, disarm, status_of_stop, stopped
from .method_options import METHODS, THINNING, check_test_args, label_of, make_test, method_config
from .storage.runfolder import CHECKPOINT, OLD_CHECKPOINT, OUTPUTS, RUN_SETTINGS, OutFolder

__all__ = ["RUN_KEYS", "run_command", "run_settings", "restore_args", "check_data_file", "coef_table"]

# settings of a run saved in run.json and restored by --resume
RUN_KEYS = ("data", "target", "features", "model", "noise_sd", "noise_prior_scale", "test", "samples", "warmup",
            "proposal", "start", "no_standardize", "no_intercept", "epsilon", "batch_size", "delta", "bound",
            "initial_batch", "gamma", "barker_batch", "barker_delta", "chains", "seed", "prior_scale", "error",
            "formula", "family", "min_ess", "stream")


def run_settings(args) -> dict:
    out = {k: getattr(args, k) for k in RUN_KEYS}
    out["data"] = os.path.abspath(os.path.expanduser(out["data"]))  # --resume works from any folder
    return out


def _formula_args(args):
    """--formula replaces --target, --features and --model; --family sets the model."""
    from .frontends.formula import FAMILIES

    if args.target is not None or args.features is not None:
        raise CLIError("--formula names the response and the predictors: drop --target and --features")
    if args.family is None:
        raise CLIError("--formula needs --family (bernoulli, gaussian, poisson or negativebinomial)")
    args.model = FAMILIES[args.family]
    args.target = args.formula.split("~")[0].strip() or None
    if args.target is None:
        raise CLIError(f"--formula {args.formula!r} has no response: write it as 'y ~ x + C(g)'")


def restore_args(args):
    """``--resume DIR``: the settings of the run in DIR, with --samples, --quiet and --checkpoint-every from
    this command line."""
    import json

    folder = os.path.abspath(os.path.expanduser(args.resume))
    path = os.path.join(folder, RUN_SETTINGS)
    ck = os.path.join(folder, CHECKPOINT)
    if not os.path.isdir(folder):
        raise CLIError(f"--resume: {folder} is not a folder")
    missing = [f for f, p in ((RUN_SETTINGS, path), (CHECKPOINT, ck)) if not os.path.exists(p)]
    if missing == [CHECKPOINT] and not os.path.exists(os.path.join(folder, OLD_CHECKPOINT)):
        ck = None  # stopped before its first draw: started again from its settings (the same draws)
    elif missing:
        if CHECKPOINT in missing and os.path.exists(os.path.join(folder, OLD_CHECKPOINT)):
            raise CLIError(f"--resume: {folder} holds a checkpoint of an earlier tallmh ({OLD_CHECKPOINT}, a pickle), "
                           "which this version does not read (loading a pickle can run code); start the run again")
        raise CLIError(f"--resume: {folder} holds no run to continue (no {' and no '.join(missing)})")
    links = [f for f in (RUN_SETTINGS, CHECKPOINT, CHECKPOINT + ".draws") if os.path.islink(os.path.join(folder, f))]
    if links:
        raise CLIError(f"--resume: refused: {', '.join(links)} in {folder} is a symbolic link; a run folder is read "
                       "and written only through its own files")
    given_data = args.data  # a data file moved since: given beside --resume, accepted when its content matches
    typed_formula = getattr(args, "formula", None)  # the user's own, given again beside --resume
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError) as e:
        raise CLIError(f"--resume: cannot read {path}: {e}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        raise CLIError(f"--resume: {path} is not the settings file of a tallmh run")
    for k in RUN_KEYS:
        if k == "samples" and args.samples is not None:
            continue
        if k in saved["settings"]:
            setattr(args, k, saved["settings"][k])
    _check_saved_formula(args, typed_formula)
    # the data path as saved: absolute (relative paths of older runs: from the folder, else as given)
    data = args.data
    if data is not None and not os.path.isabs(data):
        beside = os.path.normpath(os.path.join(folder, data))
        if not os.path.exists(data) and os.path.exists(beside):
            args.data = beside
    if given_data is not None:  # (its content is compared with the run's, data_sha256, before any sampling)
        check_data_file(given_data)
        args.data = os.path.abspath(os.path.expanduser(given_data))
    elif args.data is not None and not os.path.exists(args.data):
        raise CLIError(f"--resume: the run's data file {args.data} is not there (moved?); give it beside --resume: "
                       f"tallmh run DATA --resume {folder} (its content must be the run's)")
    args.out = folder
    return saved, ck


def _check_saved_formula(args, typed):
    """A formula from run.json is data: checked against a safe grammar (:mod:`tallmh.safe_formula`), never
    evaluated as it stands, unless the user typed the same formula again with ``--formula``."""
    saved = getattr(args, "formula", None)
    if typed is not None and typed != saved:
        raise CLIError(f"--resume: --formula {typed!r} is not the formula of the saved run ({saved!r})")
    if saved is None:
        return
    if typed is None:
        from .frontends.safe_formula import check_formula

        check_formula(saved)
    from .frontends.formula import FAMILIES

    if args.family not in FAMILIES:
        raise CLIError(f"--resume: refused: run.json's family {args.family!r} is not one of {sorted(FAMILIES)}")


def check_data_file(path):
    """The refusals of a data path that need no reading (made before anything heavy is imported)."""
    from .datasets import check_path

    check_path(path)


def _run_name(result, args) -> str:
    """The method's short name (as in the demo): ``--test auto`` names what it chose, e.g. ``austerity-cv``."""
    if args.test != "auto":
        return args.test
    name = str(getattr(result.test, "name", "auto"))
    return name + ("-cv" if getattr(result, "control_variates", None) is not None else "")


def _check_args(args):
    """The refusals of the command line (nothing heavy imported yet); ``(saved settings, checkpoint path)``
    of the run to continue with ``--resume``, else ``(None, None)``."""
    saved = ck_path = None
    if args.resume:
        saved, ck_path = restore_args(args)
    else:
        if args.data is None:
            raise CLIError("the following arguments are required: DATA (or --resume DIR)")
        if getattr(args, "formula", None):
            _formula_args(args)
        elif args.target is None:
            raise CLIError("the following arguments are required: --target")
        check_data_file(args.data)
        if args.stream and not str(args.data).lower().endswith((".csv", ".parquet", ".pq", ".npy")):
            raise CLIError("--stream reads CSV and Parquet tables (a 2-D .npy is always read from disk); "
                           f"{os.path.basename(args.data)} is read into memory: drop --stream")
    if args.samples is None:
        args.samples = "auto"
    if args.model != "linear" and args.noise_sd is not None:
        raise CLIError("--noise-sd is for --model linear")
    check_test_args(args.test, args)
    return saved, ck_path


def run_command(args, argv):
    """``tallmh run``: returns the exit status (0, or 128 + the signal's number after a stop)."""
    t_all = time.perf_counter()

    def tell(m):
        say(args, "tallmh run: " + m)

    saved, ck_path = _check_args(args)
    out = OutFolder(args.out, overwrite=args.overwrite, resuming=bool(args.resume))
    test = make_test(args.test, args)
    try:
        return _run(args, argv, test, out, saved, ck_path, tell, t_all)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM, SIGHUP before sampling began: its settings are kept
        if not os.path.exists(os.path.join(out.path, RUN_SETTINGS)):
            out.clean_up()
            raise
        stop = status_of_stop()
        what = "interrupted" if stop == 130 else f"stopped by {signal.Signals(stop - 128).name}"
        try:
            print(f"{PROG}: {what} before sampling began: no draws yet; 'tallmh run --resume {out.path}' starts the "
                  "run again with its saved settings", file=sys.stderr, flush=True)
        except OSError:  # the terminal is gone
            pass
        return stop
    except BaseException:
        # a fresh run that failed before its first checkpoint leaves nothing behind (not even run.json)
        if saved is None and (out.made or getattr(out, "wrote_settings", False)) \
                and not os.path.exists(os.path.join(out.path, CHECKPOINT)):
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


def _design(args, tell):
    """``(data, on_disk, names, scaling, digest)``: the design from disk (a ``.npy`` table, or a CSV/Parquet
    table streamed into the on-disk cache) or memory. The choice to stream is kept in ``args.stream`` (saved
    with the run, so that ``--resume`` reads the table the same way)."""
    from .reporting import compare as cmp
    from .frontends.design_cache import is_npy_table, npy_design, should_stream, streamed_design

    if is_npy_table(args):
        return npy_design(args, tell)
    args.stream = should_stream(args)
    if args.stream:
        return streamed_design(args, tell)
    X, y, names, scaling = load_design(args)
    data = {"X": X, "y": y}
    return data, None, names, scaling, cmp.data_digest(data)


def _model_of(args, scaling):
    """The regression model of ``--model`` and a line describing its prior."""
    import tallmh as tm

    if args.model == "logistic":
        model = tm.models.LogisticRegression(prior_scale=args.prior_scale)
        prior_text = f"N(0, {args.prior_scale:g}^2) on each coefficient (standardised scale)"
    elif args.model == "poisson":
        from .frontends.formula import PoissonRegression

        model = PoissonRegression(prior_scale=args.prior_scale)
        prior_text = f"N(0, {args.prior_scale:g}^2) on each coefficient (standardised scale)"
    elif args.model == "negativebinomial":
        from .frontends.formula import NegativeBinomialRegression

        model = NegativeBinomialRegression(prior_scale=args.prior_scale,
                                           dispersion_prior_scale=args.noise_prior_scale)
        prior_text = model.describe_prior() + (" (coefficients on the standardised scale)"
                                               if scaling["standardised"] else "")
    else:
        model = tm.models.LinearRegression(prior_scale=args.prior_scale, noise_sd=args.noise_sd,
                                           noise_prior_scale=args.noise_prior_scale)
        prior_text = model.describe_prior() + (" (coefficients on the standardised scale)"
                                               if scaling["standardised"] else "")
    return model, prior_text


def _resumed(args, saved, ck_path, test, tell):
    """``--resume``: the sampler's arguments that continue the saved run, and its posterior mode (or None)."""
    import tallmh as tm
    from .reporting import compare as cmp

    try:
        resume = tm.load_result(ck_path)
    except Exception as e:  # noqa: BLE001 - one line
        raise CLIError(f"--resume: cannot read the checkpoint {ck_path}: {e}") from None
    done = resume.flat_samples.shape[1]
    if (args.samples == "auto" or done >= args.samples) and not resume.partial \
            and (args.warmup == "auto" or resume.flat_warmup.shape[1] >= args.warmup):
        lost = [f for f in OUTPUTS if not os.path.exists(os.path.join(args.out, f))]
        if not lost:
            raise CLIError(f"--resume: {args.out} holds a complete run of {done} draws per chain; pass --samples "
                           f"with a larger total to draw more")
        tell(f"{args.out} holds a complete run of {done} draws per chain without its {', '.join(lost)} (a write "
             "failed): writing the outputs from the checkpoint")
    else:
        tell(f"resuming {args.out}: {plural(resume.flat_warmup.shape[1], 'warmup step')} and "
             f"{plural(done, 'draw')} per chain done; going on to {args.samples}")
    mode = None
    if saved.get("mode") is not None:
        mode = cmp.Mode(np.asarray(saved["mode"]["theta"]), np.asarray(saved["mode"]["cov"]),
                        int(saved["mode"]["passes"]), float(saved["mode"]["seconds"]))
    info = resume.resume_info
    if info.get("seed") != args.seed or resume.num_chains != args.chains:
        raise CLIError(f"--resume: refused: the checkpoint {ck_path} is from another run (seed "
                       f"{info.get('seed')}, {resume.num_chains} chain(s); {RUN_SETTINGS} says seed {args.seed}, "
                       f"{args.chains} chain(s))")
    _check_method(args, test, resume, ck_path)
    return dict(resume=resume, test=test), mode


# --proposal -> the class of the proposal it makes
_PROPOSAL_CLASS = {"laplace": "RandomWalk", "adaptive": "AdaptiveMetropolis", "langevin": "Langevin"}


def _check_method(args, test, resume, ck_path):
    """The checkpoint's test and proposal are those run.json names (a checkpoint of another run's method is
    refused, not adopted). An explicit test is compared by :func:`tallmh.sample` itself (its fingerprint)."""
    chosen = resume.resume_info.get("chosen")
    kept_test = str(getattr(resume.test, "name", type(resume.test).__name__))
    kept_prop = type(resume.proposal).__name__
    why = None
    if test is None and ((chosen is not None and not chosen.get("test")) or kept_test == "exact"):
        why = f"its test ({kept_test}) was not chosen by --test auto, which {RUN_SETTINGS} says"
    elif args.proposal == "auto" and chosen is not None and not chosen.get("proposal"):
        why = f"its proposal ({kept_prop}) was not chosen by --proposal auto, which {RUN_SETTINGS} says"
    elif args.proposal in _PROPOSAL_CLASS and kept_prop != _PROPOSAL_CLASS[args.proposal]:
        why = f"its proposal is {kept_prop}; {RUN_SETTINGS} says --proposal {args.proposal}"
    if why:
        raise CLIError(f"--resume: refused: the checkpoint {ck_path} is from another run: {why}")


def _fresh(args, argv, model, data, on_disk, test, digest, out, tell):
    """A new run: the sampler's arguments and the posterior mode (``--proposal laplace`` only), with the
    run's settings saved in ``run.json`` for ``--resume``."""
    import tallmh as tm
    from .reporting import compare as cmp

    n = data["X"].shape[0]
    mode = None
    if args.proposal == "laplace":
        mode = cmp.posterior_mode(model, data if on_disk is None else on_disk)
        tell(f"posterior mode: {mode.passes} full pass{'' if mode.passes == 1 else 'es'} over the data, "
             f"{mode.seconds:.1f} s")
    # --start mode: tm.sample finds the mode itself and starts the chains dispersed around it (Laplace)
    init = None if args.start == "mode" else model.init(data)
    # --proposal auto: tm.sample's default (Crank-Nicolson with the exact subsampled test, Langevin with an
    # approximate test and control variates, adaptive Metropolis without)
    proposal = {"laplace": lambda: cmp.laplace_proposal(mode.cov),
                "adaptive": tm.proposals.AdaptiveMetropolis,
                "langevin": lambda: tm.proposals.Langevin(batch_size=min(100, n)),
                "auto": lambda: None}[args.proposal]()
    # --test auto: control variates on (tm.sample turns them on itself when it picks the test)
    cvopt = tm.ControlVariates(order=2) if args.test.endswith("-cv") or (args.test == "auto" and test is not None) \
        else None
    kw = dict(test=test, proposal=proposal, num_chains=args.chains, seed=args.seed, init=init,
              control_variates=cvopt)
    save_settings(args, argv, out, digest, mode)
    return kw, mode


def save_settings(args, argv, out, digest, mode=None):
    """``run.json``: the run's settings for ``--resume``. Written first before the table is read (``digest``
    None: a stop while the table is read keeps them, and ``--resume`` starts the run again), then with the
    table's SHA-256 (and the mode of ``--proposal laplace``) before sampling."""
    from .reporting.report import write_json

    settings = {"command": "tallmh " + " ".join(argv), "created": now(), "settings": run_settings(args),
                "data_sha256": digest,
                "mode": None if mode is None else {"theta": mode.theta, "cov": mode.cov, "passes": mode.passes,
                                                   "seconds": mode.seconds}}
    write_json(out.file(RUN_SETTINGS), settings)


def _run(args, argv, test, out, saved, ck_path, tell, t_all):
    import tallmh as tm
    from .reporting import compare as cmp

    quiet_libraries()
    use_compile_cache(os.path.abspath(os.path.expanduser(cmp.default_cache_dir())))
    if saved is None and not os.path.exists(os.path.join(out.path, RUN_SETTINGS)):
        # the settings first (not over an earlier run's, --overwrite): a stop while the table is read keeps them
        save_settings(args, argv, out, None)
        out.wrote_settings = True  # (a failure, not a stop, removes them again: see run_command)
    data, on_disk, names, scaling, digest = _design(args, tell)
    n, d = data["X"].shape
    # (a run stopped while its table was first read has no digest yet, and no draws: it starts again)
    if saved is not None and saved.get("data_sha256") != digest and not (saved.get("data_sha256") is None
                                                                          and ck_path is None):
        raise CLIError(f"--resume: {args.data} is not the data of the saved run (it changed since); cannot continue")
    if saved is not None and saved["settings"].get("data") != args.data:  # the same table, moved: noted
        from .reporting.report import write_json

        tell(f"{args.data}: the run's data (moved from {saved['settings'].get('data')}; the same content)")
        saved["settings"]["data"] = args.data
        write_json(out.file(RUN_SETTINGS), saved)
    model, prior_text = _model_of(args, scaling)
    extra = extra_parameter_of(model)
    param_names = list(names) + ([extra[0]] if extra else [])
    tell(f"{args.data}: N = {n:,} rows, d = {d} ({', '.join(names)})")
    for note in scaling.get("data_notes") or ():  # degenerate data, named before sampling (even with --quiet)
        try:
            print(f"{PROG}: note: {note}", file=sys.stderr, flush=True)
        except OSError:
            pass
    if saved is not None and ck_path is not None:
        kw, mode = _resumed(args, saved, ck_path, test, tell)
    else:  # (a saved run stopped before its first checkpoint starts again with its settings)
        if saved is not None:
            tell(f"{args.out} holds the settings of a run stopped before its first draw: starting it again")
        kw, mode = _fresh(args, argv, model, data, on_disk, test, digest, out, tell)
    ck = out.file(CHECKPOINT)
    from .run.data_notes import checked_by_caller

    with checked_by_caller():  # (the table's degenerate columns were named by their names, above)
        result = tm.sample(model, data, num_samples=args.samples, num_warmup=args.warmup, min_ess=args.min_ess,
                           progress=False if args.quiet else None, checkpoint=ck,
                           checkpoint_every_s=args.checkpoint_every, stream_draws=True, **kw)
    # the outputs: a stop signal now is recorded, never raised where it lands (the outputs are finished)
    prev = arm_second_interrupt() if result.partial else arm_deferred_stop()
    try:
        view = types.SimpleNamespace(args=args, argv=argv, result=result, model=model, names=names,
                                     param_names=param_names, scaling=scaling, mode=mode, n=n,
                                     prior_text=prior_text, digest=digest, t_all=t_all)
        rc = _outputs(view, out)
        return status_of_stop() if rc == 0 and stopped() else rc
    except OSError as e:  # a full disk, an I/O error: say what was kept, in one line
        from .storage.safe_io import WriteError

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
        disarm(prev)


# a run of more draws per chain than this writes every t-th draw to posterior.nc and computes its tables and
# plots from those (bounded time and memory); the verdict reads every draw, which stay in the checkpoint
MAX_OUTPUT_DRAWS = 1_000_000


def thin_run(run, most: int):
    """``(run, t)``: ``run`` with every t-th draw (warmup and sampling, their statistics and times), t the
    smallest step that leaves at most ``most`` draws per chain in each phase; ``run`` itself when t = 1."""
    import dataclasses

    r = run.result
    k = max(r.flat_samples.shape[1], r.flat_warmup.shape[1])
    if k <= most:
        return run, 1
    t = -(-k // most)
    res = dataclasses.replace(r, flat_samples=r.flat_samples[:, ::t], flat_warmup=r.flat_warmup[:, ::t],
                              stats={key: val[:, ::t] for key, val in r.stats.items()},
                              warmup_stats={key: val[:, ::t] for key, val in r.warmup_stats.items()}, _cache={})
    return dataclasses.replace(run, result=res, times=run.times[:, ::t], warmup_times=run.warmup_times[:, ::t],
                               _table=None), t


def thin_note(v) -> str:
    return (f"posterior.nc, the coefficients' table and the plots use every {v.thin}th draw "
            f"({v.out_result.flat_samples.shape[1]:,} of {v.k:,} per chain; the verdict reads them all); every "
            f"draw: tallmh.load_result('{os.path.join(v.args.out, CHECKPOINT)}')")


def coef_table(draws, names):
    """mean, sd, 5% and 95% quantiles, bulk ESS and R-hat of draws ``(chain, draw, k)``."""
    from .reporting.report import param_table

    tab = param_table(draws, names)
    k = draws.shape[-1]
    if draws.size:  # (one column at a time: a long run's draws are never copied whole)
        q = np.array([np.quantile(np.asarray(draws[..., j], np.float64).ravel(), [0.05, 0.95]) for j in range(k)]).T
        tab.insert(2, "q5%", q[0])
        tab.insert(3, "q95%", q[1])
    tab = tab.drop(columns=["ess_tail"])
    tab.index.name = None
    return tab


# ---------------------------------------------------------------------------------------------------
# outputs: each stage adds its results to ``v``, the run's view


def _method_row(v):
    """The run as one method of a comparison: its MethodRun, table row, text table and verdict."""
    from .reporting import report as rp
    from .reporting.compare import verdict_of

    args, result = v.args, v.result
    t = result.timings
    c, k, _ = result.flat_samples.shape
    kw = result.flat_warmup.shape[1]
    warm_s, samp_s = float(t.get("warmup_s", 0.0)), float(t.get("sampling_s", 0.0))
    # (read-only views of one row per phase: a long run's times are not copied per chain)
    warm_times = np.broadcast_to((np.arange(1, kw + 1) / max(kw, 1)) * warm_s, (c, kw))
    times = np.broadcast_to(warm_s + (np.arange(1, k + 1) / max(k, 1)) * samp_s, (c, k))
    name = _run_name(result, args)
    label = label_of(result, name)
    config = method_config(name if name in METHODS or name.startswith(THINNING) else args.test, args)
    if args.test == "auto":
        config["chosen_by"] = "--test auto (the recommended method)"
    run = rp.MethodRun(name=name, result=result, times=times, warmup_times=warm_times,
                       seconds=warm_s + samp_s, compile_s=float(t.get("compile_s", 0.0)), steps=c * (k + kw),
                       config={**config, "label": label})
    trusted, verdict, warns = verdict_of(result)
    out_run, thin = thin_run(run, MAX_OUTPUT_DRAWS)  # the draws posterior.nc, the plots and the tables read
    row = rp.method_row(run)
    for key in ("max_mean_err_sd", "max_err_z"):
        row.pop(key, None)
    row.update({"label": label, "config": run.config, "trusted": trusted, "verdict": verdict, "warnings": warns})
    v.__dict__.update(out_run=out_run, out_result=out_run.result, thin=thin)
    v.__dict__.update(t=t, c=c, k=k, kw=kw, warm_s=warm_s, samp_s=samp_s, name=name, label=label, run=run,
                      trusted=trusted, verdict=verdict, warns=warns, row=row, text=rp.format_table([row]))


def _coefficients(v):
    """The coefficients on the original scale (and the noise sd), named by column, and the variables of
    posterior.nc."""
    result, names, scaling, model = v.out_result, v.names, v.scaling, v.model
    d = len(names)
    coef = original_scale(result.flat_samples[..., :d], scaling)
    extra_names, extra = [], {}
    if extra_parameter_of(model):
        sig = np.exp(np.asarray(result.flat_samples[..., d], np.float64))
        coef_all = np.concatenate([coef, sig[..., None]], axis=-1)
        extra_names = [extra_parameter_of(model)[1]]
        extra[extra_names[0]] = (sig, None)
    else:
        coef_all = coef
    coef_names = list(names) + extra_names
    sampled_tab = v.out_run.table().copy()
    sampled_tab.index = list(v.param_names)
    # posterior.nc: theta as sampled and beta on the original scale, on axes with distinct names and labels
    std = bool(scaling["standardised"])
    extra["beta"] = (coef, names, "coefficient")
    v.__dict__.update(
        d=d, extra_names=extra_names, extra=extra, coef_names=coef_names, coef_tab=coef_table(coef_all, coef_names),
        sampled_tab=sampled_tab, std=std, theta_dim="standardised_parameter" if std else "parameter",
        theta_labels=[f"{nm}_std" for nm in names] + list(v.param_names[d:]) if std else list(v.param_names),
        # the plots on the original scale too: the draws (warmup included) transformed like the table's
        plot_run=original_scale_run(v.out_run, result, scaling, d, model),
        laplace=original_scale_laplace(v.mode, scaling, d, len(v.param_names)) if v.mode is not None else None,
        scale_note=("coefficients on the original scale of the data (sampled on standardised features; "
                    "results.json 'standardisation' says how)" if scaling["standardised"] else "coefficients"))


def _print_summary(v):
    """The run's summary on stdout: what ran, the verdict, the audit, the table and the coefficients."""
    from .reporting.results import audit_line

    args = v.args
    print_line(f"tallmh run: {args.model} regression of {args.target!r} on {os.path.basename(args.data)}, "
               f"N = {v.n:,}; method {v.label}; {plural(v.c, 'chain')} x {plural(v.k, 'draw')} "
               f"({plural(v.kw, 'warmup step')})" + (" [PARTIAL]" if v.result.partial else ""))
    print_line(f"verdict: {v.verdict}")
    for note in v.scaling.get("data_notes") or ():
        print_line(f"data note: {note}")
    for note in getattr(v.result, "notes", None) or []:  # --samples auto: which goal was reached
        if str(note).startswith("num_samples='auto'"):
            print_line("--samples auto" + str(note)[len("num_samples='auto'"):])
    v.audit_text = audit_line(v.result.summary().overall).strip()
    if v.audit_text:
        print_line(v.audit_text)
    print_line(v.text)
    print_line(v.scale_note + ":")
    print_line(v.coef_tab.to_string(float_format=lambda x: f"{x:.4g}"))
    print_line(f"compile {float(v.t.get('compile_s', 0)):.1f} s, warmup {v.warm_s:.1f} s, sampling {v.samp_s:.1f} s")
    if v.thin > 1:
        print_line(thin_note(v))


def _results_json(v) -> dict:
    """Every number of the run, as results.json holds them."""
    import tallmh as tm
    from .reporting import compare as cmp

    args, result, scaling, mode = v.args, v.result, v.scaling, v.mode
    overall = {}
    try:
        overall = dict(result.summary().overall)
    except Exception:  # noqa: BLE001
        pass
    return {
        "command": "tallmh " + " ".join(v.argv),
        "created": now(), "tallmh_version": tm.__version__, "machine": cmp.machine(),
        "dataset": {"path": os.path.abspath(args.data), "target": args.target, "rows": v.n,
                    "features": scaling["features"], "data_sha256": v.digest},
        "standardisation": scaling,
        "model": {"name": f"{args.model} regression", "prior": v.prior_text, "prior_scale": args.prior_scale,
                  **({"noise_sd": args.noise_sd if args.noise_sd is not None else "sampled",
                      "noise_prior_scale": args.noise_prior_scale} if args.model == "linear" else {})},
        "settings": {"test": args.test, "label": v.label, "samples": args.samples, "min_ess": args.min_ess,
                     "warmup": args.warmup,
                     "chains": args.chains, "seed": args.seed, "start": args.start, "proposal": args.proposal,
                     "proposal_used": str(getattr(result.proposal, "chosen", None) or getattr(result.proposal, "name", type(result.proposal).__name__)),
                     "checkpoint_every_s": args.checkpoint_every},
        "partial": bool(result.partial), "trusted": v.trusted, "verdict": v.verdict, "warnings": v.warns,
        "data_notes": list(scaling.get("data_notes") or []),
        "posterior_nc_every": v.thin,  # posterior.nc holds every this-th draw (1: all)
        "mode": None if mode is None else {"theta": mode.theta, "passes": mode.passes, "laplace_sd": mode.sd},
        "timings": v.t, "methods": [v.row], "summary": overall,
        "parameters": v.param_names, "per_parameter": {v.name: cmp.per_param(v.run, v.param_names)},
        "coefficients": {"names": v.coef_names, "scale": "original" if scaling["standardised"] else "as given",
                         "table": {nm: {kk: float(x) for kk, x in v.coef_tab.loc[nm].items()}
                                   for nm in v.coef_names}},
        "table_text": v.text,
    }


def _write_report(v, folder):
    """report.html: the run's description, tables and plots."""
    from .reporting import report as rp

    e = html.escape
    args, audit_text = v.args, v.audit_text
    intro = [
        f"{e(args.model.capitalize())} regression of <b>{e(str(args.target))}</b> on {e(', '.join(v.names))} from "
        f"<code>{e(os.path.abspath(args.data))}</code> (N = {v.n:,}). Prior: {e(v.prior_text)}. Method: "
        f"<b>{e(v.label)}</b>; proposal: {e(args.proposal)}; start: {e(args.start)}; {plural(v.c, 'chain')} x "
        f"{plural(v.k, 'draw')} after {plural(v.kw, 'warmup step')}.",
        *([e(audit_text[0].upper() + audit_text[1:]) + "."] if audit_text else []),
        *([e(thin_note(v)[0].upper() + thin_note(v)[1:]) + "."] if v.thin > 1 else []),
        f"Timings: compile {float(v.t.get('compile_s', 0)):.1f} s, warmup {v.warm_s:.1f} s, sampling "
        f"{v.samp_s:.1f} s." + (" <b>The run was interrupted: these are the draws made so far</b> (continue it with "
                                f"<code>tallmh run --resume {e(folder)}</code>)." if v.result.partial else ""),
    ]
    sections = [("Files", ["<code>posterior.nc</code>: the draws as ArviZ InferenceData (NetCDF; "
                           f"<code>arviz.from_netcdf</code>): <code>theta</code> as sampled (axis <code>{v.theta_dim}"
                           "</code>" + (", labels ending in <code>_std</code>" if v.std else "") + "), <code>beta</code> "
                           "on the original scale (axis <code>coefficient</code>)"
                           + "".join(f", <code>{nm}</code>" for nm in v.extra_names) + "; "
                           f"<code>results.json</code>: every number above; <code>{CHECKPOINT}</code>: the run "
                           "for <code>tallmh run --resume</code>."])]
    images = [
        ("Traces", "traces.png", "trace plots of each coefficient",
         "Each coefficient" + (" (on the original scale of the data, as in the table)" if v.std else "")
         + "".join(f" and {'the noise sd' if nm == 'noise_sd' else nm}" for nm in v.extra_names) + " against seconds into the run (draws placed evenly "
         "within the warmup and sampling phases); one colour per chain, warmup grey."),
        ("Marginals", "marginals.png", "marginal densities of each coefficient",
         "Density of the draws (kernel density estimate" + (", original scale" if v.std else "") + ")"
         + ("; dashed: the Laplace approximation at the mode, for comparison only (not a reference)."
            if v.laplace is not None else ".")),
        ("Data used per step", "data_per_step.png", "histogram of data items read per step", "Log-log axes."),
    ]
    tables = [(v.scale_note[0].upper() + v.scale_note[1:], rp.frame_html(v.coef_tab)),
              ("Sampled parameters (standardised scale)", rp.frame_html(v.sampled_tab))]
    return rp.write_html(os.path.join(folder, "report.html"),
                         title=f"tallmh run: {os.path.basename(args.data)}", intro=intro, rows=[v.row],
                         table_text=v.text, sections=sections, images=images, tables=tables,
                         verdicts=[(v.label, v.trusted, v.verdict)])


def _write_files(v, out):
    """The files in ``--out``: the plots, posterior.nc, results.json and report.html."""
    from .reporting import report as rp

    result = v.result
    folder = out.make()
    if result.partial:  # the partial run can be continued with --resume: keep its checkpoint current
        try:
            result.save(os.path.join(folder, CHECKPOINT))
        except Exception:  # noqa: BLE001 - the outputs below matter more
            pass
    files = []
    files.append(rp.plot_traces([v.plot_run], v.coef_names, os.path.join(folder, "traces.png")))
    files.append(rp.plot_marginals([v.plot_run], v.coef_names, os.path.join(folder, "marginals.png"),
                                   laplace=v.laplace))
    files.append(rp.plot_data_use([v.out_run], v.n, os.path.join(folder, "data_per_step.png")))
    files.append(rp.write_netcdf(os.path.join(folder, "posterior.nc"), v.out_result, v.theta_labels, extra=v.extra,
                                 dim=v.theta_dim))
    files.append(rp.write_json(os.path.join(folder, "results.json"), _results_json(v)))
    files.append(_write_report(v, folder))
    return folder


def _outputs(v, out):
    """The run's summary on the terminal and its files; the exit status."""
    _method_row(v)
    _coefficients(v)
    _print_summary(v)
    folder = _write_files(v, out)
    print_line(f"report: {os.path.join(folder, 'report.html')}; draws: {os.path.join(folder, 'posterior.nc')} "
               f"({time.perf_counter() - v.t_all:.0f} s in all)")
    if v.result.partial:
        stop = status_of_stop()
        what = "interrupted" if stop == 130 else f"stopped by {signal.Signals(stop - 128).name}"
        print(f"{PROG}: {what} after {v.k} of {v.args.samples} draws per chain: posterior.nc, results.json and "
              f"report.html in {folder} hold them; continue with: tallmh run --resume {folder}",
              file=sys.stderr, flush=True)
        return stop
    return 0
