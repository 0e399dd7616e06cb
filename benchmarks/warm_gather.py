"""The warm start's largest sub-sample gathered from files: NumPy's ``a[idx]`` against ``storage.runs.gather``
(the runs' reads advised to the kernel, then copied by threads), each after the files' pages are dropped from the page cache
(``posix_fadvise(DONTNEED)``), alternated. The rows are those the set-up reads (``setup_passes.warm_rows`` at
the largest of ``warm_sizes``). Prints one JSON line per read and appends it to ``--out``.

    python benchmarks/warm_gather.py --data-dir DIR --n 1e9 --repeat 2
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import _common as C


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def main(argv):
    ap = C.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv[1:])
    from tallmh import setup_passes as sp
    from tallmh.storage import runs

    folder = f"{args.data_dir}/N{int(args.n)}"
    paths = [f"{folder}/X.npy", f"{folder}/y.npy"]
    n = int(args.n)
    rows = sp.warm_sizes(n, 11)[-1]
    idx = sp.warm_rows(n, rows)
    for rep in range(args.repeat):
        for how in ("numpy", "runs"):
            for p in paths:
                evict(p)
            with open("/proc/loadavg") as f:
                load = f.read().split()[:3]
            t = time.perf_counter()
            got = []
            for p in paths:
                mm = np.load(p, mmap_mode="r")
                got.append(runs.gather(mm, idx, mm) if how == "runs" else mm[idx])
            s = time.perf_counter() - t
            out = {"how": how, "rep": rep, "N": n, "rows": int(idx.size), "s": round(s, 2),
                   "gb": round(sum(g.nbytes for g in got) / 1e9, 3), "load": load, "commit": C.git_commit()}
            C.print_json_line(out, args.out)


if __name__ == "__main__":
    main(sys.argv)
