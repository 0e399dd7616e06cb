"""Running a program: the low-level ``Runner`` (compiled chunks) and ``sample_program`` (an alias of
``tm.sample(model, data, program=...)`` returning the older ``ProgramResult`` view)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List

import jax
import jax.numpy as jnp
import numpy as np

from ..storage.data import num_items, validate_data
from ..errors import ConfigError, ModelError
from .cycle import Cycle


class Runner:
    """Compiled runs of ``program`` on ``model``: ``init`` once, then ``run`` chunks of steps.

    ``run(states, data, num_steps, key, thin)`` is ``jit`` of a ``lax.scan`` over steps, mapped over
    chains with ``lax.map`` (see the comment in ``run``), with the data an argument (never a constant); the compiled function is cached per
    (num_steps, thin), so chunks of equal size reuse it. It returns the final states, the records
    (``model.record(values, aux)`` every ``thin`` steps, or all sites) and per-block :class:`BlockInfo`
    sums per recorded draw.
    """

    def __init__(self, program: Cycle, model):
        if not isinstance(program, Cycle):
            program = Cycle(list(program) if isinstance(program, (list, tuple)) else [program])
        self.program = program
        self.model = model
        self._compiled = {}

    def _record(self, state):
        rec = getattr(self.model, "record", None)
        if callable(rec):
            return rec(state.values, state.aux)
        return state.values

    def init(self, data, num_chains: int = 1, seed: int = 0, init=None):
        data = validate_data(data)
        n = num_items(data)
        self.n = n
        key = jax.random.PRNGKey(seed)
        keys = jax.random.split(key, num_chains)
        if init is None:
            if not callable(getattr(self.model, "init", None)):
                raise ModelError("the model needs init(key, data) -> (values, aux), or pass init=(values, aux)")
            values0, _ = self.model.init(keys[0], data)
        else:
            values0 = init[0]
        self.program.validate(self.model, values0, n)

        def one(k):
            vals, aux = self.model.init(k, data) if init is None else init
            return self.program.init(self.model, vals, aux, data, n)

        return jax.jit(jax.vmap(one))(keys), data

    def run(self, states, data, num_steps: int, key, thin: int = 1):
        num_steps, thin = int(num_steps), int(thin)
        if num_steps % thin:
            raise ConfigError(f"num_steps ({num_steps}) must be a multiple of thin ({thin})")
        fn = self._compiled.get((num_steps, thin))
        if fn is None:
            program, model, n = self.program, self.model, self.n

            def chain(key, state, data):
                def inner(st, k):
                    st, info = program.step(k, model, st, data, n)
                    return st, info

                def outer(st, k):
                    st, infos = jax.lax.scan(inner, st, jax.random.split(k, thin))
                    infos = jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), infos)
                    return st, (self._record(st), infos)

                return jax.lax.scan(outer, state, jax.random.split(key, num_steps // thin))

            # chains run one after another (lax.map), not vmap-ed: under vmap the member lists' O(1)
            # dynamic updates become batched scatters that XLA copies whole (O(K N) per move on CPU), and
            # every lane would wait for the slowest lane's sequential-test loop
            def chains(keys, states, data):
                return jax.lax.map(lambda ks: chain(ks[0], ks[1], data), (keys, states))

            fn = jax.jit(chains)
            self._compiled[(num_steps, thin)] = fn
        num_chains = jax.tree_util.tree_leaves(states)[0].shape[0]
        keys = jax.random.split(key, num_chains)
        states, (records, infos) = fn(keys, states, data)
        return states, records, infos


@dataclass
class ProgramResult:
    """Draws of an inference program: ``samples[name]`` shaped (chain, draw, ...), per-block stats."""

    samples: Dict[str, np.ndarray]
    stats: Dict[str, Dict[str, np.ndarray]]  # block label -> {"n_data", "proposals", "accepted"} (chain, draw)
    labels: List[str]
    timings: Dict[str, float]
    final_state: Any = None
    n: int = 0
    run: Any = None  # the tallmh.Result of the run

    def to_arviz(self):
        from ..reporting.diagnostics import idata_from_dict

        st = {}
        for lab, d in self.stats.items():
            key = lab.replace("(", "_").replace(")", "").replace(", ", "_").replace(" ", "")
            st[f"{key}__n_data"] = d["n_data"]
            st[f"{key}__acceptance_rate"] = d["accepted"] / np.maximum(d["proposals"], 1)
        return idata_from_dict({"posterior": dict(self.samples), "sample_stats": st})

    def summary(self):
        import arviz as az

        return az.summary(self.to_arviz(), kind="all")

    def items_per_step(self):
        """Mean data items read per step, by block."""
        thin = self.timings.get("thin", 1)
        return {lab: float(np.mean(d["n_data"]) / thin) for lab, d in self.stats.items()}


def sample_program(program, model, data, num_samples: int = 1000, num_warmup: int = 0, num_chains: int = 1,
                   seed: int = 0, thin: int = 1, init=None, **kwargs) -> ProgramResult:
    """Run an inference program; a thin alias of ``tm.sample(model, data, program=program, ...)``.

    It returns the older :class:`ProgramResult` view (``samples`` by site, ``stats`` by block label): the
    run itself is :func:`tallmh.sample`'s (chunks, progress, Ctrl-C, checkpoints, verdict), and
    ``result.run`` is its :class:`tallmh.Result`. ``thin`` > 1 keeps every ``thin``-th draw (the stats are
    summed over the steps between kept draws). Other keyword arguments go to :func:`tallmh.sample`.
    """
    from ..run.sampling import sample
    from .kernel import block_stats

    thin = int(thin)
    if thin < 1:
        raise ConfigError(f"thin must be at least 1; got {thin}")
    if int(num_samples) < 1 or int(num_chains) < 1 or int(num_warmup) < 0:
        raise ConfigError("num_samples and num_chains must be at least 1, num_warmup at least 0")
    kwargs.setdefault("progress", False)
    run = sample(model, data, program=program, num_samples=int(num_samples) * thin, num_warmup=int(num_warmup),
                 num_chains=int(num_chains), seed=seed, init=init, **kwargs)
    prog = run.test
    stats = {lab: {k: _thin_sum(v, thin) for k, v in d.items()}
             for lab, d in block_stats(run.stats, prog.labels).items()}
    samples = {k: np.asarray(v)[:, thin - 1::thin] for k, v in run.samples.items()}
    t = run.timings
    timings = {"init": t.get("setup_s", 0.0) + t.get("compile_s", 0.0), "warmup": t.get("warmup_s", 0.0),
               "sampling": t.get("sampling_s", 0.0), "total": t.get("total_s", 0.0), "thin": thin}
    final = run.final_state.program if run.final_state is not None else None
    out = ProgramResult(samples, stats, prog.labels, timings, final, run.n)
    out.run = run
    return out


def _thin_sum(a, thin):
    a = np.asarray(a)
    if thin == 1:
        return a
    k = a.shape[1] // thin
    return a[:, :k * thin].reshape(a.shape[0], k, thin, *a.shape[2:]).sum(axis=2)
