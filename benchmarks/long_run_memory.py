"""Memory and checkpoint size of a long run, with draws held in memory or streamed to disk.

Runs a small model (Gaussian mean, N = 1000, exact test, 4 chains) for a wall-clock budget, with a checkpoint
every few seconds, and prints the process's resident memory (RSS) and the checkpoint's size as the draws
accumulate. Usage: python benchmarks/long_run_memory.py [--budget 60] [--stream | --no-stream]
"""

import argparse
import os
import sys
import tempfile
import time
import warnings

import numpy as np

import _common as C
import tallmh as tm


def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def main():
    ap = C.parser(__doc__)
    ap.add_argument("--budget", type=float, default=60.0)
    ap.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    args = ap.parse_args()
    C.header(f"long_run_memory: stream_draws={args.stream}, budget {args.budget:g} s", C.machine_info(sys.argv))
    rng = np.random.default_rng(0)
    data = {"x": rng.normal(1.0, 1.0, 1000).astype(np.float32)}
    folder = tempfile.mkdtemp()
    ck = os.path.join(folder, "ck.npz")
    t0 = time.perf_counter()
    rows = []
    last = [0.0]

    def callback(info):
        now = time.perf_counter() - t0
        if info["phase"] == "sampling" and now - last[0] >= args.budget / 12:
            last[0] = now
            size = os.path.getsize(ck) / 1e6 if os.path.exists(ck) else float("nan")
            rows.append((now, info["done"], rss_mb(), size))
            print(f"{now:6.1f} s  {info['done']:>10,} draws/chain  RSS {rss_mb():7.1f} MB  checkpoint {size:8.2f} MB",
                  flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = tm.sample(tm.models.GaussianMean(sigma=1.0), data, num_samples=10**8, num_warmup=0, num_chains=4,
                      init=np.zeros(1), audit=0.0, progress=False, budget_s=args.budget, checkpoint=ck,
                      checkpoint_every_s=args.budget / 12, stream_draws=args.stream, callback=callback)
    print(f"stream_draws={args.stream}: {r.flat_samples.shape[1]:,} draws per chain in {args.budget:.0f} s; "
          f"final RSS {rss_mb():.1f} MB, checkpoint {os.path.getsize(ck) / 1e6:.2f} MB")
    if len(rows) >= 4:
        after = [x[2] for x in rows[len(rows) // 4:]]
        print(f"RSS over the last three quarters: {min(after):.1f}-{max(after):.1f} MB "
              f"({(max(after) - min(after)) / min(after) * 100:.1f}% spread)")


if __name__ == "__main__":
    main()
