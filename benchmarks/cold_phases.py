"""Where a fresh process's ``tm.sample`` spends its time: each stage of the runner, in which thread, from when to when.

The same call as ``time_to_trusted.py --methods tallmh --auto`` (its data, ``LogisticRegression(prior_scale=10)``,
``min_ess=1000``, seed 0), in a fresh child process with an empty compilation cache, with timestamps taken around
the runner's stages (wrappers put on its functions before the call; a name that is not there is skipped): the
chain's trace (``lower``, in the thread ``tallmh-compile``) and XLA's compile of it, the set-up's mode search,
bounds table, kernel init program and the check of the design's columns, the wait for the chain, warmup and
sampling. For each: start and end (seconds since the child's interpreter started), wall seconds, and the CPU
seconds of the thread that ran it (``time.thread_time``: XLA's compile runs on its own pool, whose CPU this does
not see; the process's total is ``cpu_s``). The parent measures the whole process; ``exit_s`` is the time from
the child's last line to its end (the interpreter's exit: its garbage collections, modules and XLA torn down).

``chain_ready_s`` (the chain compiled, from the call's start) against ``setup_end_s`` (the set-up done) says which of
the two a cold call waits for.

Usage::

    python benchmarks/cold_phases.py --runs 3                # N = 10^6
    python benchmarks/cold_phases.py --smoke --out /tmp/cp    # N = 2,000, one run

Writes ``<out>/cold_phases<tag>.json``. Wall times depend on the machine's load (recorded per run).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# (module, function, label): the stages timed in the child
STAGES = [
    ("tallmh.run.configure", "method", "configure.method"),
    ("tallmh.run.programs", "_early_shapes", "chain: states' shapes"),
    ("tallmh.run.start", "set_up", "set-up"),
    ("tallmh.setup_passes", "mode_search", "set-up: mode search"),
    ("tallmh.run.start", "_table", "set-up: bounds table"),
    ("tallmh.run.start", "init_program", "set-up: init program"),
    ("tallmh.run.data_notes", "notes_of", "design check"),
    ("tallmh.run.programs", "compile_chunk", "wait for the chain"),
    ("tallmh.run.chunks", "run_phase", "warmup / sampling"),
    ("tallmh.run.finish", "finish", "finish"),
]

CHILD = r"""
import time
T0 = time.perf_counter()
import functools, importlib, json, os, sys, threading
EV = []

def wrap(mod, name, label, where=None):
    try:
        m = importlib.import_module(mod)
        f = getattr(m, name)
    except (ImportError, AttributeError):
        return
    @functools.wraps(f)
    def g(*a, **k):
        t, c = time.perf_counter(), time.thread_time()
        try:
            return f(*a, **k)
        finally:
            EV.append({"stage": label, "thread": threading.current_thread().name, "start": t - T0,
                       "end": time.perf_counter() - T0, "thread_cpu": time.thread_time() - c})
    setattr(m, name, g)
    for other in where or ():
        if getattr(importlib.import_module(other), name, None) is f:
            setattr(importlib.import_module(other), name, g)

sys.path.insert(0, sys.argv[1])
import numpy as np
import jax
import tallmh as tm
import tallmh.run.sampling  # (the stages' modules, to wrap them)
t_import = time.perf_counter() - T0
import time_to_trusted as T
X, y, _ = T.make_data(int(sys.argv[2]), 0)
t_data = time.perf_counter() - T0
for mod, name, label in json.loads(sys.argv[3]):
    wrap(mod, name, label, ["tallmh.run.start", "tallmh.run.chunks"])
from tallmh.run import _exec_cache
_cas = _exec_cache.compile_and_store
def cas(key, lower_fn, *a, **k):  # the trace (lowering) and XLA's compile, apart
    def lf():
        t, c = time.perf_counter(), time.thread_time()
        try:
            return lower_fn()
        finally:
            EV.append({"stage": "trace", "thread": threading.current_thread().name, "start": t - T0,
                       "end": time.perf_counter() - T0, "thread_cpu": time.thread_time() - c})
    return _cas(key, lf, *a, **k)
_exec_cache.compile_and_store = cas
wrap("tallmh.run._exec_cache", "_compile", "XLA compile")
t_call = time.perf_counter() - T0
c0 = time.process_time()
res = tm.sample(tm.models.LogisticRegression(prior_scale=10.0), {"X": X, "y": y}, seed=0, progress=False,
                min_ess=1000)
t_end = time.perf_counter() - T0
theta = np.asarray(res.flat_samples)
out = {"import_s": t_import, "data_s": t_data - t_import, "call_start": t_call, "call_end": t_end,
       "call_cpu_s": time.process_time() - c0, "cpu_s_before_exit": time.process_time(), "events": EV,
       "draws_per_chain": int(theta.shape[1]), "timings": {k: float(v) for k, v in res.timings.items()
                                                            if isinstance(v, (int, float))},
       "verdict": res.verdict}
