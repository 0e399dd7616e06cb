"""Where the exact default's set-up goes on data in files: each full pass, the item table, the process's CPU seconds.

One ``tm.sample(LogisticRegression(prior_scale=10), from_npy(DIR), num_samples=4000, num_warmup=1000,
num_chains=1, seed=0)`` (the default: the exact subsampled test) on the files ``out_of_core.py --data-dir``
writes (``DIR/N<n>/X.npy``, ``y.npy``), in this process, with every full set-up pass timed (its function's name
and seconds, and the seconds since ``from_npy``), the table's separate pass (``factor_bounds.prepare``) where it
runs, or the grouping of the table whose weights the last Newton pass made (``FusedTable.table``), and the
process's CPU seconds (user + system): on a shared machine the wall times follow the load, the CPU seconds much
less. Prints one JSON line and appends it to ``--out``.

    python benchmarks/table_pass_breakdown.py --data-dir DIR --n 1e8 --label after
    python benchmarks/table_pass_breakdown.py --data-dir DIR --n 1e8 --evict [--compiled-weights] [--threads]

``--compiled-weights``: the exact table's weights in the compiled pass, fused with the derivatives, as before they
were made in NumPy beside it (``tallmh.fused_table.HOST_WEIGHTS = False``); ``--evict``: the files' pages dropped
from the page cache first; ``--threads``: the CPU milliseconds per block of 2**20 rows of the fused pass, by stage
(each stage's thread CPU clock: the model's statistics and finiteness check, the NumPy weights, the table's builder,
the reading and padding in the reader threads) and by thread (``/proc/self/task``: the compiled calls run in
XLA's own threads), and how long the process took to reach the first block.
"""

from __future__ import annotations

import resource
import sys
import time
import warnings

import _common as C


