"""Informed sub-sampling MCMC (Maire, Friel & Alquier 2019, via the Mwakima & Zhang report): its logistic
regression example, its bias as a function of n and eps, and ISS beside tallmh's tests at equal wall time.

Three parts (``--parts report,bias,peers``):

``report`` (the report's Sec. 4, as far as it states it): ``P(y=1) = sigmoid(b0 + b1 x1 + b2 x2)`` with
``(b0, b1, b2) = (-1, 1, 0)``; the features' law is not stated, we draw x1, x2 ~ N(0, 1); prior
``N(0, 100 I)`` (``tm.models.LogisticRegression(prior_scale=10)``); summary statistic ``S = y`` (the
report: "the sum of Y_U since our data is binomial"); subset kernel R "a random sample from U_n": we swap
all n members for n non-members (``swap = n``); theta kernel "uniform in R^3 with mean beta_i and width
0.2" (``UniformCube(0.2)`` below); eps in {5e-5, 1}; n in {100, 500, 1000}; the exact MH baseline
("MRH") with the same proposal. The report ran N = 1e5 (the paper 1e6); ``--report-sizes`` picks (default
both). The number of iterations is not stated: we run ``--report-steps`` (1000 warmup + 10000 draws, 2
chains). Because a 0.2-wide cube is ~20-40 posterior sds wide at these N (almost every proposal is
rejected), the same grid is also run with tallmh's default proposal (``AdaptiveMetropolis``) and
``swap = n/10``: "ours".

``bias``: the report's design at N = ``--bias-n`` (1e5), the default statistic (whitened scores at the
mode: ours, not the report's), n in {100, 1000, 10000}, eps in {0, 0.01, 0.1, 1, 10}, swap = max(1,
n/100), 4 chains x (1000 warmup + 4000 draws), AM proposal. Bias: max over coordinates of
``|mean - ref mean| / ref sd`` and the sd ratios, against the posterior's Laplace approximation (float64
Newton; at N = 1e5 and d = 3 its error is far below the numbers measured here: the exact-MH row shows it),
with the Gaussian-mixture prediction of the sd inflation ``sqrt(1 + 1/(n/(N-n) + 2 eps))`` (module
docstring of ``tallmh.informed``).

``peers``: the posteriors of ``benchmarks/peers.py`` (synthetic logistic regression, d = 10 + intercept,
N = 1e5 and 1e6, ``LogisticRegression.simulate(N, d=10, seed=0)``, prior sd 10) and their saved
references (``benchmarks/results/reference_*.npz``, NumPyro NUTS in float64). Every method runs 2
chains of 500 warmup steps and then samples for the same ``--budget`` seconds of sampling wall time
(``tm.sample(budget_s=...)``); AM proposal, default starts; tallmh's tests as peers.py configures them
(batch 100; the plain tests only at N = 1e5, as there). Reported: ESS (min over parameters) per sampling
second and accuracy (max |mean error| / ref sd, sd ratios) with peers.py's ``metrics``.

Usage::

    python benchmarks/papers/iss_mcmc.py                         # all parts (~25 min on a loaded 2-core box)
    python benchmarks/papers/iss_mcmc.py --parts bias
    python benchmarks/papers/iss_mcmc.py --smoke --out /tmp/iss  # a minute: tiny sizes
"""

from __future__ import annotations

import math
import os
import sys
import time
import warnings

import numpy as np

import _common as C

BETA = (-1.0, 1.0, 0.0)


class UniformCube:
    """Symmetric proposal ``theta' = theta + width * (U(0,1)^d - 1/2)`` (the report's Q)."""

    name = "uniform-cube"

    def __init__(self, width):
        self.width = float(width)

    def init(self, theta, n, cov_hint=None):
        import jax.numpy as jnp

        return jnp.zeros((), theta.dtype)

    def propose(self, key, theta, state):
        import jax
        import jax.numpy as jnp

        u = jax.random.uniform(key, theta.shape, theta.dtype)
        return theta + self.width * (u - 0.5), jnp.zeros((), theta.dtype)

    def update(self, state, theta, accepted, step):
        return state


