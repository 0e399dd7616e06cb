"""What one exact full-data decision costs per item: the pass the self-audit makes at every audited step.

Logistic regression (``tm.models.LogisticRegression.simulate``, d = 11, float32), the per-item log-likelihood
ratios ``l_i = log p(x_i|theta') - log p(x_i|theta)`` over all N rows, summed:

- ``plain sum``: ``jnp.sum(l)`` in float32 (what the compiler fuses best; not compensated, a floor);
- ``df_sum``: :func:`tallmh.acceptance.base.df_sum`, the pairwise TwoSum tree over all rows;
- ``df_reduce``: :func:`tallmh.acceptance.base.df_reduce`, the exact test's compensated chunk sum;
- ``exact oracle``: ``tm.acceptance.Exact()``'s own pass (chunks of rows in a loop, non-finite checks,
  compensated sums), for one chain and for 4 chains vectorised as ``tm.sample`` runs them;
- ``audit pass``: the self-audit's pass (``Exact.fixed_pass_sum``: a loop of fixed length over sliced rows,
  each chunk's ratios summed in the next iteration), through the model's own ``log_lik_ratio``.

Each is one compiled function, timed as the best of ``--reps`` calls after a first (compiling) one; printed
in ns per item and chain. The machine's load is printed with it: these are wall times.

Usage::

    python benchmarks/exact_pass.py --N 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--N", type=float, default=1e6)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    a = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    import tallmh as tm
    from tallmh.acceptance import base

    n, c = int(a.N), a.chains
    data, _ = tm.models.LogisticRegression.simulate(n, d=10)
    X, y = jnp.asarray(data["X"]), jnp.asarray(data["y"])
    model = tm.models.LogisticRegression(prior_scale=10.0)
    rng = np.random.default_rng(0)
    th = jnp.asarray(rng.standard_normal((c, 11)) * 0.01, jnp.float32)
    thp = th + jnp.asarray(rng.standard_normal((c, 11)) * 0.001, jnp.float32)

    def ratios(t, tp):
        return model.log_lik(tp, {"X": X, "y": y}) - model.log_lik(t, {"X": X, "y": y})

    def oracle(t, tp):
        def fn(idx):
            b = {"X": X[idx], "y": y[idx]}
            return model.log_lik(tp, b) - model.log_lik(t, b)

        acc = tm.acceptance.Exact()._sum(n, fn, jnp.float32, n)
        return acc.hi + acc.lo

    from jax.flatten_util import ravel_pytree

    from tallmh.kernel import make_problem

    _, unravel = ravel_pytree(th[0])

    def audit(t, tp):  # the self-audit's pass: fixed length, rows sliced, pipelined (Exact.fixed_pass_sum)
        pr = make_problem(model, {"X": X, "y": y}, n, unravel, None, t, tp, jnp.zeros((), jnp.float32))
        acc = tm.acceptance.Exact().fixed_pass_sum(pr)
        return acc.hi + acc.lo

    cells = [("plain sum", lambda t, tp: jnp.sum(ratios(t, tp))),
             ("df_sum", lambda t, tp: sum(base.df_sum(ratios(t, tp)))),
             ("df_reduce", lambda t, tp: sum(base.df_reduce(ratios(t, tp), jnp.ones(n, bool),
                                                             jnp.zeros(n, bool))[:2])),
             ("exact oracle", oracle),
             ("audit pass", audit)]
    rows = []
    print(f"N = {n:,}, load {os.getloadavg()[0]:.2f}")
    for name, f in cells:
        for chains in (1, c):
            g = jax.jit(jax.vmap(f)) if chains > 1 else jax.jit(f)
            args = (th, thp) if chains > 1 else (th[0], thp[0])
            first = np.asarray(g(*args)).ravel()
            best = float("inf")
            for _ in range(a.reps):
                t0 = time.perf_counter()
                jax.block_until_ready(g(*args))
                best = min(best, time.perf_counter() - t0)
            row = {"sum": name, "chains": chains, "ms": 1e3 * best, "ns_per_item_chain": 1e9 * best / (n * chains),
                   "value": float(first[0])}
            rows.append(row)
            print(f"{name:14s} {chains} chain(s): {row['ms']:8.1f} ms, {row['ns_per_item_chain']:6.1f} ns per item and chain")
    print(json.dumps({"N": n, "load_end": os.getloadavg()[0], "rows": rows}))


if __name__ == "__main__":
    main()
