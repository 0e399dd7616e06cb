"""The run's keys, hashed on the host: JAX's Threefry-2x32 in NumPy, bit for bit.

In: the seed, the number of chains, a phase and a chunk's first step. Out: the chain keys, set-up key and
audit key of a run (:func:`run_keys`), and a chunk's step keys (:func:`step_keys`, :func:`chunk_keys`), the
same bits as ``jax.random`` (``tests/test_runner.py`` checks them) without a program to compile.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from .. import distributed
from ..storage.data import to_device


def threefry2x32(k0, k1, x0, x1):
    """The Threefry-2x32 hash (20 rounds; Salmon et al. 2011) of the uint32 arrays ``x0, x1`` under the key
    ``(k0, k1)``, in NumPy: the function JAX's default PRNG is built on, bit for bit."""
    u = np.uint32
    k0, k1 = np.asarray(k0, u), np.asarray(k1, u)  # (scalars, or arrays broadcasting with x0 and x1)
    ks = (k0, k1, k0 ^ k1 ^ u(0x1BD11BDA))
    x0, x1 = np.asarray(x0, u) + ks[0], np.asarray(x1, u) + ks[1]
    rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
    with np.errstate(over="ignore"):  # (arithmetic mod 2^32, as meant; NumPy warns for 0-d operands)
        for i in range(5):
            for r in rotations[i % 2]:
                x0 = x0 + x1
                x1 = ((x1 << u(r)) | (x1 >> u(32 - r))) ^ x0
            x0 = x0 + ks[(i + 1) % 3]
            x1 = x1 + ks[(i + 2) % 3] + u(i + 1)
    return x0, x1


def split_host(key, num):
    """``jax.random.split(key, num)`` of a raw Threefry key (uint32[2]) in NumPy, as JAX splits under its
    ``jax_threefry_partitionable`` setting (the hash of the counts 0..num-1 as 64-bit pairs, or of 0..2 num-1
    in two halves)."""
    if jax.config.jax_threefry_partitionable:
        a, b = threefry2x32(key[0], key[1], np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
        return np.stack([a, b], axis=1)
    a, b = threefry2x32(key[0], key[1], np.arange(num, dtype=np.uint32), np.arange(num, 2 * num, dtype=np.uint32))
    return np.concatenate([a, b]).reshape(num, 2)


def fold_in_host(keys, data):
    """``jax.random.fold_in(key, d)`` of raw Threefry keys (uint32 ``(..., 2)``) and non-negative integers ``data``
    (broadcasting with ``keys[..., 0]``), in NumPy: the hash of the pair ``(0, d)`` under the key, as JAX folds
    (``tests/test_runner.py`` checks them against ``jax.random``)."""
    keys = np.asarray(keys, np.uint32)
    d = np.asarray(data, np.uint32)
    zero = np.zeros(np.broadcast_shapes(d.shape, keys.shape[:-1]), np.uint32)
    a, b = threefry2x32(keys[..., 0], keys[..., 1], zero, d)
    return np.stack([a, b], axis=-1)


def host_keys(keys) -> bool:
    """Whether ``keys`` are raw Threefry keys that :func:`fold_in_host` folds as JAX does (JAX's default PRNG)."""
    return (str(jax.config.jax_default_prng_impl) == "threefry2x32" and np.dtype(keys.dtype) == np.uint32
            and keys.shape[-1:] == (2,))


STEP_KEYS_FNS: dict = {}


def step_keys(chain_keys, k_audit, phase: int, start: int, length: int):
    """The keys of a chunk's ``length`` steps from step ``start`` of ``phase``: ``fold_in(fold_in(chain key, phase),
    step)`` per chain (``(chains, length) + key shape``) and the same of the audit key (``(length,) + key shape``),
    the keys the chain's steps and their audit uniforms are drawn from. Hashed on the host (the chain's program
    then holds four unrolled Threefry hashes fewer: 787 of its 9,129 lines of optimised HLO at N = 10^6), or by one
    small program where the keys are not JAX's default raw Threefry keys."""
    steps = np.arange(start, start + length, dtype=np.int64)
    if host_keys(chain_keys) and host_keys(k_audit) and start + length < 2**32:
        ck = fold_in_host(np.asarray(chain_keys), phase)
        ak = fold_in_host(np.asarray(k_audit), phase)
        return fold_in_host(ck[:, None, :], steps[None, :]), fold_in_host(ak[None, :], steps)
    fn = STEP_KEYS_FNS.get(length)
    if fn is None:
        def fold(keys, phase, start):
            g = start + jnp.arange(length, dtype=jnp.int32)
            per = jax.vmap(jax.random.fold_in, in_axes=(None, 0))
            return (jax.vmap(lambda k: per(jax.random.fold_in(k, phase), g))(keys[0]),
                    per(jax.random.fold_in(keys[1], phase), g))

        fn = STEP_KEYS_FNS[length] = jax.jit(fold)
    return fn((chain_keys, k_audit), jnp.int32(phase), jnp.int32(start))


def run_keys(seed, num_chains):
    """``(chain keys, set-up key, audit key)`` of a run: ``split(PRNGKey(seed), 3)`` and the first split again
    into ``num_chains``. For a 32-bit seed under JAX's default (Threefry) PRNG they are hashed in NumPy
    (:func:`threefry2x32`; no program to compile or load in a fresh process, ~0.2 s cold), the same bits as
    JAX's (``tests/test_runner.py`` checks them against ``jax.random``); otherwise by one compiled program."""
    s = int(seed)
    if not -2**31 <= s < 2**31 or jax.config.jax_enable_x64:  # (PRNGKey of a 64-bit seed: as JAX makes it)
        k_chains, k_jit, k_audit = jax.random.split(jax.random.PRNGKey(s), 3)
        return jax.random.split(k_chains, num_chains), k_jit, k_audit
    if str(jax.config.jax_default_prng_impl) == "threefry2x32":
        k3 = split_host(np.array([0, s & 0xFFFFFFFF], np.uint32), 3)
        return to_device(split_host(k3[0], num_chains)), to_device(k3[1]), to_device(k3[2])
    fn = KEYS_FNS.get(num_chains)
    if fn is None:
        def keys(seed):
            k_chains, k_jit, k_audit = jax.random.split(jax.random.PRNGKey(seed), 3)
            return jax.random.split(k_chains, num_chains), k_jit, k_audit

        fn = KEYS_FNS[num_chains] = jax.jit(keys)
    return fn(to_device(np.int32(s)))


KEYS_FNS: dict = {}


def start_normals(key, shape):
    """Standard normals (float64, NumPy) for the chains' start points, from the words of the JAX ``key``:
    the same key gives the same points, without compiling a program on the device for them."""
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):  # a typed key (jax.random.key): its bits
        key = jax.random.key_data(key)
    return np.random.default_rng(np.asarray(key, np.uint32).ravel().tolist()).standard_normal(shape)


def chunk_keys(run, phase: int, start: int):
    """The step keys of the chunk from step ``start`` of ``phase`` (:func:`step_keys`), on the device (or laid
    out over the plan's mesh: chains split, the audit's replicated)."""
    ks, ka = step_keys(run.chain_keys, run.k_audit, int(phase), int(start), run.length)
    if run.plan is None:
        return to_device(ks), to_device(ka)
    return (distributed.put(ks, run.plan.sharding(run.plan.chain_spec)),
            distributed.put(ka, run.plan.sharding(distributed.P())))
