"""Subprocess helper for tests/test_sharding.py: runs tiny samplers on several (host) devices.

The device count must be fixed before JAX starts, so the tests run this script in a fresh process:

    XLA_FLAGS=--xla_force_host_platform_device_count=4 python tests/sharding_worker.py local OUT.npz [extra]
    python tests/sharding_worker.py multi OUT.npz --process-id I --num-processes 2 --port P

``local``: one process with 4 host devices; ``multi``: one of two processes with 2 host devices each,
joined by ``tallmh.distributed.initialize`` (CPU collectives, gloo). Each run's draws and decisions are
saved in OUT.npz under the run's name; OUT.json holds the layout notes and compiled collectives.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import warnings

N = 2001  # odd: row shards of unequal length (padded)
D = 3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["local", "multi"])
    ap.add_argument("out")
    ap.add_argument("--runs", default="single,c2r2,c2r2_seed4,bad_chains",
                    help="comma-separated runs (local mode): single, default, c2r2, r4, c2r2_seed4, bad_chains, "
                         "exact, cv, langevin, thinning, thinning_full, thinning_default, thinning_bulk")
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--num-processes", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()

    import tallmh as tm
    from tallmh import distributed as dist

    if args.mode == "multi":
        dist.initialize(f"localhost:{args.port}", args.num_processes, args.process_id, local_device_count=2)

    import jax
    import jax.numpy as jnp
    import numpy as np

    from tallmh.run import programs

    jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "tallmh-test-jax-cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    warnings.simplefilter("ignore")
    data, _ = tm.models.LogisticRegression.simulate(N, d=D, seed=1)
    model = tm.models.LogisticRegression()
    aust = tm.acceptance.Austerity(epsilon=0.05, batch_size=100)
    center = jnp.asarray(np.asarray(r_center(model, data), np.float32))
    base = dict(test=aust, num_warmup=20, num_samples=20, num_chains=4, seed=3, progress=False, chunk_size=20,
                init=center, init_jitter=0.05)
    runs = args.runs.split(",")
    arrays, meta = {}, {"devices": jax.device_count(), "processes": jax.process_count(), "runs": {}}

    def run(name, mesh, **kw):
        opts = dict(base)
        opts.update(kw)
        m, x = opts.pop("model", model), opts.pop("data", data)
        try:
            r = tm.sample(m, x, mesh=mesh, **opts)
        except Exception as e:  # noqa: BLE001 - reported to the test
            meta["runs"][name] = {"error": f"{type(e).__name__}: {e}"}
            return
        arrays[name] = r.flat_samples
        arrays[name + "/accepted"] = r.stats["accepted"]
        arrays[name + "/n_data"] = r.stats["n_data"]
        entry = list(programs.RUNNERS.values())[-1]
        meta["runs"][name] = {"notes": [n for n in r.notes if n.startswith("layout")],
                              "method": [n for n in r.notes if n.startswith("default method")],
                              "collectives": dist.collectives(entry["compiled"]),
                              "step_s": r.timings["sampling_s"] / max(1, opts["num_samples"])}

    if args.mode == "local":
        mesh22 = dist.make_mesh(chains=2, rows=2)
        table = {
            "single": lambda: run("single", False),
            "default": lambda: run("default", None),  # 4 devices visible: chains split over them
            "c2r2": lambda: run("c2r2", mesh22),
            "r4": lambda: run("r4", dist.make_mesh(chains=1, rows=4)),
            "c2r2_seed4": lambda: run("c2r2_seed4", mesh22, seed=4),  # negative control
            "bad_chains": lambda: run("bad_chains", dist.make_mesh(chains=4, rows=1), num_chains=3),
        }
        ex = dict(test=tm.acceptance.Exact(), num_warmup=10, num_samples=10, chunk_size=10)
        # (adaptive Metropolis: with control variates the default is Langevin, checked apart below)
        cv = dict(control_variates=tm.ControlVariates(order=2, center=center),
                  proposal=tm.proposals.AdaptiveMetropolis())
        lg = dict(proposal=tm.proposals.Langevin(step_size=2e-4, batch_size=50))
        # the exact subsampled test: its drawn rows' remainders read on their devices; a tiny max_rate sends every
        # step to the full-pass fallback (its sum over the devices' rows)
        th = dict(test=tm.acceptance.PoissonThinning(), control_variates=tm.ControlVariates(order=2), init=None,
                  init_jitter=None)
        thf = dict(th, test=tm.acceptance.PoissonThinning(max_rate=1e-9))
        table["thinning_default"] = lambda: run("thinning_default", mesh22, test=None, init=None, init_jitter=None)

        def thinning_bulk():  # the large-N item sampler (no array of N) forced on these rows, K = 64
            from tallmh import factor_bounds as lt

            saved = lt.BULK_MIN_N, lt.HEAVY_MAX
            lt.BULK_MIN_N, lt.HEAVY_MAX = 0, 64
            try:
                run("thinning_bulk_single", False, **th)
                run("thinning_bulk_c2r2", mesh22, **th)
            finally:
                lt.BULK_MIN_N, lt.HEAVY_MAX = saved

        table["thinning_bulk"] = thinning_bulk
        for name, kw in (("exact", ex), ("cv", cv), ("langevin", lg), ("thinning", th), ("thinning_full", thf)):
            table[name] = (lambda name=name, kw=kw: (run(f"{name}_single", False, **kw),
                                                    run(f"{name}_c2r2", mesh22, **kw)))
        from tallmh.blocks.models import TwoComponentMixture

        xs = np.random.default_rng(0).normal(size=60).astype(np.float32) + np.repeat([-1.5, 1.5], 30)
        pg = dict(model=TwoComponentMixture(), data=xs, test=None, init=None, init_jitter=None, program=tm.Cycle([
            tm.blocks.MH("pi", scale=1.0), tm.blocks.Gibbs("z", items_per_step=60),
            tm.blocks.SubsampledMH("mu", test=tm.acceptance.Exact(chunk=20), scale=1.0, group_by="z")]))
        table["program"] = lambda: (run("program_single", False, **pg),
                                    run("program_c4", dist.make_mesh(chains=4, rows=1), **pg))
        for name in runs:
            table[name]()
    else:
        run("single", False)
        run("default", None)  # the 4 devices of both processes: chains split over them
        run("r4", dist.make_mesh(chains=1, rows=4))  # rows across the two processes
        # rows within a process, chains across processes
        run("c2r2", dist.make_mesh(chains=2, rows=2))

    if jax.process_index() == 0 or args.mode == "multi":
        out = args.out if args.mode == "local" else f"{args.out}.{args.process_id}"
        np.savez(out, **arrays)
        with open(out + ".json", "w") as f:
            json.dump(meta, f)
    if args.mode == "multi":
        jax.distributed.shutdown()
    return 0


def r_center(model, data):
    """A rough posterior mode (a few Newton steps in NumPy) for the control variates' centre."""
    import numpy as np

    X, y = np.asarray(data["X"], np.float64), np.asarray(data["y"], np.float64)
    th = np.zeros(X.shape[1])
    for _ in range(8):
        p = 1 / (1 + np.exp(-X @ th))
        g = X.T @ (y - p) - th / model.prior_scale**2
        h = -(X * (p * (1 - p))[:, None]).T @ X - np.eye(len(th)) / model.prior_scale**2
        th = th - np.linalg.solve(h, g)
    return th


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    sys.exit(main())
