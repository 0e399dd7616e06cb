"""Adaptive-subsampling paper Sec. 4.1, Fig. 4: where the austerity t-test goes wrong on the sigma marginal.

Bardenet, Doucet & Holmes (2014), Sec. 4.1: N = 10^5 synthetic items, a N(mu, sigma^2) model with flat
priors (tallmh's ``models.Gaussian``: theta = (mu, log sigma), flat in theta), and the marginal posterior
of sigma from

- the approximate MH test of Korattikara et al. (``Austerity``) at level epsilon = 0.05, starting each
  iteration with t = 2 items (Fig. 4a) and with t = 500 (Fig. 4b, 4c);
- their MHSubLhd (``Confidence``: empirical Bernstein-Serfling bound, p = 2, gamma = 2, delta = 0.01, the
  settings of their Sec. 4), started with the same t;

for data ``X ~ N(0, 0.1^2)`` (panels a, b) and ``X ~ logN(0, 2)`` (panel c; we read the 2 as the variance
of log X: ``X = exp(sqrt(2) Z)``). All chains are adaptive Metropolis with a 50% target acceptance (their
Sec. 4: "50% else", for d <= 2), start at the posterior mode (mean(x), log sd(x)), and run ``--warmup``
adaptation steps then ``--samples`` draws (the paper does not give its run lengths). ``Austerity(eps,
batch_size=t)`` reads t more items at each look (Korattikara et al.'s Alg. 1 with minibatch m = t);
``Confidence(initial_batch=t)`` grows geometrically by gamma.

The confidence test needs the range ``C = max_i |l_i|``. For this model ``l(x) = log N(x|mu', s'^2) -
log N(x|mu, s^2)`` is a quadratic in x, so its largest size over ``[min x, max x]`` is at an end or at the
vertex: the bound ``GaussianWithBound.lik_ratio_bound`` evaluates l there (min and max computed once at
set-up, one pass, counted as set-up items). The ends are data items, so this is the naive
``max_i |l_i|`` unless the vertex wins: tight, and no full pass per step.

Reference: the exact marginal of sigma is one-dimensional: integrating mu out of the flat-prior posterior
gives ``p(sigma | x) ∝ sigma^-N exp(-S / (2 sigma^2))``, ``S = sum (x_i - mean x)^2``, computed on a grid in
float64; its maximum is at the empirical sd ``sqrt(S/N)`` (the paper's red triangle). An exact-MH chain
with the same proposal scheme is run as a check of the MCMC itself.

Reported per run: the data fraction (mean items read per step / N), acceptance, the sigma marginal's
mean and sd against the exact ones, the location of its maximum (Gaussian KDE) relative to the true
maximum (the paper: "off by 7%" for t = 2), and the total-variation distance between the binned draws
and the exact marginal.

Usage::

    python benchmarks/papers/adaptive_fig4.py               # ~6 min on 2 cores
    python benchmarks/papers/adaptive_fig4.py --smoke --out /tmp/x
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C


def build_model(tm, jnp):
    class GaussianWithBound(tm.models.Gaussian):
        """``models.Gaussian`` plus the exact sup over the data's range of ``|l(x)|`` as the confidence range C."""

        def setup(self, data):
            x = jnp.asarray(data["x"])
            return {"x_min": jnp.min(x), "x_max": jnp.max(x)}

        def lik_ratio_bound(self, theta, theta_prop, stats):
            # l(x) = A x^2 + B x + const: vertex at -B / (2 A)
            a = 0.5 * (jnp.exp(-2.0 * theta[1]) - jnp.exp(-2.0 * theta_prop[1]))
            b = theta_prop[0] * jnp.exp(-2.0 * theta_prop[1]) - theta[0] * jnp.exp(-2.0 * theta[1])
            safe_a = jnp.where(a != 0, a, 1.0)
            vertex = jnp.where(a != 0, -b / (2.0 * safe_a), stats["x_min"])
            pts = jnp.stack([stats["x_min"], stats["x_max"], jnp.clip(vertex, stats["x_min"], stats["x_max"])])
            l = self.log_lik(theta_prop, {"x": pts}) - self.log_lik(theta, {"x": pts})
            return jnp.max(jnp.abs(l)) * (1.0 + 1e-4)  # float32 rounding headroom

    return GaussianWithBound()


def exact_sigma_marginal(x):
    x = np.asarray(x, np.float64)
    n = x.size
    s = float(np.sum((x - x.mean()) ** 2))
    mode = np.sqrt(s / n)
    sd = mode / np.sqrt(2.0 * n)
    grid = np.linspace(mode - 12 * sd, mode + 12 * sd, 20001)
    logp = -n * np.log(grid) - s / (2.0 * grid**2)
    dens = np.exp(logp - logp.max())
    dens /= np.trapezoid(dens, grid)
    mean = np.trapezoid(grid * dens, grid)
    return {"grid": grid, "density": dens, "mode": float(mode), "mean": float(mean),
            "sd": float(np.sqrt(np.trapezoid((grid - mean) ** 2 * dens, grid)))}


