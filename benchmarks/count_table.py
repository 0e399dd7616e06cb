"""`tallmh run --formula ... --family poisson|negativebinomial` on a public count table, against maximum likelihood.

The table is the RAND Health Insurance Experiment extract that statsmodels ships (``randhie``: 20,190 people,
``mdvis`` = number of outpatient visits; not in this repository: ``pip install statsmodels``). Each family is
fitted by the command line with every default (a fresh process, whole-process time measured from outside),
and by statsmodels' maximum likelihood (a Poisson GLM; NB2 by ``NegativeBinomial``). With 20,190 rows and
the command line's weak priors the posterior mean sits within a small fraction of a standard error of the
MLE and the posterior sd near the MLE's standard error, so ``|mean - MLE| / se`` and ``sd / se`` are the
check. Usage::

    python benchmarks/count_table.py                 # both families
    python benchmarks/count_table.py --families poisson
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import _common as bc

FORMULA = "mdvis ~ lncoins + idp + lpi + fmde + physlm + disea + hlthg + hlthf + hlthp"


def table(path):
    try:
        import statsmodels.api as sm
    except ImportError:
        sys.exit("count_table.py needs statsmodels for the table and the MLE: pip install statsmodels")
    data = sm.datasets.randhie.load_pandas().data
    data.to_csv(path, index=False)
    return data


def mle(data, family):
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    if family == "poisson":
        fit = smf.glm(FORMULA, data, family=sm.families.Poisson()).fit()
        return fit.params.to_numpy(), fit.bse.to_numpy(), list(fit.params.index)
    fit = smf.negativebinomial(FORMULA, data, loglike_method="nb2").fit(disp=0, maxiter=200)
    return fit.params.to_numpy(), fit.bse.to_numpy(), list(fit.params.index)


def run_cli(csv, family, out):
    cmd = [sys.executable, "-m", "tallmh", "run", csv, "--formula", FORMULA, "--family", family, "--out", out,
           "--quiet"]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        sys.exit(f"tallmh run failed ({p.returncode}):\n{p.stderr[-2000:]}")
    with open(os.path.join(out, "results.json")) as f:
        res = json.load(f)
    return res, wall, " ".join(cmd[1:])


def main():
    ap = bc.parser(__doc__)
    ap.add_argument("--families", default="poisson,negativebinomial")
    ap.add_argument("--out", default=bc.RESULTS)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="tallmh-counts-")
    csv = os.path.join(folder, "randhie.csv")
    data = table(csv)
    report = {"machine": bc.machine_info(sys.argv), "table": "statsmodels randhie", "rows": int(len(data)),
              "formula": FORMULA, "families": {}}
    for family in args.families.split(","):
        res, wall, cmd = run_cli(csv, family, os.path.join(folder, family))
        est, se, names = mle(data, family)
        post = res["coefficients"]["table"]
        mean = np.array([post[k]["mean"] for k in res["coefficients"]["names"]])
        sd = np.array([post[k]["sd"] for k in res["coefficients"]["names"]])
        k = min(len(mean), len(est))  # (NB2: statsmodels' alpha is last; tallmh names its dispersion apart)
        z = np.abs(mean[:k] - est[:k]) / se[:k]
        ratio = sd[:k] / se[:k]
        row = {"verdict": res.get("verdict"), "trusted": res.get("trusted"), "whole_process_s": round(wall, 1), "command": cmd,
               "max_abs_mean_minus_mle_in_se": float(z.max()), "sd_over_se": [float(ratio.min()), float(ratio.max())],
               "names": res["coefficients"]["names"][:k], "mle_names": names[:k],
               "seconds_inside": {k2: v for k2, v in res.get("timings", {}).items() if k2.endswith("_s")}}
        report["families"][family] = row
        print(f"{family:17s} verdict {str(row['verdict'])[:28]:28s} whole process {wall:6.1f} s   "
              f"max |mean - MLE| {z.max():.3f} se   sd/se {ratio.min():.2f}-{ratio.max():.2f}")
    bc.write_json(args.out, "count_table.json", report)


if __name__ == "__main__":
    main()
