"""The set-up's host pass (NumPy, float64) with NumPy's OpenBLAS on its default threads and on one.

The logistic model's gradient-and-Hessian pass (:meth:`tallmh.setup_passes.HostPasses.sums`) and its
line-search pass (``diff``) over N rows of ``time_to_trusted.make_data`` (d = 11), each timed in a thread of its
own, in turn: with OpenBLAS's default thread count (the pass as it was, its hold on one thread lifted for the
measurement), and with one thread (:func:`tallmh._blas.one_thread`, as the pass now runs its blocks). Prints wall
and CPU seconds per pass (CPU of the whole process: OpenBLAS's threads included) and which sums agree bit for
bit; saves ``host_pass_blas.json``. The load average is recorded: on a shared machine the default threads' cost
depends on it.

Usage::

    python benchmarks/host_pass_blas.py              # N = 10^6, 5 passes each, 3 rounds
    python benchmarks/host_pass_blas.py --smoke
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main(argv=None):
    import _common as C

    ap = C.parser(__doc__)
    ap.add_argument("--N", type=float, default=1e6)
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    C.add_run_options(ap, os.path.join(HERE, "results"), seed=False)
    a = ap.parse_args(argv)
    if a.smoke:
        a.N, a.passes, a.rounds = 2e5, 1, 1
    import numpy as np

    from tallmh import _blas, setup_passes as sp
    from tallmh.models import LogisticRegression
    from time_to_trusted import make_data

    n = int(a.N)
    X, y, theta = make_data(n, 0)
    hp = sp.HostPasses(LogisticRegression(prior_scale=10.0), {"X": X, "y": y}, n,
                       lambda s, e: {"X": X[s:e], "y": y[s:e]})
    th = np.asarray(theta, np.float64)
    rows, sums = [], {}

    def timed(kind, one):
        # the default arm: the pass as it ran before tallmh held its blocks' products to one thread
        sp.one_blas_thread = _blas.one_thread if one else _nothing

        def work():
            with _blas.one_thread() if one else _nothing():
                hp.sums(th)  # (warm: the first pass pages the data in)
                for what in ("sums", "diff"):
                    w, c = time.perf_counter(), time.process_time()
                    for _ in range(a.passes):
                        got = hp.sums(th) if what == "sums" else hp.diff(th, th + 0.01)
                    rows.append(dict(blas=kind, pass_=what, wall_s=(time.perf_counter() - w) / a.passes,
                                     cpu_s=(time.process_time() - c) / a.passes, load=os.getloadavg()[0]))
                    sums.setdefault((kind, what), got)

        t = threading.Thread(target=work)
        t.start()
        t.join()

    for _ in range(a.rounds):
        for kind, one in (("default threads", False), ("one thread", True)):
            timed(kind, one)
    sp.one_blas_thread = _blas.one_thread
    s1, s2 = sums[("default threads", "sums")], sums[("one thread", "sums")]
    same = {"value": bool(s1[0] == s2[0]), "gradient": bool(np.array_equal(s1[1], s2[1])),
            "hessian": bool(np.array_equal(s1[2], s2[2])),
            "line search": bool(sums[("default threads", "diff")] == sums[("one thread", "diff")]),
            "gradient max relative difference": float(np.max(np.abs(s1[1] - s2[1])) / np.max(np.abs(s1[1])))}
    print(f"N = {n:,}, {a.passes} passes per cell, load at start {rows[0]['load']:.1f}, one-thread setter found: "
          f"{bool(_blas._setters())}")
    print(f"{'OpenBLAS':16s} {'pass':6s} {'wall s':>8s} {'CPU s':>8s} {'load':>6s}")
    for r in rows:
        print(f"{r['blas']:16s} {r['pass_']:6s} {r['wall_s']:8.3f} {r['cpu_s']:8.3f} {r['load']:6.1f}")
    print(f"the same bits with one thread as with the default threads: {same}")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "host_pass_blas.json"), "w") as f:
        json.dump({"command": " ".join(["python", "benchmarks/host_pass_blas.py"] + (argv or sys.argv[1:])),
                   "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "N": n, "rows": rows,
                   "same_bits": same, "setter_found": bool(_blas._setters()), "cpus": os.cpu_count()}, f,
                  indent=1)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
