"""Data used and wrong decisions of the austerity test versus epsilon and versus the per-step error target.

Austerity paper, Fig. 2, on synthetic data, for both forms of ``tm.acceptance.Austerity``: the paper's
Alg. 1 with per-look level epsilon (``Austerity(epsilon=e)``) and the per-step error target
(``Austerity(error=e)``, the default: the per-look level designed so that the worst-case whole-step
error is e; ``tallmh/acceptance/_sequential.py``).

Korattikara, Chen & Welling (2014), Sec. 5.1, Fig. 2: logistic regression on MNIST 7 vs 9 (N = 12214,
PCA to 50 dimensions, Gaussian prior, random-walk proposal); average percentage of data used per test
and percentage of wrong accept/reject decisions as functions of epsilon. Here the data are synthetic
(no MNIST): ``tm.models.LogisticRegression.simulate(12214, d=50, seed=0)`` (50 standard-normal
features plus an intercept column; true weights ~ N(0, I/50)), model
``LogisticRegression(prior_scale=10)``.

(theta, theta') pairs as a converged chain sees them: theta is drawn from the Laplace approximation
N(MAP, H^-1) of the posterior (MAP by Newton's method in float64, H the Hessian of the negative log
posterior there), and theta' = theta + sigma z, z ~ N(0, I), an isotropic random walk whose sd sigma is
tuned (bisection on log sigma, exact MH acceptance probability min(1, exp(Delta)) averaged over the
pairs) to an exact acceptance rate of ``--target-accept`` (0.234, Roberts & Rosenthal). For each pair
the script draws ``--keys`` keys; for each key it makes the decision of ``Austerity(epsilon,
batch_size=500)`` and of ``Exact()``; by the library's key contract both draw the same u from the same
key, so a decision is wrong when the two differ. epsilon = 0 is exact MH (the paper: "the setting
epsilon = 0 corresponds to the exact MH algorithm"); ``Austerity`` requires epsilon in (0, 1), so the
epsilon = 0 row is computed with ``Exact()`` itself (data fraction 1, no wrong decisions by definition).

The error-targeted rows (``--errors``) run ``Austerity(error=e, batch_size=500)`` on the same pairs and
keys and also report the designed per-look level and the worst-case whole-step error the design
promises (the measured rate, averaged over u and pairs, should be at most that). The epsilon rows report
the worst-case whole-step error of Alg. 1 computed the same way.

Reported per row: mean data fraction (items read / N), wrong-decision rate with its binomial
standard error sqrt(p (1 - p) / n) over all pair x key decisions, and a pair-clustered standard error
(sd of the per-pair rates / sqrt(pairs)), which is the honest one when the error concentrates on the
pairs near the decision boundary; also wrong accepts and wrong rejects separately.

Usage::

    python benchmarks/decision_error.py                # writes benchmarks/results/decision_error.{json,png}
    python benchmarks/decision_error.py --smoke --out /tmp/x
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np

import _common as C


def plot(out, png):
    """Data used and wrong decisions versus the nominal value, both forms, from the results dict."""
    rows, error_rows = out["rows"], out.get("error_rows", [])
    cfg = out["config"]
    n = cfg["N"]
    fig, ax1 = C.figure(figsize=(6.5, 5))
    ax2 = ax1.twinx()
    for rs, key, style, name in ((rows, "epsilon", "-", "per look (epsilon)"), (error_rows, "error", "--", "per step (error)")):
        if not rs:
            continue
        x = np.array([r[key] for r in rs])
        frac = np.array([100 * r["data_fraction"] for r in rs])
        wr = np.array([100 * r["wrong_rate"] for r in rs])
        wse = np.array([100 * r["wrong_rate_pair_clustered_se"] for r in rs])
        ax1.plot(x, frac, "o" + style, color="tab:blue", label=f"data used, {name}")
        ax2.errorbar(x, wr, yerr=2 * np.nan_to_num(wse), fmt="s" + style, color="tab:red", capsize=3,
                     label=f"wrong, {name}")
    top = max([100 * r["wrong_rate"] + 200 * np.nan_to_num(r["wrong_rate_pair_clustered_se"]) for r in rows + error_rows])
    xs = np.array(sorted({r.get("error", r.get("epsilon")) for r in rows + error_rows}))
    ax2.plot(xs, 100 * xs, ":", color="gray", label="wrong = nominal value")
    ax1.set_xlabel(r"nominal value: $\epsilon$ (per look) or error target (per step)")
    ax1.set_ylabel("percentage of data used", color="tab:blue")
    ax1.tick_params(axis="y", labelcolor="tab:blue")
    ax1.set_ylim(0, 105)
    ax2.set_ylabel("percentage of wrong decisions (±2 se, pair-clustered)", color="tab:red")
    ax2.tick_params(axis="y", labelcolor="tab:red")
    ax2.set_ylim(0, max(1.0, 1.15 * float(top)))
    h1, l1 = ax1.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    fig.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower center", ncol=3, frameon=False)
    ax1.set_title(f"Austerity, synthetic logistic regression\nN = {n}, d = {cfg['d_features']}+1, batch {cfg['batch_size']}, "
                  f"{cfg['pairs']}x{cfg['keys_per_pair']} decisions", fontsize=9)
    C.finish_figure(fig, os.path.dirname(png), os.path.basename(png), rect=(0, 0.1, 1, 1), dpi=120)


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--n", type=int, default=12214, help="number of data items")
    ap.add_argument("--d", type=int, default=50, help="features (an intercept column is added)")
    ap.add_argument("--epsilons", default="0,0.001,0.01,0.05,0.1,0.2")
    ap.add_argument("--errors", default="0.001,0.01,0.05,0.1,0.2",
                    help="per-step error targets for Austerity(error=...) ('' for none)")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--pairs", type=int, default=200, help="(theta, theta') pairs")
    ap.add_argument("--keys", type=int, default=250, help="keys (u and subsample order) per pair")
    ap.add_argument("--target-accept", type=float, default=0.234)
    ap.add_argument("--prior-scale", type=float, default=10.0)
    C.add_run_options(ap, C.RESULTS, out_help="directory for decision_error.json and decision_error.png",
                      smoke_help="tiny run (seconds) for tests")
    ap.add_argument("--plot-only", metavar="JSON", help="redraw the PNG from a results JSON and exit")
    args = ap.parse_args(argv[1:])
    if args.plot_only:
        with open(args.plot_only) as f:
            plot(json.load(f), os.path.splitext(args.plot_only)[0] + ".png")
        return 0
    if args.smoke:
        args.n, args.d, args.pairs, args.keys = 2000, 10, 4, 32
        args.epsilons = "0,0.1"
        args.errors = "0.1"
        args.batch_size = 100

    import tallmh as tm

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    eps_list = C.numbers(args.epsilons)
    err_list = [float(e) for e in args.errors.split(",") if e.strip()]
    data, _ = tm.models.LogisticRegression.simulate(args.n, d=args.d, seed=args.seed)
    model = tm.models.LogisticRegression(prior_scale=args.prior_scale)
    X = np.asarray(data["X"], np.float64)
    y = np.asarray(data["y"], np.float64)
    n, dim = X.shape
    theta_map, H, _ = C.logistic_newton(X, y, args.prior_scale**2, 50)
    cov = np.linalg.inv(H)
    post_sd = np.sqrt(np.diag(cov))
    rng = np.random.default_rng(args.seed + 1)
    thetas = theta_map + rng.standard_normal((args.pairs, dim)) @ np.linalg.cholesky(cov).T
    zs = rng.standard_normal((args.pairs, dim))
    sigma, deltas = C.tune_rw_sigma(X, y, thetas, zs, args.prior_scale**2, args.target_accept,
                                    1e-2 * post_sd.min(), 10 * post_sd.max())
    props = thetas + sigma * zs
    dlt = deltas(sigma)
    exact_prob = np.exp(np.minimum(0.0, dlt))
    print(f"# tallmh decision-error benchmark (austerity paper Fig. 2, synthetic data): N = {n}, "
          f"{args.d} features + intercept, {args.pairs} pairs x {args.keys} keys, batch {args.batch_size}")
    print(f"# {meta['platform']}, {meta['cpu_count']} CPUs, JAX {meta['jax_version']}, {meta['date']}")
    print(f"# theta ~ Laplace N(MAP, H^-1) (posterior sd mean {post_sd.mean():.3g}); theta' = theta + sigma z, "
          f"sigma = {sigma:.4g} tuned to exact acceptance {float(np.mean(exact_prob)):.3f}", flush=True)

    run = C.pair_decisions(tm, model, data, thetas, props, args.seed, args.keys)
    te = time.perf_counter()
    exact_acc, exact_nd = run(tm.acceptance.Exact())
    exact_s = time.perf_counter() - te

    def summarise(acc, nd, secs, test_repr):
        row, _ = C.wrong_decisions(acc, nd, exact_acc, n)
        per_pair_frac = nd.mean(axis=1)
        return {
            "test": test_repr,
            **row,
            "data_fraction_se": (float(per_pair_frac.std(ddof=1) / math.sqrt(args.pairs) / n) if args.pairs > 1
                                 else float("nan")),
            "exact_acceptance_rate": float(exact_acc.mean()),
            "seconds": secs,
        }

    def show(label, row):
        print(f"  {label:<24s} data {100 * row['data_fraction']:7.2f}%  wrong {100 * row['wrong_rate']:6.3f}% "
              f"(binomial se {100 * row['wrong_rate_binomial_se']:.3f}%, pair-clustered se "
              f"{100 * row['wrong_rate_pair_clustered_se']:.3f}%; max over pairs "
              f"{100 * row['max_pair_wrong_rate']:.1f}%)  {row['seconds']:.1f}s", flush=True)

    rows = []
    for eps in eps_list:
        tr = time.perf_counter()
        if eps == 0.0:
            acc, nd = exact_acc, exact_nd
            test_repr = "Exact() (epsilon = 0 is exact MH)"
            secs = exact_s
            worst = 0.0
        else:
            test = tm.acceptance.Austerity(epsilon=eps, batch_size=args.batch_size)
            acc, nd = run(test)
            test_repr = repr(test)
            secs = time.perf_counter() - tr
            worst = test.worst_case_error(n)
        row = {"form": "epsilon", "epsilon": eps, **summarise(acc, nd, secs, test_repr),
               "per_look_epsilon": eps, "worst_case_step_error": worst}
        rows.append(row)
        show(f"eps {eps:g}", row)

    error_rows = []
    for target in err_list:
        tr = time.perf_counter()
        test = tm.acceptance.Austerity(error=target, batch_size=args.batch_size)
        alpha = test.per_look_epsilon(n)
        design_s = time.perf_counter() - tr
        acc, nd = run(test)
        secs = time.perf_counter() - tr
        row = {"form": "error", "error": target, **summarise(acc, nd, secs, repr(test)),
               "per_look_epsilon": alpha, "worst_case_step_error": test.worst_case_error(n),
               "design_seconds": design_s}
        error_rows.append(row)
        show(f"error {target:g} (eps {alpha:.3g})", row)

    total_s = time.perf_counter() - t_start
    print()
    def label(r):
        return (f"error={r['error']:g}" if r["form"] == "error" else
                ("exact" if r["epsilon"] == 0 else f"epsilon={r['epsilon']:g}"))

    pc = C.percent
    C.print_table(rows + error_rows, [
        ("test", ">24s", label), ("per-look", "9.3g", "per_look_epsilon"),
        ("worst %", "8.2f", pc("worst_case_step_error")), ("data %", "8.2f", pc("data_fraction")),
        ("wrong %", "8.3f", pc("wrong_rate")), ("binom se %", "10.3f", pc("wrong_rate_binomial_se")),
        ("pair se %", "9.3f", pc("wrong_rate_pair_clustered_se")),
        ("max pair %", "10.1f", pc("max_pair_wrong_rate")), ("wrong acc %", "11.3f", pc("wrong_accept_rate")),
        ("wrong rej %", "11.3f", pc("wrong_reject_rate")), ("accept", "7.3f", "acceptance_rate")])
    print(f"(exact acceptance over the same keys: {exact_acc.mean():.3f}; mean exact acceptance probability "
          f"min(1, e^Delta) of the pairs: {exact_prob.mean():.3f})")
    print(f"\ntotal runtime {total_s:.1f}s", flush=True)

    out = {
        "benchmark": "decision_error",
        "meta": meta,
        "config": {
            "N": n,
            "d_features": args.d,
            "intercept": True,
            "model": f"LogisticRegression(prior_scale={args.prior_scale})",
            "data": f"LogisticRegression.simulate({args.n}, d={args.d}, seed={args.seed})",
            "epsilons": eps_list,
            "errors": err_list,
            "batch_size": args.batch_size,
            "pairs": args.pairs,
            "keys_per_pair": args.keys,
            "pairs_from": "theta ~ Laplace N(MAP, H^-1); theta' = theta + sigma z",
            "rw_sigma": sigma,
            "target_accept": args.target_accept,
            "tuned_exact_acceptance_probability": float(exact_prob.mean()),
            "posterior_sd_mean": float(post_sd.mean()),
            "seed": args.seed,
            "smoke": args.smoke,
        },
        "pairs_summary": {
            "delta_quantiles": {q: float(np.quantile(dlt, float(q))) for q in ("0.05", "0.25", "0.5", "0.75", "0.95")},
        },
        "rows": rows,
        "error_rows": error_rows,
        "total_runtime_s": total_s,
    }
    C.write_json(args.out, "decision_error.json", out)

    plot(out, os.path.join(args.out, "decision_error.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
