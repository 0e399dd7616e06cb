"""Where the exact default's set-up goes on data in files: each full pass, the item table, the process's CPU seconds.

One ``tm.sample(LogisticRegression(prior_scale=10), from_npy(DIR), num_samples=4000, num_warmup=1000,
num_chains=1, seed=0)`` (the default: the exact subsampled test) on the files ``out_of_core.py --data-dir``
writes (``DIR/N<n>/X.npy``, ``y.npy``), in this process, with every full set-up pass timed (its function's name
and seconds, and the seconds since ``from_npy``), the table's separate pass (``factor_bounds.prepare``) where it
runs, or the grouping of the table whose weights the last Newton pass made (``FusedTable.table``), and the
process's CPU seconds (user + system): on a shared machine the wall times follow the load, the CPU seconds much
less. Prints one JSON line and appends it to ``--out``.

    python benchmarks/table_pass_breakdown.py --data-dir DIR --n 1e8 --label after
    python benchmarks/table_pass_breakdown.py --data-dir DIR --n 1e8 --evict [--compiled-weights]

``--compiled-weights``: the exact table's weights in the compiled pass, fused with the derivatives, as before they
were made in NumPy beside it (``tallmh.fused_table.HOST_WEIGHTS = False``); ``--evict``: the files' pages dropped
from the page cache first.
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
           "weights": "compiled" if args.compiled_weights else "numpy", "evicted": args.evict, "load_at_end": C.load_average()}
    C.print_json_line(out, args.out)


if __name__ == "__main__":
    main(sys.argv)
