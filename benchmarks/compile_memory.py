"""Compile time, set-up time and peak memory of a whole tm.sample call versus N.

    python benchmarks/compile_memory.py                       # N = 1e5, 1e6, 1e7, 5e7 (each in a fresh process)
    python benchmarks/compile_memory.py --sizes 1e5,1e6       # a subset

Each N runs in its own process: logistic regression, d = 10 + intercept, float32 data generated in chunks
(no float64 copy), then twice ``tm.sample(model, data, test=Austerity(batch_size=100),
control_variates=ControlVariates(), num_chains=1, num_warmup=300, num_samples=300)``. Printed per call:
compile seconds, set-up seconds (mode search, control-variate sums: full passes), whole-call seconds, and
the process's peak resident memory above what it held before the data existed, next to the data's size.
The data is passed to the compiled chain as an argument, so compile time should not grow with N and
the second call should not compile at all. ``tm.sample`` reads in-memory NumPy data in place (no copy:
``tallmh.storage.datasource.in_place_leaf``), so the peak above the data is the compile memory (about 0.7 GB)
plus the set-up passes' fixed-size blocks, whatever N (the target: peak <= data + 1 GB). The
machine's load average is saved with each N (the timings depend on it; the memory does not).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import _common as C



def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(n):
    import warnings

    import numpy as np

    warnings.simplefilter("ignore")
    import jax
    import jax.numpy as jnp

    import tallmh as tm

    jnp.zeros(1).block_until_ready()
    base = rss_mb()
    d = 10
    rng = np.random.default_rng(0)
    X = np.empty((n, d + 1), np.float32)
    y = np.empty(n, np.float32)
    theta = rng.standard_normal(d + 1) / np.sqrt(d)
    for s in range(0, n, 1_000_000):
        e = min(n, s + 1_000_000)
        X[s:e, 0] = 1.0
        X[s:e, 1:] = rng.standard_normal((e - s, d), dtype=np.float32)
        p = 1.0 / (1.0 + np.exp(-(X[s:e] @ theta.astype(np.float32))))
        y[s:e] = rng.random(e - s, dtype=np.float32) < p
    data_mb = (X.nbytes + y.nbytes) / 2**20
    after_data = rss_mb()
    model = tm.models.LogisticRegression(prior_scale=10.0)
    out = {"N": n, "data_mb": data_mb, "base_mb": base, "after_data_mb": after_data - base, "calls": []}
    for call in range(2):
        t0 = time.perf_counter()
        r = tm.sample(model, {"X": X, "y": y}, test=tm.acceptance.Austerity(batch_size=100),
                      control_variates=tm.ControlVariates(), num_chains=1, num_warmup=300, num_samples=300,
                      seed=call, progress=False)
        wall = time.perf_counter() - t0
        out["calls"].append({"wall_s": wall, "compile_s": r.timings["compile_s"], "setup_s": r.timings["setup_s"],
                             "sampling_s": r.timings["sampling_s"], "peak_above_base_mb": peak_mb() - base,
                             "items_per_step": float(np.mean(r.stats["n_data"]))})
    out["jax"] = jax.__version__
    print(json.dumps(out))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1e5,1e6,1e7,5e7")
    p.add_argument("--child", type=int, default=None)
    p.add_argument("--out", default=os.path.join(C.RESULTS, "compile_memory.json"))
    args = p.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return
    meta = C.machine_info(sys.argv)
    rows = []
    print(f"{'N':>10s} {'data MB':>8s} {'call':>4s} {'compile s':>9s} {'set-up s':>8s} {'wall s':>7s} "
          f"{'peak-base MB':>12s} {'peak-base-data MB':>17s}")
    for s in args.sizes.split(","):
        n = int(float(s))
        load = os.getloadavg()
        res = subprocess.run([sys.executable, __file__, "--child", str(n)], capture_output=True, text=True)
        if res.returncode != 0:
            print(f"N = {n}: failed\n{res.stderr[-2000:]}")
            continue
        row = json.loads(res.stdout.strip().splitlines()[-1])
        row["load_avg_before"] = load
        row["load_avg_after"] = os.getloadavg()
        rows.append(row)
        for i, c in enumerate(row["calls"]):
            print(f"{n:10d} {row['data_mb']:8.0f} {i + 1:4d} {c['compile_s']:9.2f} {c['setup_s']:8.2f} "
                  f"{c['wall_s']:7.2f} {c['peak_above_base_mb']:12.0f} {c['peak_above_base_mb'] - row['data_mb']:17.0f}",
                  flush=True)
        print(f"{'':10s} load average {load[0]:.1f} before, {row['load_avg_after'][0]:.1f} after", flush=True)
    C.write_json(os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out),
                 {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
