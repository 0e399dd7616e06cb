"""Time to a trusted posterior, from a fresh process: what a user who runs a script once waits for.

Each (method, N) cell runs in a fresh Python subprocess that imports its library, makes the data, sets up,
compiles, warms up and samples, timing each phase itself, and prints the timings as one JSON line on
stdout (the draws go to a ``.npy`` file). The parent measures the whole process from the outside
(interpreter start to exit) and scores the draws against a reference posterior.

Posterior: Bayesian logistic regression, ``theta ~ N(0, 10^2 I)``, ``y_i ~ Bernoulli(sigmoid(x_i . theta))``,
d = 11 (an intercept column first, then 10 features with unequal scales ``s_j = 10^(-1 + 2 j / 9)``, from
0.1 to 10), generated deterministically by :func:`make_data` (float32). The unequal scales make the
posterior sds differ by about 100x between coordinates: samplers that do not precondition pay for it.

Methods, each configured as its own documentation shows it (``--draws`` sets other sizes):

* ``tallmh``: the README's recipe, ``tm.sample(model, data, test=tm.acceptance.Austerity(error=0.05,
  batch_size=400), control_variates=tm.ControlVariates(order=2), num_chains=2, ...)``, every other
  argument at its default (Newton for the mode, Langevin proposal, audit), draws sized for a min bulk ESS of
  about 1,000 (``num_samples="auto"`` when the installed tallmh has it).
* ``tallmh-numpyro``: the same posterior written as a NumPyro model (``peers.numpyro_model``: ``theta ~
  Normal(0, 10)`` on 11 coordinates, ``y ~ Bernoulli(logits=X @ theta)`` in a plate) through
  ``tm.from_numpyro`` and ``tm.sample(model, data, min_ess=1000)``, every other argument at its default
  (its conversion is timed as set-up). What a NumPyro user who switches samplers waits for.
* ``hmcecs``: NumPyro's HMCECS example (``examples/hmcecs.py``): the reference point by SVI with an
  ``AutoDelta`` guide (Adam, step 1e-3, 5,000 steps, subsample 1,300), ``HMCECS(NUTS(model),
  num_blocks=100, proxy=HMCECS.taylor_proxy(ref))``, 500 warmup steps; 2 chains, draws scaled for the ESS.
* ``hmcecs-map``: the same HMCECS kernel with the Taylor proxy at the exact MAP (float64 Newton over all
  rows, ``peers.newton_map``, timed in its set-up) instead of SVI's point: HMCECS as a careful user would
  run it when SVI's point is poor (the proxy's quality is what HMCECS's efficiency rests on).
* ``nuts``: NumPyro NUTS with its defaults (diagonal mass matrix, init_to_uniform), 500 warmup steps,
  2 chains, draws scaled for the ESS.
* ``nuts-map``: the same NUTS kernel with every chain started at the exact MAP (``peers.newton_map``, timed
  in its set-up; NumPyro's ``init_params``): NUTS as a careful user would start it on a narrow posterior,
  where the default start's warmup meets very long trajectories.

The NumPyro kernels run in ``peers.drive`` (a compiled ``lax.scan`` over ``kernel.sample``, vmapped over
chains, what ``MCMC`` does inside, compiled ahead of time so that compile is timed apart).

Compilation cache (``--cache``): ``none`` turns tallmh's persistent compilation cache off
(``TALLMH_COMPILATION_CACHE=0``) and gives the peers none (their default); ``cold`` points
``XDG_CACHE_HOME`` at a fresh empty folder (tallmh's default cache location, empty: a first run ever);
``warm`` runs the cell once into such a folder and measures a second run with it (the peers then get
JAX's own cache turned on by environment, ``JAX_COMPILATION_CACHE_DIR`` in the same folder with a
minimum compile time of 0, what a user of theirs could do).

Reference: NumPyro NUTS in float64 (JAX_ENABLE_X64=1), dense mass matrix fixed to the Laplace
covariance at the Newton MAP, made by ``peers.make_reference`` on this data set in a child process and
cached as ``<out>/reference_scaled-<N>.npz`` (``--laplace-ref``, the default of ``--quick``: the Laplace
approximation at the float64 MAP instead, no reference run).

Reported per cell: ``process_s`` (whole process, measured by the parent), ``cpu_s`` (the process's CPU seconds,
user and system, all threads: what a shared machine's load changes least), the child's breakdown
(``import_s``, ``data_s``, ``setup_s``, ``compile_s``, ``warmup_s``, ``sampling_s``, ``other_s``: the rest
of the sampler call and of the child, ``startup_exit_s``: the interpreter's start and exit, ``process_s``
minus the child's own total; the parts add up to ``process_s``), min
bulk ESS and max R-hat over the coordinates, ``ess_per_process_s``, ``max_mean_err_sd`` (max_j
|mean_j - ref_j| / ref sd_j) and the sd ratios.

Usage::

    python benchmarks/time_to_trusted.py --N 100000 1000000 --cache cold warm
    python benchmarks/time_to_trusted.py --quick --out /tmp/ttt       # a smoke run of seconds

The load average (``os.getloadavg``) is recorded before and after each cell: the numbers are wall times.
"""

