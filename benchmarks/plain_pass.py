"""One plain full pass over data in files, the yardstick of the default's whole call at scale.

Times, in a fresh process, one streamed pass of ``LogisticRegression``'s log-likelihood value and gradient at the
true coefficients over every row of the files ``out_of_core.py --data-dir`` writes (``DIR/N<n>/X.npy``,
``y.npy``), through the same reader the set-up uses (``setup_passes.full_pass``: threads reading blocks ahead of
the compiled calls): what one exact-MH evaluation of the full data costs, and the least any method that reads
every row once must pay. ``--evict`` drops the files' pages from the page cache first, so the pass reads the disk.
With ``--call JSON`` (an ``out_of_core.py`` result of the same N) it prints the call's ratio to one pass plus its
chain (warmup and sampling). Prints one JSON line and appends it to ``--out``.

    python benchmarks/plain_pass.py --data-dir DIR --n 1e9 --evict --call results/out_of_core_1e9.json
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

import numpy as np

import _common as C


def main(argv):
    ap = C.parser(__doc__)
    ap.add_argument("--data-dir", required=True)
    ap.add_argument("--n", type=float, default=1e9)
    ap.add_argument("--evict", action="store_true", help="drop the files' pages from the page cache first")
    ap.add_argument("--call", default=None, help="an out_of_core.py result JSON to compare with")
    ap.add_argument("--out", default=None, help="a JSON-lines file to append the result to")
    ap.add_argument("--direct-reads", default=None, choices=["auto", "always", "never"],
                    help="tallmh.storage.direct_read.MODE (default: the library's, auto: files larger than the "
                         "memory read with O_DIRECT)")
    args = ap.parse_args(argv[1:])
    import jax.numpy as jnp

    import tallmh as tm
    from out_of_core import evict, true_theta
    from tallmh import setup_passes as sp

    try:
        from tallmh.storage import direct_read
    except ImportError:  # (an earlier version)
        direct_read = None
    if direct_read is not None and args.direct_reads:
        direct_read.MODE = args.direct_reads

    n = int(args.n)
    folder = os.path.join(args.data_dir, f"N{n}")
    if args.evict:
        evict(folder)
    load = os.getloadavg()
    data = tm.data.from_npy({k: os.path.join(folder, f"{k}.npy") for k in ("X", "y")}, check_finite=False)
    model = tm.models.LogisticRegression(prior_scale=10.0)
    theta = jnp.asarray(true_theta(), jnp.float32)
    fn = sp._newton_vg_fn(model, lambda t: t, theta)
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    v, g = sp._vg_pass(fn, data, n, theta, "plain pass")
    pass_s = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    out = {"n": n, "evicted": bool(args.evict), "pass_s": round(pass_s, 2),
           "pass_cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2),
           "direct_reads": getattr(direct_read, "MODE", None), "value": float(v), "grad_norm": float(np.linalg.norm(g)), "load": [round(x, 2) for x in load],
           "load_after": [round(x, 2) for x in os.getloadavg()], "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    if args.call:
        with open(args.call) as f:
            run = [r for r in json.load(f)["runs"] if r["mode"] == "disk"][0]
        chain = run["warmup_s"] + run["sampling_s"]
        out.update(call_s=round(run["call_s"], 2), chain_s=round(chain, 2),
                   ratio=round(run["call_s"] / (pass_s + chain), 3), call_setup_passes=run.get("setup_passes"))
    C.print_json_line(out, args.out)


if __name__ == "__main__":
    main(sys.argv)