def main(argv):
    ap = C.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--n", type=float, default=1e8)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None, help="a JSON-lines file to append the result to")
    ap.add_argument("--evict", action="store_true", help="drop the files' pages from the page cache first "
                    "(out_of_core.evict): the pass reads the disk")
    ap.add_argument("--compiled-weights", action="store_true",
                    help="the table's weights in the compiled pass, fused with the derivatives (the form before "
                         "they were made in NumPy beside it)")
    ap.add_argument("--threads", action="store_true", help="CPU ms per block by stage and by thread (see above)")
    ap.add_argument("--direct-reads", default=None, choices=["auto", "always", "never"],
                    help="tallmh.storage.direct_read.MODE (default: the library's, auto: files larger than the "
                         "memory)")
    args = ap.parse_args(argv[1:])
    import tallmh as tm
    from tallmh import factor_bounds as fbm
    from tallmh import setup_passes as sp

    log, t00 = [], [0.0]
    full_pass = sp.full_pass

    def timed_pass(chunk_fn, data, n, pargs, desc="set-up pass", **kw):
        t, c = time.perf_counter(), time.process_time()
        yield from full_pass(chunk_fn, data, n, pargs, desc, **kw)
        log.append({"what": f"pass ({getattr(chunk_fn, '__name__', '?')})", "s": round(time.perf_counter() - t, 2),
                    "cpu_s": round(time.process_time() - c, 2), "at_s": round(time.perf_counter() - t00[0], 2)})

    def timed(fn, what):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            log.append({"what": what, "s": round(time.perf_counter() - t, 2), "at_s": round(time.perf_counter() - t00[0], 2),
                        "used": out is not None})
            return out
        return wrapper

    sp.full_pass = timed_pass
    fbm.prepare = timed(fbm.prepare, "table pass (prepare)")
    try:
        from tallmh import fused_table
    except ImportError:  # (an earlier version)
        fused_table = None
    if fused_table is not None and args.compiled_weights:
        fused_table.HOST_WEIGHTS = False
    if fused_table is not None:
        run0 = fused_table.FusedTable.run
        fused_table.FusedTable.run = lambda self, _fp, *a, **k: run0(self, timed_pass, *a, **k)
        fused_table.FusedTable.table = timed(fused_table.FusedTable.table, "fused table's grouping")
    prof = _Profile(t00) if args.threads else None
    try:
        from tallmh.storage import direct_read
    except ImportError:  # (an earlier version)
        direct_read = None
    if direct_read is not None and args.direct_reads:
        direct_read.MODE = args.direct_reads
    folder = f"{args.data_dir}/N{int(args.n)}"
    if args.evict:
        from out_of_core import evict

        evict(folder)
    with open("/proc/loadavg") as f:
        load0 = f.read().split()[:3]
    t00[0] = time.perf_counter()
    data = tm.data.from_npy({"X": f"{folder}/X.npy", "y": f"{folder}/y.npy"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = tm.sample(tm.models.LogisticRegression(prior_scale=10.0), data, num_samples=4000, num_warmup=1000,
                        num_chains=1, seed=0, progress=False)
    wall = time.perf_counter() - t00[0]
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"label": args.label, "N": res.n, "load_at_start": load0, "cpu_s": round(ru.ru_utime + ru.ru_stime, 1),
           "call_s": round(res.timings["total_s"], 1), "setup_s": round(res.timings["setup_s"], 1),
           "wall_s": round(wall, 1), "setup_passes": res.setup_items / res.n, "steps": log,
           "commit": C.git_commit(), "trusted": bool(res.trusted),
           "weights": "compiled" if args.compiled_weights else "numpy", "evicted": args.evict,
           "direct_reads": getattr(direct_read, "MODE", None), "load_at_end": C.load_average()}
    if prof is not None:
        out["per_block_cpu_ms"] = prof.report()
    C.print_json_line(out, args.out)


def _thread_cpu():
    """``{tid: (name, CPU seconds)}`` of this process's threads (``/proc/self/task``)."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        rest = st[st.rindex(")") + 2:].split()
        out[int(tid)] = (name, (int(rest[11]) + int(rest[12])) / tick)
    return out


class _Profile:
    """Thread CPU clocks of the fused pass's stages, per block of 2**20 rows (``--threads``)."""

    def __init__(self, t00):
        import threading

        from tallmh import factor_bounds as fbm
        from tallmh import fused_table
        from tallmh import setup_passes as sp
        from tallmh.storage import datasource as ds

        self.t00, self.ms, self.names, self.first = t00, {}, {}, None
        self.lock = threading.Lock()
        prof = self

        def clocked(fn, what):
            def wrapper(*a, **k):
                import threading as th

                c = time.thread_time()
                try:
                    return fn(*a, **k)
                finally:
                    now = time.thread_time()
                    prof.add(what, now - c, th.get_native_id(), th.current_thread().name, now)
            return wrapper

        ds.StatsTap.part = clocked(ds.StatsTap.part, "statistics and finiteness (reader threads)")
        for cls in (fbm.TableBuilder, fbm.BulkBuilder):
            cls.add = clocked(cls.add, "table builder")
        hw = fused_table._host_weights

        def host_weights(*a, **k):
            part = hw(*a, **k)
            return None if part is None else clocked(part, "NumPy weights")

        fused_table._host_weights = host_weights
        reader = ds.host_reader

        def host_reader(data):
            read = reader(data)
            return None if read is None else clocked(read, "read (reader threads)")

        ds.host_reader = host_reader
        try:
            from tallmh.storage import direct_read
        except ImportError:  # (an earlier version)
            direct_read = None
        if direct_read is not None:
            dreader = direct_read.reader

            def direct(data, mode=None):
                read = dreader(data, mode)
                return None if read is None else clocked(read, "read (reader threads)")

            direct_read.reader = direct
        fb = sp._file_blocks

        def file_blocks(fn, *a, **k):
            main = threading.get_native_id()
            before = _thread_cpu()
            blocks = 0
            for x in fb(clocked(fn, "compiled call's dispatch (main thread)"), *a, **k):
                if prof.first is None:
                    prof.first = time.perf_counter() - prof.t00[0]
                blocks += 1
                yield x
            after = _thread_cpu()
            prof.blocks = getattr(prof, "blocks", 0) + blocks
            gone = {t: (prof.names[t], c) for t, c in prof.clock.items() if t not in after and t not in before}
            for tid, (name, s) in list(after.items()) + list(gone.items()):
                key = prof.names.get(tid, name) if tid != main else "main thread"
                d = s - before.get(tid, (name, 0.0))[1]
                prof.threads[key] = prof.threads.get(key, 0.0) + d
            prof.clock.clear()

        self.threads, self.clock = {}, {}
        sp._file_blocks = file_blocks

    def add(self, what, s, tid, name, clock):
        with self.lock:
            self.ms[what] = self.ms.get(what, 0.0) + s
            self.names[tid] = name
            self.clock[tid] = clock  # (the thread's CPU clock: a pool's thread may have exited by the pass's end)

    def report(self):
        b = max(getattr(self, "blocks", 0), 1)
        threads = {}
        for k, v in self.threads.items():
            k = k.rstrip("0123456789_")
            threads[k] = threads.get(k, 0.0) + v
        return {"blocks": b, "first_block_at_s": None if self.first is None else round(self.first, 2),
                "stages": {k: round(1e3 * v / b, 1) for k, v in self.ms.items()},
                "threads": {k: round(1e3 * v / b, 1) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])
                            if v > 0}}


if __name__ == "__main__":
    main(sys.argv)
