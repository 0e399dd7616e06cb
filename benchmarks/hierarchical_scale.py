"""A hierarchical logistic regression at scale, from a fresh process, with every default: time, memory and
accuracy against the simulated truth.

``y ~ x1 + x2 + (1|g)`` (Bambi, Bernoulli): N rows (default 10^6), two standard-normal slopes, a group intercept
over G groups (default 100) of log-uniform sizes (50 to 50,000 rows at the defaults), group sd 0.5, intercept
-0.5, slopes 0.8 and -0.5 (known truth). ``tm.from_bambi(bm)`` then ``tm.sample(model, data, program="auto")``
(the automatic blocks for group-level models) with every other default (``num_samples="auto"``: min bulk ESS 400 and R-hat <=
1.01 within the 600-s budget). Printed: the whole-process time (from the script's first line to the result),
the set-up's and the sampling's, min bulk ESS, max R-hat, the verdict, the process's peak memory (resident,
``getrusage``) and after each stage, and the z-scores of the fixed effects and the group sd against the truth
((posterior mean - truth) / posterior sd) and of the group effects (largest |z| and the share within 2). The
``Intercept`` is on the data's scale on every route (a Bambi model's as Bambi's own ``fit`` reports it), the scale of
the truth; a Bambi model's sampled intercept of the centred predictors is saved too (``Intercept_centred``), and a
reference is compared like with like (``nuts_reference.intercept_pairs``).

Usage::

    python benchmarks/hierarchical_scale.py                      # 10^6 rows x 100 groups
    python benchmarks/hierarchical_scale.py --rows 10000000 --groups 1000
    python benchmarks/hierarchical_scale.py --effects approximate   # austerity + control variates instead
    python benchmarks/hierarchical_scale.py --effects single-block  # no automatic blocks
    python benchmarks/hierarchical_scale.py --frontend pymc      # the same model written in PyMC
    python benchmarks/hierarchical_scale.py --frontend bambi-formula  # tm.from_bambi(formula, df, family=...)
    python benchmarks/hierarchical_scale.py --frontend bambi-formula --model-only --rows 10000000 --groups 1000
    python benchmarks/hierarchical_scale.py --rows 10000000 --groups 1000 --frontend pymc \\
        --nuts-reference benchmarks/results/nuts_reference_10000000x1000_2026-11-29.json
    python benchmarks/hierarchical_scale.py --smoke

``--frontend pymc`` builds the model Bambi builds (its names, its group term ``1|g = 1|g_offset * 1|g_sigma``,
priors ``Normal(0, 1.5)`` on the intercept, ``Normal(0, 1)`` on the slopes, ``HalfNormal(2.5)`` on the group sd)
directly in PyMC with an index for the group: Bambi's formula library holds the group term's rows x levels
indicator matrix in float64 (800 MB at 10^6 x 100, 80 GB at 10^7 x 1,000), so at 10^7 rows only this route fits
in memory. ``--frontend bambi-formula`` passes the formula and the data frame to ``tm.from_bambi``, which builds
Bambi's model with an integer index for the group term (no indicator matrix; the same PyMC model).
"""

import time

T0 = time.perf_counter()

import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

import _common  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def simulate(n, groups, seed):
    rng = np.random.default_rng(seed)
    lo, hi = 50, 50_000
    w = np.exp(rng.uniform(np.log(lo), np.log(hi), groups))
    sizes = np.maximum(1, np.round(w / w.sum() * n).astype(int))
    sizes[np.argmax(sizes)] += n - sizes.sum()
    g = np.repeat(np.arange(groups), sizes)
    x = rng.normal(size=(n, 2))
    a = rng.normal(0, 0.5, groups)
    truth = {"Intercept": -0.5, "x1": 0.8, "x2": -0.5, "1|g_sigma": 0.5}
    eta = truth["Intercept"] + x @ np.array([truth["x1"], truth["x2"]]) + a[g]
    y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(np.int8)
    return g, x, y, a, truth, sizes


def pymc_model(g, x, y, levels):
    """The model Bambi builds for ``y ~ x1 + x2 + (1|g)``, family bernoulli, written in PyMC with Bambi's names (the
    group term ``1|g = 1|g_offset * 1|g_sigma``), read through an index instead of an indicator matrix."""
    import pymc as pm

    with pm.Model(coords={"g__factor_dim": levels}) as m:
        b0 = pm.Normal("Intercept", 0.0, 1.5)
        b1 = pm.Normal("x1", 0.0, 1.0)
        b2 = pm.Normal("x2", 0.0, 1.0)
        sigma = pm.HalfNormal("1|g_sigma", 2.5)
        offset = pm.Normal("1|g_offset", 0.0, 1.0, dims="g__factor_dim")
        eff = pm.Deterministic("1|g", offset * sigma, dims="g__factor_dim")
        eta = b0 + b1 * x[:, 0] + b2 * x[:, 1] + eff[g]
        pm.Bernoulli("y", logit_p=eta, observed=y)
    return m


