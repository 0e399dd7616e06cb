"""The exact subsampled default's proposal chosen in warmup: each proposal's ESS per step and per second, and the choice's.

For each case and seed, ``tm.sample`` runs the exact subsampled test (the default for these models) three ways:
with the Crank-Nicolson proposal from the run's Laplace approximation (rho adapted in warmup; 0, the independence
sampler, on these cases), with MALA on the surrogate (step 1.65 d^(-1/3)), and with the default, which chooses
between them in warmup (``tallmh.run.proposal_choice``). Printed per run: the proposal used, acceptance, rows read
per step, ESS per step (the smallest bulk ESS over the coordinates, over all kept draws) and ESS per second of the
sampling stage, the warmup's seconds and the choice's (its MALA pilot included); then each method's mean over
the seeds. A last line per case runs the default with ``num_samples="auto"`` (as a user would), its sampling
stage's seconds and the choice's.

Cases: the rare feature (N = 5 10^4, a one-hot feature in 30 rows: the posterior the selection was designed on),
the unequal-scales logistic regression at N = 10^6 (near-Gaussian, also a design case), and two it was not
designed on: about 1% positives (N = 10^5) and a few rows with features 100 times the others' (N = 5 10^4).

    python benchmarks/proposal_choice.py
    python benchmarks/proposal_choice.py --cases rare --seeds 0,1,2,3 --samples 5000
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import _common as C

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "acceptance"))

COLUMNS = [("case", "<10", "case"), ("N", ">7.0e", "n"), ("method", "<12", "method"), ("seed", ">4d", "seed"),
           ("used", "<15", "used"), ("accept", ">7.3f", "accept"), ("rows/step", ">9.3g", "items"),
           ("ESS/step", ">9.4f", "ess_per_step"), ("ESS/s", ">9.4g", "ess_per_s"), ("warmup s", ">8.3f", "warmup_s"),
           ("choice s", ">8.3f", "choice_s"), ("sampling s", ">10.3f", "sampling_s")]


def cases(names, seed):
    from exact_subsampling import rare_feature, unbalanced
    from test_thinning import heavy_rows
    from time_to_trusted import make_data

    for name in names:
        if name == "rare":
            yield name, rare_feature(seed=seed)
        elif name == "balanced":
            X, y, _ = make_data(1_000_000, seed)
            yield name, {"X": X, "y": y}
        elif name == "1%-pos":
            yield name, unbalanced(100_000, seed)
        elif name == "heavy":
            yield name, heavy_rows(seed=seed)
        else:
            raise SystemExit(f"unknown case {name!r}")


def one(tm, case, data, method, seed, samples):
    from tallmh.reporting.diagnostics import ess_all

    d = int(np.shape(data["X"])[1])
    prop = {"CN": tm.proposals.CrankNicolson(), "MALA": tm.proposals.SurrogateLangevin(step=1.65 * d ** (-1 / 3)),
            "choice": None, "choice-auto": None}[method]
    r = tm.sample(tm.models.LogisticRegression(), data, proposal=prop, seed=seed, progress=False,
                  num_samples="auto" if method == "choice-auto" else samples)
    x = np.asarray(r.flat_samples, np.float64)
    ess = float(np.nanmin(ess_all(x)))
    st = r.stats
    used = getattr(r.proposal, "chosen", None) or r.proposal.name
    steps = x.shape[0] * x.shape[1]
    return {"case": case, "n": int(np.shape(data["y"])[0]), "method": method, "seed": seed, "used": used,
            "accept": float(np.mean(st["accepted"])), "items": float(np.mean(st["n_data"])),
            "ess_per_step": ess / steps, "ess_per_s": ess / r.timings["sampling_s"], "draws": steps,
            "warmup_s": r.timings["warmup_s"], "choice_s": r.timings.get("choice_s", 0.0),
            "sampling_s": r.timings["sampling_s"],
            "note": next((m for m in r.notes if m.startswith("proposal:")), "")}


def main(argv=None):
    ap = C.parser(__doc__)
    C.add_options(ap, cases="rare,balanced,1%-pos,heavy", seeds="0,1,2", samples=5000)
    C.add_run_options(ap, str(Path(__file__).parent / "results"), seed=False)
    args = ap.parse_args(argv)
    if args.smoke:
        args.cases, args.seeds, args.samples = "rare", "0", 300
    import tallmh as tm

    meta = C.machine_info(sys.argv if argv is None else ["proposal_choice.py"] + list(argv))
    C.header("the exact subsampled default's proposal choice", meta)
    print(C.table_header(COLUMNS), flush=True)
    rows = []
    names = [s.strip() for s in args.cases.split(",") if s.strip()]
    seeds = C.numbers(args.seeds, int)
    for name, data in cases(names, 0):
        for method in ("CN", "MALA", "choice"):
            for seed in seeds:
                t0 = time.perf_counter()
                r = one(tm, name, data, method, seed, args.samples)
                r["wall_s"] = time.perf_counter() - t0
                rows.append(r)
                print(C.table_row(r, COLUMNS), flush=True)
        if not args.smoke:
            r = one(tm, name, data, "choice-auto", seeds[0], args.samples)
            rows.append(r)
            print(C.table_row(r, COLUMNS), flush=True)
        for method in ("CN", "MALA", "choice"):
            mine = [r for r in rows if r["case"] == name and r["method"] == method]
            print(f"   {name} {method}: mean ESS/step {np.mean([r['ess_per_step'] for r in mine]):.4f} "
                  f"(min {min(r['ess_per_step'] for r in mine):.4f}), mean ESS/s "
                  f"{np.mean([r['ess_per_s'] for r in mine]):.4g}; chose "
                  f"{sorted(set(r['used'] for r in mine))}", flush=True)
        for r in rows:
            if r["case"] == name and r["method"] == "choice":
                print(f"   seed {r['seed']}: {r['note']}", flush=True)
    meta["load_average_at_end"] = C.load_average()
    if not args.smoke:
        C.write_json(args.out, "proposal_choice.json", {"meta": meta, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
