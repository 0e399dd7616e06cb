"""Time per step on 1 device versus chains and rows split over host devices.

    python benchmarks/sharding.py                    # N = 1e5, 4 host devices, layouts below
    python benchmarks/sharding.py --n 20000 --multi  # also two processes x 2 devices (jax.distributed, gloo)

Each device count needs its own process (``XLA_FLAGS=--xla_force_host_platform_device_count=K`` must be
set before JAX starts), so this script re-runs itself as a child. Logistic regression (d = 10 +
intercept, float32), 4 chains, the austerity test (epsilon 0.05, batch 500) with and without
second-order control variates. For each layout: ``tm.sample`` twice (the second call reuses the compiled
chain), then the sampling phase's wall time per step (all 4 chains), items read per step, the compiled
program's collectives, and the data held per device. Whether draws match the single-device ones is
checked too (``same_draws``).

Host devices are threads of one CPU: on a machine with few cores (this one has 2, shared) no speed-up is
expected; the numbers show the overhead of the layout, not the gain on real accelerators.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time

import _common as C

HERE = os.path.dirname(os.path.abspath(__file__))
LAYOUTS = {"1 device": None, "chains 4": (4, 1), "rows 4": (1, 4), "chains 2 x rows 2": (2, 2)}


def child(args):
    import warnings

    if args.port:
        sys.path.insert(0, os.path.join(HERE, "..", "src"))
        from tallmh import distributed as dist

        dist.initialize(f"localhost:{args.port}", 2, args.process_id, local_device_count=2)
    import jax
    import numpy as np

    import tallmh as tm
    from tallmh import distributed as dist
    from tallmh.run import programs

    warnings.simplefilter("ignore")
    n = int(float(args.n))
    data, _ = tm.models.LogisticRegression.simulate(n, d=10, seed=0)
    model = tm.models.LogisticRegression()
    row_bytes = sum(np.asarray(v).itemsize * int(np.prod(np.shape(v)[1:])) for v in data.values())
    out = {"n": n, "devices": jax.device_count(), "processes": jax.process_count(), "rows": []}
    configs = {"austerity": {}, "austerity + cv": {"control_variates": tm.ControlVariates(order=2)}}
    layouts = LAYOUTS if jax.device_count() >= 4 else {"1 device": None}
    for cname, extra in configs.items():
        ref = None
        for lname, shape in layouts.items():
            mesh = False if shape is None else dist.make_mesh(chains=shape[0], rows=shape[1])
            kw = dict(test=tm.acceptance.Austerity(epsilon=0.05, batch_size=500), num_chains=4, seed=0,
                      num_warmup=args.warmup, num_samples=args.samples, progress=False, mesh=mesh, **extra)
            tm.sample(model, data, **kw)  # compile
            t = time.perf_counter()
            r = tm.sample(model, data, **kw)
            wall = time.perf_counter() - t
            entry = list(programs.RUNNERS.values())[-1]
            rows = 1 if shape is None else shape[1]
            row = {"config": cname, "layout": lname, "step_ms": 1e3 * r.timings["sampling_s"] / args.samples,
                   "call_s": wall, "setup_s": r.timings["setup_s"],
                   "items_per_step": float(np.mean(r.stats["n_data"])),
                   "collectives": dist.collectives(entry["compiled"]),
                   "data_mb_per_device": row_bytes * -(-n // rows) / 2**20}
            if ref is None:
                ref = r.flat_samples
            row["same_draws"] = bool(np.array_equal(ref, r.flat_samples))
            out["rows"].append(row)
            if jax.process_index() == 0:
                print(f"{cname:15s} {lname:18s} {row['step_ms']:7.3f} ms/step  items/step "
                      f"{row['items_per_step']:7.1f}  collectives {row['collectives']}  data/device "
                      f"{row['data_mb_per_device']:.1f} MB  same draws: {row['same_draws']}", flush=True)
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    if args.port:
        jax.distributed.shutdown()


def run_child(devices, args, extra=()):
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = os.path.join(HERE, "..", "src") + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--child", "--n", str(args.n), "--warmup", str(args.warmup),
           "--samples", str(args.samples), *extra]
    return env, cmd


def result_of(text):
    for line in text.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(text[-3000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="1e5")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--multi", action="store_true", help="also two processes with 2 host devices each")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(C.RESULTS, "sharding.json"))
    args = ap.parse_args()
    if args.child:
        return child(args)
    results = {"meta": C.machine_info(sys.argv), "runs": []}
    env, cmd = run_child(4, args)
    print("# one process, 4 host devices", flush=True)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    sys.stdout.write("\n".join(l for l in p.stdout.splitlines() if not l.startswith("RESULT")) + "\n")
    results["runs"].append({"kind": "one process, 4 host devices", **result_of(p.stdout + p.stderr)})
    if args.multi:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        print("# two processes x 2 host devices (jax.distributed, gloo)", flush=True)
        procs = []
        for i in range(2):
            env, cmd = run_child(2, args, ("--port", str(port), "--process-id", str(i)))
            env["XLA_FLAGS"] = ""  # set by tallmh.distributed.initialize(local_device_count=2)
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [q.communicate()[0] for q in procs]
        sys.stdout.write("\n".join(l for l in outs[0].splitlines() if not l.startswith(("RESULT", "[Gloo]"))) + "\n")
        results["runs"].append({"kind": "two processes x 2 host devices", **result_of(outs[0])})
    C.write_json(os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
