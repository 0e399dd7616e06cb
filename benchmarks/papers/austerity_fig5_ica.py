"""Austerity paper Fig. 5: risk in the mean Amari distance of ICA on the Stiefel manifold versus wall time.

Korattikara, Chen & Welling (2014), Sec. 5.2: posterior of the unmixing matrix W of ICA on pre-whitened
data, ``p(x|W) = |det W| prod_j [4 cosh^2(w_j^T x / 2)]^-1``, uniform prior on the orthogonal matrices,
Ouyang's random walk on the Stiefel manifold (``tm.proposals.StiefelWalk(psi)``, symmetric, so
``mu0 = log(u)/N``, eq. 6). Data: 4 sources mixed by a random matrix and whitened; the paper used 43 s
of a classical music recording, street noise and two Gaussian noises at 44.1 kHz (about 1.95 million
samples). We do not have the recordings: ``tm.models.ICA.simulate`` generates a Laplace signal, a sine
wave (sub-Gaussian, periodic) and two independent standard Gaussian noises, mixed by a matrix with iid
N(0, 1) entries.

Target quantity: ``I = E_{p(W|X)}[d_A(W, W0)]``, the posterior mean of the Amari distance to the true
unmixing matrix ``W0 = (V A)^-1`` (V: whitening). Ground truth: a long exact-MH run (``--truth-chains``
chains one after another, ``--truth-seconds`` each). Then for each epsilon (0 = exact MH, ``Exact()``; else
``Austerity(epsilon, batch)``), ``--chains`` independent chains (run one after another, so that each
chain's wall time is its own; chains run side by side in one vectorised program would pay, at every
step, for the slowest chain's sequential test) for ``--seconds`` each. Risk at wall time t: the mean over
chains of the squared error of the chain's running mean of d_A over its draws up to t (the paper's Fig. 5).
All chains start at the same point: a posterior mode found by Riemannian gradient ascent on the full data
(set-up, not timed), so the curves measure variance and bias, not burn-in.

Scaled down (the defaults): N = 100,000 instead of 1.95 million, 5 chains of 15 s instead of 10 of 6400 s,
and a ground truth of 4 x 60 s of exact MH instead of T = 100K samples: the machine is 2 shared cores.
``--n 1950000`` gives the paper's size.

Usage::

    python benchmarks/papers/austerity_fig5_ica.py             # ~10 min on 2 loaded cores
    python benchmarks/papers/austerity_fig5_ica.py --smoke --out /tmp/x
"""

from __future__ import annotations

import math
import sys
import time
import warnings

import numpy as np

import _common as C


