"""A Bambi model with a categorical predictor and a group-level intercept on 3,000,000 US flights: tallmh on
the whole table and on a 10^5-row subset, PyMC's NUTS (through NumPyro) on the subset only.

    late ~ log_dist + C(dep_time) + (1|day),   family bernoulli     (--group origin: (1|origin))

The table is ``flights-3m.parquet`` of the ``vega-datasets`` package (3,000,000 domestic US flights,
January to June 2001: scheduled departure, delay in minutes, distance, origin, destination). Get it with
``npm pack vega-datasets@3.2.1 && tar xzf vega-datasets-3.2.1.tgz package/data/flights-3m.parquet`` (or
from any mirror of the npm package). Columns made here: ``late`` = delay over 15 minutes; ``log_dist`` =
log distance, standardised; ``dep_time`` = departure time in five bands (06-09, 09-13, 13-17, 17-21,
21-06); ``day`` = calendar day (182 levels, about 16,000 flights each: the day's weather and traffic);
``origin`` = the departure airport (229 levels, from 166,341 flights down to 1; 73 airports with fewer than
1,000), the group with ``--group origin``.

Needs ``bambi`` and ``numpyro`` (``pip install ".[test]"`` has both). Run::

    python benchmarks/bambi_flights3m.py --table flights-3m.parquet [--subset 100000] [--nuts-cache F.npz]
    python benchmarks/bambi_flights3m.py --table flights-3m.parquet --group origin --skip-subset
    python benchmarks/bambi_flights3m.py --table flights-3m.parquet --group origin --skip-subset --route formula \\
        --nuts-reference benchmarks/results/nuts_reference_flights3m_origin_2026-11-29.json --json OUT.json

Everything of tallmh is ``tm.sample``'s default (``--budget`` sets ``budget_s``). Times are whole calls
from the data frame: Bambi's model build, the conversion (``tm.from_bambi``, with its pilot fit) and the
sampling for tallmh; the build and ``pm.sample`` for NUTS. ``--nuts-cache F.npz`` stores NUTS's draws in F,
or reads them from F when it exists (then its time is the stored one).

``Intercept`` is on the data's scale in every column, as Bambi's own ``fit`` reports it: tallmh's, and NUTS's (its
draws of Bambi's PyMC model mapped as Bambi maps them); ``Intercept_centred`` is the sampled intercept of the centred
predictors, in both. The whole-table comparison with ``--nuts-reference`` (whose ``Intercept`` is the centred one)
compares it with tallmh's ``Intercept_centred`` and says so.
"""

import argparse
import os
import time

import numpy as np

from bambi_flights import flat, moments, show

FORMULA = "late ~ log_dist + C(dep_time) + (1|{group})"


def table(path):
    import pandas as pd

    d = pd.read_parquet(path)
    hour = d["date"].dt.hour
    band = np.select([(hour >= 6) & (hour < 9), (hour >= 9) & (hour < 13), (hour >= 13) & (hour < 17),
                      (hour >= 17) & (hour < 21)], ["06-09", "09-13", "13-17", "17-21"], "21-06")
    ld = np.log(d["distance"].to_numpy(float))
    return pd.DataFrame({
        "late": (d["delay"] > 15).astype(int),
        "log_dist": (ld - ld.mean()) / ld.std(),
        "dep_time": pd.Categorical(band),
        "day": d["date"].dt.strftime("%m-%d"),
        "origin": d["origin"].astype(str),
    })


def by_tallmh(bmb, tm, frame, label, args):
    t = time.time()
    if args.route == "formula":  # Bambi's model without its rows x levels matrix (tm.from_bambi(formula, df))
        model, data = tm.from_bambi(FORMULA.format(group=args.group), frame, family="bernoulli")
    else:
        bm = bmb.Model(FORMULA.format(group=args.group), frame, family="bernoulli")
        model, data = tm.from_bambi(bm)
    t_conv = time.time() - t
    kw = {} if args.budget is None else {"budget_s": args.budget}
    r = tm.sample(model, data, seed=args.seed, progress=False, **kw)
    wall = time.time() - t
    lines = str(r.summary()).splitlines()
    cut = next((i for i, ln in enumerate(lines) if ln.startswith("param")), len(lines) + 1) - 1
    print(f"\n== tallmh, {label}: {len(frame):,} rows; build + conversion {t_conv:.1f}s, whole call {wall:.1f}s")
    print("\n".join(lines[:max(cut, 0)]))
    print("notes:", r.notes)
    return r, wall


