"""How the cost of one MH step grows with N: items of data read per step and wall time per step.

Bayesian logistic regression (``tm.models.LogisticRegression(prior_scale=10)``, 10 standard-normal
features plus an intercept, data from ``LogisticRegression.simulate(N, d=10, seed=0)``) for
N = 1e4, 1e5, 1e6, 1e7, with four acceptance tests: exact MH, austerity (epsilon 0.05, batch 500),
the confidence test MHSubLhd (delta 0.01, Bernstein-Serfling, initial batch 500, range C from the
model's bound ||theta' - theta|| max_i ||x_i||, so no full pass per step) and minibatch Barker (batch
500, delta 0.5). Each (N, test) cell is one ``tm.sample`` chain; we report the mean number of data
items the test read per step (``result.stats["n_data"]``), the wall time per step (``sampling_s`` /
steps, compile time reported separately), the acceptance rate, and the fitted slope of
log10(items/step) and log10(time/step) against log10(N) (``numpy.polyfit``), over all sizes and over
the last two sizes (the local, large-N slope).

Proposal: a FIXED Gaussian random walk, sd 0.01 in every coordinate, the same for every N. This is the
setting of the probabilistic-programs paper (Chen, Mansinghka & Ghahramani, Sec. 4.1.1: epsilon 0.01,
fixed proposal sd 0.1, "the same current and proposed parameter value for all dataset sizes"), in
which a subsampled test needs a number of items that does not grow with N: the mean log-likelihood
ratio mu = (1/N) sum_i l_i of a fixed move stays O(1) while the threshold mu0 = log(u)/N -> 0, so
the t-statistic crosses its critical value after O((sd(l)/mu)^2) items, independent of N.

Start: every chain starts at the MAP of its own data set (a few Newton steps in float64, printed with
the posterior sd of the Laplace approximation). The MAP is where a converged chain lives, and starting
there removes burn-in drift, which would otherwise differ between N. The price of a fixed proposal is
that it does not track the posterior: the posterior sd shrinks like N^-1/2 (about 2e-2 at N = 1e4, 6e-4
at N = 1e7 for these data), so sd 0.01 is about half a posterior sd at N = 1e4 but about 15 posterior
sds at N = 1e7. At large N nearly every proposal is rejected and the chain stays at the MAP; the
decisions measured there are (MAP, MAP + 0.01 z) decisions, like the "same current and proposed
parameter" of the paper's Fig. 5b. This is NOT the equilibrium regime of an efficient sampler, where
the proposal sd shrinks like N^-1/2 and the adaptive-subsampling paper (Bardenet et al., Sec. 3.2.2)
shows the subsampled tests need t proportional to N items. ``--proposal scaled`` runs that regime
(sd = 2.38/sqrt(d) times the Laplace posterior sd per coordinate, Roberts & Rosenthal) for comparison.

Steps: ``--steps`` per chain, but a cell whose predicted cost is above ``--cell-seconds`` gets fewer
steps (at least ``--min-steps``): the time per step is predicted from the same test at the previous,
smaller N, scaled linearly in N (an upper bound when the growth is sublinear). So exact MH (and any test
that reads everything) uses fewer steps at large N. The number of steps of each cell is in the table.

Usage::

    python benchmarks/scaling.py                       # full run, writes benchmarks/results/scaling.json
    python benchmarks/scaling.py --smoke --out /tmp/x  # seconds: N = 1e3, 1e4, a few steps
    python benchmarks/scaling.py --proposal scaled     # writes benchmarks/results/scaling_scaled.json

Timings are wall-clock on whatever machine runs this; the JSON records platform, CPU count, JAX
version, date and the command line.
"""

from __future__ import annotations

import math
import os
import sys
import time

import numpy as np

import _common as C


