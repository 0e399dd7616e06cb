"""Cost per item of the subsampling permutation: the old Feistel with cycle-walking against swap-or-not.

For each N in ``--sizes`` (default 4^10, 4^10 + 1, 10^6, 10^7) and chunk size m in ``--chunks`` (100 and
65,536 positions), one jitted program reads ``--items`` positions (default 2^18) as consecutive chunks
``[t, t + m)``, ``t = 0, m, 2m, ...`` (wrapping at N), and the time is divided by the number of items:

* ``feistel``: the permutation tallmh used before (kept here only for this comparison): a balanced
  4-round Feistel network on ``2h`` bits (``4^h >= N``) with cycle-walking, in which a chunk loops until
  its slowest element lands in ``range(N)``; the mean and max number of walk rounds per chunk are recorded;
* ``swap_or_not``: :func:`tallmh.storage.data.permute` (33 rounds, no loop);
* ``loglik``: for scale, one logistic-regression log-likelihood item (d = 11, float32): the gather of a
  random row of X (N x 11) and y, and ``y * eta - softplus(eta)``, at the same N and chunk size (indices
  from the new permutation, computed outside the timed program).

Every timing is the fastest of ``--reps`` (21) runs after a warm-up run (the median is saved too), the three
programs timed in turn within each repetition: on a shared machine the fastest run is the one least
disturbed by other processes. Results are printed and saved to
``benchmarks/results/permutation.json`` (``--out``). Timings are wall-clock on whatever machine runs this,
with whatever else runs on it (the load average is recorded).

With ``--quality`` it also measures how the statistical quality grows with the number of swap-or-not rounds
(the rounds of :mod:`tallmh.storage.data` set temporarily): at N = 8, the total variation distance of the pair
``(pi(0), pi(1))`` from uniform over distinct pairs (400,000 keys; Monte Carlo floor ~0.005), against the
bound ``(1/2 + 1/(2N))^R``; and on data stored in sorted order (N = 10,007, l_i = i), the variance of the
mean of the first 100 items over 20,000 keys relative to simple random sampling without replacement
(predicted ``1 + 99 * 2^-R``). Saved under ``quality`` in the JSON.

Usage::

    python benchmarks/permutation.py
    python benchmarks/permutation.py --quality
    python benchmarks/permutation.py --sizes 1000 --chunks 100 --items 20000 --out /tmp/p.json   # seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import _common as C
from tallmh.storage.data import _mix32, make_permutation, permute

# --- the previous permutation, for comparison only -------------------------------------------------------

_FEISTEL_ROUNDS = 4


def _feistel_half_bits(n: int) -> int:
    bits = max(2, int(np.ceil(np.log2(max(n, 2)))))
    return (bits + 1) // 2


def _feistel_encrypt(keys, x, h):
    mask = jnp.uint32((1 << h) - 1)
    left = (x >> h) & mask
    right = x & mask
    for r in range(_FEISTEL_ROUNDS):
        f = _mix32(right ^ keys[r] ^ jnp.uint32(r * 0x9E3779B9 & 0xFFFFFFFF)) & mask
        left, right = right, left ^ f
    return (left << h) | right


def feistel_permute(keys, positions, n: int):
    """Old ``tallmh.storage.data.permute``: returns (items, number of walk rounds the chunk took)."""
    h = _feistel_half_bits(n)
    x = jnp.clip(positions, 0, n - 1).astype(jnp.uint32)
    nn = jnp.uint32(n)
    y = _feistel_encrypt(keys, x, h)

    def cond(c):
        return jnp.any(c[0] >= nn)

    def body(c):
        y, w = c
        return jnp.where(y >= nn, _feistel_encrypt(keys, y, h), y), w + 1

    y, walks = jax.lax.while_loop(cond, body, (y, jnp.int32(0)))
    return y.astype(jnp.int32), walks


# --- timing ----------------------------------------------------------------------------------------------

def _times_interleaved(calls, reps):
    """[(fastest, median) seconds] per ``(f, args)`` in ``calls``, the calls timed in turn in each repetition."""
    for f, a in calls:
        jax.block_until_ready(f(*a))
    ts = [[] for _ in calls]
    for _ in range(reps):
        for j, (f, a) in enumerate(calls):
            t0 = time.perf_counter()
            jax.block_until_ready(f(*a))
            ts[j].append(time.perf_counter() - t0)
    return [(float(np.min(t)), float(np.median(t))) for t in ts]


def bench_size(n, m, items, reps, X, y):
    chunks = max(1, items // m)
    total = chunks * m
    key = jax.random.PRNGKey(0)
    fkeys = jax.random.bits(key, (_FEISTEL_ROUNDS,), dtype=jnp.uint32)
    perm = make_permutation(key)
    offs = jnp.arange(m, dtype=jnp.int32)

    def starts(i):
        return ((i * m) % n).astype(jnp.int32)

    @jax.jit
    def run_feistel(fkeys):
        def body(i, c):
            s, w, wmax = c
            idx, walks = feistel_permute(fkeys, starts(i) + offs, n)
            return s + jnp.sum(idx), w + walks, jnp.maximum(wmax, walks)
        return jax.lax.fori_loop(0, chunks, body, (jnp.int32(0), jnp.int32(0), jnp.int32(0)))

    @jax.jit
    def run_new(perm):
        def body(i, s):
            return s + jnp.sum(permute(perm, starts(i) + offs, n))
        return jax.lax.fori_loop(0, chunks, body, jnp.int32(0))

    # the log-likelihood items, at indices drawn beforehand (so only gather + likelihood is timed)
    idx_all = jnp.stack([permute(perm, ((i * m) % n) + offs, n) for i in range(min(chunks, 64))])
    theta = jnp.linspace(-0.5, 0.5, X.shape[1], dtype=jnp.float32)

    @jax.jit
    def run_loglik(X, y, idx_all, theta):
        def body(i, s):
            idx = idx_all[i % idx_all.shape[0]]
            eta = jnp.take(X, idx, axis=0) @ theta
            yy = jnp.take(y, idx)
            return s + jnp.sum(yy * eta - jax.nn.softplus(eta))
        return jax.lax.fori_loop(0, chunks, body, jnp.float32(0))

    # the three programs are timed in turn within each repetition, so that a burst of load on a shared
    # machine hits them alike
    t_old, t_new, t_ll = _times_interleaved([(run_feistel, (fkeys,)), (run_new, (perm,)),
                                             (run_loglik, (X, y, idx_all, theta))], reps)
    _, walks, wmax = run_feistel(fkeys)
    h = _feistel_half_bits(n)
    return {
        "n": n, "chunk": m, "items": total,
        "feistel_ns_per_item": t_old[0] / total * 1e9,
        "swap_or_not_ns_per_item": t_new[0] / total * 1e9,
        "loglik_ns_per_item": t_ll[0] / total * 1e9,
        "feistel_ns_per_item_median": t_old[1] / total * 1e9,
        "swap_or_not_ns_per_item_median": t_new[1] / total * 1e9,
        "loglik_ns_per_item_median": t_ll[1] / total * 1e9,
        "feistel_domain_over_n": 4**h / n,
        "feistel_walk_rounds_mean_per_chunk": float(walks) / chunks,
        "feistel_walk_rounds_max_per_chunk": int(wmax),
    }


def quality(rounds=(0, 1, 2, 4, 8, 12, 16, 32)):
    import tallmh.storage.data as D

    saved = D._SWAP_ROUNDS
    out = []
    try:
        keys8 = jax.random.split(jax.random.PRNGKey(1), 400_000)
        keys_s = jax.random.split(jax.random.PRNGKey(7), 20_000)
        n_s, m_s = 10_007, 100
        want = (n_s**2 - 1) / 12.0 / m_s * (n_s - m_s) / (n_s - 1)
        for r in rounds:
            D._SWAP_ROUNDS = r
            pair = np.asarray(jax.jit(jax.vmap(lambda k: D.permute(D.make_permutation(k), jnp.arange(2), 8)))(keys8))
            c = np.bincount(pair[:, 0] * 8 + pair[:, 1], minlength=64).reshape(8, 8) / len(keys8)
            tv = 0.5 * np.abs(c - (1 - np.eye(8)) / 56).sum()
            f = jax.jit(jax.vmap(lambda k: jnp.mean(D.permute(D.make_permutation(k), jnp.arange(m_s), n_s)
                                                    .astype(jnp.float32))))
            ratio = float(np.asarray(f(keys_s), np.float64).var(ddof=1) / want)
            row = {"rounds": r, "pair_tv_n8": float(tv), "pair_tv_bound": (0.5 + 0.5 / 8) ** r,
                   "sorted_var_ratio": ratio, "sorted_var_ratio_se": ratio * np.sqrt(2 / (len(keys_s) - 1)),
                   "sorted_var_ratio_predicted": 1 + (m_s - 1) * 2.0**-r}
            out.append(row)
            print(f"rounds {r:>2}: pair TV at N=8 {tv:.4f} (bound {row['pair_tv_bound']:.4f}); sorted data: variance "
                  f"ratio {ratio:.4f} +- {row['sorted_var_ratio_se']:.4f} (predicted {row['sorted_var_ratio_predicted']:.4f})",
                  flush=True)
    finally:
        D._SWAP_ROUNDS = saved
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=f"{4**10},{4**10 + 1},1000000,10000000")
    ap.add_argument("--chunks", default="100,65536")
    ap.add_argument("--items", type=int, default=2**18)
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--quality", action="store_true", help="also: statistical quality against the number of rounds")
    ap.add_argument("--out", default=os.path.join(C.RESULTS, "permutation.json"))
    a = ap.parse_args(argv)
    sizes = C.numbers(a.sizes, int)
    chunks = C.numbers(a.chunks, int)
    meta = C.machine_info(sys.argv, device=str(jax.devices()[0]))
    info = {"items": a.items, "reps": a.reps}
    C.header(f"permutation: cost of the subsample orders, {info}", meta)
    rows = []
    hdr = (f"{'N':>10} {'chunk':>6} {'feistel ns':>10} {'walks mean/max':>15} {'swap-or-not ns':>14} {'loglik ns':>9}"
           f" {'feistel/loglik':>14} {'swap/loglik':>11}")
    print(hdr, flush=True)
    rng = np.random.default_rng(0)
    for n in sizes:
        X = jnp.asarray(np.c_[rng.standard_normal((n, 10), dtype=np.float32), np.ones((n, 1), np.float32)])
        y = jnp.asarray((rng.random(n) < 0.5).astype(np.float32))
        for m in chunks:
            mm = min(m, n)
            r = bench_size(n, mm, a.items, a.reps, X, y)
            rows.append(r)
            print(f"{n:>10} {mm:>6} {r['feistel_ns_per_item']:>10.2f} "
                  f"{r['feistel_walk_rounds_mean_per_chunk']:>8.2f}/{r['feistel_walk_rounds_max_per_chunk']:<6d} "
                  f"{r['swap_or_not_ns_per_item']:>14.2f} {r['loglik_ns_per_item']:>9.2f} "
                  f"{r['feistel_ns_per_item'] / r['loglik_ns_per_item']:>14.2f} "
                  f"{r['swap_or_not_ns_per_item'] / r['loglik_ns_per_item']:>11.2f}", flush=True)
        del X, y
    result = {"meta": meta, "info": info, "rows": rows}
    if a.quality:
        result["quality"] = quality()
    C.write_json(os.path.dirname(os.path.abspath(a.out)), os.path.basename(a.out), result)


if __name__ == "__main__":
    main()
