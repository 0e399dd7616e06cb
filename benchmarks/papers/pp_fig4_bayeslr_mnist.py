"""Probabilistic-programs paper Fig. 4 through the NumPyro front end: BayesLR on MNIST 7 vs 9, risk vs time.

Chen, Mansinghka & Ghahramani, Sec. 4.1: Bayesian logistic regression, ``w ~ N(0, 0.1 I_D)`` (eq. 7),
trained on the 12,214 MNIST training images of 7 and 9 (50 principal components after normalisation),
"the same random walk proposal distribution" as Korattikara et al. (2014), minibatch 100; Fig. 4: risk of
the predictive mean on the 2,037 test images of 7 and 9 versus running time, exact MH against
subsampled MH (50 hours in Venture; subsampled MH reached exact MH's 50-hour risk in 5 hours).

Risk (Korattikara et al. 2014, Sec. 5.1): for each test image j, the chain's running estimate of the
predictive mean ``E[sigmoid(x_j . w) | data]`` after t seconds, squared error against a reference, mean
over the 2,037 images, averaged over ``--chains`` independent chains (the austerity paper averaged over
8 simulations).

Here:
- model: a NumPyro program (``w ~ Normal(0, sqrt(0.1))``, ``y ~ Bernoulli(logits = X @ w)`` in a plate)
  through ``tm.from_numpyro``;
- data: the training images of 7 (y = 0) and 9 (y = 1), pixels / 255, centred, top 50 principal
  components, each scaled to unit variance, plus an intercept (d = 51); the test images are projected
  with the training mean, components and scales (loaders shared with ``austerity_fig2_mnist.py``);
- reference predictive means: self-normalised importance sampling from the Laplace approximation
  (``--ref-draws`` draws from ``N(MAP, 1.2^2 H^-1)``, weights from the exact log posterior on all 12,214
  images; the weights' effective sample size is printed);
- proposal: the paper's random walk is isotropic with an unpublished sd; we use a random walk shaped by
  the Laplace covariance, ``N(w, (2.38^2/d) Sigma)`` (the same for every method); chains start where
  ``tm.sample`` starts them by default (posterior mode by Newton, dispersed by the Laplace approximation,
  so no burn-in is needed), ``--budget`` seconds of sampling each;
- methods: exact MH, and austerity (``Austerity(epsilon, batch_size=100)``) for each ``--epsilons``.

The time of each draw is interpolated from the runner's per-chunk timings (``callback``). By default each
chain is its own ``tm.sample`` call (``--budget / --chains`` seconds each; the risk at time t is averaged
over chains); ``--vmap`` runs all chains side by side in one call instead (one vmapped program: the
sequential tests of the chains then run in lockstep, so a step costs as much as the slowest chain's).

Usage::

    python benchmarks/papers/pp_fig4_bayeslr_mnist.py           # about 4 minutes on 2 cores
    python benchmarks/papers/pp_fig4_bayeslr_mnist.py --smoke --out /tmp/x
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings

import numpy as np

import _common as C
from austerity_fig2_mnist import WHERE, default_mnist_dir, find_files, laplace, read_idx

TEST_FILES = (("t10k-images.idx3-ubyte.gz", "t10k-images-idx3-ubyte.gz", "t10k-images.idx3-ubyte",
               "t10k-images-idx3-ubyte"),
              ("t10k-labels.idx1-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "t10k-labels.idx1-ubyte",
               "t10k-labels-idx1-ubyte"))


def mnist_train_test(folder, n_components):
    """Train and test features of 7 vs 9: PCA fitted on the training images, applied to both."""
    files = find_files(folder)
    test_paths = []
    for names in TEST_FILES:
        p = next((os.path.join(folder, nm) for nm in names if os.path.isfile(os.path.join(folder, nm))), None)
        test_paths.append(p)
    if files is None or None in test_paths:
        return None

    def pick(images, labels):
        keep = (labels == 7) | (labels == 9)
        return images[keep].reshape(int(keep.sum()), -1).astype(np.float64) / 255.0, (labels[keep] == 9).astype(float)

    Xtr, ytr = pick(read_idx(files["images"]), read_idx(files["labels"]))
    Xte, yte = pick(read_idx(test_paths[0]), read_idx(test_paths[1]))
    mean = Xtr.mean(axis=0)
    evals, evecs = np.linalg.eigh((Xtr - mean).T @ (Xtr - mean))
    comps = evecs[:, np.argsort(evals)[::-1][:n_components]]
    Ztr = (Xtr - mean) @ comps
    scale = Ztr.std(axis=0)
    Zte = (Xte - mean) @ comps / scale
    Ztr = Ztr / scale
    add1 = lambda Z: np.concatenate([np.ones((Z.shape[0], 1)), Z], axis=1)  # noqa: E731
    return add1(Ztr), ytr, add1(Zte), yte


def sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def reference_predictive(X, y, Xte, prior_var, m_draws, seed):
    """Self-normalised importance sampling from an inflated Laplace approximation; returns (p_ref, info)."""
    theta_map, H = laplace(X, y, prior_var)
    cov = np.linalg.inv(H)
    infl = 1.2
    L = np.linalg.cholesky(cov) * infl
    rng = np.random.default_rng(seed)
    d = X.shape[1]
    logw, preds = [], []
    for start in range(0, m_draws, 500):
        k = min(500, m_draws - start)
        z = rng.standard_normal((k, d))
        th = theta_map + z @ L.T
        zz = th @ X.T  # (k, N)
        ll = -np.logaddexp(0.0, np.where(y[None, :] > 0.5, -zz, zz)).sum(axis=1)
        lp = -0.5 * np.sum(th**2, axis=1) / prior_var
        lq = -0.5 * np.sum(z**2, axis=1)  # up to a constant
        logw.append(ll + lp - lq)
        preds.append(sigmoid(th @ Xte.T))
    logw = np.concatenate(logw)
    preds = np.concatenate(preds)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    ess = float(1.0 / np.sum(w**2))
    p_ref = w @ preds
    # Monte Carlo error of the reference (delta method for a self-normalised estimate), mean over images
    var_ref = float(np.mean(np.sum((w[:, None] ** 2) * (preds - p_ref[None, :]) ** 2, axis=0)))
    return p_ref, {"draws": m_draws, "is_ess": ess, "inflation": infl, "ref_mc_var_mean": var_ref,
                   "map_train_accuracy": float(np.mean((X @ theta_map > 0) == (y > 0.5)))}, theta_map, cov


def risk_curve(draws, times, Xte, p_ref, n_points=60):
    """Mean over chains of the risk of the running predictive mean at log-spaced draw counts.

    ``draws``: (chain, k, d); ``times``: (k,) seconds at which draw i was made. Returns (t, risk, draw counts).
    """
    c, k, _ = draws.shape
    if k == 0:
        return np.zeros(0), np.zeros(0), np.zeros(0, int)
    marks = np.unique(np.clip(np.round(np.logspace(0, np.log10(k), n_points)).astype(int), 1, k))
    risks = np.zeros((c, len(marks)))
    for ch in range(c):
        csum = np.zeros(Xte.shape[0])
        prev = 0
        for i, m in enumerate(marks):
            for s in range(prev, m, 2000):
                e = min(m, s + 2000)
                csum += sigmoid(draws[ch, s:e].astype(np.float64) @ Xte.T).sum(axis=0)
            prev = m
            risks[ch, i] = np.mean((csum / m - p_ref) ** 2)
    return times[marks - 1], risks.mean(axis=0), marks


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--mnist", default=None)
    C.add_options(ap, components=50, prior_var=0.1, batch=100)
    ap.add_argument("--epsilons", default="0.01,0.05")
    ap.add_argument("--chains", type=int, default=8)
    ap.add_argument("--budget", type=float, default=40.0, help="sampling seconds per method")
    ap.add_argument("--max-draws", type=int, default=60000, help="cap on draws per chain")
    ap.add_argument("--ref-draws", type=int, default=6000)
    ap.add_argument("--vmap", action="store_true", help="run the chains side by side in one call")
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    folder = os.path.abspath(args.mnist) if args.mnist else default_mnist_dir()
    if args.smoke:
        args.components, args.budget, args.chains, args.ref_draws, args.max_draws = 10, 3.0, 2, 500, 5000
        args.epsilons = "0.05"
    loaded = mnist_train_test(folder, args.components)
    if loaded is None:
        print(WHERE.format(where=folder) + "\n(the t10k test files are needed too)", file=sys.stderr)
        return 2
    warnings.simplefilter("ignore")
    logging.getLogger("arviz").setLevel(logging.ERROR)

    import numpyro
    import numpyro.distributions as dist

    import tallmh as tm

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("probabilistic programs Fig. 4: BayesLR on MNIST 7 vs 9 through the NumPyro front end", meta)
    X, y, Xte, yte = loaded
    if args.smoke:
        X, y = X[:3000], y[:3000]
    n, d = X.shape
    tr = time.perf_counter()
    p_ref, ref_info, theta_map, cov = reference_predictive(X, y, Xte, args.prior_var, args.ref_draws, args.seed + 7)
    ref_info["seconds"] = time.perf_counter() - tr
    print(f"# N = {n} training images, {Xte.shape[0]} test images, d = {d}; reference: {args.ref_draws} "
          f"importance draws, weight ESS {ref_info['is_ess']:.0f}, reference MC variance (mean over images) "
          f"{ref_info['ref_mc_var_mean']:.2e}; MAP training accuracy {100 * ref_info['map_train_accuracy']:.2f}%; "
          f"test accuracy of p_ref {100 * np.mean((p_ref > 0.5) == (yte > 0.5)):.2f}%", flush=True)

    def bayeslr(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, math.sqrt(args.prior_var)).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    model, data = tm.from_numpyro(bayeslr, X.astype(np.float32), y.astype(np.float32))
    proposal = tm.proposals.RandomWalk((2.38**2 / d) * cov)

    methods = [("exact MH", tm.acceptance.Exact())] + [
        (f"austerity eps={float(e):g}", tm.acceptance.Austerity(epsilon=float(e), batch_size=args.batch))
        for e in args.epsilons.split(",")]
    runs = {}
    for label, test in methods:
        # --vmap: all chains side by side in one call (their sequential tests run in lockstep, so a step
        # costs the slowest chain's); default: one chain per call, budget / chains seconds each
        groups = [(args.chains, args.seed, args.budget)] if args.vmap else \
            [(1, args.seed + c, args.budget / args.chains) for c in range(args.chains)]
        curves, accs, items, drawn, secs_all, comp, all_draws = [], [], [], [], [], [], []
        for nch, seed, budget in groups:
            marks = []
            r = tm.sample(model, data, test=test, proposal=proposal, num_samples=args.max_draws, num_warmup=0,
                          num_chains=nch, seed=seed, budget_s=budget, audit=0.0, progress=False,
                          callback=lambda info: marks.append((info["done"], info["seconds"])))
            k = r.num_draws
            done = np.array([0] + [m[0] for m in marks], float)
            secs = np.array([0.0] + [m[1] for m in marks], float)
            times = np.interp(np.arange(1, k + 1), done, secs)
            draws = np.asarray(r.samples["w"])
            curves.append(risk_curve(draws, times, Xte, p_ref)[:2])
            accs.append(float(np.mean(r.stats["accepted"])))
            items.append(float(np.mean(r.stats["n_data"])))
            drawn.append(int(k))
            secs_all.append(r.timings["sampling_s"])
            comp.append(r.timings["compile_s"])
            all_draws.append(draws.reshape(-1, d))
        t_hi = max(float(c[0][-1]) for c in curves if len(c[0]))
        t_lo = min(float(c[0][0]) for c in curves if len(c[0]))
        grid = np.logspace(np.log10(t_lo), np.log10(t_hi), 60)
        per = np.full((len(curves), len(grid)), np.nan)
        for i, (tc, rc) in enumerate(curves):
            idx = np.searchsorted(tc, grid, side="right") - 1
            ok = (idx >= 0) & (grid <= tc[-1] * 1.0001)
            per[i, ok] = rc[idx[ok]]
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            risk = np.nanmean(per, axis=0)
        keep = np.isfinite(risk)
        t, risk = grid[keep], risk[keep]
        pooled = np.concatenate(all_draws)
        runs[label] = {"t": t, "risk": risk, "draws_per_chain": int(np.mean(drawn)),
                       "sampling_s": float(np.sum(secs_all)), "compile_s": float(np.max(comp)),
                       "acceptance": float(np.mean(accs)), "items_per_step": float(np.mean(items)),
                       "data_fraction": float(np.mean(items)) / n,
                       "final_risk": float(risk[-1]) if len(risk) else float("nan"),
                       "test_accuracy_of_mean": float(np.mean(
                           (sigmoid(pooled.astype(np.float64) @ Xte.T).mean(axis=0) > 0.5) == (yte > 0.5)))}
        print(f"  {label:20s}: {runs[label]['draws_per_chain']:7d} draws/chain, {runs[label]['sampling_s']:.1f}s in all "
              f"({args.chains} chains, {'vmapped' if args.vmap else 'one per call'}), acceptance "
              f"{runs[label]['acceptance']:.3f}, items/step {runs[label]['items_per_step']:.0f} "
              f"({100 * runs[label]['data_fraction']:.2f}%), final risk {runs[label]['final_risk']:.3e}, test "
              f"accuracy {100 * runs[label]['test_accuracy_of_mean']:.2f}%", flush=True)
    # time for each approximate method to reach the exact chain's final risk
    ex = runs["exact MH"]
    for label, run in runs.items():
        if label == "exact MH":
            continue
        hit = np.nonzero(run["risk"] <= ex["final_risk"])[0]
        t_ex = float(ex["t"][-1])
        run["time_to_exact_final_risk"] = float(run["t"][hit[0]]) if len(hit) else float("nan")
        run["speedup_vs_exact"] = t_ex / run["time_to_exact_final_risk"] if len(hit) else float("nan")
        print(f"  {label}: reaches exact MH's final risk ({ex['final_risk']:.3e} after {float(ex['t'][-1]):.0f}s) at "
              f"{run['time_to_exact_final_risk']:.1f}s ({run['speedup_vs_exact']:.1f}x sooner)", flush=True)
    total = time.perf_counter() - t_start
    print(f"total runtime {total:.1f}s", flush=True)
    out = {"benchmark": "pp_fig4_bayeslr_mnist", "meta": meta,
           "config": {k: getattr(args, k) for k in ("components", "prior_var", "batch", "epsilons", "chains", "budget",
                                                    "max_draws", "ref_draws", "seed", "smoke", "vmap")} | {
               "N": n, "n_test": int(Xte.shape[0]), "d": d, "proposal": "RandomWalk((2.38^2/d) Laplace cov)",
               "model": "NumPyro via tm.from_numpyro"},
           "reference": ref_info, "runs": runs, "total_runtime_s": total}
    suffix = "_vmap" if args.vmap else ""
    C.write_json(args.out, f"pp_fig4_bayeslr_mnist{suffix}.json", out)

    fig, ax = C.figure(figsize=(6.4, 4.4))
    for i, (label, run) in enumerate(runs.items()):
        ax.plot(run["t"], run["risk"], "-" if label == "exact MH" else "--", color="k" if label == "exact MH" else f"C{i}",
                label=f"{label} (T = {run['draws_per_chain']})")
    ax.axhline(ref_info["ref_mc_var_mean"], color="0.6", lw=0.8, ls=":", label="reference's own MC variance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("sampling time per chain (s)" if not args.vmap else "sampling time (s), all chains side by side")
    ax.set_ylabel("risk of the predictive mean (2,037 test images)")
    ax.set_title(f"BayesLR on MNIST 7 vs 9 via tm.from_numpyro (N = {n}, d = {d}, batch {args.batch})", fontsize=9)
    ax.legend(fontsize=8)
    C.finish_figure(fig, args.out, f"pp_fig4_bayeslr_mnist{suffix}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