from __future__ import annotations

import time

T_START = time.perf_counter()

import argparse  # noqa: E402
import datetime as _dt  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
METHODS = ["tallmh", "tallmh-numpyro", "hmcecs", "hmcecs-map", "nuts", "nuts-map"]
PRIOR_SCALE = 10.0
D_FEATURES = 10
# (warmup, draws per chain); chains = 2 for every method
DEFAULT_DRAWS = {"tallmh": (1000, 2500), "tallmh-numpyro": (1000, 2500), "hmcecs": (500, 1500), "hmcecs-map": (500, 1500), "nuts": (500, 1500),
                 "nuts-map": (500, 1500)}
QUICK_DRAWS = {"tallmh": (200, 300), "tallmh-numpyro": (200, 300), "hmcecs": (100, 100), "hmcecs-map": (100, 100), "nuts": (100, 100),
               "nuts-map": (100, 100)}
CHAINS = 2


def make_data(n, seed=0):
    """Logistic regression data with unequal feature scales: (X float32 (n, 11) with the intercept column
    first, y float32 (n,), true theta). Deterministic in (n, seed); made in blocks of 2^20 rows."""
    import numpy as np

    scales = 10.0 ** np.linspace(-1.0, 1.0, D_FEATURES)
    rng = np.random.default_rng(seed)
    coef = 0.5 * rng.standard_normal(D_FEATURES)  # effect of one sd of each feature on the logit
    theta = np.concatenate([[-0.5], coef / scales])
    X = np.empty((n, D_FEATURES + 1), np.float32)
    y = np.empty(n, np.float32)
    X[:, 0] = 1.0
    block = 1 << 20
    for a in range(0, n, block):
        b = min(n, a + block)
        r = np.random.default_rng([seed, a // block])
        Z = r.standard_normal((b - a, D_FEATURES)) * scales
        X[a:b, 1:] = Z
        p = 1.0 / (1.0 + np.exp(-(X[a:b].astype(np.float64) @ theta)))
        y[a:b] = (r.random(b - a) < p)
    return X, y, theta


# ---------------------------------------------------------------------------------------------------
# the child: one method, one data set, timed inside


def _child(args):
    t_imp = time.perf_counter()
    import numpy as np

    if args.method.startswith("tallmh"):
        import jax

        events = {}  # JAX's persistent-cache events, counted from before tallmh turns the cache on
        jax.monitoring.register_event_listener(lambda e, **k: events.__setitem__(e, events.get(e, 0) + 1))
        import tallmh as tm

        if args.method == "tallmh-numpyro":
            import numpyro  # noqa: F401
    else:
        import jax
        import jax.numpy as jnp
        import numpyro  # noqa: F401
        from numpyro.infer import HMCECS, NUTS, SVI, Trace_ELBO, autoguide  # noqa: F401
    t_data = time.perf_counter()
    X, y, _ = make_data(args.n, args.seed)
    t_run = time.perf_counter()
    out = {"method": args.method, "N": args.n, "import_s": t_data - t_imp, "data_s": t_run - t_data,
           "before_import_s": t_imp - T_START}
    warmup, draws = args.warmup, args.draws
    if args.method == "tallmh-numpyro":
        sys.path.insert(0, HERE)
        import peers

        model, data = tm.from_numpyro(peers.numpyro_model(X.shape[1]), X, y)
        t_conv = time.perf_counter() - t_run
        res = tm.sample(model, data, seed=args.seed, progress=False, min_ess=1000)
        warmup = int(res.flat_warmup.shape[1])
        theta = np.asarray(res.flat_output)
        call = time.perf_counter() - t_run
        tim = {k: float(res.timings.get(k, 0.0)) for k in ("setup_s", "compile_s", "warmup_s", "sampling_s")}
        tim["setup_s"] += t_conv
        out["cache_hits"] = events.get("/jax/compilation_cache/cache_hits", 0)
        out["cache_misses"] = events.get("/jax/compilation_cache/cache_misses", 0)
        out.update(tim, verdict=res.verdict, call_s=call, conversion_s=t_conv,
                   data_per_step=float(np.mean(res.stats["n_data"])), num_samples=int(theta.shape[1]),
                   num_warmup=warmup)
    elif args.method == "tallmh":
        model = tm.models.LogisticRegression(prior_scale=PRIOR_SCALE)
        kw = dict(num_warmup=warmup, num_samples=draws)
        import inspect

        if args.auto and "min_ess" in (inspect.getdoc(tm.sample) or ""):
            # the README's call, every default (test, control variates, proposal, 4 chains, warmup), drawing
            # until min bulk ESS >= 1,000 and R-hat <= 1.01
            res = tm.sample(model, {"X": X, "y": y}, seed=args.seed, progress=False, min_ess=1000)
            warmup = int(res.flat_warmup.shape[1])
        else:
            if args.auto and "auto" in (inspect.getdoc(tm.sample) or ""):
                kw["num_samples"] = "auto"
            res = tm.sample(model, {"X": X, "y": y}, test=tm.acceptance.Austerity(error=0.05, batch_size=400),
                            control_variates=tm.ControlVariates(order=2), num_chains=CHAINS, seed=args.seed,
                            progress=False, **kw)
        theta = np.asarray(res.flat_samples)
        call = time.perf_counter() - t_run
        tim = {k: float(res.timings.get(k, 0.0)) for k in ("setup_s", "compile_s", "warmup_s", "sampling_s")}
        out["cache_hits"] = events.get("/jax/compilation_cache/cache_hits", 0)
        out["cache_misses"] = events.get("/jax/compilation_cache/cache_misses", 0)
        out.update(tim, verdict=res.verdict, call_s=call,
                   data_per_step=float(np.mean(res.stats["n_data"])), num_samples=int(theta.shape[1]),
                   num_warmup=warmup)
    else:
        sys.path.insert(0, HERE)
        import peers

        n, d = X.shape
        Xj, yj = jnp.asarray(X), jnp.asarray(y)
        ts = time.perf_counter()
        keys = jax.random.split(jax.random.PRNGKey(args.seed), 2 * CHAINS + 1)
        note = ""
        if args.method in ("hmcecs", "hmcecs-map"):
            sub = min(1300, n)
            svi_model = peers.numpyro_model(d, sub)
            if args.method == "hmcecs":
                svi = SVI(svi_model, autoguide.AutoDelta(svi_model), numpyro.optim.Adam(step_size=1e-3),
                          loss=Trace_ELBO())
                svi_result = svi.run(keys[-1], args.svi_steps, Xj, yj, progress_bar=False)
                ref = {"theta": svi_result.params["theta_auto_loc"]}
                jax.block_until_ready(ref)
                out["svi_s"] = time.perf_counter() - ts
            else:  # the exact MAP by Newton over all rows (float64), timed as set-up
                theta_map, _, passes = peers.newton_map(X, y, PRIOR_SCALE)
                ref = {"theta": jnp.asarray(theta_map, X.dtype)}
                out["map_s"], out["map_passes"] = time.perf_counter() - ts, passes
            kernel = HMCECS(NUTS(svi_model), num_blocks=min(100, sub), proxy=HMCECS.taylor_proxy(ref))
        else:
            kernel = NUTS(peers.numpyro_model(d))
        init_params = None
        if args.method == "nuts-map":  # every chain at the exact MAP (unconstrained = constrained here)
            theta_map, _, passes = peers.newton_map(X, y, PRIOR_SCALE)
            init_params = {"theta": jnp.asarray(theta_map, X.dtype)}
            out["map_s"], out["map_passes"] = time.perf_counter() - ts, passes
        # each chain initialised by the kernel (init_to_uniform, as MCMC does), or at init_params
        states = [kernel.init(keys[2 * c], warmup, init_params, (Xj, yj), {}) for c in range(CHAINS)]
        jax.block_until_ready(states)
        out["setup_s"] = time.perf_counter() - ts

        def extract(s):
            h = s if args.method in ("nuts", "nuts-map") else s.hmc_state
            return h.z["theta"], {"num_steps": h.num_steps, "accept_prob": h.accept_prob}

        theta, info, timings, _ = peers.drive(kernel, states, (Xj, yj), warmup, draws, extract)
        out["call_s"] = time.perf_counter() - t_run
        out.update({k: float(timings[k]) for k in ("compile_s", "warmup_s", "sampling_s")})
        steps = float(np.mean(info["num_steps"]))
        out.update(num_samples=int(theta.shape[1]), num_warmup=warmup, leapfrog_steps=steps,
                   acceptance_rate=float(np.mean(info["accept_prob"])), note=note)
    np.save(args.draws_out, np.asarray(theta, np.float64))
    dev = jax.devices()[0]  # where it ran (the backend was started by the run above)
    out["device"] = f"{jax.default_backend()}: {getattr(dev, 'device_kind', dev)}"
    out["child_total_s"] = time.perf_counter() - T_START
    # the rest of the sampler's call (checks, results, diagnostics) and of the child (saving the draws)
    out["other_s"] = out["child_total_s"] - sum(out[k] for k in ("before_import_s", "import_s", "data_s", "setup_s",
                                                                  "compile_s", "warmup_s", "sampling_s"))
    print("TTT-JSON " + json.dumps(out), flush=True)


# ---------------------------------------------------------------------------------------------------
# the parent: reference, cells, tables


def _fmt_n(n):
    e = int(round(math.log10(n)))
    return f"1e{e}" if 10**e == n else str(n)


def _make_reference_child(args):
    """Child (JAX_ENABLE_X64=1): ``peers.make_reference`` on this script's data set."""
    sys.path.insert(0, HERE)
    import numpy as np
    import peers

    def load(kind, n, seed):
        X, y, theta = make_data(int(n), seed)
        return {"X": X, "y": y}, {"source": f"time_to_trusted.make_data({int(n)}, seed={seed})",
                                  "theta_true": [float(v) for v in np.asarray(theta)]}

    peers.load_data = load  # the reference runner reads the data through this name
    ns = argparse.Namespace(make_reference=f"scaled-{_fmt_n(args.n)}:scaled:{args.n}", ref_dir=args.ref_dir,
                            seed=args.seed, smoke=args.quick)
    peers.make_reference(ns)


def get_reference(n, args, say):
    sys.path.insert(0, HERE)
    import peers

    name = f"scaled-{_fmt_n(n)}" + ("-quick" if args.quick else "")
    path = peers.reference_path(args.ref_dir, name)
    ns = argparse.Namespace(ref_dir=args.ref_dir, seed=args.seed, smoke=args.quick, laplace_ref_above=0.0)
    if args.laplace_ref:
        X, y, _ = make_data(n, args.seed)
        theta_map, H, _ = peers.newton_map(X, y, PRIOR_SCALE)
        return peers.laplace_reference(theta_map, H, name, n, D_FEATURES + 1, ns, say)
    if not os.path.exists(path):
        say(f"# reference {name}: making it (NumPyro NUTS, float64, dense mass at the Laplace covariance) ...")
        cmd = [sys.executable, os.path.abspath(__file__), "--make-reference", "--n", str(n), "--seed", str(args.seed),
               "--ref-dir", args.ref_dir] + (["--quick"] if args.quick else [])
        t = time.perf_counter()
        proc = subprocess.run(cmd, env=dict(os.environ, JAX_ENABLE_X64="1"), capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"reference run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        if args.quick:  # the quick reference has its own name
            os.replace(peers.reference_path(args.ref_dir, f"scaled-{_fmt_n(n)}"), path)
        say(proc.stdout.strip() + f" (child process {time.perf_counter() - t:.1f}s)")
    return peers.get_reference(name, "scaled", n, n, D_FEATURES + 1, ns, say)


def _children_cpu():
    """CPU seconds (user + system, every thread) of this process's finished children so far."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_cell(method, n, cache, args, say):
    import _common as C  # here, not at the top: a child's measured imports start at T_START

    """One fresh process (two for ``warm``: the first fills the cache). Returns the row (metrics included
    by the caller)."""
    warmup, draws = args.sizes[method]
    tmp = tempfile.mkdtemp(prefix="ttt-")
    try:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.path.join(REPO, "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env.pop("JAX_ENABLE_X64", None)
        if cache == "none":
            env["TALLMH_COMPILATION_CACHE"] = "0"
        else:
            env["XDG_CACHE_HOME"] = os.path.join(tmp, "xdg")
            env.pop("TALLMH_COMPILATION_CACHE", None)
            if not method.startswith("tallmh") and cache == "warm":
                env["JAX_COMPILATION_CACHE_DIR"] = os.path.join(tmp, "xdg", "jax-peer")
                env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
                env["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
        cmd = [sys.executable, os.path.abspath(__file__), "--child", method, "--n", str(n), "--seed", str(args.seed),
               "--warmup", str(warmup), "--draws", str(draws), "--svi-steps", str(args.svi_steps),
               "--draws-out", os.path.join(tmp, "draws.npy")] + (["--auto"] if args.auto else [])
        runs = 2 if cache == "warm" else 1
        for i in range(runs):
            load0 = C.load_average()
            cpu0 = _children_cpu()
            try:
                row, wall = C.run_child(cmd, env, "TTT-JSON", timeout=args.timeout)
            except subprocess.TimeoutExpired:
                say(f"#   {method} N={_fmt_n(n)} cache={cache}: stopped at the time box, {args.timeout:.0f}s")
                return dict(method=method, N=n, cache=cache, timed_out=True, process_s=float(args.timeout),
                            load_before=load0, load_after=C.load_average(), chains=CHAINS), None
            except RuntimeError as e:  # the child failed: its error is the row, and the other cells still run
                last = [ln for ln in str(e).splitlines() if ln.strip()][-1:]
                say(f"#   {method} N={_fmt_n(n)} cache={cache}: failed: {last[0] if last else e}")
                return dict(method=method, N=n, cache=cache, error=str(e)[-2000:], load_before=load0,
                            load_after=C.load_average(), chains=CHAINS), None
            if i == 0 and runs == 2:
                say(f"#   {method} N={_fmt_n(n)} cache-filling run: {wall:.1f}s")
        import numpy as np

        theta = np.load(os.path.join(tmp, "draws.npy"))
        cache_files = sum(len(fs) for _, _, fs in os.walk(os.path.join(tmp, "xdg"))) if cache != "none" else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row.update(cache=cache, process_s=wall, cpu_s=_children_cpu() - cpu0, startup_exit_s=wall - row["child_total_s"], load_before=load0,
               load_after=C.load_average(), cache_files=cache_files, chains=CHAINS)
    return row, theta


def score(row, theta, ref):
    sys.path.insert(0, HERE)
    import numpy as np
    import peers
    from tallmh.reporting import diagnostics

    m = peers.metrics(theta, ref)
    d = theta.shape[-1]
    m["rhat_max"] = float(max(diagnostics.rhat(theta[:, :, j]) for j in range(d)))
    m.pop("mean", None)
    m.pop("sd", None)
    row.update(m)
    row["ess_per_process_s"] = row["ess_min"] / row["process_s"] if np.isfinite(row["ess_min"]) else float("nan")
    return row


COLS = ["method", "N", "cache", "process_s", "cpu_s", "import_s", "data_s", "setup_s", "compile_s", "warmup_s", "sampling_s",
        "other_s", "startup_exit_s", "draws", "ess_min", "rhat_max", "ess_per_process_s", "max_mean_err_sd",
        "sd_ratio_min", "sd_ratio_max", "cache_hits", "cache_misses", "load_before"]


def _cell(r, k):
    v = r.get(k)
    if v is None:
        return ""
    if k == "N":
        return _fmt_n(v)
    if k == "load_before":
        return f"{v[0]:.1f}" if v else ""
    if isinstance(v, float):
        if k in ("ess_min",):
            return f"{v:.0f}"
        if k in ("rhat_max", "max_mean_err_sd", "sd_ratio_min", "sd_ratio_max"):
            return f"{v:.3f}"
        return f"{v:.1f}" if abs(v) >= 1 else f"{v:.2f}"
    return str(v)


def markdown(rows):
    lines = ["| " + " | ".join(COLS) + " |", "|" + "---|" * len(COLS)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r, k) for k in COLS) + " |")
    return "\n".join(lines)


def ratios(rows):
    """tallmh's ESS per whole-process second over each peer's, per (N, cache)."""
    out = []
    for r in rows:
        if not r["method"].startswith("tallmh") or not r.get("ess_per_process_s", 0) > 0:
            continue
        for p in rows:
            if not p["method"].startswith("tallmh") and p["N"] == r["N"] and p["cache"] == r["cache"] and p.get("ess_per_process_s", 0) > 0:
                out.append(f"N={_fmt_n(r['N'])} cache={r['cache']}: {r['method']} / {p['method']} = "
                           f"{r['ess_per_process_s'] / p['ess_per_process_s']:.1f}x ESS per process second")
    return out


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=float, nargs="+", default=[1e5, 1e6], help="data sizes")
    p.add_argument("--methods", nargs="+", default=METHODS, choices=METHODS)
    p.add_argument("--cache", nargs="+", default=["cold"], choices=["none", "cold", "warm"],
                   help="compilation cache states to measure (see the module docstring)")
    p.add_argument("--cold", action="store_const", dest="cache", const=["cold"], help="same as --cache cold")
    p.add_argument("--warm", action="store_const", dest="cache", const=["warm"], help="same as --cache warm")
    p.add_argument("--draws", nargs="*", default=[], metavar="METHOD=WARMUP+DRAWS",
                   help="override a method's warmup and draws per chain, e.g. nuts=500+2000")
    p.add_argument("--auto", action="store_true",
                   help="tallmh as the README calls it (every default) with min_ess=1000, when available")
    p.add_argument("--svi-steps", type=int, default=None, help="HMCECS's SVI steps (default 5000; 200 with --quick)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke run: N = 2000, few draws, short reference")
    p.add_argument("--out", default=os.path.join(HERE, "results"))
    p.add_argument("--ref-dir", default=None, help="reference cache folder (default --out)")
    p.add_argument("--laplace-ref", action="store_true",
                   help="score against the Laplace approximation at the MAP (no reference run; --quick's default)")
    p.add_argument("--reference-only", action="store_true", help="only make the missing references")
    p.add_argument("--tag", default="", help="suffix of the output files")
    p.add_argument("--timeout", type=float, default=1800,
                   help="time box per process, seconds (a cell past it is recorded as timed out, without draws)")
    # internal
    p.add_argument("--child", choices=METHODS)
    p.add_argument("--make-reference", action="store_true")
    p.add_argument("--n", type=int)
    p.add_argument("--warmup", type=int)
    p.add_argument("--draws-out")
    a = p.parse_args(argv)
    if a.child:
        a.method = a.child
        a.draws = int(a.draws[0])
    return a


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.child:
        return _child(args)
    if args.make_reference:
        return _make_reference_child(args)
    import _common as C
    if args.quick:
        args.N = [2000]
        args.laplace_ref = True
    args.svi_steps = args.svi_steps or (200 if args.quick else 5000)
    args.ref_dir = args.ref_dir or args.out
    args.sizes = dict(QUICK_DRAWS if args.quick else DEFAULT_DRAWS)
    for spec in args.draws:
        m, _, wd = spec.partition("=")
        w, _, s = wd.partition("+")
        if m not in METHODS or not w.isdigit() or not s.isdigit():
            raise SystemExit(f"--draws: expected METHOD=WARMUP+DRAWS, got {spec!r}")
        args.sizes[m] = (int(w), int(s))
    os.makedirs(args.out, exist_ok=True)

    def say(s):
        print(s, flush=True)

    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["python", os.path.relpath(os.path.abspath(__file__))] + argv),
            "load_at_start": C.load_average(), "cpu_count": os.cpu_count(), "sizes": args.sizes, "chains": CHAINS,
            "git_commit": C.git_commit()}
    say(f"# {meta['date']}  load {meta['load_at_start']}  sizes {args.sizes}")
    rows = []
    stem = "time_to_trusted" + (f"_{args.tag}" if args.tag else "") + ("_quick" if args.quick else "")
    for n in [int(v) for v in args.N]:
        ref = get_reference(n, args, say)
        if args.reference_only:
            continue
        for cache in args.cache:
            for method in args.methods:
                row, theta = run_cell(method, n, cache, args, say)
                if theta is None:  # time box or failure: no draws
                    rows.append(row)
                    continue
                row = score(row, theta, ref)
                rows.append(row)
                say(f"{method:7s} N={_fmt_n(n):4s} cache={cache:5s} process {row['process_s']:6.1f}s (CPU {row['cpu_s']:.1f}s) "
                    f"(import {row['import_s']:.1f}, data {row['data_s']:.1f}, set-up {row['setup_s']:.1f}, "
                    f"compile {row['compile_s']:.1f}, warmup {row['warmup_s']:.1f}, sampling {row['sampling_s']:.1f}, "
                    f"other {row['other_s']:.1f}, start/exit {row['startup_exit_s']:.1f})  ESS {row['ess_min']:.0f}  "
                    f"R-hat {row['rhat_max']:.3f}  ESS/s {row['ess_per_process_s']:.1f}  "
                    f"err {row['max_mean_err_sd']:.3f} sd  load {row['load_before']}")
                with open(os.path.join(args.out, stem + ".json"), "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    meta["load_at_end"] = C.load_average()
    meta["devices"] = sorted({r["device"] for r in rows if r.get("device")})
    lines = ratios(rows)
    with open(os.path.join(args.out, stem + ".json"), "w") as f:
        json.dump({"meta": meta, "rows": rows, "ratios": lines}, f, indent=1)
    md = markdown(rows)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(f"{meta['command']}\n\n{meta['date']}, load at start {meta['load_at_start']}, at end "
                f"{meta['load_at_end']}, {os.cpu_count()} CPUs, ran on {', '.join(meta['devices']) or '?'}\n\n{md}\n\n" + "\n".join(f"- {s}" for s in lines) + "\n")
    say(md)
    for s in lines:
        say(s)


if __name__ == "__main__":
    main()
