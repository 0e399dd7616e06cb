"""What the chain of ``tm.sample(model, data)`` costs to compile, counted in ways the machine's load does not change.

For the built-in logistic regression (N items, d features + intercept) and the default method, a fresh
Python process with the persistent caches off builds the chain as ``tm.sample`` does, but compiles it
after the set-up (not beside it), so that the CPU seconds of the compile are the process's alone:

- ``kernels``: the kernels XLA's CPU backend emits for the chain (one LLVM module each, the cost that
  grows with the program): the functions defined in the chain's dumped LLVM IR
  (``XLA_FLAGS=--xla_dump_to=DIR``), and the fusions and other computations of its optimised HLO;
- ``trace_s`` / ``compile_s``: tracing and lowering, then XLA's compile, each in CPU seconds of the process
  (``time.process_time``) and wall seconds; ``setup_s``: the same for the set-up (mode, Laplace, control
  variates: its programs' compiles and its passes over the data);
- ``audit_trace_s`` / ``audit_compile_s`` (``--sample``): the same for the self-audit's own program, where the
  chain leaves its exact passes to one (compiled at the first audited chunk);
- ``ms_per_step`` (``--sample``): the sampling phase's wall per step of the 4 chains, fixed draw counts (the
  self-audit's passes included: ``--audit 0`` for the chain's steps alone).

Usage::

    python benchmarks/chain_compile.py --N 1000000                 # default method
    python benchmarks/chain_compile.py --N 1000000 --audit 0       # without the self-audit
    python benchmarks/chain_compile.py --N 1000000 --test exact
    python benchmarks/chain_compile.py --N 1000000 --sample 2000   # and the sampling speed
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class _Stop(Exception):
    pass


def _child(a):
    import jax

    import tallmh as tm
    from tallmh.run import _exec_cache, programs, start

    data, _ = tm.models.LogisticRegression.simulate(a.N, d=a.d)
    model = tm.models.LogisticRegression(prior_scale=10.0)
    times = {}
    programs.compile_early = lambda run: None  # compile after the set-up: nothing else runs beside it
    orig = _exec_cache.compile_and_store

    def timed(key, lower_fn, **kw):
        # the kernel's init (a small program, compiled in the set-up: init_*), then the chain (after the set-up);
        # the self-audit's program, where the chain leaves its audits to one, at the first audited chunk: its
        # times are reported apart (audit_*)
        pre = "init_" if not kw.get("unrolled", True) else "" if "trace_cpu_s" not in times else "audit_"
        got = {}

        def timed_lower():
            c, w = time.process_time(), time.perf_counter()
            lowered = lower_fn()
            got.update(trace_cpu_s=time.process_time() - c, trace_wall_s=time.perf_counter() - w)
            return lowered

        c0, w0 = time.process_time(), time.perf_counter()
        compiled = orig(None, timed_lower, **kw)  # (tallmh's own path; nothing stored)
        got.update(compile_cpu_s=time.process_time() - c0 - got["trace_cpu_s"],
                   compile_wall_s=time.perf_counter() - w0 - got["trace_wall_s"])
        times.update({pre + k: v for k, v in got.items()})
        return compiled

    _exec_cache.compile_and_store = timed
    orig_setup = start.set_up

    def timed_setup(self, init_jitter, early=None):
        c, w = time.process_time(), time.perf_counter()
        out = jax.block_until_ready(orig_setup(self, init_jitter, early))
        times.update(setup_cpu_s=time.process_time() - c, setup_wall_s=time.perf_counter() - w)
        return out

    start.set_up = timed_setup
    kw = {}
    if a.test is not None:
        kw["test"] = a.test
    if a.audit is not None:
        kw["audit"] = a.audit
    if not a.sample:
        orig_compile = programs.compile_chunk

        def compile_then_stop(self, early=None):
            orig_compile(self, early)
            raise _Stop

        programs.compile_chunk = compile_then_stop
        try:
            tm.sample(model, data, progress=False, **kw)
        except _Stop:
            pass
    else:
        r = tm.sample(model, data, num_warmup=a.warmup, num_samples=a.sample, progress=False, **kw)
        times.update(ms_per_step=1e3 * r.timings["sampling_s"] / a.sample,
                     warmup_ms_per_step=1e3 * r.timings["warmup_s"] / a.warmup,
                     audits=int(r.stats["audits"]) if "audits" in r.stats else None)
    times["jax"] = jax.__version__
    print("RESULT-JSON " + json.dumps(times), flush=True)


def _count(dump):
    """The chain's kernels in an XLA dump folder: the LLVM modules its CPU backend emitted (one per kernel)."""
    hlo = glob.glob(os.path.join(dump, "*.jit_chain_run.cpu_after_optimizations.txt"))
    if len(hlo) != 1:
        return None
    prefix = os.path.basename(hlo[0]).split(".")[0] + ".jit_chain_run."  # module_NNNN.jit_chain_run.
    kernels = [f for f in os.listdir(dump) if f.startswith(prefix) and f.endswith(".ir-with-opt.ll")]
    text = open(hlo[0]).read()
    return {"kernels": len(kernels), "hlo_lines": text.count("\n"),
            "while_loops": len(re.findall(r" while\(", text))}


def run(a, extra):
    from _common import run_child  # (here: the child's own imports are timed)

    env = {k: v for k, v in os.environ.items() if k not in ("JAX_COMPILATION_CACHE_DIR",)}
    env["TALLMH_COMPILATION_CACHE"] = "0"
    env["PYTHONPATH"] = os.path.join(REPO, "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with tempfile.TemporaryDirectory(prefix="tallmh-chain-dump-") as dump:
        if a.dump:
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + f" --xla_dump_to={dump}").strip()
        load0 = os.getloadavg()[0]
        out, wall = run_child([sys.executable, os.path.abspath(__file__), "--child"] + extra, env, "RESULT-JSON")
        if a.dump:
            out.update(_count(dump) or {})
        out.update(process_s=wall, load=[load0, os.getloadavg()[0]])
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--N", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=10, help="features (an intercept is added)")
    p.add_argument("--test", default=None, help="a test name (default: the default method)")
    p.add_argument("--audit", type=float, default=None)
    p.add_argument("--sample", type=int, default=0, help="draws per chain to time (0: compile only)")
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--no-dump", dest="dump", action="store_false", help="no XLA dump (kernels not counted)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        return _child(a)
    extra = [x for x in (argv if argv is not None else sys.argv[1:])]
    if a.sample:
        a.dump = False
        extra = extra + ["--no-dump"]
    print(json.dumps(run(a, extra)), flush=True)


if __name__ == "__main__":
    main()