def riemannian_ascent(X, iters=200, step=1.0):
    """A local maximum of the ICA log-likelihood over SO(D): ``W <- polar(W + step * grad / N)``."""
    import jax
    import jax.numpy as jnp

    Xj = jnp.asarray(X, jnp.float32)
    n, d = X.shape

    @jax.jit
    def one(W):
        Y = Xj @ W.T
        G = -jnp.tanh(Y / 2).T @ Xj / n  # d/dW of mean_i sum_j log p(w_j . x_i), up to log|det W| (0 on O(D))
        u, _, vt = jnp.linalg.svd(W + step * G)
        return u @ vt

    W = jnp.eye(d, dtype=jnp.float32)
    for _ in range(iters):
        W = one(W)
    W = np.asarray(W, np.float64)
    if np.linalg.det(W) < 0:  # stay on SO(D), where the walk started at the identity would live
        W[0] *= -1
    return W


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--epsilons", default="0,0.01,0.05,0.1,0.2")
    C.add_options(ap, batch_size=500, psi=30.0, chains=5)
    ap.add_argument("--seconds", type=float, default=15.0, help="wall time of each chain")
    ap.add_argument("--truth-chains", type=int, default=4)
    ap.add_argument("--truth-seconds", type=float, default=60.0, help="wall time of each truth chain")
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.chains, args.seconds, args.truth_chains, args.truth_seconds = 5000, 2, 1.0, 2, 2.0
        args.epsilons = "0,0.1"

    import logging

    import jax.numpy as jnp

    import tallmh as tm
    from tallmh.models.ica import amari_distance

    logging.getLogger("arviz").setLevel(logging.ERROR)  # one-chain results: ArviZ's shape warnings

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("austerity Fig. 5: ICA on the Stiefel manifold, risk in the mean Amari distance vs time", meta)
    data, info = tm.models.ICA.simulate(args.n, seed=args.seed)
    W0 = info["W0"]
    X = np.asarray(data["X"])
    ta = time.perf_counter()
    W_start = riemannian_ascent(X)
    print(f"# N = {args.n}, sources: {', '.join(info['sources'])}; start: posterior mode by Riemannian ascent "
          f"({time.perf_counter() - ta:.1f}s), d_A(mode, W0) = {amari_distance(W_start, W0):.4f}; "
          f"d_A(I, W0) = {amari_distance(np.eye(4), W0):.4f}", flush=True)
    model = tm.models.ICA()
    proposal = tm.proposals.StiefelWalk(args.psi)
    init = jnp.asarray(W_start, jnp.float32)
    cap = 10_000_000

    def run(test, chains, seconds, seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tm.sample(model, data, test=test, proposal=proposal, num_samples=cap, num_warmup=0,
                             num_chains=chains, seed=seed, init=init, progress=False, budget_s=seconds, audit=0)

    # ground truth: a long exact run, its chains one after another (exact chains vectorised side by side are
    # slower per chain-step on the CPU than one at a time: measured 7.3 steps/s for 10 against 149 for one)
    tt = time.perf_counter()
    dAs, accs = [], []
    for c in range(args.truth_chains):
        r = run(tm.acceptance.Exact(), 1, args.truth_seconds, args.seed + 1000 + c)
        accs.append(float(r.stats["accepted"].mean()))
        dAs.append(amari_distance(np.asarray(r.flat_samples, np.float64)[0].reshape(-1, 4, 4), W0))
    m_min = min(len(a) for a in dAs)
    dA_truth = np.stack([a[:m_min] for a in dAs])
    truth_acc = float(np.mean(accs))
    burn = dA_truth.shape[1] // 10
    per_chain = dA_truth[:, burn:].mean(axis=1)
    truth = float(per_chain.mean())
    import arviz as az

    truth_se = np.asarray(az.mcse(dA_truth[:, burn:], method="mean")).item() if dA_truth.shape[0] > 1 else float("nan")
    truth_sd = float(dA_truth[:, burn:].std())
    print(f"# ground truth: exact MH, {args.truth_chains} chains x {dA_truth.shape[1]} draws "
          f"({args.truth_seconds:.0f}s each, acceptance {truth_acc:.3f}), first 10% dropped: "
          f"E[d_A] = {truth:.5f} (MCSE {truth_se:.2g}; posterior sd {truth_sd:.4f}; chain means "
          f"{per_chain.min():.4f}..{per_chain.max():.4f}) [{time.perf_counter() - tt:.0f}s]", flush=True)

    tests, grid = C.epsilon_tests(tm, args.epsilons, args.batch_size), C.time_grid(args.seconds)
    rows = []
    for eps, test in tests:
        ests = np.full((args.chains, len(grid)), np.nan)
        steps, acc, frac, secs = [], [], [], []
        for c in range(args.chains):
            r = run(test, 1, args.seconds, args.seed + 1 + 17 * c)
            w = np.asarray(r.flat_samples, np.float64)[0].reshape(-1, 4, 4)
            dA = amari_distance(w, W0)
            T = r.timings["sampling_s"]
            ests[c] = C.running_means_at(dA, T, grid)  # draws at an even rate over the run
            steps.append(len(dA))
            acc.append(float(r.stats["accepted"].mean()))
            frac.append(float(r.stats["n_data"].mean()) / args.n)
            secs.append(T)
        risk = np.nanmean((ests - truth) ** 2, axis=0)
        final = ests[:, -1]
        row = {"epsilon": eps, "test": repr(test), "chains": args.chains, "seconds_per_chain": float(np.mean(secs)),
               "steps_per_chain": float(np.mean(steps)), "steps_per_s": float(np.mean(steps) / np.mean(secs)),
               "acceptance": float(np.mean(acc)), "data_fraction": float(np.mean(frac)),
               "time_grid_s": grid, "risk": risk, "final_estimates": final,
               "final_bias": float(final.mean() - truth), "final_sd_between_chains": float(final.std(ddof=1)) if args.chains > 1 else float("nan"),
               "final_risk": float(risk[-1])}
        rows.append(row)
        print(f"  eps {eps:<5g} {row['steps_per_s']:7.0f} steps/s  data {100 * row['data_fraction']:6.2f}%  accept "
              f"{row['acceptance']:.3f}  risk at {grid[len(grid) // 2]:.2f}s {risk[len(grid) // 2]:.3g}, at "
              f"{grid[-1]:.0f}s {risk[-1]:.3g} (bias {row['final_bias']:+.4f}, sd {row['final_sd_between_chains']:.4f})",
              flush=True)

    total = time.perf_counter() - t_start
    print()
    C.print_table(rows, [("epsilon", "8g", "epsilon"), ("steps/s", "8.0f", "steps_per_s"),
                         ("data %", "7.2f", C.percent("data_fraction")), ("accept", "7.3f", "acceptance"),
                         ("risk@mid", "10.3g", lambda r: r["risk"][len(grid) // 2]),
                         ("risk@end", "10.3g", "final_risk"), ("bias", "+8.4f", "final_bias"), ("sd", "8.4f", "final_sd_between_chains")])
    print(f"(risk: mean over {args.chains} chains of (running mean of d_A - truth)^2 at {grid[len(grid) // 2]:.2f}s "
          f"and {grid[-1]:.0f}s of wall time per chain; truth {truth:.5f} ± {truth_se:.2g})")
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {"benchmark": "austerity_fig5_ica", "meta": meta,
           "config": {"N": args.n, "sources": info["sources"], "psi": args.psi, "batch_size": args.batch_size,
                      "epsilons": [eps for eps, _ in tests], "chains": args.chains, "seconds_per_chain": args.seconds,
                      "truth_chains": args.truth_chains, "truth_seconds": args.truth_seconds, "seed": args.seed,
                      "start": "posterior mode by Riemannian gradient ascent (all chains)", "smoke": args.smoke,
                      "d_A_start": float(amari_distance(W_start, W0))},
           "truth": {"value": truth, "mcse": truth_se, "posterior_sd": truth_sd, "chain_means": per_chain,
                     "draws_per_chain": int(dA_truth.shape[1]), "acceptance": truth_acc},
           "rows": rows, "total_runtime_s": total}
    C.write_json(args.out, "austerity_fig5_ica.json", out)

    fig, ax = C.figure(figsize=(6, 4.2))
    for r_ in rows:
        ax.loglog(grid, r_["risk"], "o-", ms=3, label=(r"$\epsilon$ = 0 (exact)" if r_["epsilon"] == 0
                                                        else rf"$\epsilon$ = {r_['epsilon']:g}"))
    ax.axhline(truth_se**2, color="gray", ls=":", lw=1, label="truth MCSE$^2$")
    ax.set_xlabel("wall time per chain (s)")
    ax.set_ylabel(r"risk in mean Amari distance")
    ax.set_title(f"ICA, N = {args.n:,}, {args.chains} chains", fontsize=10)
    ax.legend(fontsize=8)
    C.finish_figure(fig, args.out, "austerity_fig5_ica.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
