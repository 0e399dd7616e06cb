"""Items of data and time per MH step with and without Taylor control variates.

Logistic regression (d = 10 + intercept, ``LogisticRegression.simulate(N, d=10, seed=0)``, N(0, 10^2)
prior), adaptive Metropolis, every run started at the posterior mode (found by the control variates'
Newton iterations, whose full passes are reported as set-up items), one chain, 1000 warmup + 2000 draws.
Prints, per N and test: mean items per step after warmup, fraction of N, ms per step (compile excluded),
acceptance, min ESS, ESS per second of sampling.

    python benchmarks/control_variates.py [--sizes 1e5 1e6 1e7] [--smoke] [--out benchmarks/results]
"""

import sys

import _common as C
import tallmh as tm


def main():
    ap = C.parser(__doc__, whole=True)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=1000)
    C.add_run_options(ap, C.RESULTS, seed=False, smoke_help="tiny run (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.samples, args.warmup = [3000], 100, 100
    tests = {
        "austerity": tm.acceptance.Austerity(epsilon=0.05, batch_size=100),
        "confidence": tm.acceptance.Confidence(delta=0.05, initial_batch=100),
        "barker": tm.acceptance.Barker(batch_size=100),
    }
    rows = []
    meta = C.machine_info(sys.argv, args=vars(args))
    C.header("control_variates: items and time per step with and without Taylor control variates", meta)
    print(f"{'N':>8} {'test':<12} {'cv':<3} {'items/step':>11} {'frac':>8} {'ms/step':>8} {'accept':>6} "
          f"{'ESS min':>7} {'ESS/s':>8} {'setup items':>12}")
    for n in [int(s) for s in args.sizes]:
        data, _ = tm.models.LogisticRegression.simulate(n, d=10, seed=0)
        model = tm.models.LogisticRegression(prior_scale=10.0)
        mode = None
        for name, test in tests.items():
            for use_cv in (False, True):
                cv = tm.ControlVariates(order=2) if use_cv else None
                if not use_cv and mode is None:
                    # the mode, by the same Newton iterations (their cost shows in the cv rows)
                    r0 = tm.sample(model, data, test=test, num_samples=1, num_warmup=0, num_chains=1,
                                   control_variates=tm.ControlVariates(order=2), progress=False)
                    mode = r0.final_state.cv.center[0]
                r = tm.sample(model, data, test=test, num_samples=args.samples, num_warmup=args.warmup,
                              proposal=tm.proposals.AdaptiveMetropolis(),  # the same proposal with and without
                              num_chains=1, seed=0, progress=False, control_variates=cv,
                              init=None if use_cv else mode)
                s = r.summary().overall
                row = {"N": n, "test": name, "control_variates": use_cv, "items_per_step": s["mean_n_data"],
                       "data_fraction": s["data_fraction"], "ms_per_step": 1e3 * s["sampling_s"] / args.samples,
                       "acceptance": s["acceptance_rate"], "ess_min": s["ess_min"], "ess_per_s": s["ess_per_s"],
                       "setup_items": s["setup_items"], "compile_s": s["compile_s"]}
                rows.append(row)
                print(f"{n:>8.0e} {name:<12} {'yes' if use_cv else 'no':<3} {row['items_per_step']:>11.1f} "
                      f"{row['data_fraction']:>8.4f} {row['ms_per_step']:>8.3f} {row['acceptance']:>6.3f} "
                      f"{row['ess_min']:>7.1f} {row['ess_per_s']:>8.1f} {row['setup_items']:>12}", flush=True)
    C.write_json(args.out, "control_variates.json", {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
