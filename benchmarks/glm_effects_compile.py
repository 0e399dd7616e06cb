"""What the exact effects step of a hierarchical GLM (``tallmh.glm_effects.GLMEffects``) costs to compile, counted in
ways the machine's load does not change, and its sampling speed.

A hierarchical logistic regression written in PyMC (``N`` rows, ``G`` groups of equal size, one slope and a group
intercept; ``y ~ Bernoulli(logit = mu + b x + u[g])``, ``u ~ N(0, s^2)``) is blocked by ``program="auto"``
(``tallmh.hierarchical.auto_program``); the effects block's step, run ``--steps`` times in a ``lax.scan`` for 4
chains under ``vmap`` (as a chunk of the chain runs it), is lowered and compiled in this process with the
persistent caches off:

- ``hlo_lines``, ``while_loops``, ``fusions``: the optimised HLO's lines, ``while`` loops and fusion computations;
- ``trace_cpu_s`` / ``compile_cpu_s``: tracing and lowering, then XLA's compile, in CPU seconds of the process;
- ``ms_per_step``: the compiled program's wall per step of the 4 chains (the second call), and the rows read per
  step (mean).

``GEC_DUMP=FILE`` writes the optimised HLO there.

Usage::

    python benchmarks/glm_effects_compile.py                    # N = 100,000, G = 50
    python benchmarks/glm_effects_compile.py --N 1000000 --G 100 --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def model_of(n, groups, seed=0):
    import numpy as np
    import pymc as pm

    import tallmh as tm

    rng = np.random.default_rng(seed)
    g = np.arange(n) % groups
    x = rng.normal(size=n)
    a = rng.normal(0, 0.5, groups)
    y = (rng.random(n) < 1 / (1 + np.exp(-(-1.0 + 0.8 * x + a[g])))).astype(int)
    with pm.Model() as m:
        gi = pm.Data("g_idx", g)
        mu = pm.Normal("mu", 0, 2)
        b = pm.Normal("b", 0, 2)
        s = pm.HalfNormal("s", 1)
        u = pm.Normal("u", 0, s, shape=groups)
        pm.Bernoulli("y", logit_p=mu + b * x + u[gi], observed=y)
    return tm.from_pymc(m)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--N", type=int, default=100_000)
    ap.add_argument("--G", type=int, default=50)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--out", default=os.path.join(HERE, "results"))
    a = ap.parse_args(argv)
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import jax.numpy as jnp
    import numpy as np

    from tallmh import glm_effects as ge
    from tallmh import hierarchical

    model, data = model_of(a.N, a.G)
    bm, program, _ = hierarchical.auto_program(model, data)
    eff = program.blocks[1]
    assert isinstance(eff, ge.GLMEffects), type(eff)
    data = jax.tree_util.tree_map(jnp.asarray, hierarchical.data_for(bm, data))
    values = jax.tree_util.tree_map(lambda v: jnp.broadcast_to(v, (4,) + jnp.shape(v)), dict(bm.start))

    def run(key, values, data):
        def one(key, vals):
            def body(v, k):
                v, _, _, _, info = eff.step(k, bm, v, None, None, (), data, a.N)
                return v, info.n_data
            return jax.lax.scan(body, vals, jax.random.split(key, a.steps))

        return jax.vmap(one)(jax.random.split(key, 4), values)

    c0 = time.process_time()
    lowered = jax.jit(run).lower(jax.random.PRNGKey(0), values, data)
    c1 = time.process_time()
    compiled = lowered.compile()
    c2 = time.process_time()
    text = compiled.as_text()
    if os.environ.get("GEC_DUMP"):
        open(os.environ["GEC_DUMP"], "w").write(text)
    out = compiled(jax.random.PRNGKey(1), values, data)
    jax.block_until_ready(out)
    w = time.perf_counter()
    out = compiled(jax.random.PRNGKey(2), values, data)
    jax.block_until_ready(out)
    wall = time.perf_counter() - w
    row = {"N": a.N, "G": a.G, "steps": a.steps, "hlo_lines": text.count("\n"),
           "while_loops": len(re.findall(r" while\(", text)), "fusions": len(re.findall(r"^fused_computation|\n%?fused",
                                                                                      text)),
           "trace_cpu_s": round(c1 - c0, 3), "compile_cpu_s": round(c2 - c1, 3),
           "ms_per_step": round(1e3 * wall / a.steps, 4), "rows_per_step": float(np.mean(np.asarray(out[1]))),
           "load": os.getloadavg()}
    print(json.dumps(row))
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "glm_effects_compile.json"), "w") as f:
        args = " ".join(argv or sys.argv[1:])
        args = re.sub(r"\s*--out\s+\S+", "", args)  # (no path of the machine it ran on)
        json.dump({"command": ("python benchmarks/glm_effects_compile.py " + args).strip(),
                   "rows": [row]}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
