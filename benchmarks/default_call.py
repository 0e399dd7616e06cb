"""Whole-process time of the README's ten lines: ``tm.sample(model, data)`` with every default, in a fresh
Python process, on a cold and then a warm persistent compilation cache.

The child times its own stages (import of tallmh and JAX, making the data, then ``result.timings`` of the
call: set-up, compile, warmup, sampling, and the rest of the call) and counts the programs JAX compiled
(backend compiles, from JAX's monitoring events, with their seconds) and the persistent cache's hits and
misses; the parent measures the whole process from outside. ``cold`` uses a fresh empty cache folder (a
first run ever); ``warm`` is a second process with the same folder.

Usage::

    python benchmarks/default_call.py --N 1000000            # cold, then warm
    python benchmarks/default_call.py --N 100000 --runs warm   # (warm after one unreported cold run)

The load average is recorded before and after each process (``os.getloadavg``): the numbers are wall times
on whatever else the machine runs.
"""

from __future__ import annotations

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _child(n: int, d: int):
    from collections import Counter, defaultdict

    import jax

    events, durations = Counter(), defaultdict(float)
    jax.monitoring.register_event_listener(lambda e, **k: events.update([e]))

    def on_duration(e, secs, **k):
        events.update([e])
        durations[e] += secs

    jax.monitoring.register_event_duration_secs_listener(on_duration)
    import tallmh as tm

    t_import = time.perf_counter() - T0
    t = time.perf_counter()
    data, _ = tm.models.LogisticRegression.simulate(n, d=d)
    t_data = time.perf_counter() - t
    model = tm.models.LogisticRegression(prior_scale=10.0)
    t = time.perf_counter()
    result = tm.sample(model, data)
    t_call = time.perf_counter() - t
    result.summary()
    tm_ = {k: float(v) for k, v in result.timings.items()}
    parts = ("setup_s", "compile_s", "warmup_s", "sampling_s")
    backend = "/jax/core/compile/backend_compile_duration"
    out = {
        "N": n, "d": d + 1, "import_s": t_import, "data_s": t_data, "call_s": t_call,
        **{k: tm_.get(k, 0.0) for k in parts}, "call_other_s": t_call - sum(tm_.get(k, 0.0) for k in parts),
        "programs_compiled": events[backend], "backend_compile_s": durations[backend],
        "tracing_s": durations.get("/jax/core/compile/jaxpr_trace_duration", 0.0),
        "programs_traced": events["/jax/core/compile/jaxpr_trace_duration"],
        "cache_hits": events["/jax/compilation_cache/cache_hits"],
        "cache_misses": events["/jax/compilation_cache/cache_misses"],
        "trusted": bool(result.trusted),
        "ess_min": float(min(tm.diagnostics.ess(result.flat_samples[:, :, j])
                             for j in range(result.flat_samples.shape[-1]))),
        "draws_per_chain": int(result.flat_samples.shape[1]), "chains": int(result.flat_samples.shape[0]),
        "process_cpu_s": time.process_time(),  # CPU seconds of the whole child, all threads
    }
    print("RESULT-JSON " + json.dumps(out), flush=True)


def _run(n, d, cache_dir):
    from _common import run_child  # (here: the child's own imports are timed)

    env = {k: v for k, v in os.environ.items() if k not in ("TALLMH_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env["XDG_CACHE_HOME"] = cache_dir
    env["PYTHONPATH"] = os.path.join(REPO, "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    load0 = os.getloadavg()
    out, wall = run_child([sys.executable, os.path.abspath(__file__), "--child", str(n), str(d)], env, "RESULT-JSON")
    out.update(process_s=wall, load_before=load0, load_after=os.getloadavg())
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=10, help="features (an intercept is added)")
    p.add_argument("--runs", nargs="+", default=["cold", "warm"], choices=("cold", "warm"))
    p.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return _child(*a.child)
    with tempfile.TemporaryDirectory(prefix="tallmh-default-call-") as cache:
        rows = []
        for i, kind in enumerate(a.runs):
            if kind == "warm" and i == 0:
                _run(a.N, a.d, cache)  # fill the cache first
            r = _run(a.N, a.d, cache)
            r["cache"] = kind
            rows.append(r)
            print(json.dumps(r), flush=True)
    keys = ("process_s", "import_s", "data_s", "setup_s", "compile_s", "warmup_s", "sampling_s", "call_other_s")
    print("| cache | " + " | ".join(keys) + " | programs compiled (cache hits) | traced | backend compile s | ESS min "
          "| trusted | load |")
    for r in rows:
        print(f"| {r['cache']} | " + " | ".join(f"{r[k]:.1f}" for k in keys)
              + f" | {r['programs_compiled']} ({r['cache_hits']}) | {r['programs_traced']} | {r['backend_compile_s']:.1f}"
              + f" | {r['ess_min']:.0f} | {r['trusted']}"
              + f" | {r['load_before'][0]:.1f}-{r['load_after'][0]:.1f} |")


if __name__ == "__main__":
    main()
