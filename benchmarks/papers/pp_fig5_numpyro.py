"""Probabilistic-programs paper Fig. 5 through the NumPyro front end: items and time per MH step versus N.

Chen, Mansinghka & Ghahramani, Sec. 4.1.1: Bayesian logistic regression (eq. 7, prior ``w ~ N(0, 0.1 I)``)
on synthetic data with two features, austerity with epsilon = 0.01 and minibatch 100, random-walk
proposal of sd 0.1, N varied; Fig. 5b: subsampled items per iteration at a fixed (current, proposed) pair,
averaged over 300 iterations; Fig. 5c: time per iteration; both log-log. The paper ran this through its
probabilistic-programming system (Venture); here the model is a NumPyro program::

    def bayeslr(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, sqrt(0.1)).expand([2]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

turned into a tallmh model by ``tm.from_numpyro(bayeslr, X, y)`` (the data plate's indices substituted,
never drawn by the plate). Data, pairs and timing as in ``pp_fig5_sublinear.py`` (which runs the
hand-written ``tm.models.LogisticRegression``): nested prefixes of one draw with ``w* = (1.0, -0.5)``;
``--pairs`` fixed pairs ``theta = w*``, ``theta' = w* + 0.1 z_k``; for each N and pair ``--keys`` decisions
with different keys in one compiled ``lax.map``; the hand-written model decides the same pairs with the
same keys (ratio of times = the front end's overhead; decisions must agree). Exact MH timed the same way
(fewer keys at large N). Chain mode: ``tm.sample`` with ``RandomWalk(0.1)`` from ``w*``. Also timed: the
``from_numpyro`` call itself at each N (its checks read a few items; it converts the arrays once).

Usage::

    python benchmarks/papers/pp_fig5_numpyro.py                 # a few minutes on 2 cores
    python benchmarks/papers/pp_fig5_numpyro.py --smoke --out /tmp/x
"""

from __future__ import annotations

import logging
import math
import sys
import time
import warnings

import numpy as np

