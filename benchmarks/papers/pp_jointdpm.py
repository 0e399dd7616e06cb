"""Probabilistic-programs paper Sec. 4.2, Fig. 6: JointDPM, test accuracy versus time, exact vs eps = 0.3.

Chen, Mansinghka & Ghahramani, Sec. 4.2: a joint Dirichlet-process mixture of experts (CRP(alpha) over
clusters, collapsed normal-inverse-Wishart features, one logistic regression per cluster; Fig. 7 top)
on a 2-D synthetic set of 10,000 training points and 1,000 test points; inference program
``(cycle ((mh alpha all 1) (gibbs z one step_z) (subsampled_mh w one Nbatch eps 'drift sigma 1)))``.
Fig. 6d: accuracy of the prediction averaged over the chain versus running time; "the sublinear algorithm
with eps = 0.3 reaches the same accuracy as exact MH in 10x less time".

Here, with :mod:`tallmh.blocks` and :class:`tallmh.blocks.models.JointDPM`::

    tm.Cycle([tm.blocks.MH("alpha", scale=0.5),
              tm.blocks.Gibbs("z", items_per_step=STEP_Z),
              tm.blocks.SubsampledMH("w", test=TEST, scale=SIGMA, group_by="z")])

``TEST`` = ``Exact()`` (all N_k members of each cluster) or ``Austerity(epsilon=0.3, batch_size=batch)`` over each cluster's
current members; every cluster's weights are updated once per cycle (``groups="all"``). Both runs start
from the same state and run in chunks of ``--chunk`` cycles until ``--budget`` seconds of sampling have
passed (the first chunk's compile time is excluded from the clock and reported); after each chunk the
posterior predictive ``p(y = 1 | x)`` of the current state (:meth:`JointDPM.predict`) is added to a
running average over the chain, whose accuracy on the test points is recorded against the clock.

Data: 6 Gaussian blobs in 2-D, each with its own random linear boundary (the paper's Fig. 6b data are
not given), N = 10,000 (``--n``), 1,000 test points.

Usage::

    python benchmarks/papers/pp_jointdpm.py            # ~4 min on 2 cores
    python benchmarks/papers/pp_jointdpm.py --smoke --out /tmp/x
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import _common as C


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--n-test", type=int, default=1000)
    ap.add_argument("--max-clusters", type=int, default=20)
    ap.add_argument("--step-z", type=int, default=200)
    ap.add_argument("--epsilon", type=float, default=0.3)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--sigma", type=float, default=0.15, help="random-walk sd of the weights' proposal")
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--budget", type=float, default=90.0, help="seconds of sampling per method")
    ap.add_argument("--chains", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.n_test, args.budget, args.chunk, args.max_clusters = 500, 100, 3.0, 5, 8

    import jax
    import jax.numpy as jnp

    import tallmh as tm
    from tallmh.blocks.models import JointDPM

    meta = C.machine_info(argv)
    C.header("probabilistic programs Sec. 4.2 / Fig. 6: JointDPM", meta)
    train, test = JointDPM.simulate(args.n, n_test=args.n_test, seed=args.seed)
    model = JointDPM(max_clusters=args.max_clusters)
    x_test = jnp.asarray(test["X"])
    y_test = np.asarray(test["y"])
    predict = jax.jit(jax.vmap(model.predict, in_axes=(0, 0, None)))
    print(f"# N = {args.n} train, {args.n_test} test, K_max = {args.max_clusters}, step_z = {args.step_z}, "
          f"chunk = {args.chunk} cycles, budget {args.budget}s per method", flush=True)

    runs = {}
    for name, test_obj in (("exact", tm.acceptance.Exact(chunk=256)),
                           (f"austerity eps={args.epsilon}", tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch))):
        prog = tm.Cycle([
            tm.blocks.MH("alpha", scale=0.5),
            tm.blocks.Gibbs("z", items_per_step=args.step_z),
            tm.blocks.SubsampledMH("w", test=test_obj, scale=args.sigma, group_by="z"),
        ])
        runner = tm.blocks.Runner(prog, model)
        states, data = runner.init(train, args.chains, args.seed)
        key = jax.random.PRNGKey(args.seed + 1)
        t0 = time.perf_counter()
        runner.run(states, data, args.chunk, key)  # compile (result discarded)
        compile_s = time.perf_counter() - t0
        avg = np.zeros(args.n_test)
        clock, acc, acc_now, clusters, items, steps = 0.0, [], [], [], [], []
        i = 0
        while clock < args.budget:
            t = time.perf_counter()
            states, rec, infos = runner.run(states, data, args.chunk, jax.random.fold_in(key, i))
            jax.block_until_ready(rec)
            clock += time.perf_counter() - t
            i += 1
            p = np.asarray(predict(states.values, states.aux, x_test)).mean(0)
            avg += (p - avg) / i
            acc.append((clock, float(np.mean((avg > 0.5) == y_test))))
            acc_now.append(float(np.mean((p > 0.5) == y_test)))
            clusters.append(float(np.asarray(rec["clusters"])[:, -1].mean()))
            items.append({lab: float(np.mean(np.asarray(inf.n_data))) for lab, inf in zip(prog.labels, infos)})
            steps.append(i * args.chunk)
        wl = prog.labels[2]
        w_items = float(np.mean([it[wl] for it in items]))
        runs[name] = {"compile_s": compile_s, "curve": acc, "acc_current_state": acc_now, "clusters": clusters,
                      "steps": steps, "items_per_step": {lab: float(np.mean([it[lab] for it in items]))
                                                         for lab in prog.labels},
                      "seconds_per_step": clock / steps[-1], "final_accuracy": acc[-1][1],
                      "final_alpha": float(np.asarray(rec["alpha"])[:, -1].mean())}
        print(f"{name:22s} {steps[-1]} cycles in {clock:.1f}s ({1e3 * clock / steps[-1]:.1f} ms/cycle, compile "
              f"{compile_s:.1f}s); w items/cycle {w_items:.0f} of N = {args.n}; clusters {clusters[-1]:.0f}; "
              f"accuracy (chain average) {acc[-1][1]:.3f}", flush=True)

    names = list(runs)
    ex, sub = runs[names[0]], runs[names[1]]
    final_ex = ex["curve"][-1][1]
    # time for each method to first reach (and stay within 0.5 % of) exact's final accuracy
    def time_to(curve, target):
        for j, (t, a) in enumerate(curve):
            if all(b >= target - 0.005 for _, b in curve[j:]):
                return t
        return float("nan")

    t_ex = time_to(ex["curve"], final_ex)
    t_sub = time_to(sub["curve"], final_ex)
    speedup = t_ex / t_sub if t_sub == t_sub and t_sub > 0 else float("nan")
    print(f"time to exact's final accuracy {final_ex:.3f} (-0.5%): exact {t_ex:.1f}s, subsampled {t_sub:.1f}s "
          f"-> {speedup:.1f}x (paper: 10x)")

    plt = C.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    ax = axes[0]
    for name, col in zip(names, ("r", "b")):
        c = np.array(runs[name]["curve"])
        ax.plot(c[:, 0], c[:, 1], color=col, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("sampling time (s)")
    ax.set_ylabel("test accuracy (predictive averaged over the chain)")
    ax.legend()
    ax = axes[1]
    xs = np.asarray(train["X"])
    ax.scatter(xs[:2000, 0], xs[:2000, 1], c=np.asarray(train["y"])[:2000], s=2, cmap="coolwarm")
    ax.set_title("training data (first 2,000 points)")
    fig.suptitle(f"JointDPM, N = {args.n}: exact vs austerity eps = {args.epsilon} on each cluster's members")
    fig.tight_layout()
    C.save_fig(fig, args.out, "pp_jointdpm.png" if not args.smoke else "pp_jointdpm_smoke.png")
    C.write_json(args.out, "pp_jointdpm.json" if not args.smoke else "pp_jointdpm_smoke.json", {
        "meta": meta, "args": vars(args), "runs": runs,
        "time_to_exact_final_accuracy": {"exact_s": t_ex, "subsampled_s": t_sub, "speedup": speedup},
        "paper": "Fig. 6d: eps = 0.3 reaches the accuracy of exact MH in 10x less time (10,000 points)",
    })


if __name__ == "__main__":
    main()