def main(argv=None):
    ap = _common.parser(__doc__)
    _common.add_run_options(ap, os.path.join(REPO, "benchmarks", "results"))
    _common.add_options(ap, rows=1_000_000, groups=100)
    ap.add_argument("--effects", choices=("exact-glm", "exact-mh", "approximate", "single-block"), default="exact-glm",
                    help="the effects block: the exact one for a logistic GLM (glm_effects.py) or austerity with "
                         "control variates; exact-mh: the same program with every effects step deciding on all rows "
                         "(the reference); single-block: no automatic blocks (tm.sample's default method)")
    ap.add_argument("--reference", default=None,
                    help="the JSON of an --effects exact-mh run of the same rows, groups and seed: prints each fixed "
                         "effect's and sigma's |mean difference| in its posterior sds, and the group effects' largest")
    ap.add_argument("--nuts-reference", default=None,
                    help="a NUTS reference on the same rows, groups and seed (nuts_reference.py simulated): prints "
                         "z = |mean - reference mean| / reference sd for every fixed effect and sigma, the sd ratios, "
                         "and the group effects' largest z and share within 0.1 and 0.2")
    ap.add_argument("--frontend", choices=("bambi", "bambi-formula", "pymc"), default="bambi",
                    help="bambi: bmb.Model and tm.from_bambi; bambi-formula: tm.from_bambi(formula, df, family=...); "
                         "pymc: the same model written in PyMC, tm.from_pymc")
    ap.add_argument("--model-only", action="store_true",
                    help="with --frontend bambi-formula: stop after Bambi's model is built (its memory and time)")
    ap.add_argument("--pcn", type=float, default=None, help="the exact block's Crank-Nicolson parameter")
    a = ap.parse_args(argv)
    if a.smoke:
        a.rows, a.groups = 3000, 12
    import pandas as pd

    sys.path.insert(0, os.path.join(REPO, "src"))
    import bambi as bmb

    import tallmh as tm
    from tallmh import hierarchical

    hierarchical.EXACT_GLM = a.effects in ("exact-glm", "exact-mh")
    if a.effects == "exact-mh":
        hierarchical.GLM_TEST = "exact"
    if a.pcn is not None:
        hierarchical.GLM_PCN = a.pcn

    meta = _common.machine_info(sys.argv)
    _common.header("hierarchical_scale", meta)
    mem = {"imports": peak_mb()}
    g, x, y, a_true, truth, sizes = simulate(a.rows, a.groups, a.seed)
    levels = [f"g{j:0{len(str(a.groups - 1))}d}" for j in range(a.groups)]
    if a.frontend != "pymc":
        df = pd.DataFrame({"y": y, "x1": x[:, 0], "x2": x[:, 1], "g": pd.Categorical.from_codes(g, levels)})
        del g, x, y
    mem["table"] = peak_mb()
    t1 = time.perf_counter()
    if a.frontend == "bambi":
        bm = bmb.Model("y ~ x1 + x2 + (1|g)", df, family="bernoulli")
        bm.build()
        mem["bambi model"] = peak_mb()
        model, data = tm.from_bambi(bm)
    elif a.frontend == "bambi-formula":
        if a.model_only:  # Bambi's model by the index route, built; no conversion, no sampling
            from tallmh.frontends.bambi_index import indexed_bambi_model

            indexed_bambi_model("y ~ x1 + x2 + (1|g)", df, family="bernoulli")
            mem["bambi model"] = peak_mb()
            row = {"frontend": a.frontend, "rows": a.rows, "groups": a.groups, "model s": time.perf_counter() - t1,
                   "peak MB by stage": mem, "load": open("/proc/loadavg").read().split()[:3]}
            print(row, flush=True)
            _common.write_json(a.out, f"hierarchical_scale_{a.rows}x{a.groups}_bambi_formula_model_only.json",
                               {"meta": meta, "result": row})
            return
        model, data = tm.from_bambi("y ~ x1 + x2 + (1|g)", df, family="bernoulli")
    else:
        pm_model = pymc_model(g, x, y, levels)
        del g, x, y
        mem["pymc model"] = peak_mb()
        model, data = tm.from_pymc(pm_model)
    mem["from_pymc" if a.frontend == "pymc" else "from_bambi"] = peak_mb()
    t2 = time.perf_counter()
    r = tm.sample(model, data, seed=a.seed, progress=False, program=None if a.effects == "single-block" else "auto",
                  **({"budget_s": 30.0} if a.smoke else {}))
    t3 = time.perf_counter()
    mem["sample"] = peak_mb()
    s = r.summary()
    o = s.overall
    # Intercept: on the data's scale on every route (a Bambi model's as Bambi's fit reports it), the truth's scale;
    # a Bambi model's sampled intercept of the centred predictors is kept as Intercept_centred
    sites = list(truth) + [k for k in ("Intercept_centred",) if k in r.samples]
    z = {}
    for k, v in truth.items():
        d = np.asarray(r.samples[k]).reshape(-1)
        z[k] = float((d.mean() - v) / d.std(ddof=1))
    eff = np.asarray(r.samples["1|g"]).reshape(-1, a.groups)
    zg = (eff.mean(0) - a_true) / eff.std(0, ddof=1)
    per_step = {k: float(np.mean(v)) for k, v in r.stats.items() if k.endswith("_n_data")}
    row = {"frontend": a.frontend, "effects block": a.effects, "pcn": hierarchical.GLM_PCN, "load": open("/proc/loadavg").read().split()[:3],
           "rows per step by block": per_step, "rows": a.rows, "groups": a.groups, "group sizes": f"{sizes.min()}-{sizes.max()}",
           "whole process s": t3 - T0, "from_bambi s": t2 - t1, "sample s": t3 - t2,
           "sampling s": r.timings.get("sampling_s"), "min bulk ESS": o["ess_min"], "max R-hat": o["rhat_max"],
           "trusted": bool(o["trusted"]), "verdict": o["verdict"], "peak MB": mem["sample"], "peak MB by stage": mem,
           "z (fixed, sigma)": z, "group z max |z|": float(np.max(np.abs(zg))),
           "group z share within 2": float(np.mean(np.abs(zg) < 2)), "data fraction": r.data_fraction,
           "notes": r.notes,
           "means": {k: float(np.asarray(r.samples[k]).mean()) for k in sites},
           "sds": {k: float(np.asarray(r.samples[k]).std(ddof=1)) for k in sites},
           "group means": eff.mean(0).tolist(), "group sds": eff.std(0, ddof=1).tolist()}
    if a.reference:
        from nuts_reference import intercept_pairs

        with open(a.reference) as f:
            ref = json.load(f)["result"]
        pairs = intercept_pairs(ref, row["means"])  # like with like (a reference saved with the centred Intercept)
        run_k = {k: pairs.get(k, (k,))[0] for k in truth}
        row["intercept compared"] = {k: f"reference {k} against run {v[0]}: {v[1]}" for k, v in pairs.items()}
        row["|mean - reference| / reference sd"] = {
            k: abs(row["means"][run_k[k]] - ref["means"][k]) / ref["sds"][k] for k in truth}
        row["groups: max |mean - reference| / reference sd"] = float(np.max(
            np.abs(eff.mean(0) - np.asarray(ref["group means"])) / np.asarray(ref["group sds"])))
        row["sd / reference sd"] = {k: row["sds"][run_k[k]] / ref["sds"][k] for k in truth}
    print(str(s))
    if a.nuts_reference:
        from nuts_reference import compare

        row["against the NUTS reference"] = compare(a.nuts_reference, row["means"], row["sds"], row["group means"],
                                                    row["group sds"], label="tallmh")
    for k in ("frontend", "effects block", "load", "rows per step by block", "rows", "groups", "group sizes", "whole process s", "from_bambi s", "sample s", "sampling s",
              "min bulk ESS", "max R-hat", "trusted", "peak MB", "peak MB by stage", "z (fixed, sigma)",
              "group z max |z|", "group z share within 2", "data fraction", "|mean - reference| / reference sd",
              "groups: max |mean - reference| / reference sd", "sd / reference sd", "intercept compared"):
        if k not in row:
            continue
        v = row[k]
        print(f"{k:>24}: {v:.4g}" if isinstance(v, float) else f"{k:>24}: {v}", flush=True)
    _common.write_json(a.out, "hierarchical_scale_smoke.json" if a.smoke else
                       f"hierarchical_scale_{a.rows}x{a.groups}_{a.effects}"
                       f"{'' if a.frontend == 'bambi' else '_' + a.frontend.replace('-', '_')}.json", {"meta": meta, "result": row})


if __name__ == "__main__":
    main()
