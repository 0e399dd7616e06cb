"""Cheaper-to-compile lowerings for tallmh's own programs (same bits, fewer seconds of XLA's CPU backend).

JAX lowers its counter-based random generator (Threefry-2x32, Salmon et al. 2011) in two ways that give
the same bits: with its 20 rounds unrolled (every platform but the CPU), or, on the CPU, as a loop of 5
iterations whose rotation amounts are loop-carried values. With the jaxlib this was measured on (0.10),
XLA's CPU backend compiles the unrolled form about twice as fast (0.36 s instead of 0.75 s for the bits of
one keyed permutation of four chains; about 1 CPU s of the default chain's compile, benchmarks/README.md).

:func:`unrolled_threefry` makes the CPU use the unrolled form for what the *calling thread* lowers inside
the block. The CPU rule in JAX's registry is replaced once by a rule that reads a thread-local flag: with
the flag set it lowers as JAX does elsewhere, without it exactly as JAX's own CPU rule. So a program lowered
at the same time in another thread (tallmh lowers its set-up passes while the chain lowers in the
background) keeps JAX's form, and with it its persistent-cache key. Where JAX's registry is not as expected
(another JAX version) nothing is replaced and the block changes nothing.

Only with jax below 0.11 (``UNROLL_BELOW``), where it was measured: jax 0.12's CPU compiler ran more than
10 minutes on a particle-Gibbs program lowered so, which runs in 9 s lowered as JAX does; jax 0.11 was not
measured.
"""

from __future__ import annotations

import contextlib
import threading

UNROLL_BELOW = (0, 11)  # the jax versions (below this) where the unrolled form was measured to compile faster
_LOCAL = threading.local()
_LOCK = threading.Lock()
_INSTALLED = {"done": False, "ok": False}


def measured_here() -> bool:
    """Whether the installed jax is one of those where the unrolled form was measured (below ``UNROLL_BELOW``)."""
    import jax

    return tuple(int(p) for p in jax.__version__.split(".")[:2]) < UNROLL_BELOW


def _flag() -> bool:
    return getattr(_LOCAL, "depth", 0) > 0


def _install() -> bool:
    """Put the dispatching rule in JAX's CPU table (once); False where the registry is not as expected."""
    with _LOCK:
        if _INSTALLED["done"]:
            return _INSTALLED["ok"]
        _INSTALLED["done"] = True
        try:
            if not measured_here():
                return False
            from jax._src.interpreters import mlir
            from jax.extend.random import threefry2x32_p

            table = mlir._platform_specific_lowerings["cpu"]
            cpu_entry = table.get(threefry2x32_p)
            default_entry = mlir._lowerings.get(threefry2x32_p)
            if cpu_entry is None or default_entry is None:
                return False
            cpu_rule, default_rule = cpu_entry.rule, default_entry.rule

            def rule(ctx, *args, **params):
                return (default_rule if _flag() else cpu_rule)(ctx, *args, **params)

            table[threefry2x32_p] = type(cpu_entry)(rule, cpu_entry.inline)
        except Exception:  # noqa: BLE001 - another JAX: leave its lowering alone
            return False
        _INSTALLED["ok"] = True
        return True


@contextlib.contextmanager
def unrolled_threefry():
    """Within the block, what this thread lowers lowers Threefry on the CPU unrolled (same bits)."""
    _install()
    _LOCAL.depth = getattr(_LOCAL, "depth", 0) + 1
    try:
        yield
    finally:
        _LOCAL.depth -= 1
