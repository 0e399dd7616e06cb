"""The self-audit with and without certified decisions (``tallmh.certify``), in the austerity default's call.

For each N (``time_to_trusted.make_data``: logistic regression, d = 11, feature scales 0.1 to 10) the script
runs ``tm.sample(model, data, num_samples="auto", min_ess=1000)`` with the approximate default
(``Austerity(error=0.05)`` + control variates; for this model the default is now the exact subsampled test,
which has nothing to audit) in one process: once to
compile (discarded), then alternately with certification on (the default) and off
(``tallmh.run.selfaudit.CERTIFY = False``: every audited decision takes a full pass, and the default audit's plan is
cut to its item budget at N items per audit, as before certification). It prints per configuration the
audited chain-steps, how many were certified, the items the audits read, the audit's power to flag twice the
target, the call's sampling and total seconds (medians over ``--repeats``), and for the certified runs the
medians of the bound ``B``, the rounding allowance ``R`` and the thresholds' distance ``|t - P|``
(``tallmh.certify.bounds``). The draws are the same in both configurations (the audits never change them).

    python benchmarks/certified_audit.py --sizes 1e5 1e6 1e7
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C
from time_to_trusted import PRIOR_SCALE, make_data


def main():
    ap = C.parser(__doc__, whole=True)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7])
    ap.add_argument("--repeats", type=int, default=2)
    C.add_run_options(ap, C.RESULTS, smoke_help="tiny run (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.repeats = [2e4], 1
    import tallmh as tm
    from tallmh import certify
    from tallmh.run import selfaudit

    seen = []
    settle = certify.settle

    def recording(cert, theta, theta_p, t, size):
        P, B, R, _ = certify.bounds(cert, theta, theta_p)
        seen.append(np.stack([np.abs(np.asarray(t, float) - P), B, R], axis=-1))
        return settle(cert, theta, theta_p, t, size)

    certify.settle = recording
    meta = C.machine_info(sys.argv)
    C.header("the self-audit with and without certified decisions (default call, min_ess=1000)", meta)
    rows = []
    for n in [int(s) for s in args.sizes]:
        X, y, _ = make_data(n)
        data, model = {"X": X, "y": y}, tm.models.LogisticRegression(prior_scale=PRIOR_SCALE)

        def run():
            t0 = time.perf_counter()
            r = tm.sample(model, data, num_samples="auto", min_ess=1000, progress=False, seed=args.seed,
                          test=tm.acceptance.Austerity(error=0.05), control_variates=tm.ControlVariates())
            wall = time.perf_counter() - t0
            a = r.audit
            note = [m for m in r.notes if "tallmh.certify;" in m]
            certified = int(note[0].split("self-audit: ")[1].split(" ")[0]) if note else 0
            return {"audited": a["audit_steps"], "certified": certified, "audit_items": a["audit_items"],
                    "power": a["audit_power"], "wrong": a.get("audit_wrong", 0), "sampling_s": r.timings["sampling_s"],
                    "call_s": wall, "ess_min": r.summary().overall["ess_min"]}

        selfaudit.CERTIFY = True
        run()  # (compiles)
        got = {"on": [], "off": []}
        for _ in range(args.repeats):
            for cfg in ("on", "off"):
                selfaudit.CERTIFY = cfg == "on"
                seen.clear()
                got[cfg].append(run())
                if cfg == "on" and seen:
                    got[cfg][-1]["bounds_median"] = np.median(np.concatenate(seen), axis=0).tolist()
        selfaudit.CERTIFY = True
        for cfg in ("on", "off"):
            rs = got[cfg]
            row = {"N": n, "certify": cfg, **{k: rs[-1][k] for k in ("audited", "certified", "audit_items", "power",
                                                                      "wrong", "ess_min")},
                   "sampling_s": float(np.median([r["sampling_s"] for r in rs])),
                   "call_s": float(np.median([r["call_s"] for r in rs]))}
            if "bounds_median" in rs[-1]:
                row["t_minus_P"], row["B"], row["R"] = rs[-1]["bounds_median"]
            rows.append(row)
            extra = (f"; median |t - P| {row['t_minus_P']:.3f}, B {row['B']:.3f}, R {row['R']:.3f}"
                     if "B" in row else "")
            print(f"N {n:.0e} certify {cfg:3s}: audited {row['audited']:4d}, certified {row['certified']:4d}, "
                  f"audit items {row['audit_items']:.3g}, power {row['power']:.2f}, wrong {row['wrong']}; "
                  f"sampling {row['sampling_s']:.2f} s, call {row['call_s']:.2f} s{extra}", flush=True)
    if args.out:
        C.write_json(args.out, "certified_audit" + ("_smoke" if args.smoke else "") + ".json",
                     {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