import _common as C
from pp_fig5_sublinear import TRUE_W, mapped, parse_args, plot_items, setup, slopes_over_n, timed


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_args(__doc__, argv, sizes="1e3,1e4,1e5,1e6,1e7", pairs=3, repeats=2, exact_budget=2e6)
    warnings.simplefilter("ignore")
    logging.getLogger("arviz").setLevel(logging.ERROR)

    import jax
    import numpyro
    import numpyro.distributions as dist

    import tallmh as tm

    def bayeslr(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, math.sqrt(0.1)).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("probabilistic programs Fig. 5 through the NumPyro front end", meta)
    sizes, X_all, y_all, theta, props, austerity, exact = setup(tm, args)
    hand = tm.models.LogisticRegression(prior_scale=math.sqrt(0.1))

    rows = []
    for n in sizes:
        tb = time.perf_counter()
        model, data = tm.from_numpyro(bayeslr, X_all[:n], y_all[:n])
        build_s = time.perf_counter() - tb
        hdata = {"X": data["X"], "y": data["y"]}
        as_dict = lambda t: {"w": t}  # noqa: E731
        ga = mapped(tm.decision_fn(austerity, model, data), as_dict)
        gh = mapped(tm.decision_fn(austerity, hand, hdata), lambda t: t)
        ge = mapped(tm.decision_fn(exact, model, data), as_dict)
        keys = jax.random.split(jax.random.PRNGKey(args.seed + n % 9973), args.keys)
        n_exact = int(max(3, min(args.keys, args.exact_budget // n)))
        per_pair = []
        for tp in props:
            acc_a, nd_a = ga(theta, tp, keys)
            acc_h, nd_h = gh(theta, tp, keys)
            acc_e, _ = ge(theta, tp, keys[:n_exact])
            s_a = timed(ga, theta, tp, keys, args.repeats)
            s_h = timed(gh, theta, tp, keys, args.repeats)
            s_e = timed(ge, theta, tp, keys[:n_exact], args.repeats)
            acc_a, acc_h, acc_e = np.asarray(acc_a), np.asarray(acc_h), np.asarray(acc_e)
            per_pair.append({"items_mean": float(np.mean(nd_a)), "hand_items_mean": float(np.mean(nd_h)),
                             "same_as_hand": float(np.mean(acc_a == acc_h)),
                             "wrong_decision_rate": float(np.mean(acc_a[:n_exact] != acc_e)),
                             "s_per_decision": s_a, "hand_s_per_decision": s_h, "exact_s_per_decision": s_e})
        r = tm.sample(model, data, test=austerity, proposal=tm.proposals.RandomWalk(args.proposal_sd),
                      num_samples=args.chain_steps, num_warmup=50, num_chains=1, seed=args.seed,
                      init={"w": theta}, progress=False)
        row = {"N": n, "from_numpyro_s": build_s,
               **{k: float(np.mean([p[k] for p in per_pair])) for k in per_pair[0]},
               "exact_keys_timed": n_exact, "pairs": per_pair,
               "chain_items_mean": float(np.mean(r.stats["n_data"])),
               "chain_acceptance": float(np.mean(r.stats["accepted"])),
               "chain_s_per_step": r.timings["sampling_s"] / args.chain_steps,
               "chain_compile_s": r.timings["compile_s"]}
        rows.append(row)
        print(f"  N = {n:>9d}: items {row['items_mean']:8.1f} ({100 * row['items_mean'] / n:6.2f}%), "
              f"{1e6 * row['s_per_decision']:8.1f} us/decision (hand-written {1e6 * row['hand_s_per_decision']:8.1f}, "
              f"exact {1e6 * row['exact_s_per_decision']:10.1f}), same as hand {100 * row['same_as_hand']:.0f}%, "
              f"wrong {100 * row['wrong_decision_rate']:.1f}% | chain items {row['chain_items_mean']:8.1f}, "
              f"{1e6 * row['chain_s_per_step']:8.1f} us/step | from_numpyro {build_s:.2f}s", flush=True)

    Ns = np.array([r["N"] for r in rows], float)
    slopes = slopes_over_n(rows, ("items_mean", "s_per_decision", "hand_s_per_decision", "exact_s_per_decision",
                                  "chain_items_mean", "chain_s_per_step", "from_numpyro_s"), args.large_n, "large")
    total = time.perf_counter() - t_start
    print(f"\nlog-log slopes (all sizes / N >= {args.large_n:g}):")
    for k, v in slopes.items():
        print(f"  {k:22s} {v['all']:6.3f} / {v['large']:6.3f}")
    print(f"total runtime {total:.1f}s", flush=True)
    out = {"benchmark": "pp_fig5_numpyro", "meta": meta,
           "config": {k: getattr(args, k) for k in ("epsilon", "batch", "proposal_sd", "pairs", "keys", "repeats",
                                                    "chain_steps", "large_n", "seed", "smoke")} | {
               "sizes": sizes, "true_w": TRUE_W, "prior": "N(0, 0.1 I)", "model": "NumPyro via tm.from_numpyro"},
           "rows": rows, "slopes": slopes, "total_runtime_s": total}
    C.write_json(args.out, "pp_fig5_numpyro.json", out)

    fig, axes = C.figure(1, 2, figsize=(11, 4.2))
    ax = axes[0]
    plot_items(ax, Ns, rows, slopes, args, "austerity via from_numpyro")
    ax = axes[1]
    for key, style, lab in (("s_per_decision", "o-", "austerity via from_numpyro"),
                            ("hand_s_per_decision", "x--", "austerity, hand-written model"),
                            ("chain_s_per_step", "s--", "austerity via from_numpyro, RW chain"),
                            ("exact_s_per_decision", "k^:", "exact MH via from_numpyro")):
        ax.plot(Ns, 1e3 * np.array([r[key] for r in rows]), style, label=f"{lab} (slope {slopes[key]['all']:.2f})")
    C.log_log(ax, "N", "ms per iteration", "(c) time per iteration (2-core shared CPU: noisy)")
    C.finish_figure(fig, args.out, "pp_fig5_numpyro.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