def compare(sig, ref):
    from scipy.stats import gaussian_kde

    lo, hi = min(sig.min(), ref["grid"][0]), max(sig.max(), ref["grid"][-1])
    width = ref["sd"] / 4.0
    nb = int(min(20000, np.ceil((hi - lo) / width)))
    edges = np.linspace(lo, hi + 1e-12, nb + 1)
    counts, _ = np.histogram(sig, edges)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (ref["density"][1:] + ref["density"][:-1]) * np.diff(ref["grid"]))])
    cdf /= cdf[-1]
    p_true = np.diff(np.interp(edges, ref["grid"], cdf, left=0.0, right=1.0))
    tv = 0.5 * float(np.sum(np.abs(counts / counts.sum() - p_true)))
    if np.std(sig) > 0:
        kde = gaussian_kde(sig)
        g = np.linspace(sig.min(), sig.max(), 2001)
        kde_mode = float(g[np.argmax(kde(g))])
    else:
        kde_mode = float(sig[0])
    return {"sigma_mean": float(sig.mean()), "sigma_sd": float(sig.std()),
            "mean_rel_err": float(sig.mean() / ref["mean"] - 1.0), "sd_ratio": float(sig.std() / ref["sd"]),
            "kde_mode": kde_mode, "mode_rel_err": float(kde_mode / ref["mode"] - 1.0), "tv_distance_binned": tv}


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    C.add_options(ap, n=100_000, epsilon=0.05, delta=0.01, samples=4000, warmup=1000)
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.samples, args.warmup = 5000, 150, 50

    import jax.numpy as jnp

    import tallmh as tm

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("adaptive subsampling Sec. 4.1 / Fig. 4: sigma marginal, austerity t-test vs confidence test", meta)
    rng = np.random.default_rng(args.seed)
    datasets = {
        "normal": (0.1 * rng.standard_normal(args.n)).astype(np.float32),
        "lognormal": np.exp(np.sqrt(2.0) * rng.standard_normal(args.n)).astype(np.float32),
    }
    model = build_model(tm, jnp)
    eps, delta = args.epsilon, args.delta
    # (panel, dataset, t): the paper's three panels; plus t = 2 on the log-normal data
    panels = [("a", "normal", 2), ("b", "normal", 500), ("c", "lognormal", 500), ("d", "lognormal", 2)]
    if args.smoke:
        panels = [("a", "normal", 2)]
    refs = {k: exact_sigma_marginal(v) for k, v in datasets.items()}
    for k, r in refs.items():
        print(f"# {k}: N = {args.n}, empirical sd (true max of the sigma marginal) {r['mode']:.5f}, exact marginal "
              f"mean {r['mean']:.5f} sd {r['sd']:.2e}; x range [{datasets[k].min():.3g}, {datasets[k].max():.3g}]", flush=True)

    rows = []
    draws = {}

    def run(dname, key, label, test):
        x = datasets[dname]
        init = jnp.array([float(np.mean(x, dtype=np.float64)), float(np.log(np.std(x, dtype=np.float64)))])
        r = tm.sample(model, {"x": x}, test=test, proposal=tm.proposals.AdaptiveMetropolis(target_accept=0.5),
                      num_samples=args.samples, num_warmup=args.warmup, num_chains=1, seed=args.seed,
                      init=init, progress=False)
        sig = np.exp(np.asarray(r.samples, np.float64)[0, :, 1])
        nd = np.asarray(r.stats["n_data"], np.float64)
        row = {"dataset": dname, "run": key, "label": label, "test": repr(test),
               "data_fraction": float(nd.mean() / args.n),
               "data_fraction_warmup": float(np.mean(r.warmup_stats["n_data"]) / args.n) if args.warmup else None,
               "acceptance_rate": float(np.mean(r.stats["accepted"])),
               "setup_items": int(r.setup_items),
               "timings": {k: round(float(v), 3) for k, v in r.timings.items()},
               "ms_per_step": 1e3 * r.timings["sampling_s"] / args.samples}
        row.update(compare(sig, refs[dname]))
        rows.append(row)
        draws[(dname, key)] = sig
        print(f"  {dname:9s} {label:24s} data {100 * row['data_fraction']:7.3f}%  accept {row['acceptance_rate']:.2f}  "
              f"sigma mean {row['mean_rel_err']:+.2%}  mode {row['mode_rel_err']:+.2%}  sd x{row['sd_ratio']:.2f}  "
              f"TV {row['tv_distance_binned']:.2f}  {row['ms_per_step']:.2f} ms/step, compile {r.timings['compile_s']:.1f}s",
              flush=True)

    for dname in sorted({p[1] for p in panels}, reverse=True):
        run(dname, "exact", "exact MH", tm.acceptance.Exact())
    done = set()
    for _, dname, t in panels:
        if (dname, t) in done:
            continue
        done.add((dname, t))
        run(dname, f"austerity_t{t}", f"austerity eps={eps:g}, t={t}", tm.acceptance.Austerity(epsilon=eps, batch_size=t))
        run(dname, f"confidence_t{t}", f"confidence d={delta:g}, t={t}",
            tm.acceptance.Confidence(delta=delta, bound="bernstein-serfling", p=2, gamma=2.0, initial_batch=t))

    total = time.perf_counter() - t_start
    print()
    C.print_table(rows, [("data", "9s", "dataset"), ("run", "24s", "label"),
                         ("data %", "8.3f", C.percent("data_fraction")), ("accept", "6.2f", "acceptance_rate"),
                         ("mean err", "+9.2%", "mean_rel_err"),
                         ("mode err", "+9.2%", "mode_rel_err"), ("sd ratio", "8.2f", "sd_ratio"),
                         ("TV", "5.2f", "tv_distance_binned"), ("ms/step", "8.2f", "ms_per_step")])
    print("(errors relative to the exact sigma marginal; mode = maximum of a Gaussian KDE of the draws vs the empirical sd)")
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {
        "benchmark": "adaptive_fig4",
        "meta": meta,
        "config": {"N": args.n, "epsilon": eps, "delta": delta, "p": 2, "gamma": 2.0, "bound": "bernstein-serfling",
                   "samples": args.samples, "warmup": args.warmup, "chains": 1, "seed": args.seed,
                   "proposal": "AdaptiveMetropolis(target_accept=0.5)",
                   "datasets": {"normal": "0.1 * N(0, 1)", "lognormal": "exp(sqrt(2) * N(0, 1)), i.e. logN(0, variance 2)"},
                   "panels": panels, "smoke": args.smoke},
        "paper": {"fig4a_austerity_t2_mode_off_percent": 7.0,
                  "text": "t = 500 works better for N(0, 0.1^2) but fails dramatically for logN(0, 2); MHSubLhd gives "
                          "better marginals at the price of more data, essentially the whole dataset for logN(0, 2)"},
        "exact_marginals": {k: {kk: r[kk] for kk in ("mode", "mean", "sd")} for k, r in refs.items()},
        "rows": rows,
        "total_runtime_s": total,
    }
    C.write_json(args.out, "adaptive_fig4.json", out)

    from scipy.stats import gaussian_kde

    fig, axes = C.figure(1, len(panels), figsize=(4.2 * len(panels), 4.2))
    axes = np.atleast_1d(axes)
    for ax, (letter, dname, t) in zip(axes, panels):
        ref = refs[dname]
        curves = [("exact", "exact MH", "0.5", "-"), (f"austerity_t{t}", f"austerity t={t}", "tab:red", "-"),
                  (f"confidence_t{t}", f"confidence t={t}", "tab:blue", "--")]
        xs = [draws[(dname, k)] for k, *_ in curves]
        lo = min(min(np.quantile(v, 0.001) for v in xs), ref["grid"][0])
        hi = max(max(np.quantile(v, 0.999) for v in xs), ref["grid"][-1])
        g = np.linspace(lo, hi, 800)
        ax.plot(ref["grid"], ref["density"], "k-", lw=2.5, alpha=0.35, label="exact marginal")
        for (k, lab, col, ls), v in zip(curves, xs):
            row = next(r for r in rows if r["dataset"] == dname and r["run"] == k)
            dens = gaussian_kde(v)(g) if np.std(v) > 0 else np.zeros_like(g)
            ax.plot(g, dens, color=col, ls=ls, lw=1.3, label=f"{lab} ({100 * row['data_fraction']:.1f}% data)")
        ax.plot([ref["mode"]], [0], marker="^", color="red", ms=10, clip_on=False)
        ax.set_xlim(lo, hi)
        ax.set_xlabel(r"$\sigma$")
        ax.set_title(f"({letter}) X ~ {'N(0, 0.1^2)' if dname == 'normal' else 'logN(0, 2)'}, t = {t}", fontsize=9)
        ax.legend(fontsize=7)
        ax.tick_params(labelsize=7)
    C.finish_figure(fig, args.out, "adaptive_fig4.png",
                    suptitle=f"Adaptive subsampling Fig. 4: sigma marginals, N = {args.n}, austerity eps = {eps:g}, "
                             f"confidence delta = {delta:g}; {args.samples} draws each")
    return 0


if __name__ == "__main__":
    sys.exit(main())
