"""tallmh against NumPyro HMCECS and NUTS on one GPU, at N = 10^7 and 10^8.

Prepared to run in ONE short call (default global budget ``--budget-s 420``, under 8 minutes with start-up)
on a machine with one GPU. Posterior: Bayesian logistic regression, ``theta ~ N(0, 10^2 I)``, d = 11
(an intercept and 10 standard-normal features, true ``theta ~ N(0, I/10)``, as
``tm.models.LogisticRegression.simulate``), float32, **data generated on the device** with ``jax.random``
(no host copy of the data is made by this script; ``tm.sample``'s one-time finiteness check reads it once).

First (``--perm-sizes``, ~30 s): the per-item cost of the subsampling permutation on the device, the old
Feistel with cycle-walking against swap-or-not and one log-likelihood item (``benchmarks/permutation.py``'s
``bench_size`` at N = 4^10, 4^10 + 1 and 10^7, chunks of 100 and 65,536; in the JSON's ``meta.permutation``).

Then per N (``--sizes``, default 1e7,1e8), in this order of priority (a cell is skipped, with the reason in the
JSON, when the time left for that N is below ``--min-cell-s``):

1. ``tallmh-austerity-cv`` with ``--chains`` (default 16) vectorised chains: ``tm.sample(model, data,
   test=Austerity(epsilon=0.05, batch_size=100), control_variates=ControlVariates(order=2))`` with the
   proposal ``AdaptiveMetropolis()`` and tallmh's default start (its own Newton mode and Laplace
   dispersion, charged to the call);
2. ``hmcecs``, 1 chain: ``HMCECS(NUTS(model), proxy=HMCECS.taylor_proxy({"theta": MAP}))``, subsample
   1000, driven as in ``benchmarks/peers.py`` (its ``run_numpyro``: a compiled ``jit(vmap(scan))`` loop);
   the MAP comes from the on-device Newton below, charged to its ``setup_s``;
3. ``tallmh-austerity-cv`` with 1 chain;
4. ``hmcecs`` with ``--chains`` vectorised chains (GPUs run vmapped chains almost for free);
5. ``tallmh-langevin-cv`` with ``--chains`` chains: ``proposals.Langevin(step_size=h, batch_size=100)``
   with control variates, ``h = 1.2 * lambda_min`` of the Laplace covariance (the MALA scaling
   ``1.65^2 d^(-1/3) ~ 1.2`` for d = 11), when tallmh has a Langevin proposal;
6. ``nuts``, 1 chain, only for N in ``--nuts-sizes`` (default 1e7): NumPyro NUTS on the full data. The
   NUTS cells run last, after every N (their time per step is the least predictable), with
   ``--nuts-reserve-s`` (70) of the budget kept for them plus whatever the other cells left.

HMCECS and NUTS are set up exactly as in ``benchmarks/peers.py`` (``run_numpyro``) but driven in compiled
chunks of 25 steps so that the caps act inside warmup too: a warmup that runs past twice the cell's
sampling cap abandons the cell (with the reason), and sampling stops at the cap (``partial``).

Reference: the Laplace approximation at the MAP (Newton on the device: float32 chunk sums of the gradient
and Hessian, added in float64 on the host). At N >= 10^7 and d = 11 the posterior is Gaussian to within
far less than the 0.1-sd accuracy asked (Bernstein-von Mises; the skew is O(N^-1/2) sd), so
``max_mean_err_sd`` and the sd ratios are against it.

Metrics per row (as in ``benchmarks/peers.py``): ``wall_s`` (the whole call), ``setup_s``, ``compile_s``,
``warmup_s``, ``sampling_s``, ``time_per_step_s`` (sampling seconds per step of the vectorised chains),
min and median bulk ESS over the parameters (all chains), ``ess_per_s`` (min ESS / sampling_s),
``ess_per_s_total`` (min ESS / wall_s), ``data_per_step`` (items read per step and chain: tallmh
``mean(stats["n_data"])``; HMCECS subsample x (leapfrog steps + 3); NUTS N x leapfrog steps),
``max_mean_err_sd``, ``sd_ratio_min/max``. Printed as it goes; the JSON is rewritten after every cell to
``$OUT/gpu.json`` when ``OUT`` is set, else ``benchmarks/results/gpu.json`` (``--out`` overrides).

Without a GPU the script says so and exits with status 0 (nothing is written), unless ``--smoke``: a CPU
check of the whole script in about a minute (N = 10^4, few steps, results to ``gpu_smoke.json``).

Usage::

    python benchmarks/gpu.py                      # on a GPU machine: about 7 minutes
    python benchmarks/gpu.py --smoke --out /tmp/gpu_smoke.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import _common as C  # noqa: E402

PRIOR_SCALE = 10.0
D_FEATURES = 10


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="CPU check: N = 1e4, few steps")
    ap.add_argument("--allow-cpu", action="store_true", help="run the full plan even without a GPU")
    ap.add_argument("--sizes", default=None, help="comma-separated N (default 1e7,1e8; smoke 1e4)")
    ap.add_argument("--nuts-sizes", default=None, help="N at which NUTS runs (default 1e7; smoke 1e4)")
    ap.add_argument("--chains", type=int, default=None, help="vectorised chains (default 16; smoke 4)")
    ap.add_argument("--budget-s", type=float, default=None, help="global wall budget (default 420; smoke 600)")
    ap.add_argument("--nuts-reserve-s", type=float, default=None,
                    help="budget kept for the NUTS cells, which run last (default 70; smoke 20)")
    ap.add_argument("--min-cell-s", type=float, default=None, help="skip a cell when less is left for its N (default 30)")
    ap.add_argument("--tallmh-steps", default=None, help="warmup,draws of tallmh (default 2000,20000)")
    ap.add_argument("--hmc-steps", default=None, help="warmup,draws of HMCECS and NUTS (default 300,300)")
    ap.add_argument("--cell-cap-s", type=float, default=None, help="cap on one cell's sampling seconds (default 25)")
    ap.add_argument("--subsample", type=int, default=None, help="HMCECS subsample (default 1000)")
    ap.add_argument("--hard-stop-s", type=float, default=None,
                    help="interrupt a cell still running this long after start (default budget + 45 s); the "
                         "rows so far are kept and the script ends normally")
    ap.add_argument("--perm-sizes", default=None,
                    help="N for the permutation timing made first (old Feistel vs swap-or-not vs a log-likelihood "
                         "item, benchmarks/permutation.py; default 4^10,4^10+1,1e7; '' skips it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    sm = a.smoke
    dflt = dict(sizes="1e4" if sm else "1e7,1e8", nuts_sizes="1e4" if sm else "1e7", chains=4 if sm else 16,
                budget_s=600.0 if sm else 420.0, nuts_reserve_s=20.0 if sm else 70.0, min_cell_s=5.0 if sm else 30.0,
                tallmh_steps="100,300" if sm else "2000,20000", hmc_steps="50,50" if sm else "300,300",
                cell_cap_s=20.0 if sm else 25.0, subsample=200 if sm else 1000,
                perm_sizes="1024,1025" if sm else f"{4**10},{4**10 + 1},10000000")
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.hard_stop_s is None:
        a.hard_stop_s = a.budget_s + 45.0
    a.sizes = [int(float(s)) for s in str(a.sizes).split(",") if s]
    a.perm_sizes = [int(float(s)) for s in str(a.perm_sizes).split(",") if s]
    a.nuts_sizes = {int(float(s)) for s in str(a.nuts_sizes).split(",") if s}
    a.tallmh_steps = [int(v) for v in a.tallmh_steps.split(",")]
    a.hmc_steps = [int(v) for v in a.hmc_steps.split(",")]
    if a.out is None:
        name = "gpu_smoke.json" if sm else "gpu.json"
        a.out = os.path.join(os.environ["OUT"], name) if os.environ.get("OUT") else os.path.join(C.RESULTS, name)
    return a


def say(*a):
    print(*a, flush=True)


def device_info():
    import jax

    dev = jax.devices()[0]
    info = {"backend": jax.default_backend(), "device": str(dev),
            "device_kind": getattr(dev, "device_kind", None), "device_count": jax.device_count(),
            "jax": jax.__version__}
    for mod in ("numpyro", "tallmh"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception:
            info[mod] = None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = smi.stdout.strip() or None
    except Exception:
        info["nvidia_smi"] = None
    return info


# ---------------------------------------------------------------------------------------------------
# data on the device, MAP and Laplace approximation


def make_data(n, seed):
    """``{"X": (n, 11), "y": (n,)}`` float32 generated on the default device, and the true theta."""
    import jax
    import jax.numpy as jnp

    theta = np.random.default_rng(seed).standard_normal(D_FEATURES + 1) / np.sqrt(D_FEATURES)

    @jax.jit
    def gen(key, th):
        kx, ky = jax.random.split(key)
        feats = jax.random.normal(kx, (n, D_FEATURES), jnp.float32)
        X = jnp.concatenate([jnp.ones((n, 1), jnp.float32), feats], axis=1)
        y = (jax.random.uniform(ky, (n,)) < jax.nn.sigmoid(X @ th)).astype(jnp.float32)
        return X, y

    X, y = gen(jax.random.PRNGKey(seed), jnp.asarray(theta, jnp.float32))
    jax.block_until_ready((X, y))
    return {"X": X, "y": y}, theta


def _chunk_len(n, target=1_000_000):
    c = min(n, target)
    while n % c:
        c -= 1
    return c


def laplace(X, y, iters=20):
    """MAP by Newton on the device and the Laplace covariance: (MAP, cov, passes, seconds)."""
    import jax
    import jax.numpy as jnp

    t0 = time.perf_counter()
    n, d = X.shape
    c = _chunk_len(n)

    @jax.jit
    def sums(theta, X, y):
        Xr, yr = X.reshape(n // c, c, d), y.reshape(n // c, c)

        def one(args):
            Xc, yc = args
            eta = Xc @ theta
            p = jax.nn.sigmoid(eta)
            return Xc.T @ (yc - p), (Xc * (p * (1 - p))[:, None]).T @ Xc

        return jax.lax.map(one, (Xr, yr))

    theta = np.zeros(d)
    passes = 0
    for _ in range(iters):
        g, H = (np.asarray(v, np.float64).sum(0) for v in sums(jnp.asarray(theta, jnp.float32), X, y))
        passes += 1
        g -= theta / PRIOR_SCALE**2
        H += np.eye(d) / PRIOR_SCALE**2
        step = np.linalg.solve(H, g)
        theta = theta + step
        if np.max(np.abs(step)) < 1e-6 * np.sqrt(np.min(np.diag(np.linalg.inv(H)))):
            break
    _, H = (np.asarray(v, np.float64).sum(0) for v in sums(jnp.asarray(theta, jnp.float32), X, y))
    H += np.eye(d) / PRIOR_SCALE**2
    return theta, np.linalg.inv(H), passes + 1, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------
# cells


def run_tallmh(kind, data, chains, steps, cap_s, seed, cov):
    import tallmh as tm

    model = tm.models.LogisticRegression(prior_scale=PRIOR_SCALE)
    test = tm.acceptance.Austerity(epsilon=0.05, batch_size=100)
    if kind == "langevin":
        if not hasattr(tm.proposals, "Langevin"):
            raise RuntimeError("this tallmh has no Langevin proposal")
        h = 1.2 * float(np.min(np.linalg.eigvalsh(cov)))
        proposal = tm.proposals.Langevin(step_size=h, batch_size=100)
        note = f"Langevin step {h:.3g} (1.2 x smallest Laplace variance), batch 100"
    else:
        proposal = tm.proposals.AdaptiveMetropolis()
        note = "AdaptiveMetropolis"
    warm, draws = steps
    t0 = time.perf_counter()
    r = tm.sample(model, data, test=test, proposal=proposal, num_samples=draws, num_warmup=warm,
                  num_chains=chains, seed=seed, progress=False, control_variates=tm.ControlVariates(order=2),
                  budget_s=cap_s)
    wall = time.perf_counter() - t0
    tim = {k: float(r.timings[k]) for k in ("compile_s", "warmup_s", "sampling_s")}
    theta = np.asarray(r.flat_samples)
    return dict(theta=theta, wall_s=wall, setup_s=wall - sum(tim.values()), timings=tim, partial=bool(r.partial),
                data_per_step=float(np.mean(r.stats["n_data"])), setup_items=int(r.setup_items),
                acceptance_rate=float(np.mean(r.stats["accepted"])), note=note, warmup=warm,
                draws=int(theta.shape[1]))


def run_peer(kind, data, chains, steps, cap_s, seed, theta_map, map_s, subsample, chunk=25):
    """NumPyro NUTS or HMCECS set up as in ``benchmarks/peers.py`` (``run_numpyro``), driven in compiled
    chunks of ``chunk`` steps so that the caps act inside warmup too: warmup may take at most ``2 cap_s``
    (else the cell is abandoned, with what it did, since draws taken while the kernel still adapts would
    not be samples) and sampling at most ``cap_s`` (then the draws so far are kept: ``partial``)."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer import HMCECS, NUTS

    import peers

    X, y = data["X"], data["y"]
    n, d = X.shape
    warm, draws = steps
    t0 = time.perf_counter()
    if kind == "nuts":
        kernel = NUTS(peers.numpyro_model(d))
    else:
        kernel = HMCECS(NUTS(peers.numpyro_model(d, subsample)),
                        proxy=HMCECS.taylor_proxy({"theta": jnp.asarray(theta_map, X.dtype)}))
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * chains)
    state0 = kernel.init(keys[0], warm, {"theta": jnp.asarray(theta_map, X.dtype)}, (X, y), {})
    states = []
    for c in range(chains):  # same start, step size and subsample; own random keys (as peers.py)
        if kind == "nuts":
            states.append(state0._replace(rng_key=keys[2 * c]))
        else:
            states.append(state0._replace(rng_key=keys[2 * c],
                                          hmc_state=state0.hmc_state._replace(rng_key=keys[2 * c + 1])))
    states = jax.tree_util.tree_map(lambda *a: jnp.stack(a), *states)
    jax.block_until_ready(states)
    setup_s = time.perf_counter() - t0 + map_s  # the MAP this script found (proxy centre, start)

    def extract(s):
        h = s if kind == "nuts" else s.hmc_state
        return h.z["theta"], h.num_steps, h.accept_prob, h.diverging

    def one_chain(state, args):
        def body(s, _):
            s = kernel.sample(s, args, {})
            return s, extract(s)
        return jax.lax.scan(body, state, None, length=chunk)

    t = time.perf_counter()
    compiled = jax.jit(jax.vmap(one_chain, in_axes=(0, None))).lower(states, (X, y)).compile()
    tim = {"compile_s": time.perf_counter() - t, "warmup_s": 0.0, "sampling_s": 0.0}
    outs, partial = [], False
    for phase, total, cap in (("warmup", warm, 2 * cap_s), ("sampling", draws, cap_s)):
        t = time.perf_counter()
        done = 0
        while done < total:
            states, out = compiled(states, (X, y))
            jax.block_until_ready(states)
            done += chunk
            tim[f"{phase}_s"] = time.perf_counter() - t
            if phase == "sampling":
                outs.append(jax.tree_util.tree_map(np.asarray, out))
            if tim[f"{phase}_s"] > cap and done < total:
                if phase == "warmup":
                    raise RuntimeError(f"warmup took more than its cap {cap:.0f}s ({done} of {warm} steps in "
                                       f"{tim['warmup_s']:.1f}s after {tim['compile_s']:.1f}s compiling)")
                partial = True
                break
    theta = np.concatenate([o[0] for o in outs], axis=1)
    nsteps = np.concatenate([o[1] for o in outs], axis=1)
    acc = np.concatenate([o[2] for o in outs], axis=1)
    div = np.concatenate([o[3] for o in outs], axis=1)
    wall = time.perf_counter() - t0 + map_s
    lf = float(np.mean(nsteps))
    per_step = n * lf if kind == "nuts" else subsample * (lf + 3)
    return dict(theta=theta, wall_s=wall, setup_s=setup_s, timings=tim, partial=partial, data_per_step=per_step,
                setup_items=n if kind == "nuts" else 3 * n, acceptance_rate=float(np.mean(acc)),
                leapfrog_steps=lf, divergences=int(np.sum(div)), warmup=warm, draws=int(theta.shape[1]),
                note=f"mean leapfrog steps {lf:.1f}" + (f", subsample {subsample}" if kind != "nuts" else ""))


