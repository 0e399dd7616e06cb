"""How many digits the exact test's Delta keeps in float32.

Float32 data and parameters (JAX's default precision), ``GaussianMean`` (sigma = 1, x ~ N(3, 1)) and
``LinearRegression`` (d = 3, noise sd 1), N = 10^6, 10^7, 10^8. For a few (theta, theta') pairs one MH
step apart (theta drawn from the posterior, theta' = theta + 2.4 / sqrt(d) posterior sd x N(0, I)):

- ``ref``: Delta = sum_i log p(x_i|theta') - log p(x_i|theta), in float64 NumPy on the same float32 data
  and parameters;
- ``before``: the former computation (a float32 running mean of log p(x_i|theta) over the data, times N,
  for theta and theta', then the difference of the two numbers near -1.4 N);
- ``after (tracked)``: what ``Exact`` does inside ``tm.sample`` now: the full log-likelihood kept as a
  double-float pair (``Exact.initial_log_lik``), Delta from ``Exact.log_ratio``;
- ``after (per-item)``: ``Exact.log_ratio`` without a tracked log-likelihood (compensated sum of the
  per-item differences l_i; what the self-audit and ``tm.decide`` use);
- ``floor``: the float32 per-item values log p(x_i|theta) summed exactly (float64 on the host): the error
  no summation can remove, the rounding of each item's own float32 log-likelihood.

Prints |Delta - ref| (largest over the pairs) and saves ``benchmarks/results/precision.json``.

    python benchmarks/precision.py [--sizes 1e6 1e7 1e8] [--pairs 3] [--smoke] [--x64]
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import _common as C
import tallmh as tm
from tallmh.acceptance.base import Moments, Problem, StreamReader
from tallmh.storage.data import take

_CH = 1 << 20


def make_data(which, n, seed):
    rng = np.random.default_rng(seed)
    if which == "gaussian-mean":
        x = rng.standard_normal(n, dtype=np.float32)
        x += np.float32(3.0)
        return tm.models.GaussianMean(), {"x": x}
    X = rng.standard_normal((n, 3), dtype=np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5], np.float32)) + rng.standard_normal(n, dtype=np.float32)
    return tm.models.LinearRegression(), {"X": X, "y": y.astype(np.float32)}


def ll64(model, data, theta):
    th = np.asarray(theta, np.float64)
    tot = 0.0
    if "x" in data:
        x = data["x"]
        for s in range(0, x.shape[0], _CH):
            z = x[s:s + _CH].astype(np.float64) - th[0]
            tot += np.sum(-0.5 * z * z - 0.5 * np.log(2 * np.pi))
        return tot
    X, y = data["X"], data["y"]
    for s in range(0, y.shape[0], _CH):
        r = y[s:s + _CH].astype(np.float64) - X[s:s + _CH].astype(np.float64) @ th
        tot += np.sum(-0.5 * r * r - 0.5 * np.log(2 * np.pi))
    return tot


def posterior(model, data):
    """Posterior mean and sd (float64; flat prior for GaussianMean, the model's prior for LinearRegression)."""
    if "x" in data:
        n = data["x"].shape[0]
        m = float(np.mean(data["x"], dtype=np.float64))
        return np.array([m]), np.array([[1.0 / n]])
    X, y = data["X"], data["y"]
    xtx = np.zeros((3, 3))
    xty = np.zeros(3)
    for s in range(0, y.shape[0], _CH):
        Xs = X[s:s + _CH].astype(np.float64)
        xtx += Xs.T @ Xs
        xty += Xs.T @ y[s:s + _CH].astype(np.float64)
    prec = xtx + np.eye(3) / model.prior_scale**2
    cov = np.linalg.inv(prec)
    return cov @ xty, cov


def build(model, n, dt=jnp.float32):
    test = tm.acceptance.Exact()

    @jax.jit
    def run(th, thp, jdata):
        def ll(t):
            return lambda idx: model.log_lik(t, take(jdata, idx))

        cur = test.initial_log_lik(n, ll(th), dt)

        def prob(current):
            return Problem(n, jnp.asarray(0.0, dt), lambda idx: ll(thp)(idx) - ll(th)(idx), ll(thp), None, current)

        tracked, _, _, _ = test.log_ratio(prob(cur))
        per_item, _, _, _ = test.log_ratio(prob(None))
        if callable(getattr(model, "log_lik_ratio", None)):  # what tm.sample's exact test uses for such models
            pr = Problem(n, jnp.asarray(0.0, dt), lambda idx: model.log_lik_ratio(th, thp, take(jdata, idx)),
                         ll(thp), None, None)
            ratio, _, _, _ = test.log_ratio(pr)
        else:
            ratio = per_item
        a = StreamReader(n, 4096, ll(th), permuted=False).advance(None, Moments.zero(dt), n)
        b = StreamReader(n, 4096, ll(thp), permuted=False).advance(None, Moments.zero(dt), n)
        before = b.mean * n - a.mean * n
        return tracked, per_item, before, ratio

    @jax.jit
    def items(t, batch):
        return model.log_lik(t, batch)

    def floor(th, jdata):  # float32 items, exact (float64) sum
        tot = 0.0
        for s in range(0, n, _CH):
            batch = jax.tree_util.tree_map(lambda a: a[s:s + _CH], jdata)
            if jax.tree_util.tree_leaves(batch)[0].shape[0] < _CH:
                tot += float(np.sum(np.asarray(model.log_lik(th, batch), np.float64)))
            else:
                tot += float(np.sum(np.asarray(items(th, batch), np.float64)))
        return tot

    return run, floor


def main():
    ap = C.parser(__doc__, whole=True)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e6, 1e7, 1e8])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--models", nargs="+", default=["gaussian-mean", "linear-regression"])
    ap.add_argument("--smoke", action="store_true", help="tiny run (seconds)")
    ap.add_argument("--x64", action="store_true",
                    help="float64 throughout (jax_enable_x64, float64 data and parameters): the floor goes away")
    ap.add_argument("--out", default=C.RESULTS)
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.pairs = [20_000], 1
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    fdt = np.float64 if args.x64 else np.float32
    meta = C.machine_info(sys.argv, dtype=np.dtype(fdt).name)
    C.header(f"precision: error of the log-likelihood difference sums, {np.dtype(fdt).name}", meta)
    print(f"{'model':<18} {'N':>6} {'|Delta| typ':>11} {'before':>10} {'after trk':>10} {'after item':>10} "
          f"{'ratio':>10} {'floor':>10} {'s':>6}")
    rows = []
    for which in args.models:
        for n in [int(s) for s in args.sizes]:
            t0 = time.perf_counter()
            model, data = make_data(which, n, seed=n % 1000 + 1)
            mean, cov = posterior(model, data)
            data = {k: v.astype(fdt) for k, v in data.items()}
            jdata = jax.tree_util.tree_map(jnp.asarray, data)
            run, floor = build(model, n, jnp.dtype(fdt))
            rng = np.random.default_rng(7)
            L = np.linalg.cholesky(cov)
            d = mean.shape[0]
            errs = {"before": [], "after_tracked": [], "after_per_item": [], "after_ratio": [], "floor": []}
            deltas = []
            for _ in range(args.pairs):
                th = (mean + L @ rng.standard_normal(d)).astype(fdt)
                thp = (th + 2.4 / np.sqrt(d) * (L @ rng.standard_normal(d))).astype(fdt)
                ref = ll64(model, data, thp) - ll64(model, data, th)
                tracked, per_item, before, ratio = run(jnp.asarray(th), jnp.asarray(thp), jdata)
                fl = floor(jnp.asarray(thp), jdata) - floor(jnp.asarray(th), jdata)
                errs["before"].append(abs(float(before) - ref))
                errs["after_tracked"].append(abs(float(tracked[0]) + float(tracked[1]) - ref))
                errs["after_per_item"].append(abs(float(per_item[0]) + float(per_item[1]) - ref))
                errs["after_ratio"].append(abs(float(ratio[0]) + float(ratio[1]) - ref))
                errs["floor"].append(abs(fl - ref))
                deltas.append(abs(ref))
            secs = time.perf_counter() - t0
            row = {"model": which, "N": n, "pairs": args.pairs, "median_abs_delta": float(np.median(deltas)),
                   **{f"max_abs_err_{k}": float(max(v)) for k, v in errs.items()},
                   **{f"abs_err_{k}": [float(e) for e in v] for k, v in errs.items()}, "seconds": secs}
            rows.append(row)
            print(f"{which:<18} {n:>6.0e} {row['median_abs_delta']:>11.3g} {row['max_abs_err_before']:>10.3g} "
                  f"{row['max_abs_err_after_tracked']:>10.3g} {row['max_abs_err_after_per_item']:>10.3g} "
                  f"{row['max_abs_err_after_ratio']:>10.3g} {row['max_abs_err_floor']:>10.3g} {secs:>6.1f}", flush=True)
            del data, jdata
    if not args.smoke:
        name = "precision_x64.json" if args.x64 else "precision.json"
        path = os.path.join(args.out, name)
        if os.path.exists(path):  # keep the other models' rows from an earlier run
            with open(path) as f:
                old = json.load(f).get("rows", [])
            done = {r["model"] for r in rows}
            rows = [r for r in old if r["model"] not in done] + rows
        C.write_json(args.out, name, {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