print("COLD-JSON " + json.dumps(out), flush=True)
print("COLD-END %.6f" % time.time(), flush=True)
"""


def one_run(n, env):
    t0, w0 = time.perf_counter(), time.time()
    proc = subprocess.run([sys.executable, "-c", CHILD, HERE, str(n), json.dumps(STAGES)], env=env,
                          capture_output=True, text=True)
    wall, w_end = time.perf_counter() - t0, time.time()
    if proc.returncode != 0:
        raise RuntimeError(f"child failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    out = json.loads(next(ln for ln in lines if ln.startswith("COLD-JSON "))[len("COLD-JSON "):])
    out["exit_s"] = w_end - float(next(ln for ln in lines if ln.startswith("COLD-END ")).split()[1])
    out["process_s"] = wall
    out["start_s"] = w_end - w0 - wall  # (~0: the parent's own spawn)
    return out


def summary(r):
    """The critical path of one run: the chain compiled (from the call's start) against the set-up done."""
    ev, c0 = r["events"], r["call_start"]
    last = lambda name, thread=None: max((e["end"] for e in ev if e["stage"] == name  # noqa: E731
                                          and (thread is None or e["thread"] == thread)), default=float("nan"))
    first = lambda name: min((e["start"] for e in ev if e["stage"] == name), default=float("nan"))  # noqa: E731
    chain = [e for e in ev if e["thread"] == "tallmh-compile"]
    trace = [e for e in chain if e["stage"] == "trace"]
    xla = [e for e in chain if e["stage"] == "XLA compile"]
    return {"call_s": r["call_end"] - c0, "trace_start_s": (trace[0]["start"] - c0) if trace else None,
            "trace_s": (trace[0]["end"] - trace[0]["start"]) if trace else None,
            "trace_cpu_s": trace[0]["thread_cpu"] if trace else None,
            "xla_compile_s": (xla[0]["end"] - xla[0]["start"]) if xla else None,
            "chain_ready_s": last("wait for the chain") - c0, "setup_end_s": last("set-up") - c0,
            "first_draw_wait_s": first("warmup / sampling") - c0}


def _without_out(argv):
    """The arguments less ``--out DIR`` (no machine's paths in the saved command)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--out":
            skip = True
        elif not a.startswith("--out="):
            out.append(a)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--N", type=float, default=1e6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    ap.add_argument("--tag", default="")
    ap.add_argument("--smoke", action="store_true", help="N = 2,000, one run")
    args = ap.parse_args(argv)
    n, runs = (2000, 1) if args.smoke else (int(args.N), args.runs)
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for i in range(runs):
        with tempfile.TemporaryDirectory(prefix="cold-phases-") as tmp:
            env = dict(os.environ, XDG_CACHE_HOME=tmp)  # (an empty compilation cache: a first run ever)
            env["PYTHONPATH"] = os.path.join(REPO, "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            env.pop("TALLMH_COMPILATION_CACHE", None)
            load = os.getloadavg()
            r = one_run(n, env)
        r.update(run=i + 1, load_before=list(load), summary=summary(r))
        rows.append(r)
        s = {k: ("-" if v is None else f"{v:.3f}") for k, v in r["summary"].items()}
        print(f"run {i + 1} (load {load[0]:.2f}): process {r['process_s']:.2f} s, import {r['import_s']:.2f}, data "
              f"{r['data_s']:.2f}, call {s['call_s']} (chain traced from {s['trace_start_s']} for "
              f"{s['trace_s']} s, {s['trace_cpu_s']} CPU s; XLA {s['xla_compile_s']} s; chain ready "
              f"{s['chain_ready_s']}, set-up done {s['setup_end_s']}), exit {r['exit_s']:.2f} s, "
              f"CPU {r['cpu_s_before_exit']:.2f} s before exit, {r['draws_per_chain']} draws per chain")
        for e in sorted(r["events"], key=lambda e: e["start"]):
            print(f"    {e['stage']:24s} {e['thread'][:18]:18s} {e['start'] - r['call_start']:7.3f} -> "
                  f"{e['end'] - r['call_start']:7.3f}  wall {e['end'] - e['start']:.3f}  thread CPU {e['thread_cpu']:.3f}")
    path = os.path.join(args.out, f"cold_phases{args.tag}.json")
    with open(path, "w") as f:
        json.dump({"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "N": n,
                   "command": "python benchmarks/cold_phases.py " + " ".join(_without_out(argv if argv is not None
                                                                                         else sys.argv[1:])),
                   "note": "times from the call's start; thread CPU of the thread that ran the stage", "runs": rows},
                  f, indent=1)
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()
