"""Time and peak memory of reading a CSV table for `tallmh run`: in memory or streamed into the on-disk design
cache (`--stream`). Run each mode in its own process, e.g.

    python benchmarks/stream_table.py make /tmp/big.csv 1000000
    /usr/bin/time -f "%M KB max RSS" python benchmarks/stream_table.py memory /tmp/big.csv
    /usr/bin/time -f "%M KB max RSS" python benchmarks/stream_table.py stream /tmp/big.csv
"""

import argparse
import sys
import time

import numpy as np


def main(mode, path, rows=1_000_000):
    if mode == "make":  # 5 features off centre and scale, a 0/1 target
        import pandas as pd

        rng = np.random.default_rng(0)
        X = rng.normal(size=(int(rows), 5)) * [1, 10, 100, 0.1, 3] + [0, 50, 2013, 1, -2]
        df = pd.DataFrame(X, columns=list("abcde"))
        df["y"] = (rng.random(int(rows)) < 0.3).astype(int)
        df.to_csv(path, index=False)
        return
    from tallmh.frontends.design import load_design
    from tallmh.frontends.design_cache import streamed_design

    args = argparse.Namespace(data=path, target="y", features=None, model="logistic", test="auto",
                              batch_size="auto", initial_batch=100, barker_batch=1000, no_intercept=False,
                              no_standardize=False, formula=None, stream=mode == "stream")
    t = time.perf_counter()
    if mode == "stream":
        streamed_design(args, lambda m: None)
    else:
        load_design(args)
    print(f"{mode}: {time.perf_counter() - t:.1f} s")


if __name__ == "__main__":
    main(*sys.argv[1:])