def summarise(row, out, ref):
    import peers

    theta = out.pop("theta")
    tim = out.pop("timings")
    row.update(out)
    row.update(tim)
    row.update(peers.metrics(theta, ref))
    row.pop("mean", None)
    row.pop("sd", None)
    steps = max(row["draws"], 1)
    row["time_per_step_s"] = row["sampling_s"] / steps
    ess = row.get("ess_min", float("nan"))
    row["ess_per_s"] = ess / row["sampling_s"] if row["sampling_s"] > 0 else float("nan")
    row["ess_per_s_total"] = ess / row["wall_s"] if row["wall_s"] > 0 else float("nan")
    row["accurate"] = bool(np.isfinite(row.get("max_mean_err_sd", np.nan)) and row["max_mean_err_sd"] <= 0.1
                           and row["sd_ratio_min"] >= 0.9 and row["sd_ratio_max"] <= 1.1)
    return row


def fmt_row(r):
    if r.get("skipped") or r.get("error"):
        return f"{r['method']:<22} N={r['n']:.0e} ch={r['chains']:<3} {'SKIPPED' if r.get('skipped') else 'ERROR'}: " \
               f"{r.get('skipped') or r.get('error')}"
    return (f"{r['method']:<22} N={r['n']:.0e} ch={r['chains']:<3} wall {r['wall_s']:7.1f}s (setup {r['setup_s']:5.1f}, "
            f"compile {r['compile_s']:5.1f}, warm {r['warmup_s']:5.1f}, sampl {r['sampling_s']:6.2f}) "
            f"draws {r['draws']:>6} ms/step {1e3 * r['time_per_step_s']:8.3f} items/step {r['data_per_step']:10.4g} "
            f"ESS min {r.get('ess_min', float('nan')):7.0f} ESS/s {r['ess_per_s']:9.4g} (call {r['ess_per_s_total']:8.3g}) "
            f"err/sd {r.get('max_mean_err_sd', float('nan')):.3f} sd ratio {r.get('sd_ratio_min', float('nan')):.2f}-"
            f"{r.get('sd_ratio_max', float('nan')):.2f}{' PARTIAL' if r.get('partial') else ''}")


