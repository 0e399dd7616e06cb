"""Seconds from opening the files to the set-up's first full pass, with the files' pages dropped from the page
cache first (``posix_fadvise(DONTNEED)``): the default call on ``DIR/N<n>/{X,y}.npy`` stopped (by an exception
raised from the pass) as that pass starts, so nothing beyond the warm start is read. Prints one JSON line and
appends it to ``--out``.

    python benchmarks/first_pass_wait.py --data-dir DIR --n 1e9 --label after
"""

from __future__ import annotations

import resource
import sys
import time
import warnings

import _common as C
from warm_gather import evict


class _Stop(Exception):
    pass


def main(argv):
    ap = C.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv[1:])
    import tallmh as tm
    from tallmh import setup_passes as sp

    folder = f"{args.data_dir}/N{int(args.n)}"
    paths = {"X": f"{folder}/X.npy", "y": f"{folder}/y.npy"}
    for p in paths.values():
        evict(p)
    at = {}

    def stop(*a, **k):
        at["s"] = time.perf_counter() - t0
        raise _Stop
        yield  # (a generator, as full_pass is)

    sp.full_pass = stop
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tm.sample(tm.models.LogisticRegression(prior_scale=10.0), tm.data.from_npy(paths), num_samples=4000,
                      num_warmup=1000, num_chains=1, seed=0, progress=False)
    except _Stop:
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF)
    out = {"label": args.label, "N": int(args.n), "first_pass_at_s": round(at.get("s", float("nan")), 2),
           "cpu_s": round(ru.ru_utime + ru.ru_stime, 1), "load": load, "commit": C.git_commit()}
    C.print_json_line(out, args.out)


if __name__ == "__main__":
    main(sys.argv)