def report_data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = np.concatenate([np.ones((n, 1)), rng.standard_normal((n, 2))], axis=1).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(X.astype(np.float64) @ np.array(BETA))))
    y = (rng.random(n) < p).astype(np.float32)
    return {"X": X, "y": y}


def laplace(data):
    sys.path.insert(0, os.path.join(C.REPO_ROOT, "benchmarks"))
    import peers

    theta, H, _ = peers.newton_map(data["X"], data["y"], prior_scale=10.0)
    cov = np.linalg.inv(H)
    return {"mean": theta, "sd": np.sqrt(np.diag(cov)), "mcse": np.zeros_like(theta)}


def y_stat(batch):
    return batch["y"]


def run(tm, data, test, proposal, warmup, draws, chains, seed, budget=None):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = tm.sample(tm.models.LogisticRegression(prior_scale=10.0), data, test=test, proposal=proposal,
                      num_samples=draws, num_warmup=warmup, num_chains=chains, seed=seed, progress=False,
                      budget_s=budget)
    wall = time.perf_counter() - t0
    o = r.summary().overall
    out = {"label": o["label"], "wall_s": wall, "setup_s": r.timings["setup_s"], "compile_s": r.timings["compile_s"],
           "warmup_s": r.timings["warmup_s"], "sampling_s": r.timings["sampling_s"], "draws": int(r.num_draws),
           "ms_per_step": 1e3 * r.timings["sampling_s"] / max(1, r.num_draws), "acceptance": o["acceptance_rate"],
           "items_per_step": o["mean_n_data"], "setup_items": int(r.setup_items), "rhat_max": o["rhat_max"],
           "verdict": o["verdict"]}
    ex = r.final_state.extra
    if ex is not None and hasattr(ex, "delta_sq"):
        out["subset_acceptance"] = float(np.mean(np.asarray(ex.subset_accepted) / np.maximum(np.asarray(ex.steps), 1)))
        out["final_delta_sq"] = [float(v) for v in np.asarray(ex.delta_sq)]
    return r, out


def score(theta, ref):
    sys.path.insert(0, os.path.join(C.REPO_ROOT, "benchmarks"))
    import peers

    m = peers.metrics(np.asarray(theta, np.float64), ref)
    return {k: m[k] for k in ("ess_min", "ess_median", "max_mean_err_sd", "max_mean_err_z", "sd_ratio_min",
                              "sd_ratio_median", "sd_ratio_max", "mean", "sd") if k in m}


def fmt_row(r, cols):
    out = []
    for c, f in cols:
        v = r.get(c)
        out.append("-" if v is None or (isinstance(v, float) and not np.isfinite(v)) else format(v, f))
    return out


def md_table(rows, cols, names):
    lines = ["| " + " | ".join(names) + " |", "|" + "|".join(["---"] + ["---:"] * (len(names) - 1)) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt_row(r, cols)) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
