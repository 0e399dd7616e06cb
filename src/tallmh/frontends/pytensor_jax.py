"""A PyTensor graph compiled to JAX (PyMC's :func:`pymc.sampling.jax.get_jaxified_graph`), with the integer constants
of its ``arange`` nodes widened to the node's own dtype first.

PyTensor types a Python integer by the smallest dtype that holds it, so ``pt.arange(n)`` carries ``int8`` constants
``0`` and ``1`` (the node itself is ``int64``). Its JAX translation calls ``jnp.arange(0, n, 1)`` with those ``int8``
scalars and a length ``n`` known only at trace time, and under NumPy 2's promotion rules ``n - int8(0)`` overflows
once ``n`` > 127 (PyTensor's issue 2296, where a matrix's size passes 127). PyMC's ``Categorical`` log density indexes
its probabilities by such an ``arange`` over the rows, so a Bambi ``family="categorical"`` model failed on any batch
of 128 rows or more. Widening the constants changes no value: the node's dtype is the same.
"""

from __future__ import annotations

import numpy as np

__all__ = ["jaxified_graph", "widen_arange_constants"]


def widen_arange_constants(outputs):
    """``outputs`` with every ``ARange`` node above them rebuilt with its constant inputs in the node's dtype (the
    outputs themselves where there is none)."""
    from pytensor import tensor as pt
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import ancestors
    from pytensor.graph.replace import clone_replace
    from pytensor.tensor.basic import ARange

    repl = {}
    for v in ancestors(outputs):
        node = v.owner
        if node is None or not isinstance(node.op, ARange) or v in repl:
            continue
        dt = node.op.dtype
        ins = [pt.constant(np.asarray(i.data, dtype=dt)) if isinstance(i, Constant) and i.type.dtype != dt else i
               for i in node.inputs]
        if any(a is not b for a, b in zip(ins, node.inputs)):
            repl[v] = node.op(*ins)
    if not repl:
        return list(outputs)
    return clone_replace(list(outputs), replace=repl, rebuild_strict=False)


def jaxified_graph(inputs, outputs):
    """PyMC's ``get_jaxified_graph(inputs, outputs)`` on :func:`widen_arange_constants` of ``outputs``."""
    from pymc.sampling.jax import get_jaxified_graph

    return get_jaxified_graph(inputs=inputs, outputs=widen_arange_constants(outputs))
