"""Data pytrees and subsampling without replacement at O(batch) cost.

Data is any pytree of arrays whose leading axis indexes the N data items (``{"X": X, "y": y}``).

Within one MH step the approximate tests read the items in the order of a keyed pseudo-random
permutation ``pi`` of ``range(N)``: the k-th item read is ``pi(k)``. Because ``pi`` is a bijection, a step
never reads an item twice, and reading the positions ``[t, t + m)`` costs O(m): no O(N) shuffle is ever
made. ``pi`` is the swap-or-not shuffle (Hoang, Morris & Rogaway, "An enciphering scheme based on a card
shuffle", CRYPTO 2012) on ``Z_N`` itself: round r draws ``K_r`` uniform on ``range(N)`` and moves
``x`` to its partner ``x' = (K_r - x) mod N`` iff the keyed bit ``F_r(max(x, x'))`` is 1. Each round is an
involution, so the composition is a bijection of ``range(N)`` for every N; there is no cycle-walking, so the
cost per item is the same for every N (and for a traced N). A round 0 that always swaps makes every
position's item exactly uniform; then ``_SWAP_ROUNDS`` = 32 rounds. Why 32: for two positions, with random
round bits, the pair is uniform over distinct pairs from the first round in which exactly one of the two
moves (each round: probability 1/2 - 1/(2N)), so its total variation from uniform is at most
``(1/2 + 1/(2N))**32`` (2.3e-10 for large N; measured at N = 8 it decays as that bound says); the
covariance of a minibatch of m items, which sets the variance of the tests' estimates, is then off by a
relative amount of about ``(m - 1) * 2**-32`` even for data stored in sorted order (1.5e-5 at
m = 65,536). Measured on sorted data (N = 10,007, m = 100, 20,000 keys): with 8 rounds the variance of
the minibatch mean is 1.38x that of simple random sampling (predicted 1 + 99/256), with 12 rounds
1.019 (predicted 1.024), with 32 rounds 0.996 +- 0.010. Statistical
quality, not cryptographic security (which needs more rounds), is what subsampling needs.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import DataError

__all__ = ["validate_data", "num_items", "take", "from_npy", "Permutation", "make_permutation", "permute",
           "uniform_items"]

_SWAP_ROUNDS = 32



def to_device(a, dtype=None):
    """A host array as a JAX array by a plain transfer (``jax.device_put``, dtypes canonicalised as by
    ``jnp.asarray``). ``jnp.asarray`` of a NumPy array lifts it by ``lax.stage``, which in a fresh process
    compiles a small program for each shape and dtype (10-40 ms each on the set-up's path). On the CPU the
    result may alias ``a``'s buffer: pass arrays that nothing changes afterwards."""
    if isinstance(a, jax.Array) and (dtype is None or a.dtype == np.dtype(dtype)):
        return a
    return jax.device_put(np.asarray(a) if dtype is None else np.asarray(a, np.dtype(dtype)))


def num_items(data) -> int:
    """Number of data items N: the common leading length of the data's leaves (on-disk leaves included)."""
    from .datasource import leaves_of

    leaves = leaves_of(data)
    return int(np.shape(leaves[0])[0])


def validate_data(data, check_finite: bool = True, in_place: bool = False, defer_files: bool = False):
    """Check a data pytree and return it with its leaves as JAX arrays.

    Raises :class:`DataError` naming the problem when the pytree has no leaves, a leaf is a scalar, the
    leaves disagree on the leading length, N is 0, or (with ``check_finite``) a leaf holds NaN or inf.
    The finiteness check is a one-time pass over the data made before sampling starts.

    Out-of-core leaves (:mod:`tallmh.storage.datasource`: an ``np.memmap``, or what ``from_npy`` returns) are
    never loaded whole: a memory map becomes a zero-copy ``jax.Array`` or a host-gathered
    :class:`~tallmh.storage.datasource.HostArray`, and its finiteness check streams over it in blocks (once:
    skipped for leaves ``from_npy`` has checked already).

    ``in_place=True`` (what :func:`tallmh.sample` asks for): an in-memory NumPy leaf is not copied where
    the CPU backend can read it in place (:func:`tallmh.storage.datasource.in_place_leaf`: a ``jax.Array``
    aliasing it when it is 64-byte aligned, else an :class:`~tallmh.storage.datasource.InPlaceArray`); a copy of
    the data (``jnp.asarray``) was the largest memory cost of a call. Where that is
    impossible (another backend, several devices, a dtype JAX converts, a non-contiguous array) the
    leaf is copied, as without it. The finiteness check of an in-memory leaf reads it in blocks too (no
    N-sized boolean temporary).

    ``defer_files=True``: leaves in files whose finiteness is not settled are left unchecked (their check is
    then the caller's: :func:`tallmh.sample` makes it in its first full pass over the files, or streams it).
    """
    from . import datasource as ds

    leaves, treedef = jax.tree_util.tree_flatten_with_path(data, is_leaf=ds.is_data_leaf)
    if not leaves:
        raise DataError("data has no arrays: pass a pytree of arrays with a leading axis of length N")
    lengths = {}
    out = []
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path) or "data"
        if ds.is_host_leaf(leaf):
            if isinstance(leaf, np.memmap):
                ds._check_array(leaf, name)
                if check_finite and not defer_files:
                    ds.check_finite_streamed(leaf, name)
                leaf = ds.host_leaf(leaf, "auto", name, checked=check_finite and not defer_files)
            elif check_finite and not defer_files and not ds.finite_checked(leaf):
                ds.check_finite_streamed(ds.memmap_of(leaf), name)
                ds.mark_checked(leaf)
            if len(leaf.shape) == 0:
                raise DataError(f"data leaf {name} is a scalar; every leaf needs a leading axis of length N")
            lengths[name] = leaf.shape[0]
            out.append(leaf)
            continue
        arr = np.asarray(leaf)
        if arr.ndim == 0:
            raise DataError(f"data leaf {name} is a scalar; every leaf needs a leading axis of length N")
        if arr.dtype.kind not in "biuf":  # text, objects, dates, complex: never handed to JAX as they are
            raise DataError(f"data leaf {name} is not numeric (dtype {arr.dtype}): convert it to numbers first "
                            "(e.g. the codes of a categorical column)")
        lengths[name] = arr.shape[0]
        if check_finite:
            ds.check_finite_streamed(arr, name)
        if isinstance(leaf, jax.Array):
            out.append(leaf)
            continue
        placed = ds.in_place_leaf(arr, checked=check_finite) if in_place else None
        # (a copy: the transfer of an aligned array would alias the caller's buffer on the CPU)
        out.append(placed if placed is not None else to_device(np.array(arr, copy=True)))
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

    An on-disk leaf read by host gathers (:class:`~tallmh.storage.datasource.HostArray`) is read with one
    ``jax.pure_callback`` per leaf; an in-memory array read in place
    (:class:`~tallmh.storage.datasource.InPlaceArray`) by a gather of row slices of its flat buffer; every other
    leaf (zero-copy memory maps included) with ``jnp.take``. All give the same values.
    """
    from .datasource import HostArray, InPlaceArray, host_take, in_place_take

    def one(a):
        if isinstance(a, HostArray):
            return host_take(a, idx)
        if isinstance(a, InPlaceArray):
            return in_place_take(a, idx)
        return jnp.take(a, idx, axis=0, mode="clip")

    return jax.tree_util.tree_map(one, data, is_leaf=lambda a: isinstance(a, (HostArray, InPlaceArray)))


class Permutation(NamedTuple):
    """A keyed bijection of ``range(n)`` for any ``n``: the round keys of a swap-or-not shuffle.

    ``round_keys[0], round_keys[1]`` (high and low 32-bit words) give the round offsets ``K_r``, reduced
    into ``range(n)`` when ``n`` is known (so one key serves every n, traced ones included);
    ``round_keys[2]`` keys the rounds' swap bits. Round 0 is an unconditional reflection.
    """

    round_keys: jax.Array  # (3, _SWAP_ROUNDS + 1) uint32


def _mix32(x):
    # A 32-bit integer finaliser (xor-shift-multiply; a bijection of uint32 with full avalanche), used as
    # the swap-or-not round function F_r(z) = top bit of _mix32(z ^ key_r).
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    x = x ^ (x >> 16)
    return x


def make_permutation(key) -> Permutation:
    """Draw a permutation of ``range(n)`` from a key: O(1) work, whatever n (n is given to :func:`permute`)."""
    return Permutation(jax.random.bits(key, (3, _SWAP_ROUNDS + 1), dtype=jnp.uint32))


def _mul_wide(a, b):
    """The 64-bit product of two uint32 arrays as ``(high word, low word)``, from 16-bit limbs."""
    lo16 = jnp.uint32(0xFFFF)
    a0, a1, b0, b1 = a & lo16, a >> 16, b & lo16, b >> 16
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1  # each < 2**32
    mid = (p00 >> 16) + (p01 & lo16) + (p10 & lo16)  # < 3 * 2**16
    return p11 + (p01 >> 16) + (p10 >> 16) + (mid >> 16), (p00 & lo16) | (mid << 16)


def _scale64(hi, lo, n):
    """``floor(u * n / 2**64)`` for the 64-bit integer ``u = hi * 2**32 + lo``: a value in ``range(n)``.

    With u uniform, each value in ``range(n)`` gets ``floor`` or ``ceil`` of ``2**64 / n`` of the u's, so
    the result is uniform up to a total variation of ``n / 2**64`` (a single 32-bit word taken mod n
    would be off by up to 1/8 for n near 2**31). Exact uint32 arithmetic.
    """
    h1, l1 = _mul_wide(hi, n)
    h2, _ = _mul_wide(lo, n)
    s = l1 + h2
    return h1 + (s < l1).astype(jnp.uint32)


@jax.jit
def _swap_round(x, kr, fr, n):
    """One swap-or-not round: ``x`` moves to its partner ``(K_r - x) mod n`` iff the keyed bit of the larger
    of the two is 1. Jitted so that the 32 rounds trace and lower as calls of one function (XLA inlines them:
    the compiled program is the same as with the rounds written out)."""
    xp = _partner(kr, x, n)
    bit = _mix32(jnp.maximum(x, xp) ^ fr) >> 31
    return jnp.where(bit == 1, xp, x)


def _partner(kr, x, n):
    # (K_r - x) mod n in uint32: where K_r < x, ``K_r - x`` wraps to ``2**32 + K_r - x`` and adding n gives
    # ``K_r + n - x`` (< 2**32) exactly. (Written so, not as ``(K_r + n) - x``: that form has a term free
    # of x, which XLA hoists out of the reader's loop as one tiny kernel per round.)
    d = kr - x
    return jnp.where(kr >= x, d, d + n)


def _encrypt(perm: Permutation, x, n):
    """The swap-or-not shuffle of ``x`` (uint32 in ``range(n)``; ``n`` uint32, ``1 <= n < 2**31``)."""
    k = _scale64(perm.round_keys[0], perm.round_keys[1], n)
    fkey = perm.round_keys[2]
    x = _partner(k[0], x, n)  # round 0: always swap, so every position's item is exactly uniform
    for r in range(1, _SWAP_ROUNDS + 1):
        x = _swap_round(x, k[r], fkey[r], n)
    # x < n already. Reduced mod n once more (a no-op) by a divisor XLA cannot see is a constant (n, as the
    # larger of n and K_0 + 1 <= n): a remainder by a variable is an "expensive" operation to XLA's fusion,
    # which then computes the rounds once into a buffer instead of fusing them into every gather that reads
    # the items (one per data leaf), compiling them and running them once per leaf.
    return x % jnp.maximum(n, k[0] + 1)


def uniform_items(key, size: int, n: int):
    """``size`` independent uniform draws from ``range(n)`` (with replacement; ``1 <= n < 2**31``): two 32-bit
    words of one Threefry call per draw, scaled exactly (:func:`_scale64`: uniform up to ``n / 2**64``)."""
    w = jax.random.bits(key, (2, size), dtype=jnp.uint32)
    return _scale64(w[0], w[1], jnp.uint32(n)).astype(jnp.int32)


def permute(perm: Permutation, positions, n: int):
    """The items at ``positions`` (ints in ``range(n)``) of the permuted order: ``pi(positions)``.

    Cost O(len(positions)), the same per item for every n (``_SWAP_ROUNDS`` rounds, no loop whose length
    depends on the data or the key). Positions outside ``range(n)`` are clipped into it; callers mask them.
    ``n`` may also be a traced integer scalar (a population whose size changes from step to step, such as
    a mixture component's current members); n = 0 (an empty population) gives item 0.
    """
    if isinstance(n, (int, np.integer)):
        nn = jnp.uint32(max(int(n), 1))
    else:
        nn = jnp.maximum(jnp.asarray(n, jnp.int32), 1).astype(jnp.uint32)
    x = jnp.clip(jnp.asarray(positions).astype(jnp.int32), 0, jnp.maximum(n - 1, 0)).astype(jnp.uint32)
    return _encrypt(perm, x, nn).astype(jnp.int32)


from .datasource import from_npy  # noqa: E402  (re-exported: ``tm.data.from_npy``)