def make_tests(tm):
    return [
        ("exact", tm.acceptance.Exact()),
        ("austerity", tm.acceptance.Austerity(epsilon=0.05, batch_size=500)),
        ("confidence", tm.acceptance.Confidence(delta=0.01, bound="bernstein-serfling", initial_batch=500)),
        ("barker", tm.acceptance.Barker(batch_size=500, delta=0.5)),
    ]


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--sizes", default="1e4,1e5,1e6,1e7", help="comma-separated N values")
    ap.add_argument("--steps", type=int, default=1000, help="MH steps per chain (before the time cap)")
    ap.add_argument("--min-steps", type=int, default=20, help="fewest steps of a capped cell")
    ap.add_argument("--cell-seconds", type=float, default=20.0,
                    help="predicted sampling time above which a cell gets fewer steps")
    ap.add_argument("--proposal", choices=["fixed", "scaled"], default="fixed",
                    help="fixed: sd --rw-sd for every N; scaled: 2.38/sqrt(d) x Laplace posterior sd")
    ap.add_argument("--rw-sd", type=float, default=0.01, help="random-walk sd per coordinate (fixed proposal)")
    ap.add_argument("--tests", default="exact,austerity,confidence,barker")
    C.add_run_options(ap, C.RESULTS,
                      out_help="directory for scaling.json (scaling_scaled.json with --proposal scaled)",
                      smoke_help="tiny run (N = 1e3, 1e4; few steps) for tests")
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.sizes = "1e3,1e4"
        args.steps = 20
        args.min_steps = 10

    import jax

    import tallmh as tm

    t_start = time.perf_counter()
    sizes = C.numbers(args.sizes, int)
    wanted = [s.strip() for s in args.tests.split(",") if s.strip()]
    tests = [(name, t) for name, t in make_tests(tm) if name in wanted]
    d = 10
    prior_scale = 10.0
    model = tm.models.LogisticRegression(prior_scale=prior_scale)
    meta = C.machine_info(argv, jax_devices=[str(dv) for dv in jax.devices()],
                          xla_flags=os.environ.get("XLA_FLAGS", ""))
    print(f"# tallmh scaling benchmark: logistic regression, d = {d} + intercept, proposal {args.proposal}"
          f"{f' (sd {args.rw_sd})' if args.proposal == 'fixed' else ''}", flush=True)
    print(f"# {meta['platform']}, {meta['cpu_count']} CPUs, JAX {meta['jax_version']} ({meta['jax_backend']}), "
          f"{meta['date']}", flush=True)

    rows = []
    per_n = []
    prev_time = {}  # test -> (N, seconds per step)
    for n in sizes:
        tg = time.perf_counter()
        data, theta_true = tm.models.LogisticRegression.simulate(n, d=d, seed=args.seed)
        theta_map, H, _ = C.logistic_newton(data["X"], data["y"], prior_scale**2, 30)
        post_sd = np.sqrt(np.diag(np.linalg.inv(H)))
        gen_s = time.perf_counter() - tg
        if args.proposal == "fixed":
            scale = args.rw_sd
            sd_vec = np.full(d + 1, args.rw_sd)
        else:
            sd_vec = 2.38 / math.sqrt(d + 1) * post_sd
            scale = sd_vec
        info_n = {
            "N": n,
            "posterior_sd_mean": float(post_sd.mean()),
            "proposal_sd_mean": float(np.mean(sd_vec)),
            "proposal_sd_over_posterior_sd": float(np.mean(sd_vec / post_sd)),
            "map_minus_true_norm": float(np.linalg.norm(theta_map - theta_true)),
            "data_and_map_s": gen_s,
        }
        per_n.append(info_n)
        print(f"# N = {n:.0e}: Laplace posterior sd (mean over coords) {post_sd.mean():.2e}, proposal sd "
              f"{np.mean(sd_vec):.2e} = {np.mean(sd_vec / post_sd):.2f} posterior sd; data + MAP {gen_s:.1f}s",
              flush=True)
        for name, test in tests:
            steps = args.steps
            if name in prev_time:
                n0, s0 = prev_time[name]
                predicted = s0 * n / n0 * steps
                if predicted > args.cell_seconds:
                    steps = max(args.min_steps, int(args.cell_seconds / (s0 * n / n0)))
                    steps = min(steps, args.steps)
            r = tm.sample(model, data, test=test, proposal=tm.proposals.RandomWalk(scale), num_samples=steps,
                          num_warmup=0, num_chains=1, seed=args.seed, init=np.asarray(theta_map, np.float32),
                          progress=False)
            nd = np.asarray(r.stats["n_data"], float).ravel()
            secs = r.timings["sampling_s"]
            per_step = secs / steps
            prev_time[name] = (n, per_step)
            row = {
                "N": n,
                "test": name,
                "steps": steps,
                "acceptance_rate": float(np.mean(r.stats["accepted"])),
                "items_per_step": float(nd.mean()),
                "items_per_step_se": float(nd.std(ddof=1) / math.sqrt(nd.size)) if nd.size > 1 else float("nan"),
                "items_per_step_median": float(np.median(nd)),
                "items_per_step_max": float(nd.max()),
                "data_fraction": float(nd.mean() / n),
                "rounds_per_step": float(np.mean(r.stats["rounds"])),
                "sampling_s": float(secs),
                "seconds_per_step": float(per_step),
                "compile_s": float(r.timings["compile_s"]),
                "setup_items": int(r.setup_items),
            }
            rows.append(row)
            print(f"  {name:<11s} steps {steps:5d}  acc {row['acceptance_rate']:.3f}  items/step "
                  f"{row['items_per_step']:12.1f}  frac {row['data_fraction']:.3g}  ms/step {1e3 * per_step:9.3f}"
                  f"  compile {row['compile_s']:.2f}s", flush=True)
        del data
        jax.clear_caches()

    slopes = {}
    for name, _ in tests:
        rs = [r for r in rows if r["test"] == name]
        ns = [r["N"] for r in rs]
        it = [r["items_per_step"] for r in rs]
        tt = [r["seconds_per_step"] for r in rs]
        slopes[name] = {
            "items_slope_all": C.slope(ns, it),
            "time_slope_all": C.slope(ns, tt),
            "items_slope_last2": C.slope(ns[-2:], it[-2:]),
            "time_slope_last2": C.slope(ns[-2:], tt[-2:]),
        }

    total = time.perf_counter() - t_start
    print()
    C.print_table(rows, [("N", "9.0e", "N"), ("test", "<11s", "test"), ("steps", "5d", "steps"),
                         ("accept", "6.3f", "acceptance_rate"), ("items/step", "12.1f", "items_per_step"),
                         ("data frac", "9.3g", "data_fraction"),
                         ("ms/step", "9.3f", lambda r: 1e3 * r["seconds_per_step"]),
                         ("compile s", "9.2f", "compile_s")])
    print()
    print(f"log-log slopes vs N (polyfit over N = {', '.join(f'{n:.0e}' for n in sizes)}; 'last2' = "
          f"{sizes[-2]:.0e}..{sizes[-1]:.0e} only)" if len(sizes) > 1 else "log-log slopes: need 2 sizes")
    C.print_table([{"test": name, **s} for name, s in slopes.items()],
                  [("test", "<11s", "test"), ("items slope", "11.3f", "items_slope_all"),
                   ("time slope", "10.3f", "time_slope_all"), ("items last2", "11.3f", "items_slope_last2"),
                   ("time last2", "10.3f", "time_slope_last2")])
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {
        "benchmark": "scaling",
        "meta": meta,
        "config": {
            "model": "LogisticRegression(prior_scale=10.0)",
            "d_features": d,
            "intercept": True,
            "sizes": sizes,
            "steps": args.steps,
            "min_steps": args.min_steps,
            "cell_seconds": args.cell_seconds,
            "proposal": args.proposal,
            "rw_sd": args.rw_sd if args.proposal == "fixed" else None,
            "start": "MAP (Newton, float64)",
            "num_chains": 1,
            "seed": args.seed,
            "smoke": args.smoke,
            "tests": {name: repr(t) for name, t in tests},
        },
        "per_n": per_n,
        "rows": rows,
        "slopes": slopes,
        "total_runtime_s": total,
    }
    C.write_json(args.out, "scaling.json" if args.proposal == "fixed" else "scaling_scaled.json", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
