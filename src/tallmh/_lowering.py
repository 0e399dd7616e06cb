"""Cheaper-to-compile lowerings for tallmh's own programs (same bits, fewer seconds of XLA's CPU backend).

JAX lowers its counter-based random generator (Threefry-2x32, Salmon et al. 2011) in two ways that give
the same bits: with its 20 rounds unrolled (every platform but the CPU), or, on the CPU, as a loop of 5
iterations whose rotation amounts are loop-carried values. (The unrolled form is emitted here as StableHLO
operations directly, not traced from array operations as JAX does: :func:`_unrolled_rule`.) With the jaxlib this was measured on (0.10),
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


# Threefry-2x32 (Salmon, Moraes, Dror & Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011): 20 rounds of
# add, rotate and xor on two 32-bit words, the key injected every 4 rounds with its parity word and the injection's
# count; the rotations of its Table 4.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = 0x1BD11BDA


def _unrolled_rule(ctx, k1, k2, x1, x2):
    """Threefry-2x32 unrolled, emitted as StableHLO operations directly (what JAX lowers on other platforms, the same
    bits): a rule that traces the hash as array operations spent ~0.05 s of the default chain's trace on its six
    hashes, emitting the same ~200 integer operations each."""
    from jax._src.interpreters import mlir
    from jax._src.lib.mlir.dialects import hlo

    aval = ctx.avals_out[0]
    rank = len(aval.shape)
    if 0 in aval.shape:
        zeros = mlir.full_like_aval(ctx, 0, aval)
        return [zeros, zeros]

    def full(v, a):  # an operand broadcast to the output's shape (the primitive broadcasts its operands)
        if tuple(a.shape) == tuple(aval.shape):
            return v
        return mlir.broadcast_in_dim(ctx, v, aval, broadcast_dimensions=range(rank - len(a.shape), rank))

    k1, k2, x1, x2 = (full(v, a) for v, a in zip((k1, k2, x1, x2), ctx.avals_in))
    consts = {}

    def const(c):
        if c not in consts:
            consts[c] = mlir.full_like_aval(ctx, c, aval)
        return consts[c]

    def rotl(v, r):
        return hlo.or_(hlo.shift_left(v, const(r)), hlo.shift_right_logical(v, const(32 - r)))

    keys = (k1, k2, hlo.xor(hlo.xor(k1, k2), const(_PARITY)))
    a, b = hlo.add(x1, keys[0]), hlo.add(x2, keys[1])
    for j in range(5):
        for r in _ROTATIONS[j % 2]:
            a = hlo.add(a, b)
            b = hlo.xor(a, rotl(b, r))
        a = hlo.add(a, keys[(j + 1) % 3])
        b = hlo.add(hlo.add(b, keys[(j + 2) % 3]), const(j + 1))
    return [a, b]


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
            cpu_rule = cpu_entry.rule

            def rule(ctx, *args, **params):
                return (_unrolled_rule if _flag() else cpu_rule)(ctx, *args, **params)

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
