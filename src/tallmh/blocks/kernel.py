"""An inference program as a kernel, so that :func:`tallmh.sample` runs it like any other.

``tm.sample(model, data, program=tm.Cycle([...]))`` builds the kernel here: a chain's state is the
program's :class:`~tallmh.blocks.ProgramState` plus the flat vector of what a draw records
(``model.record(values, aux)``, or every site), which is what the runner keeps per step. One step of the
kernel is one pass of the cycle (Tierney 1994: a composition of kernels that each leave the target
invariant leaves it invariant). Its statistics are the runner's (items read, acceptance, ...) summed over
the blocks, plus each block's own: ``block{i}_n_data``, ``block{i}_proposals`` and ``block{i}_accepted``
(and ``block{i}_refresh_items`` for a block with control variates).
At an audited step every approximate decision of a :class:`~tallmh.blocks.SubsampledMH` block is also taken
by the exact test with the same u: ``audit_count`` decisions, of which ``audit_wrong`` differed.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from ..errors import ModelError
from ..kernel import Kernel
from .cycle import Cycle
from .state import BlockInfo

__all__ = ["ProgramChain", "build_program_kernel", "block_stats"]


class ProgramChain(NamedTuple):
    theta: jax.Array  # the flattened record of the current state (what the runner keeps per step)
    program: Any  # ProgramState


def block_stats(stats: dict, labels) -> dict:
    """``{label: {"n_data", "proposals", "accepted"}}`` from a run's statistics (``Result.stats``), plus
    ``"refresh_items"`` for a block with control variates (of its ``n_data``, the items read to keep their
    sums current)."""
    return {lab: {k: stats[f"block{i}_{k}"] for k in ("n_data", "proposals", "accepted", "refresh_items")
                  if f"block{i}_{k}" in stats}
            for i, lab in enumerate(labels)}


def _as_cycle(program) -> Cycle:
    if isinstance(program, Cycle):
        return program
    return Cycle(list(program) if isinstance(program, (list, tuple)) else [program])


def build_program_kernel(program, model, data, n: int, init=None):
    """``(kernel, init_states, unravel, template, program)`` for ``program`` on ``model``.

    ``init_states(keys)`` starts one chain per key (``model.init(key, data)``, or ``init=(values, aux)``);
    ``unravel`` maps a flat record back to its dict of sites; ``template`` is one record (its shapes).
    """
    program = _as_cycle(program)
    if init is None and not callable(getattr(model, "init", None)):
        raise ModelError("the model needs init(key, data) -> (values, aux), or pass init=(values, aux)")

    def record(pst):
        rec = getattr(model, "record", None)
        return rec(pst.values, pst.aux) if callable(rec) else pst.values

    def start(key, data):
        values, aux = model.init(key, data) if init is None else init
        pst = program.init(model, values, aux, data, n)
        flat, _ = ravel_pytree(record(pst))
        return ProgramChain(flat, pst)

    values0 = model.init(jax.random.PRNGKey(0), data)[0] if init is None else init[0]
    program.validate(model, values0, n)
    shapes = jax.eval_shape(lambda: record(program.init(model, *(
        model.init(jax.random.PRNGKey(0), data) if init is None else init), data, n)))
    template = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    _, unravel = ravel_pytree(template)
    k_blocks = len(program.blocks)
    refreshing = {i for i, b in enumerate(program.blocks) if getattr(b, "refreshes", False)}

    def to_info(infos, dtype):
        total = BlockInfo.zero()
        for inf in infos:
            total = total + inf
        out = {"accepted": (total.accepted / jnp.maximum(total.proposals, 1)).astype(dtype),
               "n_data": total.n_data, "rounds": total.proposals, "nonfinite": jnp.zeros((), jnp.int32),
               "excess_error": jnp.zeros((), dtype), "audited": jnp.asarray(total.audits) > 0,
               "audit_exact": jnp.bool_(False), "audit_items": jnp.asarray(total.audit_items, jnp.int32),
               "audit_count": jnp.asarray(total.audits, jnp.int32),
               "audit_wrong": jnp.asarray(total.audit_wrong, jnp.int32)}
        for i, inf in enumerate(infos):
            out.update({f"block{i}_n_data": inf.n_data, f"block{i}_proposals": inf.proposals,
                        f"block{i}_accepted": inf.accepted})
            if i in refreshing:
                out[f"block{i}_refresh_items"] = jnp.asarray(inf.refresh_items, jnp.int32)
        return out

    def empty_info(dtype):
        return to_info((BlockInfo.zero(),) * k_blocks, dtype)

    def step(key, state, data, step_index, adapt, stats=None, audit=False):
        pst, infos = program.step(key, model, state.program, data, n, audit=audit, step_index=step_index,
                                  adapt=adapt)
        flat, _ = ravel_pytree(record(pst))
        return ProgramChain(flat.astype(state.theta.dtype), pst), to_info(infos, state.theta.dtype)

    def init_states(keys):
        return jax.jit(jax.vmap(start, in_axes=(0, None)))(keys, data)

    kernel = Kernel(init=start, step=step, full_log_lik=None, grad_estimate=None, empty_info=empty_info,
                    map_chains=True)
    return kernel, init_states, unravel, template, program
