"""Probabilistic-programs paper Sec. 4.1.1, Fig. 5: items read and time per MH step versus N at a fixed proposal.

Chen, Mansinghka & Ghahramani, Sec. 4.1.1: Bayesian logistic regression (their eq. 7: prior
``w ~ N(0, 0.1 I)``) on a synthetic data set with two input features and a binary label, austerity test
with epsilon = 0.01 and minibatch 100, random-walk proposal of sd 0.1, N varied. Fig. 5b: the number of
subsampled items per iteration "with the same current and proposed parameter value for all dataset
sizes", averaged over 300 iterations; Fig. 5c: the running time per iteration; both log-log.

Here (``tm.models.LogisticRegression(prior_scale=sqrt(0.1))``, no intercept):

- data: two standard-normal features, labels from a logistic model with fixed true weights
  ``w* = (1.0, -0.5)`` (the paper's Fig. 5a is not reproduced in its text); the data sets are nested
  prefixes of one draw of the largest size, so each N sees the same first items.
- pair mode (the paper's Fig. 5b/5c): ``--pairs`` fixed pairs ``theta = w*``, ``theta' = w* + 0.1 z_k``
  (``z_k`` fixed standard-normal draws), the same for every N. For each N and pair,
  ``tm.decision_fn(Austerity(0.01, 100), ...)`` decides 300 times with different keys (u and subsample
  order). Items per decision are averaged; the time per decision is the wall time of one compiled
  ``lax.map`` over the 300 keys (sequential decisions, no Python dispatch per decision) divided by 300, best
  of ``--repeats``. ``Exact()`` is timed the same way (fewer keys at large N) for the linear reference.
- chain mode (a real chain at the same fixed proposal): ``tm.sample`` with ``RandomWalk(0.1)`` from
  ``w*``, ``--chain-steps`` steps after 50 warmup steps, items per step and ``sampling_s`` per step.
  As N grows the posterior shrinks like N^-1/2 while the proposal stays 0.1, so at large N almost every
  proposal is rejected and the chain sits at its start: its decisions are then on pairs like the fixed
  ones.

Slopes: least-squares slope of log10(items) and log10(time) on log10(N), over all sizes and over
N >= ``--large-n`` (the asymptotic regime). The paper's blue curve (the expected count from eq. 19 of
Korattikara et al.'s longer version) is not reproduced: that equation is not in the text we have.

Usage::

    python benchmarks/papers/pp_fig5_sublinear.py              # ~4 min on 2 cores
    python benchmarks/papers/pp_fig5_sublinear.py --smoke --out /tmp/x
"""

from __future__ import annotations

import math
import sys
import time

import numpy as np

import _common as C

TRUE_W = (1.0, -0.5)


def make_data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2)).astype(np.float32)
    p = 1.0 / (1.0 + np.exp(-(X.astype(np.float64) @ np.array(TRUE_W))))
    y = (rng.random(n) < p).astype(np.float32)
    return X, y


def parse_args(doc, argv, *, sizes, pairs, repeats, exact_budget):
    """The options of this script and of ``pp_fig5_numpyro.py`` (the same experiment), with their defaults."""
    ap = C.parser(doc)
    C.add_options(ap, sizes=sizes, epsilon=0.01, batch=100, proposal_sd=0.1, pairs=pairs, keys=300, repeats=repeats,
                  chain_steps=300, large_n=1e5)
    ap.add_argument("--exact-budget", type=float, default=exact_budget,
                    help="items per exact timing run (sets its key count)")
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.sizes, args.pairs, args.keys, args.repeats, args.chain_steps = "1e3,1e4", 1, 20, 1, 20
        args.large_n = 1e3
    return args


def setup(tm, args):
    """The sizes N, the data for the largest, the current point w* and ``--pairs`` proposals
    ``w* + proposal_sd z`` (float32), the austerity test and the exact one."""
    import jax.numpy as jnp

    sizes = C.numbers(args.sizes, int)
    X_all, y_all = make_data(max(sizes), args.seed)
    rng = np.random.default_rng(args.seed + 1)
    theta = jnp.asarray(TRUE_W, jnp.float32)
    props = [theta + args.proposal_sd * jnp.asarray(rng.standard_normal(2), jnp.float32) for _ in range(args.pairs)]
    austerity = tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch)
    return sizes, X_all, y_all, theta, props, austerity, tm.acceptance.Exact()


def mapped(f, wrap=None):
    """One compiled program that makes len(keys) decisions one after another (lax.map); ``wrap`` turns a flat
    parameter into the model's (the NumPyro front end's dict).

    theta' gets ``1e-30 * uniform`` per key: numerically a no-op in float32 (far below one ulp of
    theta', so every decision is unchanged) but not loop-invariant, so XLA cannot hoist the exact test's
    full-data sum out of the loop and compute it once for all keys (which it did: 0.2 ns per item).
    """
    import jax

    wrap = wrap or (lambda t: t)

    def one(th, tp, k):
        tp = tp + 1e-30 * jax.random.uniform(jax.random.fold_in(k, 12345), tp.shape, tp.dtype)
        return f(wrap(th), wrap(tp), k)

    return jax.jit(lambda th, tp, ks: jax.lax.map(lambda k: one(th, tp, k), ks))


