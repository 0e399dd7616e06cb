"""Group-level Poisson-log and known-sd Gaussian GLMs under ``tm.sample``'s default (the automatic blocks with the
exact effects step): whole-call time, verdict, rows read per step, and the estimates against the simulation's truth.

Data simulated with a known truth: ``eta = 0.2 + 0.5 x1 - 0.3 x2 + u_g``, ``u_g ~ N(0, 0.5^2)``, groups of
random sizes (a log-normal spread: many small, a few large); ``y ~ Poisson(exp(eta))`` or ``y ~ N(eta, 1)`` (the
sd known to the model). The model is written in PyMC (centred group effects, ``sigma ~ HalfNormal(1)``) and
converted by ``tm.from_pymc``. The "z vs truth" columns are (posterior mean - truth) / posterior sd: a sanity
check of one data set (a posterior need not cover its truth), not a reference posterior.

Usage::

    python benchmarks/group_families.py --rows 100000 --groups 100 --families poisson,gaussian
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import _common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH = {"mu": 0.2, "b1": 0.5, "b2": -0.3, "sigma": 0.5}


def simulate(family, n, groups, seed):
    rng = np.random.default_rng(seed)
    w = rng.lognormal(0.0, 1.5, groups)
    g = rng.choice(groups, n, p=w / w.sum())
    x1, x2 = rng.normal(size=n), rng.normal(size=n)
    u = rng.normal(0, TRUTH["sigma"], groups)
    eta = TRUTH["mu"] + TRUTH["b1"] * x1 + TRUTH["b2"] * x2 + u[g]
    y = rng.poisson(np.exp(eta)) if family == "poisson" else eta + rng.normal(size=n)
    return g, x1, x2, y


def model(family, g, x1, x2, y, groups):
    import pymc as pm

    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("mu", 0, 5)
        b1 = pm.Normal("b1", 0, 5)
        b2 = pm.Normal("b2", 0, 5)
        s = pm.HalfNormal("sigma", 1)
        u = pm.Normal("u", 0, s, shape=groups)
        eta = mu + b1 * x1 + b2 * x2 + u[gi]
        if family == "poisson":
            pm.Poisson("y", pm.math.exp(eta), observed=y)
        else:
            pm.Normal("y", eta, 1.0, observed=y)
    return m


def main(argv=None):
    ap = _common.parser(__doc__)
    _common.add_run_options(ap, os.path.join(REPO, "benchmarks", "results"))
    _common.add_options(ap, rows=100_000, groups=100, families="poisson,gaussian", budget=600.0)
    a = ap.parse_args(argv)
    if a.smoke:
        a.rows, a.groups = 2000, 10
    import tallmh as tm

    meta = _common.machine_info(sys.argv)
    _common.header("group_families", meta)
    cols = [("family", ">9s", "family"), ("rows", ">9d", "rows"), ("groups", ">6d", "groups"),
            ("whole s", ">8.1f", "whole s"), ("rows/step", ">10.1f", "rows/step"), ("ESS min", ">8.0f", "ESS min"),
            ("R-hat", ">6.3f", "R-hat"), ("max |z| vs truth", ">16.2f", "max |z| vs truth"),
            ("verdict", ">12s", "verdict")]
    rows = []
    for fam in a.families.split(","):
        g, x1, x2, y = simulate(fam, a.rows, a.groups, a.seed)
        t = time.time()
        mdl, data = tm.from_pymc(model(fam, g, x1, x2, y, a.groups))
        r = tm.sample(mdl, data, seed=a.seed, progress=False, budget_s=a.budget)
        whole = time.time() - t
        z = {k: (float(np.mean(r.samples[k])) - v) / float(np.std(r.samples[k])) for k, v in TRUTH.items()}
        d = r.summary().overall
        rows.append({"family": fam, "rows": a.rows, "groups": a.groups, "whole s": whole,
                     "rows/step": float(d["mean_n_data"]), "ESS min": float(d["ess_min"]),
                     "R-hat": float(d["rhat_max"]), "max |z| vs truth": max(abs(v) for v in z.values()),
                     "verdict": str(r.verdict), "z": z, "label": r.label, "notes": list(r.notes)})
        print(r.label, flush=True)
    _common.print_table(rows, cols)
    _common.write_json(a.out, "group_families.json" if not a.smoke else "group_families_smoke.json",
                       {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
