"""The Poisson-log / known-sd Gaussian recognition's derivative pass over every row: the forward reading
(``tallmh.glm_rows.second_order_rows``, ``p + 3`` directions, O(N p)) against the former per-row gradients and
Hessian-vector products over all ``p + G`` effects (O(N G); kept in ``tests/test_glm_rows.py`` as the reference).

The model and data are ``group_families.py``'s (PyMC, ``y ~ x1 + x2 + (1|g)``, centred, a known truth). Printed per
reading: wall and CPU seconds of the pass (compile included), whether every chunk was read as the form, and whether
the two readings give the same group index on every row.

Usage::

    python benchmarks/glm_rows_speed.py --rows 1000000 --groups 1000 --families poisson
    python benchmarks/glm_rows_speed.py --smoke
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

import _common

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pass(fn, data, n, size):
    import jax
    import jax.numpy as jnp

    t, cpu, outs = time.perf_counter(), time.process_time(), []
    for s in range(0, n, size):
        idx = jnp.asarray(np.minimum(np.arange(s, s + size), n - 1).astype(np.int32))
        outs.append(jax.block_until_ready(fn(data, idx)))
    gi = np.concatenate([np.asarray(o[2]) for o in outs])[:n]
    return time.perf_counter() - t, time.process_time() - cpu, all(bool(o[7]) for o in outs), gi


def one(family, n, groups, seed):
    import jax
    import jax.numpy as jnp

    import group_families as gf
    import tallmh as tm
    from tallmh import glm_effects as ge
    from tallmh import hierarchical
    from tallmh.glm_rows import second_order_rows, tangents
    from tallmh.storage.data import take
    from test_glm_rows import _reference_rows

    g, x1, x2, y = gf.simulate(family, n, groups, seed)
    model, data = tm.from_pymc(gf.model(family, g, x1, x2, y, groups))
    hierarchical.EXACT_GLM = False  # the blocked model only (the pass is timed below)
    bm = hierarchical.auto_program(model, data)[0]
    data = jax.tree_util.tree_map(jnp.asarray, data)
    pos = ge._positions(bm)
    gkey = max(pos, key=lambda k: pos[k].size)
    group, fixed = pos[gkey], np.sort(np.concatenate([pos[k] for k in pos if k != gkey]))
    e0, h0 = bm.start["effects"], bm.start["hyper"]
    d = int(e0.shape[0])
    w = jnp.asarray(np.random.default_rng(4).standard_normal(d), e0.dtype)
    fj, gj, tang = jnp.asarray(fixed), jnp.asarray(group), tangents(fixed, group, d, e0.dtype)
    size = int(max(256, min(8192, (1 << 25) // (8 * d))))  # glm_effects' chunk

    def lik(e, rows):
        return bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), rows)

    @jax.jit
    def forward(data, idx):
        flat = take(data, idx)
        return second_order_rows(lambda e: lik(e, flat), e0, tang, w, int(fixed.size), fj, gj)

    @jax.jit
    def former(data, idx):
        flat = take(data, idx)
        return _reference_rows(lambda e, row: lik(e, row)[0], e0, w, jax.tree_util.tree_map(lambda a: a[:, None], flat),
                               fj, gj)

    row = {"family": family, "rows": n, "groups": groups, "effects": d, "chunk": size}
    gis = {}
    for name, fn in (("forward", forward), ("former", former)):
        wall, cpu, ok, gis[name] = _pass(fn, data, n, size)
        row[name] = {"wall s": wall, "cpu s": cpu, "read as the form": ok, "load": _common.load_average()}
        print(f"{family:>8} {n:>9} rows x {groups:>5} groups  {name:>8}: {wall:7.1f} s wall, {cpu:7.1f} s CPU, "
              f"read as the form {ok}, load {row[name]['load']}", flush=True)
    row["same group index"] = bool(np.array_equal(gis["forward"], gis["former"]))
    print(f"{'':>8} same group index on every row: {row['same group index']}", flush=True)
    return row


def main(argv=None):
    ap = _common.parser(__doc__)
    _common.add_run_options(ap, os.path.join(REPO, "benchmarks", "results"))
    _common.add_options(ap, rows=1_000_000, groups=1000, families="poisson,gaussian")
    a = ap.parse_args(argv)
    if a.smoke:
        a.rows, a.groups, a.families = 2000, 20, "poisson"
    sys.path.insert(0, os.path.join(REPO, "src"))
    sys.path.insert(0, os.path.join(REPO, "tests"))
    meta = _common.machine_info(sys.argv)
    _common.header("glm_rows_speed", meta)
    rows = [one(f, a.rows, a.groups, a.seed) for f in a.families.split(",")]
    _common.write_json(a.out, "glm_rows_speed_smoke.json" if a.smoke else f"glm_rows_speed_{a.rows}x{a.groups}.json",
                       {"meta": meta, "results": rows})


if __name__ == "__main__":
    main()
