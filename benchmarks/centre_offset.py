"""Items read per step when the control variates' centre is away from the posterior mode.

``tm.sample``'s set-up finds the centre of the Taylor control variates by Newton: first on sub-samples of the
rows (``setup_passes.warm_sizes``), then on the full data until the Newton decrement is below
``setup_passes.centre_tol(d)`` = 0.01 d. From the last sub-sample's mode the first full pass measures the
decrement, which is about d N / m for m sub-sampled rows: one pass is enough only where that is already below
the tolerance; otherwise the pass's Newton step and a second pass follow (the "correction"). This script
measures what the correction buys: the default call with its centre moved to squared Laplace distance delta
from the mode (``ControlVariates(center=mode + L u sqrt(delta))``, ``L L^T`` the Laplace covariance, ``u`` a
random unit vector, so that the Newton decrement at the centre is about delta), for a grid of delta and for
the decrement the last sub-sample's mode leaves (a one-pass set-up's centre). Everything else is the default
call (its own mode search still starts the chains; with the exact test, the Laplace proposals are centred at
the mode it finds and the table's trust region widened to reach them, as a one-pass set-up does:
``tallmh.one_pass``). ``--test``: ``default`` (``tm.sample``'s own: the exact subsampled test where the model
bounds its remainders) or ``austerity`` (the approximate default of 2026-11-28).

Posterior: ``time_to_trusted.make_data`` (logistic regression, d = 11, feature scales 0.1 to 10). Printed per
(N, delta, seed): mean, median and 99th percentile of the items per step (``stats["n_data"]``, warmup
excluded), the acceptance rate, the sampling time of the call, min bulk ESS and min ESS per step.

    python benchmarks/centre_offset.py --sizes 1e6 1e7 --deltas 0 0.11 1.1 11 110 --seeds 0 1
    python benchmarks/centre_offset.py --test default --sizes 1e6 1e7 --deltas 0 11 110 1000 --seeds 0 1
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

import _common as C
from peers import newton_map
from time_to_trusted import PRIOR_SCALE, make_data


def sub_sample_decrement(X, y, H, setup):
    """The full data's Newton decrement at the mode of the last warm-start sub-sample (float64; measured in the
    metric of ``H``, the negative Hessian at the MAP, which differs from the one at that point by O(its distance))."""
    n, d = X.shape
    sizes = setup.warm_sizes(n, d)
    if not sizes:
        return None, 0
    idx = setup.warm_rows(n, sizes[-1])
    m = len(idx)
    theta_sub, _, _ = C.logistic_newton(X[idx], y[idx], PRIOR_SCALE**2 * n / m, 50, tol=1e-10)
    g = -theta_sub / PRIOR_SCALE**2
    for a in range(0, n, 1 << 20):
        Xc = np.asarray(X[a:a + (1 << 20)], np.float64)
        g += Xc.T @ (np.asarray(y[a:a + (1 << 20)], np.float64) - 1.0 / (1.0 + np.exp(-(Xc @ theta_sub))))
    return float(g @ np.linalg.solve(H, g)), m


def main():
    ap = C.parser(__doc__, whole=True)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7])
    ap.add_argument("--deltas", nargs="+", type=float, default=[0.0, 0.11, 1.1, 11.0, 110.0])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--no-sub", action="store_true", help="skip the one-pass centre's row")
    ap.add_argument("--test", choices=["austerity", "default"], default="austerity",
                    help="the test: the approximate default of 2026-11-28, or tm.sample's own default (exact)")
    C.add_run_options(ap, C.RESULTS, seed=False, smoke_help="tiny run (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.deltas, args.seeds, args.samples = [2e4], [0.0, 11.0], [0], 100

    import tallmh as tm
    from tallmh import setup_passes as setup

    warnings.simplefilter("ignore", tm.TrustWarning)  # (each row prints its verdict)

    meta = C.machine_info(sys.argv)
    C.header("tallmh: items per step against the control variates' centre offset", meta)
    rows = []
    for n in [int(s) for s in args.sizes]:
        X, y, _ = make_data(n)
        theta_map, H, _ = newton_map(X, y, PRIOR_SCALE)
        d = X.shape[1]
        L = np.linalg.cholesky(np.linalg.inv(H))
        deltas = list(args.deltas)
        sub, m = (None, 0) if args.no_sub else sub_sample_decrement(X, y, H, setup)
        if sub is not None:
            print(f"# N = {n:.0e}: the last warm-start sub-sample ({m:,} rows) leaves a decrement of {sub:.1f} "
                  f"(d N / m = {d * n / m:.1f}); the centre's tolerance is {setup.centre_tol(d):.2f}", flush=True)
            deltas.append(sub)
        model = tm.models.LogisticRegression(prior_scale=PRIOR_SCALE)
        for delta in deltas:
            for seed in args.seeds:
                u = np.random.default_rng([seed, 7]).standard_normal(d)
                centre = theta_map + L @ (u / np.linalg.norm(u) * np.sqrt(delta))
                t0 = time.perf_counter()
                kw = {"test": "austerity"} if args.test == "austerity" else {}
                res = tm.sample(model, {"X": X, "y": y}, num_samples=args.samples, seed=seed, progress=False,
                                control_variates=tm.ControlVariates(center=centre.astype(X.dtype)), **kw)
                wall = time.perf_counter() - t0
                nd = np.asarray(res.stats["n_data"], np.float64).ravel()
                row = {"N": n, "delta": delta, "one_pass_centre": sub is not None and delta == sub, "seed": seed,
                       "items_mean": float(nd.mean()), "items_median": float(np.median(nd)),
                       "items_p99": float(np.quantile(nd, 0.99)), "sampling_s": float(res.timings["sampling_s"]),
                       "call_s": wall, "ess_min": float(res.summary().overall["ess_min"]),
                       "accept": float(np.mean(np.asarray(res.stats["accepted"]))), "test": args.test,
                       "verdict": res.verdict.split(":")[0]}
                row["ess_per_step"] = row["ess_min"] / max(1, res.flat_samples.shape[0] * res.flat_samples.shape[1])
                rows.append(row)
                print(f"N {n:.0e}  delta {delta:9.2f}{' (one pass)' if row['one_pass_centre'] else '           '}  "
                      f"seed {seed}  items/step mean {row['items_mean']:8.1f}  median {row['items_median']:6.0f}  "
                      f"p99 {row['items_p99']:8.0f}  acc {row['accept']:.3f}  sampling {row['sampling_s']:6.2f} s  "
                      f"min ESS {row['ess_min']:6.0f} ({row['ess_per_step']:.3f}/step)  {row['verdict']}", flush=True)
    if args.out:
        C.write_json(args.out, "centre_offset" + ("_exact" if args.test == "default" else "")
                     + ("_smoke" if args.smoke else "") + ".json",
                     {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
