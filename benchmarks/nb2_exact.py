"""tm.sample's exact default on NB2 regression (``NegativeBinomialRegression``: the remainder bound on a trust region).

Simulated overdispersed counts (``X = (1, x1, x2)`` normal features, ``beta = (1.5, 0.8, -0.3)``, ``alpha = 0.5``:
counts up to several hundred) at each N of ``--sizes``. Printed per run: the default's test, whole call seconds,
draws per chain, rows read per step (mean, 99th percentile), the share of steps that read all N rows (the trust
region's or the rate's fallback), min ESS per step, the sampling stage's seconds, the largest posterior-mean error
in posterior sds against the simulation's parameters, and the verdict. ``--austerity`` adds the approximate test
of models without a bound (austerity with control variates, per-step error 0.05) for comparison. ``--frontend
pymc|bambi|numpyro`` writes the same regression in that library (``NegativeBinomial(mu=exp(eta), alpha)``,
``family="negativebinomial"``, ``NegativeBinomial2(exp(eta), concentration)``) and samples the converted model.

Usage::

    python benchmarks/nb2_exact.py                      # writes results/nb2_exact.json
    python benchmarks/nb2_exact.py --sizes 1e5 --austerity --out /tmp/x
    python benchmarks/nb2_exact.py --sizes 1e5 --frontend pymc      # writes results/nb2_exact_pymc.json
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C

BETA, ALPHA = (1.5, 0.8, -0.3), 0.5


def nb_data(n, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=n), rng.normal(size=n)]).astype(np.float32)
    mu = np.exp(X.astype(np.float64) @ np.asarray(BETA))
    y = rng.poisson(rng.gamma(1.0 / ALPHA, mu * ALPHA)).astype(np.float32)
    return {"X": X, "y": y}


# the simulation's parameters by the names each front end gives them (the dispersion as r = 1/alpha)
TRUTH = {"a": BETA[0], "Intercept": BETA[0], "b[0]": BETA[1], "x1": BETA[1], "b[1]": BETA[2], "x2": BETA[2],
         "r": 1.0 / ALPHA, "alpha": 1.0 / ALPHA, "conc": 1.0 / ALPHA}


def frontend_model(tm, frontend, data):
    """``(model, data)``: the regression of :func:`nb_data` written in PyMC, Bambi or NumPyro and converted."""
    X, y = np.asarray(data["X"][:, 1:], np.float64), np.asarray(data["y"], np.int64)
    if frontend == "pymc":
        import pymc as pm

        with pm.Model() as m:
            a, b, r = pm.Normal("a", 0, 10), pm.Normal("b", 0, 10, shape=2), pm.HalfNormal("r", 10.0)
            pm.NegativeBinomial("y", mu=pm.math.exp(a + pm.math.dot(X, b)), alpha=r, observed=y)
        return tm.from_pymc(m)
    if frontend == "bambi":
        import bambi as bmb
        import pandas as pd

        df = pd.DataFrame({"x1": X[:, 0], "x2": X[:, 1], "y": y})
        return tm.from_bambi(bmb.Model("y ~ x1 + x2", df, family="negativebinomial"))
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def model(X, y=None):
        a = numpyro.sample("a", dist.Normal(0, 10))
        b = numpyro.sample("b", dist.Normal(0, 10).expand([2]))
        c = numpyro.sample("conc", dist.HalfNormal(10.0))
        with numpyro.plate("rows", X.shape[0]):
            numpyro.sample("y", dist.NegativeBinomial2(jnp.exp(a + X @ b), c), obs=y)

    return tm.from_numpyro(model, X.astype(np.float32), y.astype(np.float32))


def one(tm, n, data, seed, test=None, frontend="builtin"):
    import arviz as az

    from tallmh.frontends.formula import NegativeBinomialRegression

    t0 = time.perf_counter()
    model, data = (NegativeBinomialRegression(), data) if frontend == "builtin" else \
        frontend_model(tm, frontend, data)
    kw = {} if test is None else {"test": test, "control_variates": tm.ControlVariates(order=2)}
    r = tm.sample(model, data, seed=seed, progress=False, **kw)
    wall = time.perf_counter() - t0
    x = np.asarray(r.flat_samples, np.float64)
    nd = np.asarray(r.stats["n_data"], np.float64)
    ess = min(float(az.ess(x[..., j])) for j in range(x.shape[-1]))
    if frontend == "builtin":
        flat = x.reshape(-1, x.shape[-1])
        truth = np.r_[BETA, np.log(ALPHA)]
    else:  # (by name, on the scale each front end reports)
        out = np.asarray(r.flat_output, np.float64)
        names = list(r.output_names)
        flat = out.reshape(-1, out.shape[-1])[:, [names.index(k) for k in names if k in TRUTH]]
        truth = np.asarray([TRUTH[k] for k in names if k in TRUTH])
        assert truth.size == 4, names
    zmax = float(np.max(np.abs((flat.mean(axis=0) - truth) / flat.std(axis=0))))
    note = next((m for m in r.notes if m.startswith("default method:")), "?")
    return {"n": n, "frontend": frontend, "method": note.split("(")[0].replace("default method: ", "").strip() if test is None
            else "austerity+cv (error 0.05)", "wall_s": round(wall, 2), "draws": int(x.shape[1]),
            "rows_mean": float(nd.mean()), "rows_p99": float(np.percentile(nd, 99)),
            "full_share": float(np.mean(nd >= n)), "ess_per_step": ess / (x.shape[0] * x.shape[1]),
            "sampling_s": float(r.timings["sampling_s"]), "z_truth_max": zmax, "max_count": float(data["y"].max()),
            "verdict": str(r.verdict)}


def main(argv=None):
    ap = C.parser(__doc__)
    C.add_options(ap, sizes="1e5,1e6", austerity=False, frontend="builtin")
    C.add_run_options(ap, "results")
    args = ap.parse_args(argv)
    import tallmh as tm

    sizes = [5000] if args.smoke else C.numbers(args.sizes, int)
    meta = C.machine_info(sys.argv)
    C.header("tm.sample's default on NB2 regression (exact subsampled test, trust-region remainder bound)"
             + ("" if args.frontend == "builtin" else f", written in {args.frontend} (call s: conversion included)"),
             meta)
    rows = []
    print(f"{'N':>8} {'method':<26} {'call s':>7} {'draws':>6} {'rows/step':>10} {'p99':>6} {'full':>6} "
          f"{'ESS/step':>9} {'sampling s':>10} {'z truth':>7}  verdict", flush=True)
    for n in sizes:
        data = nb_data(n, seed=args.seed)
        tests = [None] + ([tm.acceptance.Austerity(error=0.05)] if args.austerity else [])
        for test in tests:
            r = one(tm, n, data, args.seed, test, args.frontend)
            rows.append(r)
            print(f"{n:>8.0e} {r['method']:<26} {r['wall_s']:>7.1f} {r['draws']:>6} {r['rows_mean']:>10.2f} "
                  f"{r['rows_p99']:>6.0f} {r['full_share']:>6.3f} {r['ess_per_step']:>9.4f} {r['sampling_s']:>10.2f} "
                  f"{r['z_truth_max']:>7.2f}  {r['verdict']}", flush=True)
    tail = "" if args.frontend == "builtin" else "_" + args.frontend
    C.write_json(args.out, f"nb2_exact{tail}_smoke.json" if args.smoke else f"nb2_exact{tail}.json",
                 {"meta": meta, "config": vars(args), "rows": rows})


if __name__ == "__main__":
    sys.exit(main())