def markdown(rows):
    lines = ["| N | method | chains | ESS/s (sampling) | ESS/s (whole call) | ms/step | items/step | max err/sd | sd ratio | wall s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        if r.get("skipped") or r.get("error"):
            continue
        lines.append(f"| {r['n']:.0e} | {r['method']} | {r['chains']} | {r['ess_per_s']:.4g} | {r['ess_per_s_total']:.3g} | "
                     f"{1e3 * r['time_per_step_s']:.3g} | {r['data_per_step']:.4g} | {r.get('max_mean_err_sd', float('nan')):.3f} | "
                     f"{r.get('sd_ratio_min', float('nan')):.2f}-{r.get('sd_ratio_max', float('nan')):.2f} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv=None):
    t_start = time.perf_counter()
    args = parse(sys.argv[1:] if argv is None else argv)
    import jax

    backend = jax.default_backend()
    if backend != "gpu" and not (args.smoke or args.allow_cpu):
        say(f"No GPU: JAX's backend is '{backend}' (devices: {jax.devices()}). benchmarks/gpu.py measures tallmh, "
            "NumPyro HMCECS and NUTS on one GPU, so nothing was run and nothing was written. "
            "Run it on a machine with a CUDA GPU and jax[cuda], or use --smoke for a quick CPU check of the script.")
        return 0
    meta = C.machine_info([__file__] + (sys.argv[1:] if argv is None else list(argv)), smoke=args.smoke,
                          budget_s=args.budget_s, chains=args.chains, tallmh_steps=args.tallmh_steps,
                          hmc_steps=args.hmc_steps, cell_cap_s=args.cell_cap_s, subsample=args.subsample,
                          **device_info())
    say("gpu benchmark:", json.dumps(meta))

    class HardStop(Exception):
        pass

    guard = {"in_cell": False, "stopped": False}

    def on_alarm(signum, frame):
        guard["stopped"] = True
        if guard["in_cell"]:  # interrupt the running cell; between cells the loop sees the flag
            guard["in_cell"] = False
            raise HardStop(f"hard stop after {args.hard_stop_s:.0f}s")

    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(max(1, int(args.hard_stop_s)))
    rows, data_rows = [], []

    def save():
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "datasets": data_rows, "rows": rows,
                       "total_s": time.perf_counter() - t_start}, f, indent=1, default=float)

    def run_cells(n, cells, deadline, ctx):
        data, theta_map, map_s, cov, ref = ctx
        for method, chains in cells:
            row = {"method": method, "n": n, "chains": chains}
            left_n = 0.0 if guard["stopped"] else deadline - time.perf_counter()
            if left_n < args.min_cell_s:
                row["skipped"] = f"time budget: {left_n:.0f}s left for it (< --min-cell-s {args.min_cell_s:.0f})"
                rows.append(row)
                say(fmt_row(row))
                save()
                continue
            # sampling gets what is left after a rough allowance for compile, set-up and warmup
            cap = max(2.0, min(args.cell_cap_s, 0.5 * left_n))
            say(f"-- {method}, N = {n:.0e}, {chains} chain(s): sampling capped at {cap:.0f}s ({left_n:.0f}s left)")
            guard["in_cell"] = True
            try:
                if method.startswith("tallmh"):
                    out = run_tallmh("langevin" if "langevin" in method else "am", data, chains, args.tallmh_steps,
                                     cap, args.seed, cov)
                else:
                    out = run_peer(method, data, chains, args.hmc_steps, cap, args.seed, theta_map, map_s,
                                   args.subsample)
                guard["in_cell"] = False
                row = summarise(row, out, ref)
            except (Exception, HardStop) as e:
                row["error"] = f"{type(e).__name__}: {e}"
                if not isinstance(e, HardStop):
                    traceback.print_exc()
            guard["in_cell"] = False
            rows.append(row)
            say(fmt_row(row))
            save()

    perm_rows = []
    if args.perm_sizes:
        # the subsampling permutation on this device: per-item cost of the old Feistel (cycle-walking) and of
        # swap-or-not, against one log-likelihood item (gather + likelihood), chunks of 100 and 65,536
        import jax
        import jax.numpy as jnp
        import permutation as pb

        say("\n=== permutation cost per item (ns) ===")
        guard["in_cell"] = True
        try:
            for n in args.perm_sizes:
                kx, ky = jax.random.split(jax.random.PRNGKey(1))
                X = jnp.concatenate([jnp.ones((n, 1), jnp.float32), jax.random.normal(kx, (n, D_FEATURES))], axis=1)
                y = (jax.random.uniform(ky, (n,)) < 0.5).astype(jnp.float32)
                for m in (100, 65536):
                    r = pb.bench_size(n, min(m, n), 4096 if args.smoke else 2**20, 3, X, y)
                    perm_rows.append(r)
                    say(f"N {n:>9} chunk {r['chunk']:>6}: feistel {r['feistel_ns_per_item']:8.3f} (walks max "
                        f"{r['feistel_walk_rounds_max_per_chunk']}), swap-or-not {r['swap_or_not_ns_per_item']:8.3f}, "
                        f"loglik {r['loglik_ns_per_item']:8.3f}")
                del X, y
        except (Exception, HardStop) as e:
            perm_rows.append({"error": f"{type(e).__name__}: {e}"})
            say(f"permutation timing failed: {type(e).__name__}: {e}")
        guard["in_cell"] = False
        meta["permutation"] = perm_rows
        save()

    sizes = sorted(args.sizes)
    nuts_later = {}  # NUTS runs last (its time per step is the least predictable), on data kept for it
    reserve = args.nuts_reserve_s if set(sizes) & args.nuts_sizes else 0.0
    for si, n in enumerate(sizes):
        left = args.budget_s - reserve - (time.perf_counter() - t_start)
        # share the remaining budget (less the NUTS reserve) between this N and the larger ones; the NUTS
        # cells at the end get the reserve and whatever the others leave
        n_deadline = time.perf_counter() + left / (len(sizes) - si)
        say(f"\n=== N = {n:.0e}: {left:.0f}s of the budget left, {n_deadline - time.perf_counter():.0f}s for this N ===")
        if guard["stopped"] or time.perf_counter() - t_start > args.hard_stop_s - 5:
            data_rows.append({"n": n, "error": "hard stop reached before this N"})
            continue
        guard["in_cell"] = True
        try:
            t0 = time.perf_counter()
            data, theta_true = make_data(n, args.seed)
            gen_s = time.perf_counter() - t0
            theta_map, cov, passes, map_s = laplace(data["X"], data["y"])
            guard["in_cell"] = False
        except Exception as e:
            guard["in_cell"] = False  # e.g. out of device memory at 1e8 (HardStop included: it is an Exception)
            say(f"data or MAP at N = {n:.0e} failed: {type(e).__name__}: {e}")
            data_rows.append({"n": n, "error": f"{type(e).__name__}: {e}"})
            save()
            continue
        ref = {"mean": theta_map, "sd": np.sqrt(np.diag(cov)), "mcse": np.zeros(len(theta_map))}
        data_rows.append({"n": n, "generate_s": gen_s, "map_s": map_s, "map_passes": passes,
                          "bytes": int(data["X"].nbytes + data["y"].nbytes), "laplace_sd": ref["sd"].tolist(),
                          "theta_true": theta_true.tolist(), "map": theta_map.tolist()})
        say(f"data generated on the device in {gen_s:.1f}s ({data_rows[-1]['bytes'] / 1e9:.2f} GB); "
            f"MAP by Newton in {map_s:.1f}s ({passes} passes); Laplace sd {ref['sd'].min():.3g}-{ref['sd'].max():.3g}")
        ctx = (data, theta_map, map_s, cov, ref)
        if n in args.nuts_sizes:
            nuts_later[n] = ctx
        run_cells(n, [("tallmh-austerity-cv", args.chains), ("hmcecs", 1), ("tallmh-austerity-cv", 1),
                      ("hmcecs", args.chains), ("tallmh-langevin-cv", args.chains)],
                  n_deadline, ctx)
        del data, ctx
    for n, ctx in sorted(nuts_later.items()):
        say(f"\n=== NUTS at N = {n:.0e} ===")
        run_cells(n, [("nuts", 1)], t_start + args.budget_s, ctx)
    nuts_later.clear()
    if hasattr(signal, "SIGALRM"):
        signal.alarm(0)
    say("\n" + markdown(rows))
    meta["total_s"] = time.perf_counter() - t_start
    save()
    say(f"\ntotal {meta['total_s']:.0f}s; saved {args.out}")
    if guard["stopped"]:
        # an interrupted cell may leave a worker thread inside XLA (tallmh compiles in a thread), which
        # would abort the interpreter's shutdown: everything is saved, so leave at once
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
