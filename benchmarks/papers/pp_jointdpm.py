"""Probabilistic-programs paper Sec. 4.2, Fig. 6: JointDPM, test accuracy versus time, exact vs eps = 0.3.

Chen, Mansinghka & Ghahramani, Sec. 4.2: a joint Dirichlet-process mixture of experts (CRP(alpha) over
clusters, collapsed normal-inverse-Wishart features, one logistic regression per cluster; Fig. 7 top)
on a 2-D synthetic set of 10,000 training points and 1,000 test points; inference program
``(cycle ((mh alpha all 1) (gibbs z one step_z) (subsampled_mh w one Nbatch eps 'drift sigma 1)))``.
Fig. 6d: accuracy of the prediction averaged over the chain versus running time; "the sublinear algorithm
with eps = 0.3 reaches the same accuracy as exact MH in 10x less time".

Here the model is a **NumPyro model** (:func:`tallmh.blocks.numpyro_models.joint_dpm`) run through the
front end, ``model, data = tm.blocks.from_numpyro(joint_dpm, X, y, K=K, state=("z",))``, with::

    tm.Cycle([tm.blocks.MH("alpha", scale=0.5),                      # reads no data (no local sections)
              tm.blocks.Gibbs("z", items_per_step=STEP_Z),           # O(STEP_Z * K), batched
              tm.blocks.SubsampledMH("pi", test=TEST, scale=...),    # over all N items (z_i ~ Cat(pi))
              tm.blocks.SubsampledMH("mu", test=TEST, scale=..., group_by="z"),   # over cluster k's members
              tm.blocks.SubsampledMH("sd", test=TEST, scale=..., group_by="z"),
              tm.blocks.SubsampledMH("w", test=TEST, scale=SIGMA, group_by="z")])

``TEST`` = ``Exact()`` or ``Austerity(epsilon=0.3, batch_size=batch)``. A NumPyro program has conditionally
independent items given its globals, so the NumPyro JointDPM is the *finite* (truncated) version: K
clusters, ``pi ~ Dirichlet(alpha / K)``, diagonal-Gaussian features and a logistic regression per
cluster, every cluster parameter a global site updated over its cluster's members; the paper's (and the
hand-written :class:`~tallmh.blocks.models.JointDPM`'s) CRP with collapsed NIW features is not such a
program. Both methods start from the same state (cluster means at K random training points, z by the
nearest mean) and run in chunks of ``--chunk`` cycles until ``--budget`` seconds of sampling have passed
(the first chunk's compile time is excluded and reported); after each chunk the posterior predictive
``p(y = 1 | x)`` of the current state is added to a running average over the chain, whose test accuracy is
recorded against the clock. ``--hand-written`` also runs the earlier hand-written collapsed-CRP program
(same data, same budget) as a cross-check of the accuracy.

Data: 6 Gaussian blobs in 2-D, each with its own random linear boundary (the paper's Fig. 6b data are
not given), N = 10,000 (``--n``), 1,000 test points.

Usage::

    python benchmarks/papers/pp_jointdpm.py --hand-written     # the committed results
    python benchmarks/papers/pp_jointdpm.py --smoke --out /tmp/x
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C


def _init_state(model, train, k, seed):
    """Cluster means at k random training points, sds 0.6, w = 0, pi uniform, alpha 1, z = nearest mean."""
    import jax.numpy as jnp

    rng = np.random.default_rng(seed)
    x = np.asarray(train["X"])
    mu = x[rng.choice(len(x), k, replace=False)]
    z = np.argmin(((x[:, None, :] - mu[None]) ** 2).sum(-1), axis=1).astype(np.int32)
    const = {"alpha": np.float32(1.0), "pi": np.full(k, 1.0 / k, np.float32), "mu": mu.astype(np.float32),
             "sd": np.full_like(mu, 0.6, np.float32), "w": np.zeros((k, x.shape[1] + 1), np.float32)}
    values = {s: jnp.asarray(v) for s, v in model.np_model.unconstrain(const).items()}
    values["z"] = jnp.asarray(z)
    return values, ()


def run_method(name, prog, model, data, init, predict_fn, args, y_test, clusters_fn):
    import jax

    import tallmh as tm

    runner = tm.blocks.Runner(prog, model)
    states, data = runner.init(data, args.chains, args.seed, init=init)
    key = jax.random.PRNGKey(args.seed + 1)
    t0 = time.perf_counter()
    runner.run(states, data, args.chunk, key)  # compile (result discarded)
    compile_s = time.perf_counter() - t0
    avg = np.zeros(len(y_test))
    clock, acc, acc_now, clusters, items, steps = 0.0, [], [], [], [], []
    i = 0
    while clock < args.budget:
        t = time.perf_counter()
        states, rec, infos = runner.run(states, data, args.chunk, jax.random.fold_in(key, i))
        jax.block_until_ready(rec)
        clock += time.perf_counter() - t
        i += 1
        p = np.asarray(predict_fn(states)).mean(0)
        avg += (p - avg) / i
        acc.append((clock, float(np.mean((avg > 0.5) == y_test))))
        acc_now.append(float(np.mean((p > 0.5) == y_test)))
        clusters.append(clusters_fn(states, rec))
        items.append({lab: float(np.mean(np.asarray(inf.n_data))) for lab, inf in zip(prog.labels, infos)})
        steps.append(i * args.chunk)
    item_means = {lab: float(np.mean([it[lab] for it in items])) for lab in prog.labels}
    acc_rates = {lab: float(np.sum(np.asarray(inf.accepted)) / max(np.sum(np.asarray(inf.proposals)), 1))
                 for lab, inf in zip(prog.labels, infos)}
    run = {"compile_s": compile_s, "curve": acc, "acc_current_state": acc_now, "clusters": clusters,
           "steps": steps, "items_per_step": item_means, "acceptance_last_chunk": acc_rates,
           "seconds_per_step": clock / steps[-1], "final_accuracy": acc[-1][1],
           "final_alpha": float(np.asarray(rec["alpha"])[:, -1].mean())}
    grouped = {lab: v for lab, v in item_means.items() if lab.startswith("subsampled_mh")}
    print(f"{name:34s} {steps[-1]} cycles in {clock:.1f}s ({1e3 * clock / steps[-1]:.1f} ms/cycle, compile "
          f"{compile_s:.1f}s); clusters {clusters[-1]:.0f}; accuracy (chain average) {acc[-1][1]:.3f}", flush=True)
    print("   items/cycle: " + ", ".join(f"{k}: {v:.0f}" for k, v in grouped.items()) + f" (N = {args.n}); "
          "acceptance: " + ", ".join(f"{k}: {v:.2f}" for k, v in acc_rates.items()), flush=True)
    return run


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--n-test", type=int, default=1000)
    ap.add_argument("--clusters", type=int, default=10, help="K of the finite NumPyro JointDPM")
    ap.add_argument("--max-clusters", type=int, default=20, help="K_max of the hand-written CRP version")
    C.add_options(ap, step_z=200, epsilon=0.3, batch=100)
    ap.add_argument("--sigma", type=float, default=0.15, help="random-walk sd of the weights' proposal")
    ap.add_argument("--scale-mu", type=float, default=0.03)
    ap.add_argument("--scale-sd", type=float, default=0.03, help="random-walk sd on log sd")
    ap.add_argument("--scale-pi", type=float, default=0.02, help="random-walk sd on pi's stick-breaking coordinates")
    ap.add_argument("--chunk", type=int, default=20)
    ap.add_argument("--budget", type=float, default=60.0, help="seconds of sampling per method")
    ap.add_argument("--chains", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hand-written", action="store_true", help="also run the hand-written collapsed-CRP program")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.n_test, args.budget, args.chunk, args.max_clusters, args.clusters = 500, 100, 3.0, 5, 8, 6

    import jax
    import jax.numpy as jnp

    import tallmh as tm
    from tallmh.blocks.models import JointDPM
    from tallmh.blocks.numpyro_models import joint_dpm, joint_dpm_predict

    meta = C.machine_info(argv)
    C.header("probabilistic programs Sec. 4.2 / Fig. 6: JointDPM (NumPyro model through tm.blocks.from_numpyro)", meta)
    train, test = JointDPM.simulate(args.n, n_test=args.n_test, seed=args.seed)
    x_test = jnp.asarray(test["X"])
    y_test = np.asarray(test["y"])
    model, data = tm.blocks.from_numpyro(joint_dpm, train["X"], train["y"], K=args.clusters, state=("z",))
    init = _init_state(model, train, args.clusters, args.seed)
    print(f"# N = {args.n} train, {args.n_test} test; {model}; K = {args.clusters}, step_z = {args.step_z}, "
          f"chunk = {args.chunk} cycles, budget {args.budget}s per method", flush=True)
    np_predict = jax.jit(lambda states: jax.vmap(lambda v: joint_dpm_predict(model.record(v, ()), x_test))(states.values))

    def np_clusters(states, rec):
        z = np.asarray(states.values["z"])
        return float(np.mean([len(np.unique(zc)) for zc in z]))

    runs = {}
    for name, test_obj in (("exact", tm.acceptance.Exact(chunk=256)),
                           (f"austerity eps={args.epsilon}", tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch))):
        prog = tm.Cycle([
            tm.blocks.MH("alpha", scale=0.5),
            tm.blocks.Gibbs("z", items_per_step=args.step_z),
            tm.blocks.SubsampledMH("pi", test=test_obj, scale=args.scale_pi),
            tm.blocks.SubsampledMH("mu", test=test_obj, scale=args.scale_mu, group_by="z"),
            tm.blocks.SubsampledMH("sd", test=test_obj, scale=args.scale_sd, group_by="z"),
            tm.blocks.SubsampledMH("w", test=test_obj, scale=args.sigma, group_by="z"),
        ])
        runs[name] = run_method(name, prog, model, data, init, np_predict, args, y_test, np_clusters)

    if args.hand_written:
        hw = JointDPM(max_clusters=args.max_clusters)
        hw_predict_one = jax.jit(jax.vmap(hw.predict, in_axes=(0, 0, None)))
        for name, test_obj in (("hand-written CRP, exact", tm.acceptance.Exact(chunk=256)),
                               (f"hand-written CRP, austerity eps={args.epsilon}",
                                tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch))):
            prog = tm.Cycle([
                tm.blocks.MH("alpha", scale=0.5),
                tm.blocks.Gibbs("z", items_per_step=args.step_z),
                tm.blocks.SubsampledMH("w", test=test_obj, scale=args.sigma, group_by="z"),
            ])
            runs[name] = run_method(name, prog, hw, train, None,
                                    lambda st: hw_predict_one(st.values, st.aux, x_test), args, y_test,
                                    lambda st, rec: float(np.asarray(rec["clusters"])[:, -1].mean()))

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

    fig, axes = C.figure(1, 2, figsize=(11, 4))
    ax = axes[0]
    for name, (col, ls) in zip(names, (("r", "-"), ("b", "-"), ("r", ":"), ("b", ":"))):
        c = np.array(runs[name]["curve"])
        ax.plot(c[:, 0], c[:, 1], color=col, ls=ls, label=name)
    ax.set_xscale("log")
    ax.set_xlabel("sampling time (s)")
    ax.set_ylabel("test accuracy (predictive averaged over the chain)")
    ax.legend()
    ax = axes[1]
    xs = np.asarray(train["X"])
    ax.scatter(xs[:2000, 0], xs[:2000, 1], c=np.asarray(train["y"])[:2000], s=2, cmap="coolwarm")
    ax.set_title("training data (first 2,000 points)")
    fig.suptitle(f"JointDPM (NumPyro, K = {args.clusters}), N = {args.n}: exact vs austerity eps = {args.epsilon} "
                 "on each cluster's members")
    C.finish_figure(fig, args.out, "pp_jointdpm.png" if not args.smoke else "pp_jointdpm_smoke.png")
    C.write_json(args.out, "pp_jointdpm.json" if not args.smoke else "pp_jointdpm_smoke.json", {
        "meta": meta, "args": vars(args), "runs": runs,
        "time_to_exact_final_accuracy": {"exact_s": t_ex, "subsampled_s": t_sub, "speedup": speedup},
        "paper": "Fig. 6d: eps = 0.3 reaches the accuracy of exact MH in 10x less time (10,000 points)",
        "model": "NumPyro joint_dpm (finite K, Dirichlet(alpha/K) weights) through tm.blocks.from_numpyro; "
                 "hand-written collapsed-CRP runs (if any) are a cross-check",
    })


if __name__ == "__main__":
    main()