def timed(g, th, tp, keys, repeats):
    """Best wall time per decision of ``g(th, tp, keys)`` over ``repeats`` calls, after one warm-up call."""
    import jax

    jax.block_until_ready(g(th, tp, keys))  # compile (first pair only) and warm up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(g(th, tp, keys))
        best = min(best, time.perf_counter() - t0)
    return best / keys.shape[0]


def slopes_over_n(rows, keys, large_n, large_name):
    """Log-log slope of each key against N, over all sizes (``"all"``) and over N >= ``large_n``
    (``large_name``)."""
    Ns = np.array([r["N"] for r in rows], float)
    big = Ns >= large_n
    return {key: {"all": C.slope(Ns, v), large_name: C.slope(Ns[big], v[big])}
            for key, v in ((key, np.array([r[key] for r in rows], float)) for key in keys)}


def plot_items(ax, Ns, rows, slopes, args, label):
    """Panel (b): items read per iteration against N, at the fixed pairs and along the chain (``label`` names
    the sampler), with N itself for exact MH."""
    ax.plot(Ns, [r["items_mean"] for r in rows], "o-", color="tab:green",
            label=f"{label}, fixed pairs (slope {slopes['items_mean']['all']:.2f})")
    ax.plot(Ns, [r["chain_items_mean"] for r in rows], "s--", color="tab:purple",
            label=f"{label}, RW chain (slope {slopes['chain_items_mean']['all']:.2f})")
    ax.plot(Ns, Ns, "k:", label="N (exact MH)")
    C.log_log(ax, "N", "items read per iteration",
              f"(b) items per iteration, eps {args.epsilon}, batch {args.batch}, sd {args.proposal_sd}")


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse_args(__doc__, argv, sizes="1e3,3e3,1e4,3e4,1e5,3e5,1e6,3e6,1e7", pairs=4, repeats=3,
                      exact_budget=3e6)

    import jax

    import tallmh as tm

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("probabilistic programs Sec. 4.1.1 / Fig. 5: sublinear austerity at a fixed proposal", meta)
    sizes, X_all, y_all, theta, props, austerity, exact = setup(tm, args)
    model = tm.models.LogisticRegression(prior_scale=math.sqrt(0.1))
    print(f"# w* = {TRUE_W}, prior N(0, 0.1 I), austerity eps {args.epsilon} batch {args.batch}, proposal sd "
          f"{args.proposal_sd}; pairs theta' - theta = {[np.round(np.asarray(p - theta), 3).tolist() for p in props]}",
          flush=True)

    rows = []
    for n in sizes:
        data = {"X": X_all[:n], "y": y_all[:n]}
        tc = time.perf_counter()
        f_a = tm.decision_fn(austerity, model, data)
        f_e = tm.decision_fn(exact, model, data)
        ga, ge = mapped(f_a), mapped(f_e)
        keys = jax.random.split(jax.random.PRNGKey(args.seed + n % 9973), args.keys)
        n_exact_keys = int(max(3, min(args.keys, args.exact_budget // n)))
        per_pair = []
        for k, tp in enumerate(props):
            acc_a, nd_a = ga(theta, tp, keys)
            acc_e, _ = ge(theta, tp, keys[:n_exact_keys])
            s_a = timed(ga, theta, tp, keys, args.repeats)
            s_e = timed(ge, theta, tp, keys[:n_exact_keys], args.repeats)
            nd_a, acc_a, acc_e = np.asarray(nd_a, np.float64), np.asarray(acc_a), np.asarray(acc_e)
            per_pair.append({"pair": k, "items_mean": float(nd_a.mean()), "items_max": float(nd_a.max()),
                             "accept_rate": float(np.mean(acc_a)), "exact_accept_rate": float(np.mean(acc_e)),
                             "wrong_decision_rate": float(np.mean(acc_a[:n_exact_keys] != acc_e)),
                             "s_per_decision": s_a, "exact_s_per_decision": s_e})
        pair_s = time.perf_counter() - tc
        # chain mode
        r = tm.sample(model, data, test=austerity, proposal=tm.proposals.RandomWalk(args.proposal_sd),
                      num_samples=args.chain_steps, num_warmup=50, num_chains=1, seed=args.seed, init=theta,
                      progress=False)
        nd_c = np.asarray(r.stats["n_data"], np.float64)
        row = {"N": n,
               "items_mean": float(np.mean([p["items_mean"] for p in per_pair])),
               "s_per_decision": float(np.mean([p["s_per_decision"] for p in per_pair])),
               "exact_s_per_decision": float(np.mean([p["exact_s_per_decision"] for p in per_pair])),
               "exact_keys_timed": n_exact_keys,
               "wrong_decision_rate": float(np.mean([p["wrong_decision_rate"] for p in per_pair])),
               "pairs": per_pair,
               "chain_items_mean": float(nd_c.mean()),
               "chain_acceptance": float(np.mean(r.stats["accepted"])),
               "chain_s_per_step": r.timings["sampling_s"] / args.chain_steps,
               "chain_compile_s": r.timings["compile_s"],
               "pair_phase_s": pair_s}
        rows.append(row)
        print(f"  N = {n:>9d}: pairs: items {row['items_mean']:8.1f} ({100 * row['items_mean'] / n:6.2f}%), "
              f"{1e6 * row['s_per_decision']:8.1f} us/decision (exact {1e6 * row['exact_s_per_decision']:9.1f} us), "
              f"wrong {100 * row['wrong_decision_rate']:.1f}% | chain: items {row['chain_items_mean']:8.1f}, "
              f"accept {row['chain_acceptance']:.2f}, {1e6 * row['chain_s_per_step']:8.1f} us/step", flush=True)

    Ns = np.array([r["N"] for r in rows], float)
    big = Ns >= args.large_n
    slopes = slopes_over_n(rows, ("items_mean", "s_per_decision", "exact_s_per_decision", "chain_items_mean",
                                  "chain_s_per_step"), args.large_n, f"N>={args.large_n:g}")
    per_pair_slopes = []
    for k in range(args.pairs):
        v = np.array([r["pairs"][k]["items_mean"] for r in rows], float)
        per_pair_slopes.append({"all": C.slope(Ns, v), "large": C.slope(Ns[big], v[big])})
    total = time.perf_counter() - t_start
    print()
    C.print_table(rows, [("N", "9d", "N"), ("items", "9.1f", "items_mean"),
                         ("frac %", "7.2f", lambda r: 100 * r["items_mean"] / r["N"]),
                         ("us/dec", "8.1f", lambda r: 1e6 * r["s_per_decision"]),
                         ("exact us", "10.1f", lambda r: 1e6 * r["exact_s_per_decision"]),
                         ("wrong %", "7.2f", C.percent("wrong_decision_rate")),
                         ("chain items", "11.1f", "chain_items_mean"),
                         ("chain us", "9.1f", lambda r: 1e6 * r["chain_s_per_step"])])
    print(f"\nlog-log slopes (all sizes / N >= {args.large_n:g}):")
    for k, v in slopes.items():
        print(f"  {k:22s} {v['all']:6.3f} / {v[f'N>={args.large_n:g}']:6.3f}")
    print(f"  items per pair        " + ", ".join(f"{p['all']:.2f}/{p['large']:.2f}" for p in per_pair_slopes))
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {
        "benchmark": "pp_fig5_sublinear",
        "meta": meta,
        "config": {"sizes": sizes, "epsilon": args.epsilon, "batch": args.batch, "proposal_sd": args.proposal_sd,
                   "true_w": TRUE_W, "prior": "N(0, 0.1 I)", "pairs": args.pairs, "keys": args.keys,
                   "repeats": args.repeats, "chain_steps": args.chain_steps, "large_n": args.large_n,
                   "seed": args.seed, "smoke": args.smoke},
        "rows": rows,
        "slopes": slopes,
        "per_pair_item_slopes": per_pair_slopes,
        "total_runtime_s": total,
    }
    C.write_json(args.out, "pp_fig5_sublinear.json", out)

    fig, axes = C.figure(1, 3, figsize=(14, 4.3))
    Xs = X_all[: min(2000, max(sizes))]
    ys = y_all[: len(Xs)]
    ax = axes[0]
    ax.scatter(Xs[ys > 0.5, 0], Xs[ys > 0.5, 1], s=3, c="tab:red", label="y = 1")
    ax.scatter(Xs[ys < 0.5, 0], Xs[ys < 0.5, 1], s=3, c="tab:blue", label="y = 0")
    ax.set_title("(a) training data (first 2000 items)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    for k in range(args.pairs):
        ax.plot(Ns, [r["pairs"][k]["items_mean"] for r in rows], "-", color="tab:green", alpha=0.35, lw=1)
    plot_items(ax, Ns, rows, slopes, args, "austerity")
    ax = axes[2]
    ax.plot(Ns, 1e3 * np.array([r["s_per_decision"] for r in rows]), "o-", color="tab:green",
            label=f"austerity, fixed pairs (slope {slopes['s_per_decision']['all']:.2f})")
    ax.plot(Ns, 1e3 * np.array([r["chain_s_per_step"] for r in rows]), "s--", color="tab:purple",
            label=f"austerity, RW chain (slope {slopes['chain_s_per_step']['all']:.2f})")
    ax.plot(Ns, 1e3 * np.array([r["exact_s_per_decision"] for r in rows]), "k^:",
            label=f"exact MH (slope {slopes['exact_s_per_decision']['all']:.2f})")
    C.log_log(ax, "N", "ms per iteration", "(c) time per iteration (2-core CPU, shared: noisy)")
    C.finish_figure(fig, args.out, "pp_fig5_sublinear.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
