"""The default test's bias on a hierarchical model's group scale: sequential decisions against exact ones.

A PyMC model with a group-level intercept written as Bambi writes it (``1|g = 1|g_offset * 1|g_sigma``; six
groups of 3,000 rows and four of 200, 50, 10 and 3: 18,263 rows), through ``tm.from_pymc`` (the group terms
recentred), sampled by the default path (Austerity with control variates and the Langevin drift) and, with
everything else the same, with exact decisions (``test=Exact()``) or another error target. Each run's
posterior means are compared with the reference by quadrature (``tests/test_pymc.py``): the bias in posterior
sds and in Monte Carlo standard errors (z), for the group scale ``1|g_sigma`` and the largest over the other
11 coordinates, with the run's verdict.

Usage::

    python benchmarks/group_scale_bias.py --seeds 0,1 --tests default,exact
    python benchmarks/group_scale_bias.py --seeds 0 --tests austerity-0.01
    python benchmarks/group_scale_bias.py --groups 3000,3000,3000,3000,3000,3000,200   # without the small groups
"""

from __future__ import annotations

import os
import sys

import numpy as np

import _common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _test(name):
    import tallmh as tm

    if name == "default":
        return None
    if name == "exact":
        return tm.acceptance.Exact()
    if name.startswith("austerity-"):
        return tm.acceptance.Austerity(error=float(name.split("-", 1)[1]))
    raise SystemExit(f"unknown test {name!r}: default, exact or austerity-ERROR")


def main(argv=None):
    ap = _common.parser(__doc__)
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--tests", default="default,exact")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--groups", default="3000,3000,3000,3000,3000,3000,200,50,10,3", help="rows per group")
    ap.add_argument("--out", default=os.path.join(REPO, "benchmarks", "results"))
    a = ap.parse_args(argv)
    sys.path.insert(0, REPO)
    import tallmh as tm
    from tests.test_pymc import _group_reference, bambi_style_groups

    meta = _common.machine_info(sys.argv)
    _common.header("group_scale_bias", meta)
    m, g, y, n_j = bambi_style_groups(n_j=tuple(_common.numbers(a.groups, int)))
    mean, sd = _group_reference(g, y, n_j)
    cols = [("test", ">15s", "test"), ("seed", ">4d", "seed"), ("sigma bias/sd", ">13.3f", "sigma bias/sd"),
            ("sigma z", ">7.2f", "sigma z"), ("others max |z|", ">14.2f", "others max |z|"),
            ("sigma sd ratio", ">14.2f", "sigma sd ratio"), ("ESS sigma", ">9.0f", "ESS sigma"),
            ("verdict", ">11s", "verdict")]
    print(_common.table_header(cols), flush=True)
    rows = []
    for name in a.tests.split(","):
        for seed in _common.numbers(a.seeds, int):
            model, data = tm.from_pymc(m, centre_groups=True)
            kw = {} if name == "default" else {"test": _test(name), "control_variates": tm.ControlVariates(order=2)}
            r = tm.sample(model, data, num_samples=a.samples, num_warmup=500, seed=seed, progress=False, **kw)
            draws = np.concatenate([r.samples["1|g_sigma"][..., None], r.samples["Intercept"][..., None],
                                    r.samples["1|g"]], axis=-1)
            flat = draws.reshape(-1, draws.shape[-1])
            z = np.array([(flat[:, j].mean() - mean[j]) / float(tm.diagnostics.mcse_mean(draws[..., j]))
                          for j in range(len(mean))])
            row = {"test": name, "seed": seed, "sigma bias/sd": float((flat[:, 0].mean() - mean[0]) / sd[0]),
                   "sigma z": float(z[0]), "others max |z|": float(np.max(np.abs(z[1:]))),
                   "sigma sd ratio": float(flat[:, 0].std() / sd[0]),
                   "ESS sigma": float(tm.diagnostics.ess(draws[..., 0])),
                   "verdict": "trusted" if r.trusted else "NOT trusted"}
            rows.append(row)
            print(_common.table_row(row, cols), flush=True)
    name = "group_scale_bias.json" if a.groups == ap.get_default("groups") else "group_scale_bias_groups.json"
    _common.write_json(a.out, name, {"meta": meta, "groups": a.groups, "rows": rows})


if __name__ == "__main__":
    main()