def part_report(tm, args):
    rows = []
    for N in args.report_sizes:
        data = report_data(N, args.seed)
        ref = laplace(data)
        print(f"## report: N = {N}, Laplace mean {np.round(ref['mean'], 4)}, sd {np.round(ref['sd'], 5)}", flush=True)
        for setting in ("report", "ours"):
            if setting == "report":
                prop = UniformCube(0.2)
            else:
                prop = tm.proposals.AdaptiveMetropolis()
            configs = [("MRH (exact)", tm.acceptance.Exact(), None, None)]
            for n in args.report_n:
                for eps in args.report_eps:
                    k = n if setting == "report" else max(1, n // 10)
                    configs.append((f"ISS n={n} eps={eps:g}",
                                    tm.acceptance.Informed(subset_size=n, swap=k, epsilon=eps, statistic=y_stat), n, eps))
            for name, test, n, eps in configs:
                budget = args.report_exact_budget if n is None else None
                r, row = run(tm, data, test, prop, args.report_warmup, args.report_draws, 2, args.seed, budget)
                row.update(score(r.flat_samples, ref))
                row.update(N=N, setting=setting, method=name, n=n, eps=eps)
                rows.append(row)
                print(f"{setting:6s} {name:22s} wall {row['wall_s']:6.1f}s sampling {row['sampling_s']:6.2f}s "
                      f"({row['ms_per_step']:.3f} ms/step) acc {row['acceptance']:.3f} "
                      f"U-acc {row.get('subset_acceptance', float('nan')):.3f} ESS {row['ess_min']:.0f} "
                      f"|dmean|/sd {row['max_mean_err_sd']:.2f} sd ratio {row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f}",
                      flush=True)
    return rows


def part_bias(tm, args):
    N = args.bias_n
    data = report_data(N, args.seed)
    ref = laplace(data)
    rows = []
    r, row = run(tm, data, tm.acceptance.Exact(), None, 1000, args.bias_draws // 2, 2, args.seed)
    row.update(score(r.flat_samples, ref), method="exact MH", n=N, eps=None, N=N)
    rows.append(row)
    print(f"exact MH: |dmean|/sd {row['max_mean_err_sd']:.3f} sd ratio {row['sd_ratio_min']:.3f}-{row['sd_ratio_max']:.3f}",
          flush=True)
    for n in args.bias_subsets:
        k = max(1, n // 100)
        for eps in args.bias_eps:
            test = tm.acceptance.Informed(subset_size=n, swap=k, epsilon=eps)
            r, row = run(tm, data, test, None, 1000, args.bias_draws, 4, args.seed)
            row.update(score(r.flat_samples, ref))
            pred = math.sqrt(1.0 + 1.0 / (n / (N - n) + 2.0 * eps))
            row.update(method="ISS", n=n, k=k, eps=eps, N=N, sd_ratio_pred=pred,
                       mean_final_delta_sq=float(np.mean(row["final_delta_sq"])))
            rows.append(row)
            print(f"n={n:6d} k={k:3d} eps={eps:<6g} |dmean|/sd {row['max_mean_err_sd']:7.3f} sd ratio "
                  f"{row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f} (pred {pred:.2f}) U-acc "
                  f"{row['subset_acceptance']:.3f} ||Delta||^2 {row['mean_final_delta_sq']:.3g} R-hat "
                  f"{row['rhat_max']:.3f} ESS {row['ess_min']:.0f} {row['ms_per_step']:.3f} ms/step", flush=True)
    return rows


def plot_bias(rows, out):
    fig, axes = C.figure(1, 2, figsize=(11, 4.2))
    iss = [r for r in rows if r["method"] == "ISS"]
    ns = sorted({r["n"] for r in iss})
    exact = [r for r in rows if r["method"] == "exact MH"]
    for i, n in enumerate(ns):
        rs = sorted([r for r in iss if r["n"] == n], key=lambda r: r["eps"])
        x = [max(r["eps"], 1e-3) for r in rs]
        c = f"C{i}"
        axes[0].plot(x, [r["max_mean_err_sd"] for r in rs], "o-", color=c, label=f"n = {n}")
        axes[1].plot(x, [r["sd_ratio_max"] for r in rs], "o-", color=c, label=f"n = {n}: max sd ratio")
        axes[1].plot(x, [r["sd_ratio_pred"] for r in rs], "--", color=c, alpha=0.7, label=f"n = {n}: mixture prediction")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xlabel("eps (eps = 0 plotted at 1e-3)")
        ax.grid(alpha=0.3)
    if exact:
        axes[0].axhline(exact[0]["max_mean_err_sd"], color="k", lw=0.8, ls=":", label="exact MH")
        axes[1].axhline(exact[0]["sd_ratio_max"], color="k", lw=0.8, ls=":", label="exact MH")
    axes[0].set_yscale("log")
    axes[0].set_ylabel("max |mean - posterior mean| / posterior sd")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("sd / posterior sd")
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"ISS-MCMC bias, logistic regression (report design), N = {rows[0]['N']}, whitened-score statistic")
    fig.tight_layout()
    return C.save_fig(fig, out, "iss_mcmc_bias.png")


def plot_report(rows, out):
    """Time per step and the widest sd ratio of each configuration, per N and setting (the report's Table 1
    as a time per iteration, and how far each run is from the posterior)."""
    sizes = sorted({r["N"] for r in rows})
    fig, axes = C.figure(len(sizes), 2, figsize=(12, 3.6 * len(sizes)), squeeze=False)
    for i, N in enumerate(sizes):
        for j, (key, lab) in enumerate((("ms_per_step", "ms per iteration (2 chains, vectorised)"),
                                        ("sd_ratio_max", "max sd / posterior sd"))):
            ax = axes[i][j]
            for s_i, setting in enumerate(("report", "ours")):
                rs = [r for r in rows if r["N"] == N and r["setting"] == setting]
                x = np.arange(len(rs)) + (0.2 if s_i else -0.2)
                ax.bar(x, [r[key] for r in rs], width=0.4, color=f"C{s_i}",
                       label="report's Q (cube 0.2), swap = n" if setting == "report" else "AM proposal, swap = n/10")
                ax.set_xticks(np.arange(len(rs)))
                ax.set_xticklabels([r["method"].replace("ISS ", "") for r in rs], rotation=30, fontsize=7, ha="right")
            ax.set_yscale("log")
            ax.set_ylabel(lab, fontsize=8)
            ax.set_title(f"N = {N}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
            if j == 1:
                ax.axhline(1.0, color="k", lw=0.8, ls=":")
            ax.legend(fontsize=7)
    fig.suptitle("ISS-MCMC on the report's logistic regression (S = y): cost per iteration and posterior width")
    fig.tight_layout()
    return C.save_fig(fig, out, "iss_mcmc_report.png")


def part_peers(tm, args):
    sys.path.insert(0, os.path.join(C.REPO_ROOT, "benchmarks"))
    import peers

    rows = []
    for N in args.peer_sizes:
        name = f"synthetic-{peers._fmt_n(N)}"
        data, _ = peers.load_data("synthetic", N, args.seed)
        path = os.path.join(C.REPO_ROOT, "benchmarks", "results", f"reference_{name}.npz")
        if args.smoke or not os.path.exists(path):
            ref = laplace(data)
            ref_how = "Laplace (float64 Newton)"
        else:
            with np.load(path) as z:
                ref = {k: np.asarray(z[k]) for k in ("mean", "sd", "mcse")}
            ref_how = os.path.relpath(path, C.REPO_ROOT)
        methods = []
        if N <= 500_000:
            methods += ["tallmh-exact", "tallmh-austerity", "tallmh-confidence", "tallmh-barker"]
        methods += ["tallmh-austerity-cv", "tallmh-confidence-cv", "tallmh-barker-cv"]
        if args.peer_methods is not None:
            methods = [m for m in methods if m in args.peer_methods]
        for meth in methods:
            test, cv = peers.tallmh_config(tm, meth, 100)
            methods_args = (meth, test, cv)
            rows.append(_peer_row(tm, data, N, name, ref, ref_how, *methods_args, args))
        for n, k, eps in args.peer_iss:
            test = tm.acceptance.Informed(subset_size=n, swap=k, epsilon=eps)
            rows.append(_peer_row(tm, data, N, name, ref, ref_how, f"iss(n={n},k={k},eps={eps:g})", test, None, args))
    return rows


def _peer_row(tm, data, N, name, ref, ref_how, meth, test, cv, args):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = tm.sample(tm.models.LogisticRegression(prior_scale=10.0), data, test=test,
                      proposal=tm.proposals.AdaptiveMetropolis(), num_samples=args.peer_max_draws,
                      num_warmup=args.peer_warmup, num_chains=2, seed=args.seed, progress=False,
                      control_variates=cv, budget_s=args.budget)
    wall = time.perf_counter() - t0
    row = {"method": meth, "dataset": name, "N": N, "reference": ref_how, "wall_s": wall,
           "setup_s": r.timings["setup_s"], "compile_s": r.timings["compile_s"], "warmup_s": r.timings["warmup_s"],
           "sampling_s": r.timings["sampling_s"], "draws": int(r.num_draws), "acceptance": float(np.mean(r.stats["accepted"])),
           "items_per_step": float(np.mean(r.stats["n_data"])), "setup_items": int(r.setup_items),
           "ms_per_step": 1e3 * r.timings["sampling_s"] / max(1, r.num_draws)}
    row.update(score(r.flat_samples, ref))
    row["ess_per_s"] = row["ess_min"] / row["sampling_s"] if row["sampling_s"] > 0 else float("nan")
    sys.path.insert(0, os.path.join(C.REPO_ROOT, "benchmarks"))
    import peers

    row["accurate"] = bool(peers.accurate(row))
    print(f"{name:14s} {meth:34s} draws {row['draws']:7d} sampling {row['sampling_s']:5.1f}s ESS {row['ess_min']:7.0f} "
          f"ESS/s {row['ess_per_s']:8.1f} |dmean|/sd {row['max_mean_err_sd']:6.3f} sd ratio "
          f"{row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f} items/step {row['items_per_step']:.0f} "
          f"{'accurate' if row['accurate'] else 'NOT accurate'}", flush=True)
    return row


def _floats(s):
    return [float(v) for v in s.split(",") if v]


def _ints(s):
    return [int(float(v)) for v in s.split(",") if v]


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--parts", default="report,bias,peers")
    ap.add_argument("--out", default=C.DEFAULT_OUT)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--replot", action="store_true", help="only redraw the figures from the JSON files in --out")
    ap.add_argument("--report-sizes", default="100000,1000000")
    ap.add_argument("--report-n", default="100,500,1000")
    ap.add_argument("--report-eps", default="5e-5,1")
    ap.add_argument("--report-warmup", type=int, default=1000)
    ap.add_argument("--report-draws", type=int, default=10000)
    ap.add_argument("--report-exact-budget", type=float, default=60.0,
                    help="sampling seconds at most for the exact MH baseline (fewer draws at large N)")
    ap.add_argument("--bias-n", type=int, default=100_000)
    ap.add_argument("--bias-subsets", default="100,1000,10000")
    ap.add_argument("--bias-eps", default="0,0.01,0.1,1,10")
    ap.add_argument("--bias-draws", type=int, default=4000)
    ap.add_argument("--peer-sizes", default="100000,1000000")
    ap.add_argument("--peer-iss", default="1000:10:1,10000:100:1",
                    help="ISS configurations n:k:eps, comma-separated")
    ap.add_argument("--peer-methods", default=None, help="tallmh tests to run beside ISS (default: as peers.py)")
    ap.add_argument("--peers-file", default="iss_mcmc_peers.json")
    ap.add_argument("--budget", type=float, default=20.0, help="sampling seconds per method (peers part)")
    ap.add_argument("--peer-warmup", type=int, default=500)
    ap.add_argument("--peer-max-draws", type=int, default=200_000)
    args = ap.parse_args(argv[1:])
    args.report_sizes = _ints(args.report_sizes)
    args.report_n = _ints(args.report_n)
    args.report_eps = _floats(args.report_eps)
    args.bias_subsets = _ints(args.bias_subsets)
    args.bias_eps = _floats(args.bias_eps)
    args.peer_sizes = _ints(args.peer_sizes)
    if args.peer_methods is not None:
        args.peer_methods = [m for m in args.peer_methods.split(",") if m]
    args.peer_iss = [(int(a), int(b), float(c)) for a, b, c in (t.split(":") for t in args.peer_iss.split(",") if t)]
    if args.smoke:
        args.report_sizes, args.report_n, args.report_eps = [5000], [100], [1.0]
        args.report_warmup, args.report_draws = 100, 300
        args.bias_n, args.bias_subsets, args.bias_eps, args.bias_draws = 5000, [100], [0.0, 1.0], 300
        args.peer_sizes, args.peer_iss, args.budget, args.peer_warmup = [5000], [(200, 2, 1.0)], 1.0, 100
    parts = [p for p in args.parts.split(",") if p]
    if args.replot:  # figures again from the saved JSON files in --out
        import json

        for fname, fn in (("iss_mcmc_report.json", plot_report), ("iss_mcmc_bias.json", plot_bias)):
            path = os.path.join(args.out, fname)
            if os.path.exists(path):
                with open(path) as f:
                    fn(json.load(f)["rows"], args.out)
        return

    import tallmh as tm

    meta = C.machine_info(argv)
    C.header("ISS-MCMC (Maire, Friel & Alquier 2019; Mwakima & Zhang report)", meta)
    for part in parts:
        run_part(tm, args, meta, part)


# each part: (rows, JSON file, figure or None, table columns (title, key, format))
PARTS = {
    "report": (part_report, "iss_mcmc_report.json", plot_report, [
        ("N", "N", "d"), ("setting", "setting", "s"), ("method", "method", "s"),
        ("sampling s", "sampling_s", ".2f"),
        ("ms/step", "ms_per_step", ".3f"), ("accept", "acceptance", ".3f"), ("U accept", "subset_acceptance", ".3f"),
        ("ESS min", "ess_min", ".0f"), ("max dmean/sd", "max_mean_err_sd", ".2f"),
        ("sd ratio min", "sd_ratio_min", ".2f"), ("sd ratio max", "sd_ratio_max", ".2f")]),
    "bias": (part_bias, "iss_mcmc_bias.json", plot_bias, [
        ("n", "n", "d"), ("k", "k", "d"), ("eps", "eps", "g"), ("max dmean/sd", "max_mean_err_sd", ".3f"),
        ("sd ratio min", "sd_ratio_min", ".2f"), ("sd ratio max", "sd_ratio_max", ".2f"),
        ("predicted sd ratio", "sd_ratio_pred", ".2f"), ("U accept", "subset_acceptance", ".3f"),
        ("final ||Delta||^2", "mean_final_delta_sq", ".3g"), ("R-hat", "rhat_max", ".3f"),
        ("ESS min", "ess_min", ".0f"), ("ms/step", "ms_per_step", ".3f")]),
    "peers": (part_peers, None, None, [
        ("data", "dataset", "s"), ("method", "method", "s"), ("draws", "draws", "d"),
        ("sampling s", "sampling_s", ".1f"),
        ("ESS min", "ess_min", ".0f"), ("ESS/s", "ess_per_s", ".1f"), ("max dmean/sd", "max_mean_err_sd", ".3f"),
        ("sd ratio min", "sd_ratio_min", ".2f"), ("sd ratio max", "sd_ratio_max", ".2f"),
        ("items/step", "items_per_step", ".0f"), ("ms/step", "ms_per_step", ".3f"), ("setup s", "setup_s", ".1f"),
        ("compile s", "compile_s", ".1f")]),
}


def run_part(tm, args, meta, part):
    """Run one part, print its table and write its JSON (``--peers-file`` for the peers) and figure."""
    make_rows, filename, plot, columns = PARTS[part]
    rows = make_rows(tm, args)
    tab = md_table(rows, [(key, fmt) for _, key, fmt in columns], [title for title, _, _ in columns])
    print(tab)
    C.write_json(args.out, filename or args.peers_file, {"meta": meta, "rows": rows, "table": tab})
    if plot is not None:
        plot(rows, args.out)


if __name__ == "__main__":
    main()
