"""Compiled programs kept on disk by tallmh's own key, so that a warm process skips tracing them too.

JAX's persistent compilation cache (:mod:`tallmh._cache`) saves XLA's compile, but its key is the traced
program: a second process still traces and lowers the chain (1-2 s for the default method) before it can
look the executable up. For the programs whose every input to tracing tallmh can name (its own model,
proposal and test classes by value, the shapes and tree structures of the arguments, the options), this
module keys the serialised executable by those names instead and loads it without tracing.

The key also holds the jax and jaxlib versions, a hash of tallmh's source files (an edited tallmh never
reads an executable an older one wrote), the backend and device kind, ``XLA_FLAGS`` and the JAX settings
that change what a program computes. Objects that are not tallmh's own (a user's model class) have no
stable key: their programs are traced every time, as before. Entries live in the folder of JAX's
persistent cache (``<cache>/tallmh-executables``), so turning that cache off or moving it does the same
here; reading an entry unpickles it, so the folder must be trusted like JAX's (docs/compilation-cache.md).
Each entry starts with a SHA-256 checksum of the rest: a damaged entry (a flipped bit, a write cut short) is
removed and the program compiled anew, never loaded (a damaged executable can crash the process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pickle
import sys
import tempfile
import threading
from typing import Optional

import jax
import numpy as np

__all__ = ["stable_key", "program_key", "load", "store"]

_SUBDIR = "tallmh-executables"
_FORMAT = 2
_MAGIC = b"tallmh-executable\x00"  # then the SHA-256 of the rest, then the pickled entry
_SOURCE_HASH: list = []
# JAX settings that change a traced program (or its random numbers) without showing in its argument shapes
_CONFIG = ("jax_enable_x64", "jax_threefry_partitionable", "jax_default_matmul_precision", "jax_default_prng_impl",
           "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion", "jax_enable_custom_prng")


class _NoKey(Exception):
    pass


def _leaf(v):
    if v is None or isinstance(v, (bool, int, float, str, complex, bytes)):
        return (type(v).__name__, repr(v))
    if isinstance(v, np.dtype):
        return ("dtype", v.str)
    if isinstance(v, type):
        if not v.__module__.startswith("tallmh"):
            raise _NoKey
        return ("type", v.__module__, v.__qualname__)
    if isinstance(v, (tuple, list)):
        return (type(v).__name__,) + tuple(_leaf(x) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple(sorted((repr(k), _leaf(x)) for k, x in v.items()))
    if isinstance(v, (np.ndarray, np.generic, jax.Array)):
        a = np.asarray(v)
        return ("array", a.dtype.str, a.shape, hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest())
    return _object(v)


def _object(obj):
    t = type(obj)
    if not t.__module__.startswith("tallmh."):
        raise _NoKey
    if dataclasses.is_dataclass(obj):
        items = [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    elif hasattr(obj, "__dict__"):
        items = sorted(vars(obj).items())
    else:
        raise _NoKey
    if hasattr(obj, "__slots__") and not dataclasses.is_dataclass(obj):
        raise _NoKey
    for _, v in items:
        if callable(v) and not isinstance(v, type):
            raise _NoKey  # a function held by the object: its code is not in the key
    return (t.__module__, t.__qualname__) + tuple((k, _leaf(v)) for k, v in items)


def stable_key(obj) -> Optional[tuple]:
    """A key for ``obj`` that is the same in every process (tallmh's own classes by their field values), or
    None when ``obj`` has none (a user's class, a held function)."""
    try:
        return _leaf(obj)
    except (_NoKey, RecursionError):
        return None


def _source_hash() -> str:
    if not _SOURCE_HASH:
        h = hashlib.sha256()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # (the whole tallmh package, not run/ alone)
        for folder, dirs, files in sorted(os.walk(root)):
            dirs.sort()
            for f in sorted(files):
                if f.endswith((".py", ".npz")):
                    p = os.path.join(folder, f)
                    h.update(os.path.relpath(p, root).encode())
                    with open(p, "rb") as fh:
                        h.update(fh.read())
        _SOURCE_HASH.append(h.hexdigest())
    return _SOURCE_HASH[0]


def program_key(*parts) -> Optional[str]:
    """The hex key of a program named by ``parts`` (already stable: strings, numbers, tuples, shape keys),
    with the versions, backend and JAX settings; None when the cache is off."""
    if jax.config.jax_compilation_cache_dir is None:
        return None
    import jaxlib

    from .. import __version__

    dev = jax.devices()[0]
    env = (jax.__version__, jaxlib.__version__, __version__, _source_hash(), dev.platform,
           getattr(dev, "device_kind", ""), getattr(dev.client, "platform_version", ""), jax.device_count(),
           os.environ.get("XLA_FLAGS", ""), sys.version_info[:2],
           tuple((c, repr(getattr(jax.config, c, None))) for c in _CONFIG))
    return hashlib.sha256(repr((_FORMAT, env, parts)).encode()).hexdigest()


def _path(key: str) -> Optional[str]:
    folder = jax.config.jax_compilation_cache_dir
    if folder is None or key is None:
        return None
    return os.path.join(folder, _SUBDIR, key + ".pkl")


LOADED = 0  # programs this process loaded from here (no JAX cache lookup was made for them)
_HITS = threading.local()  # JAX cache hits per thread (a compile reports its events in its own thread)


def _hits() -> int:
    return getattr(_HITS, "n", 0)


def _on_event(event, **kw):
    if event == "/jax/compilation_cache/cache_hits":
        _HITS.n = _hits() + 1


jax.monitoring.register_event_listener(_on_event)


# An XLA option set to its default value: it changes nothing in the code XLA makes, but it is part of JAX's
# cache key, so the programs kept here are compiled for real instead of read from an entry JAX holds of
# the same program (see compile_and_store).
_OWN_OPTIONS = {"xla_embed_ir_in_executable": False}


_PENDING: list = []  # the threads writing entries in the background (compile_and_store(..., background=True))


def wait_stored():
    """Wait for the entries being written in the background (a run waits for them before it returns)."""
    while _PENDING:
        _PENDING.pop().join()


def compile_and_store(key: Optional[str], lower_fn, unrolled: bool = True, elemental: bool = False,
                      quick: bool = False, background: bool = False):
    """``lower_fn().compile()``, and the executable stored under ``key``.

    An executable that JAX read back from its own persistent cache does not serialise whole again (the
    copy lacks its kernels' code), so a program with a key is compiled under its own JAX cache key
    (``_OWN_OPTIONS``), and one that was a JAX cache hit all the same is used but not stored. With
    ``unrolled`` the program lowers Threefry unrolled (same bits, cheaper to compile for tallmh's MH chain:
    see tallmh._lowering); inference programs pass False: jax 0.12's CPU compiler took more than 10 minutes
    on a stochastic-volatility program lowered so, against 9-17 s for the whole run lowered as JAX does.
    ``elemental``: compile with ``_CPU_OPTIONS`` on the CPU (only for programs where they were measured safe);
    ``quick``: with ``_CPU_QUICK`` (only for programs measured no slower with it). ``background``: the entry is
    written in a thread (:func:`wait_stored` waits for it) and the program returned at once: its serialisation and
    write (~0.05-0.15 s for the default chain) then overlap the chain's first chunks instead of delaying them."""
    from .._lowering import unrolled_threefry

    # (the precision the caller's thread traces with: a config context does not follow into this thread)
    with unrolled_threefry() if unrolled else contextlib.nullcontext(), jax.default_matmul_precision("float32"):
        lowered = lower_fn()
    fast = _cpu_options(elemental, quick)
    if key is None:
        return _compile(lowered, fast)
    hits = _hits()
    with _no_jax_entry():  # (kept here: JAX's own copy would be serialised in the caller's time for nothing)
        try:
            compiled = _compile(lowered, dict(own_options(key), **fast))
        except Exception:  # noqa: BLE001 - an XLA without the debug option: JAX's key is then per program only
            compiled = _compile(lowered, dict(_OWN_OPTIONS, **fast))
    if _hits() == hits:
        if background:
            t = threading.Thread(target=store, args=(key, compiled), name="tallmh-store")
            _PENDING.append(t)
            t.start()
        else:
            store(key, compiled)
    return compiled


def _no_jax_entry():
    """A context in which this thread's compiles write no entry to JAX's persistent cache (its threshold of compile
    seconds set out of reach for this thread only). A program kept here under its own key is compiled under JAX
    options of that key (:func:`own_options`), so JAX's entry could only be read by a process that has this entry
    too; JAX serialised and compressed it in the compiling thread after the compile (0.05 s of the default chain's
    ~1 s at N = 10^6, on a fresh process's critical path). Where this JAX has no such thread-local setting, nothing
    changes."""
    try:
        from jax._src import config as jax_config

        return jax_config.persistent_cache_min_compile_time_secs(float("inf"))
    except Exception:  # noqa: BLE001 - another JAX: its entries are written as before
        return contextlib.nullcontext()


# XLA's CPU backend emits fusions by its MLIR "fusion emitters" by default; its elemental emitters compile the
# default chain (N = 10^6, 4 chains) in ~2.0 s instead of ~2.8-3.4 s on a 2-core CPU, with the same speed per step
# and the same draws (tests/test_same_draws.py), and the chain's compile is a fresh process's critical path. They
# re-emit an expression for each of its uses inside a fusion, which can grow without bound: the reversible-jump
# chain's compile took over 24 GB of memory with them. So they are asked for only where the caller knows the
# program (tm.sample's chain for tallmh's built-in models whose chains were measured: ``elemental=True``).
_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
# LLVM's optimisation level 1 for XLA's CPU code instead of its default (3): measured on the logistic model's chain
# at N = 10^6 (2 cores, 2026-11-27), XLA's compile 1.4 s wall / 2.3 CPU s instead of 1.6-2.0 / 2.6-3.3, and the
# sampling no slower (0.36-0.40 s against 0.42-0.53 s for 1,500 steps of 4 chains); the audit's exact pass runs
# at the same speed (30 ms per step of 4 chains). Level 0 compiled in 0.8 s but sampled 3.5 times slower. It
# changes the draws in float32's last bits (the order XLA's code rounds in), so it is a choice per program too.
_CPU_QUICK = {"xla_backend_optimization_level": 1}
# XLA's CPU backend cuts a program's LLVM code into this many modules (default 32) and compiles them on its thread pool.
# Each module repeats work of its own (the math functions it inlines and optimises, a target machine): on a 2-core CPU
# the default chain (N = 10^6, 4 chains) compiled in 1.20 CPU s with 2 modules, 1.16 with 1, and 1.31-1.35 with 32
# (interleaved, 2026-11-29), the same code (the draws of tests/test_same_draws.py). So as many modules as the process
# may use cores (up to the default): every core still compiles, and no more repeated work than that.
_SPLIT = "xla_cpu_parallel_codegen_split_count"
_SPLIT_DEFAULT = 32


def _cpu_split() -> dict:
    """``{_SPLIT: cores}`` where the process may use fewer cores than XLA's default count of modules, else {}."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # (no affinity on this OS)
        cores = os.cpu_count() or _SPLIT_DEFAULT
    return {_SPLIT: max(1, cores)} if cores < _SPLIT_DEFAULT else {}


def _cpu_options(elemental: bool = True, quick: bool = False) -> dict:
    """The CPU compile options asked for (``_CPU_OPTIONS`` with ``elemental``, ``_CPU_QUICK`` with ``quick``, the
    LLVM modules per core with either: :func:`_cpu_split`) where programs compile for the CPU (the default
    backend), less those this XLA refused."""
    try:
        if jax.default_backend() != "cpu":
            return {}
    except Exception:  # noqa: BLE001
        return {}
    out = {}
    for wanted, group in ((elemental, _CPU_OPTIONS), (quick, _CPU_QUICK), (elemental or quick, _cpu_split())):
        if wanted and group and not _REFUSED.get(tuple(group)):
            out.update(group)
    return out


_REFUSED: dict = {}  # CPU option groups this XLA refused (asked once per process)


def _compile(lowered, options: dict):
    """``lowered.compile`` with ``options``; without a group of CPU options (``_CPU_OPTIONS``, ``_CPU_QUICK``,
    ``_SPLIT``) that this XLA does not know, one group at a time."""
    if not options:
        return lowered.compile()
    try:
        return lowered.compile(compiler_options=options)
    except Exception:  # noqa: BLE001 - an XLA without one of the CPU options: compiled without that group
        for group in (_CPU_OPTIONS, _CPU_QUICK, {_SPLIT: None}):
            if any(k in options for k in group):
                rest = {k: v for k, v in options.items() if k not in group}
                try:
                    compiled = _compile(lowered, rest)
                except Exception:  # noqa: BLE001 - not this group: the next
                    continue
                _REFUSED[tuple(group)] = True
                return compiled
        raise


def own_options(key: str) -> dict:
    """The compile options of the program stored under ``key``: ``_OWN_OPTIONS`` and, so that JAX's cache key
    is this key's alone, ``xla_debug_buffer_assignment_show_max`` (how many buffers XLA's debug text lists:
    nothing in the code it makes) set from it. Without it, a program whose HLO did not change while tallmh's
    source did (an upgrade, an edit elsewhere) was a JAX cache hit under the new key, which cannot be stored,
    so every later process traced it again (~1.5-2 s of a warm call at N = 10^6)."""
    return dict(_OWN_OPTIONS, xla_debug_buffer_assignment_show_max=16 + int(key[:12], 16))


def load(key: Optional[str]):
    """The compiled program stored under ``key``, or None (none stored, unreadable, or made elsewhere)."""
    path = _path(key)
    if path is None or not os.path.exists(path):
        return None
    try:
        from jax.experimental.serialize_executable import deserialize_and_load

        with open(path, "rb") as f:
            raw = f.read()
        body = raw[len(_MAGIC) + 32:]
        if not raw.startswith(_MAGIC) or hashlib.sha256(body).digest() != raw[len(_MAGIC):len(_MAGIC) + 32]:
            _discard(path)  # damaged (a flipped bit, a truncated write) or of an older format: rebuilt
            return None
        fmt, payload, in_tree, out_tree = pickle.loads(body)
        if fmt != _FORMAT:
            return None
        if b"lapack" in payload:
            _lapack_ready()
        compiled = deserialize_and_load(payload, in_tree, out_tree)
        global LOADED
        LOADED += 1
        return compiled
    except Exception:  # noqa: BLE001 - a damaged or foreign entry: compile as if there were none
        return None


def _discard(path):
    """Remove a damaged entry (the program is compiled anew and stored again)."""
    try:
        os.remove(path)
    except OSError:
        pass


def _lapack_ready():
    """Load the LAPACK routines JAX's CPU linear algebra calls (a Cholesky factor, a triangular solve). JAX does so
    when it lowers such an operation; a program read back from the disk was never lowered in this process, and
    called before anything else had lowered one, it crashed the process (a segmentation fault)."""
    try:
        from jax._src.lax import linalg

        linalg.initialize_lapack()
    except Exception:  # noqa: BLE001 - another JAX: it loads them as it needs them, or the program is compiled anew
        pass


def store(key: Optional[str], compiled) -> bool:
    """Write ``compiled`` under ``key`` (atomically); False when it cannot be (callbacks, a read-only disk)."""
    path = _path(key)
    if path is None:
        return False
    try:
        from jax.experimental.serialize_executable import serialize

        payload, in_tree, out_tree = serialize(compiled)
        blob = pickle.dumps((_FORMAT, payload, in_tree, out_tree), protocol=pickle.HIGHEST_PROTOCOL)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:  # (a checksum first: a damaged entry is never loaded)
                f.write(_MAGIC + hashlib.sha256(blob).digest() + blob)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return True
    except Exception:  # noqa: BLE001 - not serialisable here (host callbacks) or not writable: nothing kept
        return False