def by_nuts(bmb, frame, args, names, shifts):
    """NUTS's draws of Bambi's PyMC model, flat, with its Intercept put on the data's scale as Bambi's ``fit`` puts
    it (``shifts``: :func:`tallmh.frontends.bambi_intercept.intercept_shifts`) and the sampled one kept as
    ``Intercept_centred``, as tallmh reports them; the cache holds the sampled draws."""
    from tallmh.frontends.bambi_intercept import shift_draws

    if args.nuts_cache and os.path.exists(args.nuts_cache):
        z = np.load(args.nuts_cache)
        print(f"\nNUTS draws read from {args.nuts_cache}")
        raw = {k: z[k] for k in z.files if not k.startswith("__")}
        return flat(shift_draws(raw, shifts)), float(z["__wall"]), int(z["__div"])
    import pymc as pm

    t = time.time()
    bm = bmb.Model(FORMULA.format(group=args.group), frame, family="bernoulli")
    bm.build()
    with bm.backend.model:
        idata = pm.sample(draws=args.nuts_draws, tune=args.nuts_tune, chains=2, nuts_sampler="numpyro",
                          random_seed=args.seed, progressbar=False,
                          nuts_sampler_kwargs={"chain_method": "sequential"})
    wall = time.time() - t
    post = idata.posterior
    raw = {k: post[k].values for k in post.data_vars if k in names}  # not Bambi's per-row "p"
    div = int(idata.sample_stats["diverging"].values.sum()) if "diverging" in idata.sample_stats else -1
    if args.nuts_cache:
        np.savez(args.nuts_cache, __wall=wall, __div=div, **raw)
    return flat(shift_draws(raw, shifts)), wall, div


