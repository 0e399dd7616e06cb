"""Austerity paper Fig. 8 (Sec. 5.4): uncorrected SGLD versus MH-corrected Langevin on 1-D L1-regularised linear regression.

Korattikara, Chen & Welling (2014), Sec. 5.4. Model (their words): Gaussian error model
``p(y|x, theta) ∝ exp(-lambda/2 (y - theta x)^2)`` and Laplace prior ``p(theta) ∝ exp(-lambda0 |theta|)``,
theta and x one-dimensional, N = 10,000 synthetic items ``y_i = 0.5 x_i + xi``, ``xi ~ N(0, 1/3)``,
lambda = 3 (the noise precision, matching var(xi) = 1/3), lambda0 = 4950 (the Laplace prior's rate,
"so that the prior is not washed out by the likelihood"). alpha = 5e-6 is the SGLD step size: the
proposal is eq. (13), ``theta' ~ N(theta + alpha/2 grad{(N/n) sum_{x in X_n} log p(x|theta) + log rho(theta)},
alpha)``, which is ``tm.proposals.Langevin(step_size=alpha, batch_size=n)``.

What the paper does not state, and what we chose:

- the distribution of x: ``x_i ~ Uniform(-1, 1)``. With E[x^2] = 1/3, the likelihood's pull at
  theta = 0, ``lambda sum x_i y_i ≈ 3 * 0.5 * N/3 = 5000``, is just above lambda0 = 4950, which is what "the
  prior is not washed out" needs (the posterior mode sits near 0 with a steep wall on the left, the
  "valley" of Fig. 8(a,b)); with x ~ N(0, 1) the mode would be at 0.34 and the prior irrelevant.
- the minibatch size n: 500 for the SGLD gradient and 500 for the austerity test's batches. The paper
  says that at epsilon = 0.5 the test "uses only 5% of the data per test, which is no more than the size
  of the mini-batch we used in the SGLD proposal", and that "a decision is always made in the first
  step": 5% of 10,000 = 500.
- start at the posterior mode, 1,000 burn-in steps (not in the paper), then 100,000 samples (the
  paper's count), one chain per sampler.

Samplers (all with the same Langevin proposal and seed): SGLD (``AlwaysAccept``: no test), exact MH
(``Exact``), austerity (``Austerity(0.1, 500)`` and ``Austerity(0.5, 500)``). The proposal ratio of each
step uses the same minibatch both ways (Sec. 5.4, eq. 14); that is how ``Langevin`` works.

The true posterior is 1-D: its density is computed on a fine grid (float64) and normalised by the
trapezoidal rule. Reported per sampler: mean and sd against the true ones, the total-variation distance
between the histogram (bins of width ``--bin-width``) and the true bin probabilities, the
Kolmogorov-Smirnov distance to the true CDF (the draws are autocorrelated, so no p-value), the acceptance
rate, and the data fraction per step: the test's items / N (the paper's number), and separately with
the 2 x 500 items of the Langevin gradients (``result.stats["n_data"]`` counts those too).

Usage::

    python benchmarks/papers/austerity_fig8_sgld.py              # ~3 min on 2 cores
    python benchmarks/papers/austerity_fig8_sgld.py --smoke --out /tmp/x
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, n)
    y = 0.5 * x + rng.normal(0.0, np.sqrt(1.0 / 3.0), n)
    return x, y


def true_posterior(x, y, lam, lam0, halfwidth_sd=12.0, points=200_001):
    """Grid, density and gradient of the log posterior (float64)."""
    sxx, sxy, syy = float(np.sum(x * x)), float(np.sum(x * y)), float(np.sum(y * y))

    def logp(t):
        return -lam0 * np.abs(t) - 0.5 * lam * (syy - 2.0 * t * sxy + t * t * sxx)

    # locate the mode, then a grid wide enough for both sides
    coarse = np.linspace(-1.0, 1.0, 200_001)
    mode = coarse[np.argmax(logp(coarse))]
    sd_guess = 1.0 / np.sqrt(lam * sxx)
    grid = np.linspace(mode - halfwidth_sd * sd_guess, mode + halfwidth_sd * sd_guess, points)
    lp = logp(grid)
    dens = np.exp(lp - lp.max())
    dens /= np.trapezoid(dens, grid)
    grad = -lam0 * np.sign(grid) + lam * (sxy - grid * sxx)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
    cdf /= cdf[-1]
    mean = np.trapezoid(grid * dens, grid)
    sd = np.sqrt(np.trapezoid((grid - mean) ** 2 * dens, grid))
    return {"grid": grid, "density": dens, "grad": grad, "cdf": cdf, "mode": float(grid[np.argmax(dens)]),
            "mean": float(mean), "sd": float(sd), "sxx": sxx, "sxy": sxy}


def compare(samples, post, bin_width):
    g, cdf = post["grid"], post["cdf"]
    lo = min(samples.min(), g[0]) - bin_width
    hi = max(samples.max(), g[-1]) + bin_width
    edges = np.arange(np.floor(lo / bin_width), np.ceil(hi / bin_width) + 1) * bin_width
    counts, _ = np.histogram(samples, edges)
    p_true = np.diff(np.interp(edges, g, cdf, left=0.0, right=1.0))
    tv = 0.5 * float(np.sum(np.abs(counts / counts.sum() - p_true)))
    s = np.sort(samples)
    f_true = np.interp(s, g, cdf, left=0.0, right=1.0)
    k = np.arange(1, s.size + 1) / s.size
    ks = float(max(np.max(np.abs(k - f_true)), np.max(np.abs(k - 1.0 / s.size - f_true))))
    q999 = float(np.interp(0.999, cdf, g))
    return {
        "mean": float(samples.mean()),
        "sd": float(samples.std()),
        "mean_err_in_true_sd": float((samples.mean() - post["mean"]) / post["sd"]),
        "sd_ratio": float(samples.std() / post["sd"]),
        "tv_distance_binned": tv,
        "ks_distance": ks,
        "frac_beyond_true_q999": float(np.mean(samples > q999)),
        "quantiles": {q: float(np.quantile(samples, float(q))) for q in ("0.001", "0.025", "0.5", "0.975", "0.999")},
    }


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--lam", type=float, default=3.0, help="noise precision lambda")
    ap.add_argument("--lam0", type=float, default=4950.0, help="Laplace prior rate lambda0")
    ap.add_argument("--alpha", type=float, default=5e-6, help="SGLD step size")
    ap.add_argument("--batch", type=int, default=500, help="minibatch for the gradient and for austerity")
    C.add_options(ap, samples=100_000, warmup=1_000, bin_width=0.001)
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.samples, args.warmup, args.batch = 2000, 500, 50, 100
        args.lam0 = args.lam0 * args.n / 10_000  # keep the prior's pull comparable to the likelihood's

    import jax.numpy as jnp

    import tallmh as tm

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("austerity Fig. 8: SGLD vs MH-corrected Langevin, 1-D L1-regularised linear regression", meta)
    x, y = make_data(args.n, args.seed)
    post = true_posterior(x, y, args.lam, args.lam0)
    print(f"# N = {args.n}, lambda = {args.lam}, lambda0 = {args.lam0}, alpha = {args.alpha}, batch = {args.batch}; "
          f"lambda*sum(xy) = {args.lam * post['sxy']:.1f} vs lambda0 = {args.lam0}")
    print(f"# true posterior: mode {post['mode']:.5f}, mean {post['mean']:.5f}, sd {post['sd']:.5f}", flush=True)

    lam, lam0 = args.lam, args.lam0
    model = tm.Model(
        log_prior=lambda t: -lam0 * jnp.sum(jnp.abs(t)),
        log_lik=lambda t, b: -0.5 * lam * (b["y"] - t[0] * b["x"]) ** 2,
        name="l1-linear-regression-1d",
    )
    data = {"x": x.astype(np.float32), "y": y.astype(np.float32)}
    init = jnp.array([post["mode"]])
    runs = [
        ("sgld", "SGLD (no MH test)", tm.acceptance.AlwaysAccept()),
        ("exact", "exact MH", tm.acceptance.Exact()),
        ("austerity_0.1", "austerity eps = 0.1", tm.acceptance.Austerity(epsilon=0.1, batch_size=args.batch)),
        ("austerity_0.5", "austerity eps = 0.5", tm.acceptance.Austerity(epsilon=0.5, batch_size=args.batch)),
    ]
    if args.smoke:  # fewer compilations; austerity 0.5 runs the same code as 0.1
        runs = runs[:3]
    rows = []
    draws = {}
    grad_items = 2 * args.batch
    for key, label, test in runs:
        r = tm.sample(model, data, test=test, proposal=tm.proposals.Langevin(args.alpha, args.batch),
                      num_samples=args.samples, num_warmup=args.warmup, num_chains=1, seed=args.seed,
                      init=init, progress=False)
        s = np.asarray(r.samples)[0, :, 0].astype(np.float64)
        draws[key] = s
        nd = np.asarray(r.stats["n_data"], np.float64)
        row = {"sampler": key, "label": label, "test": repr(test),
               "acceptance_rate": float(np.mean(r.stats["accepted"])),
               "data_fraction_test": float((nd.mean() - grad_items) / args.n),
               "data_fraction_with_gradient": float(nd.mean() / args.n),
               "test_items_per_step_mean": float(nd.mean() - grad_items),
               "test_items_per_step_max": float(nd.max() - grad_items),
               "timings": {k: round(float(v), 3) for k, v in r.timings.items()},
               "us_per_step": 1e6 * r.timings["sampling_s"] / args.samples}
        row.update(compare(s, post, args.bin_width))
        row["ess_mean"] = tm.diagnostics.ess(s, method="mean")
        row["mcse_mean"] = tm.diagnostics.mcse_mean(s)
        row["mean_err_in_mcse"] = float((row["mean"] - post["mean"]) / row["mcse_mean"])
        rows.append(row)
        print(f"  {label:22s} accept {row['acceptance_rate']:.3f}  data/test {100 * row['data_fraction_test']:6.2f}% "
              f"(+grad {100 * row['data_fraction_with_gradient']:6.2f}%)  mean {row['mean']:.5f} sd {row['sd']:.5f} "
              f"(mean - true = {row['mean_err_in_mcse']:+.1f} MCSE, ESS {row['ess_mean']:.0f}) "
              f"TV {row['tv_distance_binned']:.3f} KS {row['ks_distance']:.3f}  "
              f"{row['us_per_step']:.0f} us/step, compile {r.timings['compile_s']:.1f}s", flush=True)

    total = time.perf_counter() - t_start
    print()
    paper = {"austerity_0.1": "14.2", "austerity_0.5": "~5", "exact": "100", "sgld": "0"}
    columns = [("sampler", "22s", "label"), ("accept", "6.3f", "acceptance_rate"),
               ("data %", "7.2f", C.percent("data_fraction_test")), ("paper %", ">7s", lambda r: paper[r["sampler"]]),
               ("mean", "9.5f", "mean"), ("err/MCSE", "+8.1f", "mean_err_in_mcse"), ("sd", "8.5f", "sd"),
               ("TV", "6.3f", "tv_distance_binned"), ("KS", "6.3f", "ks_distance"), ("us/step", "8.0f", "us_per_step")]
    print(C.table_header(columns))
    print(f"{'true posterior':22s} {'':>6s} {'':>7s} {'':>7s} {post['mean']:9.5f} {'':>8s} {post['sd']:8.5f}")
    for r in rows:
        print(C.table_row(r, columns))
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {
        "benchmark": "austerity_fig8_sgld",
        "meta": meta,
        "config": {"N": args.n, "lambda": lam, "lambda0": lam0, "alpha": args.alpha, "batch": args.batch,
                   "samples": args.samples, "warmup": args.warmup, "chains": 1, "seed": args.seed,
                   "x_distribution": "Uniform(-1, 1) (not stated in the paper; our choice)",
                   "noise": "N(0, 1/3)", "bin_width": args.bin_width, "smoke": args.smoke},
        "true_posterior": {k: post[k] for k in ("mode", "mean", "sd")},
        "paper": {"austerity_0.1_data_percent": 14.2, "austerity_0.5_data_percent": 5.0},
        "rows": rows,
        "total_runtime_s": total,
    }
    C.write_json(args.out, "austerity_fig8_sgld.json", out)

    fig, axes = C.figure(2, 3, figsize=(13, 7))
    g, dens = post["grid"], post["density"]
    lo = min(np.quantile(np.concatenate(list(draws.values())), 0.0005), g[dens > dens.max() * 1e-4][0])
    hi = max(np.quantile(np.concatenate(list(draws.values())), 0.9995), g[dens > dens.max() * 1e-4][-1])
    ax = axes[0, 0]
    ax.plot(g, dens, "b-")
    ax.set_title("(a) true posterior density", fontsize=9)
    ax.set_xlim(lo, hi)
    ax = axes[1, 0]
    ax.plot(g, post["grad"], "b-")
    ax.axhline(0, color="k", lw=0.5)
    ax.set_title("(b) gradient of the log posterior", fontsize=9)
    ax.set_xlim(lo, hi)
    edges = np.arange(np.floor(lo / args.bin_width), np.ceil(hi / args.bin_width) + 1) * args.bin_width
    for ax in [axes[0, 1], axes[0, 2], axes[1, 1], axes[1, 2]][len(rows):]:
        ax.axis("off")
    for ax, r, letter in zip([axes[0, 1], axes[0, 2], axes[1, 1], axes[1, 2]], rows, "cdef"):
        ax.hist(draws[r["sampler"]], bins=edges, density=True, color="tab:red", alpha=0.7)
        ax.plot(g, dens, "b-", lw=1)
        ax.set_xlim(lo, hi)
        frac = "" if r["sampler"] == "sgld" else f", data/test {100 * r['data_fraction_test']:.1f}%"
        ax.set_title(f"({letter}) {r['label']}{frac}\nTV {r['tv_distance_binned']:.3f}, accept "
                     f"{r['acceptance_rate']:.2f}", fontsize=9)
    for ax in axes.flat:
        ax.set_xlabel(r"$\theta$", fontsize=8)
        ax.tick_params(labelsize=7)
    C.finish_figure(fig, args.out, "austerity_fig8_sgld.png",
                    suptitle=f"Austerity Fig. 8: N = {args.n}, lambda = {lam:g}, lambda0 = {lam0:g}, "
                             f"alpha = {args.alpha:g}, batch {args.batch}, {args.samples} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
