"""Items and time per step of a grouped SubsampledMH with and without control variates, in a program.

K = 3 logistic regressions (``GroupedLogistic``: 2 features + bias per cluster, clusters with known feature
laws), ``tm.Cycle([Gibbs("z", items_per_step=100), SubsampledMH("w", Austerity(epsilon=0.05,
batch_size=100), scale=0.03, group_by="z", control_variates=...)])`` run by ``tm.sample`` (one chain).
Every run starts near the posterior (w at the simulating weights, z at the nearest cluster mean), so the
numbers describe steps at the posterior. Prints, per N and arm: test items per decision (one decision per
cluster per step), the control variates' refresh items per sampling step (the moves of the step) and in
all of warmup (set-up pass, recentring passes and moves), ms per step, acceptance, compile time. Then the
same program's step timed with the chains run one after another (``lax.map``, as the runner does) and
side by side (``vmap``), with the Gibbs block and with z fixed: no per-step copy of the data under vmap.

    python benchmarks/subsampled_cv.py [--sizes 2e4,1e5] [--samples 500] [--warmup 200] [--chains 4]
        [--timing-steps 200] [--timing-only] [--smoke]
"""

import sys
import time

import _common as C
import numpy as np

import tallmh as tm

W = np.array([[1.0, -0.5, 0.3], [-0.8, 1.2, -0.2], [0.5, 0.5, 0.0]], np.float32)


def program(cv, gibbs=True):
    block = tm.blocks.SubsampledMH("w", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100), scale=0.03,
                                   group_by="z", control_variates=tm.ControlVariates() if cv else None)
    return tm.Cycle(([tm.blocks.Gibbs("z", items_per_step=100)] if gibbs else []) + [block])


def start(model, data):
    import jax.numpy as jnp

    z0 = np.argmin(((data["X"][:, None] - np.asarray(model.means)[None]) ** 2).sum(-1), -1).astype(np.int32)
    return {"w": jnp.asarray(W), "z": jnp.asarray(z0)}, ()


def per_step_ms(model, data, cv, chains, steps, vectorised, gibbs=True):
    """ms per step of ``chains`` chains (compile excluded): lax.map over chains, or vmap."""
    import jax
    import jax.numpy as jnp

    from tallmh.blocks.kernel import build_program_kernel

    n = data["y"].shape[0]
    kern, init_states, *_ = build_program_kernel(program(cv, gibbs), model, data, n, init=start(model, data))
    states = init_states(jax.random.split(jax.random.PRNGKey(0), chains))

    def chain(key, st, data):
        def body(s, i):
            return kern.step(jax.random.fold_in(key, i), s, data, i, False)[0], None
        return jax.lax.scan(body, st, jnp.arange(steps))[0]

    keys = jax.random.split(jax.random.PRNGKey(1), chains)
    if vectorised:
        fn = jax.jit(jax.vmap(chain, in_axes=(0, 0, None)))
    else:
        fn = jax.jit(lambda ks, sts, d: jax.lax.map(lambda a: chain(a[0], a[1], d), (ks, sts)))
    jax.block_until_ready(fn(keys, states, data))
    best = float("inf")
    for _ in range(5):  # the least of 5 (a shared machine's load only adds time)
        t = time.perf_counter()
        jax.block_until_ready(fn(keys, states, data))
        best = min(best, time.perf_counter() - t)
    return 1e3 * best / steps


def main():
    ap = C.parser(__doc__, whole=True)
    C.add_options(ap, sizes="2e4,1e5", samples=500, warmup=200, chains=4, timing_steps=200, timing_only=False)
    C.add_run_options(ap, C.RESULTS)
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.samples, args.warmup, args.chains, args.timing_steps = "3000", 20, 20, 2, 5
    from tallmh.blocks.kernel import block_stats
    from tallmh.blocks.models import GroupedLogistic

    meta = C.machine_info(sys.argv, args=vars(args))
    C.header("subsampled_cv: a grouped SubsampledMH with and without control variates", meta)
    model = GroupedLogistic()
    rows = []
    print(f"{'N':>7} {'cv':<3} {'items/decision':>14} {'refresh/step':>12} {'warmup refresh':>14} "
          f"{'ms/step':>8} {'accept':>6} {'compile s':>9} {'map ms':>7} {'vmap ms':>7}")
    for n in C.numbers(args.sizes, int) if not args.timing_only else []:
        data, _ = model.simulate(n, W, seed=args.seed)
        for cv in (True, False):
            prog = program(cv)
            r = tm.sample(model, data, program=prog, num_samples=args.samples, num_warmup=args.warmup,
                          num_chains=1, seed=args.seed, init=start(model, data), progress=False)
            st = block_stats(r.stats, r.test.labels)[prog.labels[1]]
            nd = np.asarray(st["n_data"], float)
            rf = np.asarray(st.get("refresh_items", np.zeros_like(nd)), float)
            wrf = np.asarray(r.warmup_stats.get("block1_refresh_items", np.zeros(1)), float)
            row = {"N": n, "cv": cv, "items_per_decision": float((nd - rf).mean() / 3),
                   "refresh_per_step": float(rf.mean()), "warmup_refresh_total": float(wrf.sum()),
                   "ms_per_step": 1e3 * r.timings["sampling_s"] / args.samples,
                   "acceptance": float(np.asarray(st["accepted"]).mean() / 3),
                   "compile_s": r.timings["compile_s"],
                   "map_ms_per_step": per_step_ms(model, data, cv, args.chains, args.timing_steps, False),
                   "vmap_ms_per_step": per_step_ms(model, data, cv, args.chains, args.timing_steps, True)}
            rows.append(row)
            print(f"{n:>7} {'yes' if cv else 'no':<3} {row['items_per_decision']:>14.1f} "
                  f"{row['refresh_per_step']:>12.0f} {row['warmup_refresh_total']:>14.0f} {row['ms_per_step']:>8.2f} "
                  f"{row['acceptance']:>6.2f} {row['compile_s']:>9.1f} {row['map_ms_per_step']:>7.2f} "
                  f"{row['vmap_ms_per_step']:>7.2f}", flush=True)
    print(f"\n{args.chains} chains, control variates, z fixed (no Gibbs block): ms per step of all chains")
    print(f"{'N':>7} {'map ms':>7} {'vmap ms':>7}")
    for n in C.numbers(args.sizes, int):
        data, _ = model.simulate(n, W, seed=args.seed)
        row = {"N": n, "fixed_z": True,
               "map_ms_per_step": per_step_ms(model, data, True, args.chains, args.timing_steps, False, False),
               "vmap_ms_per_step": per_step_ms(model, data, True, args.chains, args.timing_steps, True, False)}
        rows.append(row)
        print(f"{n:>7} {row['map_ms_per_step']:>7.2f} {row['vmap_ms_per_step']:>7.2f}", flush=True)
    if not args.smoke:
        C.write_json(args.out, "subsampled_cv_timing.json" if args.timing_only else "subsampled_cv.json",
                     {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
