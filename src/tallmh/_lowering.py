"""Cheaper-to-compile lowerings for tallmh's own programs (same bits, fewer seconds of XLA's CPU backend).

JAX lowers its counter-based random generator (Threefry-2x32, Salmon et al. 2011) in two ways that give
the same bits: with its 20 rounds unrolled (every platform but the CPU), or, on the CPU, as a loop of 5
iterations whose rotation amounts are loop-carried values. With the jaxlib this was measured on (0.10),
XLA's CPU backend compiles the unrolled form about twice as fast: 0.36 s instead of 0.75 s for the bits
of one keyed permutation of four chains, 0.33 s instead of 0.62 s for four chains' normal draws, and
8.0 instead of 9.0 CPU seconds for the whole default chain (benchmarks/README.md). While tallmh lowers its
chain, :func:`unrolled_threefry` makes the CPU use the unrolled form. A program lowered meanwhile in
another thread may get it too: its bits are the same. Where JAX's registry is not as expected (another
JAX version) it does nothing.
"""

from __future__ import annotations

import contextlib
import threading

_LOCK = threading.Lock()
_STATE = {"depth": 0, "saved": None}


def _table():
    try:
        from jax._src.interpreters import mlir
        from jax.extend.random import threefry2x32_p

        table = mlir._platform_specific_lowerings["cpu"]
    except Exception:  # noqa: BLE001 - another JAX: leave its lowering alone
        return None, None
    return (table, threefry2x32_p) if threefry2x32_p in table else (None, None)


@contextlib.contextmanager
def unrolled_threefry():
    """Within the block, Threefry lowers on the CPU as it does elsewhere (unrolled; same bits)."""
    with _LOCK:
        if _STATE["depth"] == 0:
            table, prim = _table()
            _STATE["saved"] = (table, prim, table.pop(prim)) if table is not None else None
        _STATE["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0 and _STATE["saved"] is not None:
                table, prim, entry = _STATE["saved"]
                table[prim] = entry
                _STATE["saved"] = None
