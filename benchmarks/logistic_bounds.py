"""tm.sample's exact default on logistic regression with the local remainder bound (the default) and the global one.

``LogisticRegression(remainder_bound="local")`` bounds each row's third derivative on a trust region around the
centre (the exact decision outside it); ``"global"`` uses ``sqrt(3)/18`` everywhere. Both chains are exact, so
their draws follow the same law: what differs is the rows read per step and the steps that leave the region
(each a full pass). Cases: ``rare`` (N = 5 10^4, a one-hot feature in 30 rows: a skewed posterior), ``separated``
(N = 2 10^4, classes well separated: large margins), ``unbalanced`` (N = 10^5, about 1% positives), ``balanced``
(N = 10^6, ``LogisticRegression.simulate``) and ``tiny`` (60 rows, nearly separated: far from Gaussian). Printed per
run: whole call seconds, draws per chain, rows read per step (mean, 99th percentile), the share of steps that read
all N rows (the region's or the rate's fallback), min ESS per step, the sampling stage's seconds and the verdict.

Usage::

    python benchmarks/logistic_bounds.py                 # writes results/logistic_bounds.json
    python benchmarks/logistic_bounds.py --cases rare,tiny --out /tmp/x
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C
from exact_subsampling import rare_feature


def separated(seed=1, n=20_000):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 3))]).astype(np.float32)
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ np.array([0.0, 8.0, -6.0, 4.0]))))).astype(np.float32)
    return {"X": X, "y": y}


def unbalanced(seed=3, n=100_000):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 10)) * np.linspace(0.3, 3.0, 10)]).astype(np.float32)
    beta = np.r_[np.log(0.01 / 0.99), rng.normal(size=10) * 0.1]
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X, "y": y}


def tiny(seed=2, n=60):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 2))]).astype(np.float32)
    y = (X[:, 1] + 0.3 * rng.normal(size=n) > 0).astype(np.float32)
    return {"X": X, "y": y}


def cases(tm, names):
    make = {"rare": lambda: rare_feature(seed=0), "separated": separated, "unbalanced": unbalanced,
            "balanced": lambda: tm.models.LogisticRegression.simulate(10**6, d=10, seed=0)[0], "tiny": tiny}
    return {k: make[k]() for k in names}


def one(tm, name, data, bound, seed):
    import arviz as az

    n = int(data["y"].shape[0])
    t0 = time.perf_counter()
    r = tm.sample(tm.models.LogisticRegression(remainder_bound=bound), data, seed=seed, progress=False)
    wall = time.perf_counter() - t0
    x = r.flat_samples
    nd = np.asarray(r.stats["n_data"], np.float64)
    ess = min(float(az.ess(x[..., j])) for j in range(x.shape[-1]))
    return {"case": name, "n": n, "bound": bound, "wall_s": round(wall, 2), "draws": int(x.shape[1]),
            "rows_mean": float(nd.mean()), "rows_p99": float(np.percentile(nd, 99)),
            "full_share": float(np.mean(nd >= n)), "ess_per_step": ess / (x.shape[0] * x.shape[1]),
            "sampling_s": float(r.timings["sampling_s"]), "verdict": str(r.verdict)}


def main(argv=None):
    ap = C.parser(__doc__)
    C.add_options(ap, cases="rare,separated,unbalanced,balanced,tiny")
    C.add_run_options(ap, "results")
    args = ap.parse_args(argv)
    import tallmh as tm

    names = ["tiny"] if args.smoke else args.cases.split(",")
    meta = C.machine_info(sys.argv)
    C.header("tm.sample's default on logistic regression: local and global remainder bounds", meta)
    rows = []
    print(f"{'case':<11} {'N':>8} {'bound':<7} {'call s':>7} {'draws':>6} {'rows/step':>10} {'p99':>6} "
          f"{'full':>6} {'ESS/step':>9} {'sampling s':>10}  verdict", flush=True)
    for name, data in cases(tm, names).items():
        for bound in ("local", "global"):
            r = one(tm, name, data, bound, args.seed)
            rows.append(r)
            print(f"{name:<11} {r['n']:>8.0e} {bound:<7} {r['wall_s']:>7.1f} {r['draws']:>6} {r['rows_mean']:>10.3f} "
                  f"{r['rows_p99']:>6.0f} {r['full_share']:>6.3f} {r['ess_per_step']:>9.4f} {r['sampling_s']:>10.2f}  "
                  f"{r['verdict']}", flush=True)
    C.write_json(args.out, "logistic_bounds_smoke.json" if args.smoke else "logistic_bounds.json",
                 {"meta": meta, "config": vars(args), "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