def whole_table_summary(r, wall, gt, keys, args):
    """Means and sds (over all draws, ddof 1) of the common effects and the group sd, and of each group effect."""
    import sys

    d = flat(r.samples)
    eff = np.asarray(r.samples[gt], float)
    eff = eff.reshape(-1, eff.shape[-1])
    o = r.summary().overall
    return {"command": "python " + " ".join(sys.argv), "whole call s": wall, "verdict": r.verdict,
            "min bulk ESS": o["ess_min"], "max R-hat": o["rhat_max"], "notes": r.notes,
            "load": open("/proc/loadavg").read().split()[:3],
            "means": {k: float(d[k].mean()) for k in keys}, "sds": {k: float(d[k].std(ddof=1)) for k in keys},
            "group means": eff.mean(0).tolist(), "group sds": eff.std(0, ddof=1).tolist()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="flights-3m.parquet", help="path of flights-3m.parquet")
    ap.add_argument("--subset", type=int, default=100_000)
    ap.add_argument("--nuts-draws", type=int, default=1500)
    ap.add_argument("--nuts-tune", type=int, default=500)
    ap.add_argument("--nuts-cache", default=None, help="an .npz of NUTS draws: read if it exists, else written")
    ap.add_argument("--skip-subset", action="store_true", help="the whole table only")
    ap.add_argument("--skip-full", action="store_true", help="the subset only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--group", default="day", choices=["day", "origin"], help="the group-level intercept's group")
    ap.add_argument("--budget", type=float, default=None, help="tm.sample's budget_s (default: its own, 600 s)")
    ap.add_argument("--nuts-reference", default=None,
                    help="a NUTS reference on the whole table (nuts_reference.py flights): prints, for the whole-table "
                         "run, z = |mean - reference mean| / reference sd for every fixed effect and the group sd, the "
                         "sd ratios, and the group effects' largest z and share within 0.1 and 0.2")
    ap.add_argument("--json", default=None, help="write the whole-table run's summary (means and sds per site, the "
                                                 "group effects', the verdict, times, the comparison) to this file")
    ap.add_argument("--route", default="model", choices=["model", "formula"],
                    help="tallmh's conversion: tm.from_bambi(bmb.Model(...)) or tm.from_bambi(formula, frame), "
                         "which builds the same model without the group term's dense rows x levels matrix")
    args = ap.parse_args()
    if not os.path.exists(args.table):
        ap.error(f"{args.table} not found; see this script's docstring for where to get flights-3m.parquet")

    t0 = time.time()
    import jax

    # float64: Bambi's Bernoulli graph takes the log of invlogit(eta), which float32 rounds to log 0 far out
    jax.config.update("jax_enable_x64", True)
    import bambi as bmb

    import tallmh as tm

    df = table(args.table)
    print(f"imports and table {time.time() - t0:.1f}s; bambi {bmb.__version__}, tallmh {tm.__version__}; "
          f"{len(df):,} rows, {df[args.group].nunique()} levels of {args.group}, late {df['late'].mean():.3f}")
    res = {}
    gt = f"1|{args.group}"
    names = ["Intercept", "log_dist", "C(dep_time)", f"{gt}_sigma", gt]
    if not args.skip_subset:
        sub = df.sample(n=min(args.subset, len(df)), random_state=args.seed).reset_index(drop=True)
        r_sub, w_sub = by_tallmh(bmb, tm, sub, f"{len(sub):,}-row subset", args)
        d_t = flat(r_sub.samples)
        res["tallmh subset"] = (moments(d_t), r_sub.verdict, w_sub)
        from tallmh.frontends.bambi_index import indexed_bambi_model
        from tallmh.frontends.bambi_intercept import intercept_shifts

        # Bambi's column means of the subset's common terms: NUTS's Intercept on the data's scale, as tallmh's
        shifts = intercept_shifts(indexed_bambi_model(FORMULA.format(group=args.group), sub, family="bernoulli"))
        d_n, w_n, div = by_nuts(bmb, sub, args, names, shifts)
        ess = min(float(tm.diagnostics.ess(v)) for v in d_n.values() if np.std(v) > 0)
        rhat = max(float(tm.diagnostics.rhat(v)) for v in d_n.values() if np.std(v) > 0)
        print(f"\n== NUTS (PyMC model from Bambi, NumPyro's NUTS), same subset: 2 chains x ({args.nuts_tune} + "
              f"{args.nuts_draws}), {w_n:.1f}s, {div} divergences, min bulk ESS {ess:.0f}, max R-hat {rhat:.3f}")
        res["NUTS subset"] = (moments(d_n), f"{div} divergences", w_n)
        mt, mn = moments(d_t), moments(d_n)
        common = [k for k in d_t if k in d_n and mn[k][1] > 0]
        diff = {k: abs(mt[k][0] - mn[k][0]) / mn[k][1] for k in common}
        z = {k: abs(mt[k][0] - mn[k][0]) / np.hypot(float(tm.diagnostics.mcse_mean(d_t[k])),
                                                    float(tm.diagnostics.mcse_mean(d_n[k]))) for k in common}
        sds = {k: mt[k][1] / mn[k][1] for k in common}
        main_names = [k for k in common if not k.startswith(gt + "[") and not k.startswith(gt + "_offset")]
        show("means and sds on the subset (common effects and the group scale)",
             {k: v[0] for k, v in res.items()}, main_names)
        v = np.array([diff[k] for k in common])
        print(f"\n|tallmh mean - NUTS mean| / NUTS sd over all {len(common)} outputs: max {v.max():.3f}, "
              f"median {np.median(v):.3f}, share <= 0.1: {np.mean(v <= 0.1):.3f}; max |z| (both MCSEs) "
              f"{max(z.values()):.2f}; sd ratio {min(sds.values()):.2f}-{max(sds.values()):.2f}")
        worst = sorted(diff, key=diff.get, reverse=True)[:5]
        print("  largest:", ", ".join(f"{k} {diff[k]:.3f} (z {z[k]:.2f})" for k in worst), flush=True)
    if not args.skip_full:
        r_full, w_full = by_tallmh(bmb, tm, df, "whole table", args)
        res["tallmh whole table"] = (moments(flat(r_full.samples)), r_full.verdict, w_full)
        keys = [k for k in flat(r_full.samples) if not k.startswith(gt + "[") and not k.startswith(gt + "_offset")]
        show("means and sds (common effects and the group scale)", {k: v[0] for k, v in res.items()}, keys)
        if args.nuts_reference or args.json:
            summary = whole_table_summary(r_full, w_full, gt, keys, args)
            if args.nuts_reference:
                from nuts_reference import compare

                summary["against the NUTS reference"] = compare(
                    args.nuts_reference, summary["means"], summary["sds"], summary["group means"],
                    summary["group sds"], label="tallmh, whole table")
            if args.json:
                import json

                with open(args.json, "w") as f:
                    json.dump({"result": summary}, f, indent=1)
    print("\nwall times: " + ", ".join(f"{k} {v[2]:.1f}s" for k, v in res.items()))
    print("verdicts: " + "; ".join(f"{k}: {v[1]}" for k, v in res.items()))


if __name__ == "__main__":
    main()
