"""Data pytrees and subsampling without replacement at O(batch) cost.

Data is any pytree of arrays whose leading axis indexes the N data items (``{"X": X, "y": y}``).

Within one MH step the approximate tests read the items in the order of a keyed pseudo-random
permutation ``pi`` of ``range(N)``: the k-th item read is ``pi(k)``. Because ``pi`` is a bijection, a step
never reads an item twice, and reading the positions ``[t, t + m)`` costs O(m): no O(N) shuffle is ever
made. ``pi`` is a balanced Feistel network on ``2 * h`` bits (``4**h >= N``) with cycle-walking: values
that land outside ``range(N)`` are encrypted again until they fall inside, which keeps the map a
bijection of ``range(N)`` (Black & Rogaway, "Ciphers with arbitrary finite domains", 2002). Since
``4**h < 4 N``, fewer than four rounds of walking are needed on average.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .errors import DataError

__all__ = ["validate_data", "num_items", "take", "from_npy", "Permutation", "make_permutation", "permute"]

_FEISTEL_ROUNDS = 4


def num_items(data) -> int:
    """Number of data items N: the common leading length of the data's leaves (on-disk leaves included)."""
    from .datasource import leaves_of

    leaves = leaves_of(data)
    return int(np.shape(leaves[0])[0])


def validate_data(data, check_finite: bool = True):
    """Check a data pytree and return it with its leaves as JAX arrays.

    Raises :class:`DataError` naming the problem when the pytree has no leaves, a leaf is a scalar, the
    leaves disagree on the leading length, N is 0, or (with ``check_finite``) a leaf holds NaN or inf.
    The finiteness check is a one-time pass over the data made before sampling starts.

    Out-of-core leaves (:mod:`tallmh.datasource`: an ``np.memmap``, or what ``from_npy`` returns) are
    never loaded whole: a memory map becomes a zero-copy ``jax.Array`` or a host-gathered
    :class:`~tallmh.datasource.HostArray`, and its finiteness check streams over it in blocks (once:
    skipped for leaves ``from_npy`` has checked already).
    """
    from . import datasource as ds

    leaves, treedef = jax.tree_util.tree_flatten_with_path(data, is_leaf=ds._is_leaf)
    if not leaves:
        raise DataError("data has no arrays: pass a pytree of arrays with a leading axis of length N")
    lengths = {}
    out = []
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path) or "data"
        if ds.is_host_leaf(leaf):
            if isinstance(leaf, np.memmap):
                ds._check_array(leaf, name)
                if check_finite:
                    ds.check_finite_streamed(leaf, name)
                leaf = ds.host_leaf(leaf, "auto", name, checked=check_finite)
            elif check_finite and not ds.finite_checked(leaf):
                ds.check_finite_streamed(ds._memmap_of(leaf), name)
                ds.mark_checked(leaf)
            if len(leaf.shape) == 0:
                raise DataError(f"data leaf {name} is a scalar; every leaf needs a leading axis of length N")
            lengths[name] = leaf.shape[0]
            out.append(leaf)
            continue
        arr = np.asarray(leaf)
        if arr.ndim == 0:
            raise DataError(f"data leaf {name} is a scalar; every leaf needs a leading axis of length N")
        if arr.dtype == object:
            raise DataError(f"data leaf {name} is not numeric (dtype object)")
        lengths[name] = arr.shape[0]
        if check_finite and np.issubdtype(arr.dtype, np.inexact) and not np.all(np.isfinite(arr)):
            bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
            raise DataError(f"data leaf {name} holds {bad} NaN or infinite value(s)")
        out.append(leaf if isinstance(leaf, jax.Array) else jnp.asarray(arr))
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{k}: {v}" for k, v in lengths.items())
        raise DataError(f"data leaves have different leading lengths ({desc}); all must share N")
    n = next(iter(lengths.values()))
    if n == 0:
        raise DataError("data is empty (N = 0)")
    if n >= 2**31:
        raise DataError(f"N = {n} items is more than this version supports (2**31 - 1)")
    return jax.tree_util.tree_unflatten(treedef, out)


def take(data, idx):
    """The items ``idx`` (int array, all in range) of every leaf of ``data``.

    An on-disk leaf read by host gathers (:class:`~tallmh.datasource.HostArray`) is read with one
    ``jax.pure_callback`` per leaf; every other leaf (zero-copy memory maps included) with ``jnp.take``.
    """
    from .datasource import HostArray, host_take

    def one(a):
        if isinstance(a, HostArray):
            return host_take(a, idx)
        return jnp.take(a, idx, axis=0, mode="clip")

    return jax.tree_util.tree_map(one, data, is_leaf=lambda a: isinstance(a, HostArray))


class Permutation(NamedTuple):
    """A keyed bijection of ``range(n)``: the round keys of a Feistel network."""

    round_keys: jax.Array  # (_FEISTEL_ROUNDS,) uint32


def _half_bits(n: int) -> int:
    bits = max(2, int(np.ceil(np.log2(max(n, 2)))))
    return (bits + 1) // 2


def _mix32(x):
    # A 32-bit integer finaliser (xor-shift-multiply), used as the Feistel round function.
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    x = x ^ (x >> 16)
    return x


def make_permutation(key) -> Permutation:
    """Draw a permutation of ``range(n)`` from a key: O(1) work, whatever n."""
    return Permutation(jax.random.bits(key, (_FEISTEL_ROUNDS,), dtype=jnp.uint32))


def _encrypt(perm: Permutation, x, h):
    if isinstance(h, int):
        mask = jnp.uint32((1 << h) - 1)
    else:  # a traced h (a population whose size is only known at run time)
        h = h.astype(jnp.uint32)
        mask = (jnp.uint32(1) << h) - jnp.uint32(1)
    left = (x >> h) & mask
    right = x & mask
    for r in range(_FEISTEL_ROUNDS):
        f = _mix32(right ^ perm.round_keys[r] ^ jnp.uint32(r * 0x9E3779B9 & 0xFFFFFFFF)) & mask
        left, right = right, left ^ f
    return (left << h) | right


def permute(perm: Permutation, positions, n: int):
    """The items at ``positions`` (ints in ``range(n)``) of the permuted order: ``pi(positions)``.

    Cost O(len(positions)). Positions outside ``range(n)`` are clipped into it; callers mask them.
    ``n`` may also be a traced integer scalar (a population whose size changes from step to step, such as
    a mixture component's current members): the network's width then follows n at run time, so
    cycle-walking still needs fewer than four rounds on average.
    """
    if isinstance(n, (int, np.integer)):
        h = _half_bits(int(n))
    else:
        nm1 = jnp.maximum(jnp.asarray(n, jnp.int32), 2).astype(jnp.uint32) - jnp.uint32(1)
        bits = jnp.maximum(jnp.int32(32) - jax.lax.clz(nm1).astype(jnp.int32), 2)
        h = (bits + 1) // 2
    x = jnp.clip(positions, 0, jnp.maximum(n - 1, 0)).astype(jnp.uint32)
    if not isinstance(n, (int, np.integer)):
        # n = 0 (an empty population) must still terminate: vmapped while loops run this for every lane
        n = jnp.maximum(jnp.asarray(n, jnp.int32), 1)
    nn = jnp.uint32(n)
    y = _encrypt(perm, x, h)

    def cond(y):
        return jnp.any(y >= nn)

    def body(y):
        return jnp.where(y >= nn, _encrypt(perm, y, h), y)

    y = jax.lax.while_loop(cond, body, y)
    return y.astype(jnp.int32)


from .datasource import from_npy  # noqa: E402  (re-exported: ``tm.data.from_npy``)
