"""Checkpoints that cannot run code, bound to the run that made them.

**Format.** One ``.npz`` archive (read with ``allow_pickle=False``): every array of the run (draws,
per-step statistics, the chains' final state) as a plain numeric array, plus ``__meta__``, UTF-8 JSON
that holds everything else and says where each array goes. Objects are stored by value: tallmh's own
classes (tests, proposals, control variates, state tuples) as their class path and attributes, rebuilt
on load without running any constructor; a class outside tallmh, a function or an object array is not
stored (``{"__opaque__": ...}``) and loads as ``None``, so a resumed run then needs it passed again.
Loading imports nothing but tallmh's modules, so a crafted file can at worst be refused.

**Fingerprint.** A run records what it was made of (:func:`run_fingerprint`): N, the data's leaves
(shape, dtype, and for a file its path, size and modification time), a hash of rows drawn with a key
kept in the fingerprint, the model (class, name, settings), the test, the proposal, the control
variates, chains, seed and parameter size. Resuming recomputes it on the data and settings given and
refuses, in one line, a checkpoint from another run (:func:`mismatch`). A data file of another size is
refused; one with only another modification time (a cache rebuilt, a file copied or moved) is accepted when
the rows drawn with the key agree (``tallmh run --resume`` compares a hash of the whole table too).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import zipfile
from typing import Any, Optional

import numpy as np

from ..errors import ConfigError
from ..labels import method_label

__all__ = ["FORMAT", "VERSION", "write", "read", "run_fingerprint", "mismatch", "new_salt"]

FORMAT = "tallmh-checkpoint"
VERSION = 2
ROWS_SAMPLED = 32


class _Opaque:
    """Stands for a value that could not be stored."""


_OPAQUE = _Opaque()


def _class_path(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _own(cls) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    return mod == "tallmh" or mod.startswith("tallmh.")


def _encode(obj, arrays: dict, base=None):
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int) and not isinstance(obj, bool):
        return obj
    if isinstance(obj, float):
        return {"__float__": repr(obj)}  # keeps nan and inf, and every bit
    if base is not None and isinstance(obj, np.memmap):
        from .drawstore import stream_ref

        ref = stream_ref(obj, base)
        if ref is not None:  # draws streamed to a file beside the checkpoint: referred to, not copied
            return {"__stream__": ref}
    if isinstance(obj, (np.ndarray, np.generic)) or type(obj).__module__.startswith(("jax", "jaxlib")):
        try:
            a = np.asarray(obj)
        except Exception:  # noqa: BLE001 - e.g. a typed PRNG key array
            return {"__opaque__": type(obj).__name__}
        if a.dtype.hasobject or a.dtype.kind not in "biufc":
            return {"__opaque__": f"array of {a.dtype}"}
        key = f"a{len(arrays)}"
        arrays[key] = a
        return {"__array__": key, "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            return {"__opaque__": "dict with non-string keys"}
        return {"__dict__": [[k, _encode(v, arrays, base)] for k, v in obj.items()]}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        if not _own(type(obj)):
            return {"__opaque__": type(obj).__name__}
        return {"__namedtuple__": _class_path(type(obj)), "fields": [_encode(v, arrays, base) for v in obj]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, arrays, base) for v in obj]}
    if isinstance(obj, list):
        return {"__list__": [_encode(v, arrays, base) for v in obj]}
    if _own(type(obj)) and hasattr(obj, "__dict__") and not callable(getattr(obj, "__call__", None)) \
            and not isinstance(obj, type):
        return {"__object__": _class_path(type(obj)),
                "attrs": [[k, _encode(v, arrays, base)] for k, v in vars(obj).items()]}
    return {"__opaque__": type(obj).__name__}


def _own_class(path: str):
    mod, _, qual = str(path).partition(":")
    if not (mod == "tallmh" or mod.startswith("tallmh.")) or not qual:
        raise ConfigError(f"refers to {path!r}, which is not a tallmh class")
    obj: Any = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, type) or not _own(obj):
        raise ConfigError(f"refers to {path!r}, which is not a tallmh class")
    return obj


def _decode(node, arrays, base=None):
    if node is None or isinstance(node, (bool, int, str)):
        return node
    if isinstance(node, list):
        raise ConfigError("has an untagged list")
    if not isinstance(node, dict) or len(node) == 0:
        raise ConfigError("has an unreadable entry")
    if "__float__" in node:
        return float(node["__float__"])
    if "__array__" in node:
        a = arrays[node["__array__"]]
        return a[()] if node.get("scalar") else a
    if "__stream__" in node:
        from .drawstore import open_ref

        if base is None:
            raise ConfigError("refers to a draws file, which is not allowed here")
        try:
            return open_ref(node["__stream__"], base)
        except (ValueError, KeyError, TypeError, OSError) as e:
            raise ConfigError(str(e)) from None
    if "__dict__" in node:
        out = {}
        for k, v in node["__dict__"]:
            val = _decode(v, arrays, base)
            if val is _OPAQUE:
                return _OPAQUE
            out[str(k)] = val
        return out
    for tag, kind in (("__tuple__", tuple), ("__list__", list)):
        if tag in node:
            vals = [_decode(v, arrays, base) for v in node[tag]]
            return _OPAQUE if any(v is _OPAQUE for v in vals) else kind(vals)
    if "__namedtuple__" in node:
        cls = _own_class(node["__namedtuple__"])
        vals = [_decode(v, arrays, base) for v in node["fields"]]
        if any(v is _OPAQUE for v in vals):
            return _OPAQUE
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise ConfigError(f"refers to {node['__namedtuple__']!r}, which is not a named tuple")
        return cls._make(vals)
    if "__object__" in node:
        cls = _own_class(node["__object__"])
        obj = object.__new__(cls)
        for k, v in node["attrs"]:
            val = _decode(v, arrays, base)
            if val is _OPAQUE:
                return _OPAQUE
            object.__setattr__(obj, str(k), val)
        return obj
    if "__opaque__" in node:
        return _OPAQUE
    raise ConfigError("has an unreadable entry")


def write(path: str, payload: dict) -> str:
    """Write ``payload`` (a dict of the run's parts) to ``path`` atomically (:mod:`tallmh.storage.safe_io`)."""
    from .safe_io import atomic_write

    arrays: dict = {}
    base = os.path.dirname(os.path.abspath(path))
    body = {k: _encode(v, arrays, base) for k, v in payload.items()}
    meta = json.dumps({"format": FORMAT, "version": VERSION, "payload": body}).encode("utf-8")
    nbytes = sum(a.nbytes for a in arrays.values()) + len(meta)

    def w(tmp):
        with open(tmp, "wb") as f:
            np.savez(f, __meta__=np.frombuffer(meta, np.uint8), **arrays)

    return atomic_write(path, w, nbytes=nbytes + (1 << 16))


def read(path: str) -> dict:
    """The payload written by :func:`write`; values that could not be stored come back as ``None``.
    Raises :class:`ConfigError` (one line) for anything else."""
    try:
        z = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ConfigError(f"no saved run at {path}") from None
    except Exception as e:  # noqa: BLE001 - pickles, truncated files, other formats
        raise ConfigError(f"{path} is not a tallmh checkpoint ({type(e).__name__}: {_short(e)})") from None
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ConfigError(f"{path} is not a tallmh checkpoint (a single array, not an archive)")
    try:
        with z:
            if "__meta__" not in z.files:
                raise ConfigError(f"{path} is not a tallmh checkpoint (no metadata)")
            meta = json.loads(bytes(z["__meta__"]).decode("utf-8"))
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ConfigError(f"{path} is not a tallmh checkpoint")
            if meta.get("version") != VERSION:
                raise ConfigError(f"{path} is a tallmh checkpoint of format version {meta.get('version')}; this "
                                  f"tallmh reads version {VERSION}")
            arrays = {k: z[k] for k in z.files if k != "__meta__"}
            base = os.path.dirname(os.path.abspath(path))
            out = {}
            for k, v in meta["payload"].items():
                try:
                    val = _decode(v, arrays, base)
                except ConfigError as e:
                    raise ConfigError(f"{path}: the checkpoint's {k} {e}") from None
                out[k] = None if val is _OPAQUE else val
            return out
    except ConfigError:
        raise
    except (KeyError, ValueError, TypeError, OSError, zipfile.BadZipFile, EOFError, RecursionError, OverflowError,
            AttributeError, IndexError, MemoryError) as e:  # (odd metadata: deep nesting, huge numbers, ...)
        raise ConfigError(f"{path} is not a readable tallmh checkpoint ({type(e).__name__}: {_short(e)})") from None


def _short(e) -> str:
    return " ".join(str(e).split())[:200]


# ---------------------------------------------------------------------------------------------------
# fingerprint


def new_salt() -> int:
    return int.from_bytes(os.urandom(7), "little")


def _describe(obj, depth: int = 0) -> Any:
    """A JSON-able description of an object's settings, arrays by hash (for fingerprints, not to rebuild)."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return repr(obj)
    if depth > 4:
        return type(obj).__name__
    if isinstance(obj, (np.ndarray, np.generic)) or type(obj).__module__.startswith(("jax", "jaxlib")):
        try:
            a = np.ascontiguousarray(np.asarray(obj))
            if a.dtype.hasobject:
                return f"array {a.dtype}"
            return f"array {a.dtype} {a.shape} {hashlib.sha256(a.tobytes()).hexdigest()[:16]}"
        except Exception:  # noqa: BLE001
            return type(obj).__name__
    if isinstance(obj, dict):
        return {str(k): _describe(v, depth + 1) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, (list, tuple)):
        return [_describe(v, depth + 1) for v in obj]
    if callable(obj) and not hasattr(obj, "__dict__"):
        return getattr(obj, "__qualname__", type(obj).__name__)
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        attrs = {k: v for k, v in vars(obj).items() if not k.startswith("_")}
        return {"class": f"{type(obj).__module__}.{type(obj).__qualname__}", "settings": _describe(attrs, depth + 1)}
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _digest(obj) -> str:
    return hashlib.sha256(json.dumps(_describe(obj), sort_keys=True).encode()).hexdigest()[:16]


def _leaf_file(leaf) -> Optional[dict]:
    from . import datasource as ds

    mm = ds.memmap_of(leaf) if ds.is_host_leaf(leaf) else None
    name = getattr(mm, "filename", None) if mm is not None else None
    if not name:
        return None
    try:
        st = os.stat(name)
    except OSError:
        return {"path": os.path.abspath(name), "size": None, "mtime_ns": None}
    return {"path": os.path.abspath(name), "size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def fingerprint_rows(n: int, salt: int) -> list:
    """The rows a fingerprint reads: the first, the last and ``ROWS_SAMPLED`` drawn with ``salt`` (not
    counted in ``setup_items``, like the model check's first rows)."""
    return sorted(set(np.random.default_rng(salt).integers(0, n, ROWS_SAMPLED).tolist()) | {0, n - 1})


def data_fingerprint(data, n: int, salt: int) -> dict:
    """Shape, dtype and file identity of each leaf, and a hash of ``ROWS_SAMPLED`` rows drawn with ``salt``."""
    import jax

    from . import datasource as ds

    leaves = ds.leaves_of(data)
    rows = fingerprint_rows(n, salt)
    h = hashlib.sha256()
    for i in rows:
        for leaf in jax.tree_util.tree_leaves(ds.read_rows(data, i, i + 1)):
            h.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return {"n": int(n), "salt": int(salt),
            "leaves": [{"shape": [int(s) for s in np.shape(a)], "dtype": str(np.dtype(a.dtype)),
                        "file": _leaf_file(a)} for a in leaves],
            "rows_sha256": h.hexdigest()}


def run_fingerprint(model, data, n, test, proposal, control_variates, num_chains, seed, d, dtype,
                    salt: Optional[int] = None) -> dict:
    """What a run is made of (module docstring); ``salt`` keys the rows sampled (new when None)."""
    salt = new_salt() if salt is None else int(salt)
    return {
        "data": data_fingerprint(data, n, salt),
        "model": {"class": f"{type(model).__module__}.{type(model).__qualname__}",
                  "name": str(getattr(model, "name", "")), "settings": _digest(model)},
        "test": {"label": method_label(test), "settings": _digest(test)},
        "proposal": {"class": f"{type(proposal).__module__}.{type(proposal).__qualname__}",
                     "settings": _digest(proposal)},
        "control_variates": None if control_variates is None else _digest(control_variates),
        "chains": int(num_chains), "seed": int(seed), "d": int(d), "dtype": str(dtype),
    }


# modules that moved into the layers' folders: a checkpoint made before names its classes by the old paths
MOVED = {"tallmh.numpyro_model.": "tallmh.frontends.numpyro_model.", "tallmh.pymc_model.": "tallmh.frontends.pymc_model.",
         "tallmh.formula.": "tallmh.frontends.formula.", "tallmh.results.": "tallmh.reporting.results."}


def _current(part):
    """A fingerprint's part with a class named by a module's old path renamed to its current one."""
    if isinstance(part, dict) and isinstance(part.get("class"), str):
        for old, new in MOVED.items():
            if part["class"].startswith(old):
                return {**part, "class": new + part["class"][len(old):]}
    return part


def mismatch(saved: dict, now: dict) -> Optional[str]:
    """Why a checkpoint with fingerprint ``saved`` cannot continue the run ``now`` (None: it can)."""
    sd, nd = saved.get("data", {}), now.get("data", {})
    if sd.get("n") != nd.get("n"):
        return f"the checkpoint's run had N = {sd.get('n')} items; this data has N = {nd.get('n')}"
    if [(l["shape"], l["dtype"]) for l in sd.get("leaves", [])] != \
            [(l["shape"], l["dtype"]) for l in nd.get("leaves", [])]:
        return "the data's shape or dtype differs from the checkpoint's run"
    # a file of the same size with another modification time (a cache rebuilt, a file copied or moved) is the
    # same data when the rows sampled by the checkpoint's key agree; a changed size never is
    touched = None
    for a, b in zip(sd.get("leaves", []), nd.get("leaves", [])):
        fa, fb = a.get("file"), b.get("file")
        if fa and fb and fa.get("size") != fb.get("size"):
            return (f"the data file {fb['path']} changed since the checkpoint was made (its size); the checkpoint "
                    "is stale")
        if fa and fb and fa.get("mtime_ns") != fb.get("mtime_ns") and touched is None:
            touched = fb["path"]
    if sd.get("rows_sha256") != nd.get("rows_sha256"):
        if touched is not None:
            return (f"the data file {touched} changed since the checkpoint was made (modified, and rows sampled by "
                    "its key differ); the checkpoint is stale")
        return "the data differs from the checkpoint's run (rows sampled by its key differ): other data of the same shape"
    for key, what in (("model", "model"), ("test", "test"), ("proposal", "proposal"),
                      ("control_variates", "control variates"), ("chains", "number of chains"), ("seed", "seed"),
                      ("d", "parameter size"), ("dtype", "dtype")):
        if _current(saved.get(key)) != now.get(key):
            def show(v):
                if isinstance(v, dict):
                    return v.get("label") or v.get("name") or v.get("class") or "?"
                return str(v)
            extra = " (other settings)" if show(saved.get(key)) == show(now.get(key)) else \
                f" ({show(saved.get(key))} there, {show(now.get(key))} here)"
            return f"the {what} differs from the checkpoint's run{extra}"
    return None
