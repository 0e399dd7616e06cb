"""Out-of-core data: ``.npy`` files and ``np.memmap`` arrays read in place, never loaded whole.

``from_npy({"X": "X.npy", "y": "y.npy"})`` opens the files as read-only memory maps and returns a data
pytree that :func:`tallmh.sample` accepts like any other; an ``np.memmap`` given as a leaf of the data is
treated the same way. A subsampled step reads only the rows it uses; the set-up passes (finiteness check,
the model's ``setup``, Newton's mode search and the control-variate sums) stream over the rows in blocks
of :data:`BLOCK_ROWS` rows, with a progress bar on long passes.

Two ways for the compiled chain to read rows that live in a file (``gather=``):

``"zero_copy"``
    the memory map is handed to JAX without a copy (``jax.device_put`` of an aligned, C-ordered array
    on the CPU backend aliases NumPy memory; this is checked on a one-row probe before the whole array
    is put, and again after). The leaf is then an ordinary ``jax.Array`` whose pages the operating
    system reads from the file on demand, so the kernel's gathers (``jnp.take``) touch only the pages of
    the rows they use, and clean pages can be evicted: data larger than RAM works, at the speed of the
    page cache or the disk. Measured (``benchmarks/out_of_core.py``): about as fast as in-memory data
    once the pages are cached.
``"callback"``
    each gather is a ``jax.pure_callback`` that indexes the memory map on the host (indices sorted
    first, so that the reads go forward through the file; a contiguous range is one slice). Needed
    where the data cannot be aliased: accelerator backends (a GPU cannot address a file-backed host
    buffer; ``device_put`` would copy the whole file to the device), unaligned or non-native-dtype
    files. 5-10x slower per step than zero-copy on the CPU (one host round-trip per read; measured 777 vs
    115 us per step at N = 10^6, ``benchmarks/results/out_of_core_callback.json``).
``"auto"`` (default)
    zero-copy where the probe shows that it aliases, else callback.

A callback-mode leaf is a :class:`HostArray`: a pytree whose only JAX leaf is an int32 token naming the
memory map in a process-wide registry, so a compiled chain takes the data as an argument and serves any
file of the same shape without recompiling.
"""

from __future__ import annotations

import itertools
import mmap
import os
import sys
import weakref
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import DataError, ModelError

__all__ = ["from_npy", "HostArray", "is_out_of_core", "host_leaf", "read_rows", "setup_stats", "block_bounds",
           "BLOCK_ROWS", "progress_bar"]

BLOCK_ROWS = 2**20  # rows per block of a streamed set-up pass over on-disk data
PROGRESS: Optional[bool] = None  # progress bars on long passes: None = when stderr is a terminal
PROGRESS_MIN_ROWS = 2**22  # passes over fewer rows than this never show a bar

_MODES = ("auto", "zero_copy", "callback")
_TOKENS = itertools.count(1)
_HOST: dict = {}  # token -> np.memmap (callback leaves)
_ALIASED: dict = {}  # id(jax array) -> (weakref to it, np.memmap it aliases, finiteness checked)


class _RowArray:
    """What :class:`HostArray` and :class:`InPlaceArray` share: an array's ``shape``, ``dtype``, ``ndim``,
    ``size``, ``nbytes`` and ``len`` (rows), without the array itself."""

    __slots__ = ("shape", "dtype", "__weakref__")

    def __init__(self, shape, dtype):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return int(np.prod(self.shape))

    @property
    def nbytes(self):
        return self.size * self.dtype.itemsize

    def __len__(self):
        return self.shape[0]


class HostArray(_RowArray):
    """A data leaf that stays in a file: rows are gathered on the host by ``jax.pure_callback``.

    Has ``shape``, ``dtype``, ``ndim`` and ``nbytes`` like an array, and NumPy-style row slicing
    (``h[a:b]`` reads those rows from the file). ``np.asarray(h)`` is refused (it would load the whole
    file); use :func:`read_rows`. Inside compiled code, :func:`tallmh.storage.data.take` gathers rows of it.
    """

    __slots__ = ("token",)

    def __init__(self, token, shape, dtype):
        super().__init__(shape, dtype)
        self.token = token

    @property
    def array(self) -> np.ndarray:
        """The underlying memory map (only outside compiled code)."""
        return _HOST[int(np.asarray(self.token))]

    def __getitem__(self, item):
        return np.asarray(self.array[item], self.dtype)

    def __array__(self, dtype=None, copy=None):
        raise DataError(f"refusing to load an on-disk array of shape {self.shape} ({self.nbytes / 1e9:.2f} GB) "
                        "whole into memory; read rows with tallmh.storage.datasource.read_rows, or pass the data "
                        "in memory")

    def __repr__(self):
        return f"HostArray(shape={self.shape}, dtype={self.dtype})"


jax.tree_util.register_pytree_node(
    HostArray,
    lambda h: ((h.token,), (h.shape, h.dtype.str)),
    lambda aux, children: HostArray(children[0], aux[0], np.dtype(aux[1])),
)


def _gather_host(token, idx, dtype):
    """Rows ``idx`` of the memory map named by ``token`` (any index shape; indices clipped into range)."""
    mm = _HOST[int(np.asarray(token).reshape(-1)[0])]
    idx = np.asarray(idx)
    flat = np.clip(idx.reshape(-1).astype(np.int64), 0, mm.shape[0] - 1)
    row = mm.shape[1:]
    if flat.size == 0:
        return np.zeros(idx.shape + row, dtype)
    lo, hi = int(flat.min()), int(flat.max())
    if hi - lo + 1 <= 2 * flat.size:  # (nearly) a contiguous range: one forward read
        out = np.asarray(mm[lo:hi + 1])[flat - lo]
    else:  # scattered rows: read them in file order, then put them back in the asked order
        order = np.argsort(flat, kind="stable")
        out = np.empty((flat.size,) + row, mm.dtype)
        out[order] = mm[flat[order]]
    return np.ascontiguousarray(out, dtype).reshape(idx.shape + row)


def host_take(h: HostArray, idx):
    """``h[idx]`` inside or outside compiled code: one host gather (``jax.pure_callback``)."""
    idx = jnp.asarray(idx)
    out = jax.ShapeDtypeStruct(tuple(idx.shape) + h.shape[1:], h.dtype)
    return jax.pure_callback(lambda t, i: _gather_host(t, i, h.dtype), out, h.token, idx,
                             vmap_method="expand_dims")


def _aliases(x, mm) -> bool:
    try:
        return int(x.unsafe_buffer_pointer()) == int(mm.ctypes.data)
    except Exception:  # noqa: BLE001 - a backend without host pointers: not aliased
        return False


def canonical_dtype(dtype) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(dtype))


def _check_array(mm, name):
    if mm.dtype == object or not (np.issubdtype(mm.dtype, np.number) or mm.dtype == np.bool_):
        raise DataError(f"data leaf {name} is not numeric (dtype {mm.dtype})")
    if mm.ndim == 0:
        raise DataError(f"data leaf {name} is a scalar; every leaf needs a leading axis of length N")
    if mm.ndim > 1 and not mm.flags.c_contiguous:
        raise DataError(f"data leaf {name} is stored in Fortran (column) order, so a row is scattered over the "
                        "file; rewrite it in C (row) order, e.g. np.save(path, np.ascontiguousarray(a)) in chunks")


def host_leaf(mm: np.ndarray, gather: str = "auto", name: str = "data", checked: bool = False):
    """Wrap a memory-mapped array as a data leaf without loading it: a zero-copy ``jax.Array`` or a
    :class:`HostArray` (see the module docstring for ``gather``). ``checked``: its finiteness is settled
    (checked, or the check waived), so :func:`tallmh.storage.data.validate_data` does not stream over it again."""
    if gather not in _MODES:
        from ..errors import ConfigError

        raise ConfigError(f"gather must be one of {_MODES}; got {gather!r}")
    _check_array(mm, name)
    want = canonical_dtype(mm.dtype)
    if gather != "callback":
        reason = None
        if jax.default_backend() != "cpu":
            reason = f"the default JAX backend is {jax.default_backend()}, which cannot address host memory"
        elif want != mm.dtype:
            reason = (f"its dtype {mm.dtype} is not one JAX uses in this mode ({want}; "
                      "jax_enable_x64 is off), so it would be converted, that is copied whole")
        elif not mm.flags.c_contiguous:
            reason = "it is not C-contiguous"
        else:
            probe = jax.device_put(mm[:1])
            if not _aliases(probe, mm):
                reason = "this JAX build copies it instead of aliasing it (alignment or platform)"
            del probe
        if reason is None:
            x = jax.device_put(mm)
            if _aliases(x, mm):
                _register_alias(x, mm, checked)
                return x
            reason = "JAX copied it despite the probe"
            del x
        if gather == "zero_copy":
            raise DataError(f"data leaf {name} cannot be read zero-copy: {reason}; use gather='callback'")
    token = next(_TOKENS)
    _HOST[token] = mm
    h = HostArray(np.int32(token), mm.shape, want)
    if checked:
        _CHECKED.add(token)
    return h


_CHECKED: set = set()  # callback tokens whose finiteness has been checked


def _aliased_host(x):
    """The host array a ``jax.Array`` was registered as aliasing (:func:`_register_alias`), or None."""
    ent = _ALIASED.get(id(x)) if isinstance(x, jax.Array) else None
    return ent[1] if ent is not None and ent[0]() is x else None


def _register_alias(x, arr, checked):
    """Record that the JAX array ``x`` reads ``arr``'s memory; the entry goes when ``x`` is freed."""
    key = id(x)
    _ALIASED[key] = (weakref.ref(x), arr, bool(checked))

    def drop(key=key):
        ent = _ALIASED.get(key)
        if ent is not None and ent[0]() is None:
            del _ALIASED[key]

    weakref.finalize(x, drop)


_ALIGN = 64  # bytes: the CPU client aliases host memory only at this alignment (else it copies)
# Arrays smaller than this are copied into JAX's own (aligned) buffer rather than read in place: malloc puts
# them in its heap at an address whose offset within 64 bytes depends on what the process allocated
# before, and the in-place program depends on that offset (a second process would then miss the
# persistent compilation cache). Larger ones are memory-mapped by malloc (glibc's largest dynamic
# threshold is 32 MiB) at a fixed offset from a page boundary; their copy is what reading in place avoids.
_COPY_BELOW_BYTES = 32 << 20


class _Span:
    """A read-only NumPy view of ``count`` items of ``dtype`` at ``addr`` that keeps ``owner`` (the array
    whose memory it covers) alive: ``np.asarray(_Span(...))`` has this object as its base."""

    def __init__(self, owner, addr, count, dtype):
        self._owner = owner
        self.__array_interface__ = {"data": (int(addr), True), "shape": (int(count),),
                                    "typestr": np.dtype(dtype).str, "version": 3}


class InPlaceArray(_RowArray):
    """An in-memory NumPy data leaf read by compiled code in place, without a copy.

    The CPU backend aliases host memory only from a 64-byte-aligned address, and NumPy places a large
    array at 16 bytes past a page boundary, so ``jax.device_put`` of it copies. Instead, ``buf`` is a
    flat ``jax.Array`` that aliases the aligned span ``[start rounded down to 64 bytes, end)`` (the few
    bytes before the start lie in the same memory page; they are never used), and row ``i`` is the
    ``offset + i * row`` .. ``+ row`` elements of it (:func:`in_place_take`, a gather inside compiled
    code). JAX arrays are immutable and tallmh donates no buffer, so nothing writes into the user's
    array; ``buf`` holds a reference to the NumPy array (through its :class:`_Span` base), so the memory
    stays valid if the user deletes their array while a result of JAX still reads it. (As with any
    zero-copy alias, writing into the array while a ``tm.sample`` call runs changes what it reads.)

    Has ``shape``, ``dtype``, ``ndim``, ``nbytes``; ``np.asarray`` gives the original array (read-only
    view) outside compiled code; ``jnp.asarray`` (``__jax_array__``) materialises a copy.
    """

    __slots__ = ("buf", "offset")

    def __init__(self, buf, offset, shape, dtype):
        super().__init__(shape, dtype)
        self.buf = buf
        self.offset = int(offset)

    def _host(self):
        return _aliased_host(self.buf)

    def __array__(self, dtype=None, copy=None):
        host = self._host()
        if host is None:
            return np.asarray(self.__jax_array__(), dtype)
        if copy:
            return np.array(host, dtype=dtype, copy=True)
        view = host.view()
        view.flags.writeable = False
        return view if dtype is None else view.astype(dtype)

    def __jax_array__(self):
        return jax.lax.slice(self.buf, (self.offset,), (self.offset + self.size,)).reshape(self.shape)

    def __getitem__(self, item):
        host = self._host()
        return np.asarray(host[item]) if host is not None else self.__jax_array__()[item]

    def __repr__(self):
        return f"InPlaceArray(shape={self.shape}, dtype={self.dtype}, offset={self.offset})"


jax.tree_util.register_pytree_node(
    InPlaceArray,
    lambda a: ((a.buf,), (a.offset, a.shape, a.dtype.str)),
    lambda aux, children: InPlaceArray(children[0], aux[0], aux[1], np.dtype(aux[2])),
)


def in_place_leaf(arr, checked: bool = False):
    """An in-memory NumPy array as a data leaf that compiled code reads without copying it, or None
    where that is impossible (then the caller copies it, as before).

    A 64-byte-aligned array becomes a plain ``jax.Array`` aliasing it; any other an :class:`InPlaceArray`,
    except below 32 MiB (``_COPY_BELOW_BYTES``), where the copy is cheap and keeps the compiled program
    independent of where malloc placed the array.
    Needs the CPU backend with one device (a row-sharded or accelerator layout needs its own copy), a
    C-contiguous array of the dtype JAX would use (``float64`` with x64 off would be converted, i.e.
    copied), and fewer than 2**31 elements (int32 element offsets).
    """
    if not isinstance(arr, np.ndarray) or isinstance(arr, np.memmap) or arr.size == 0 or arr.ndim == 0:
        return None
    if jax.default_backend() != "cpu" or jax.device_count() != 1 or jax.process_count() != 1:
        return None
    if arr.dtype != canonical_dtype(arr.dtype) or not arr.flags.c_contiguous or not arr.flags.aligned:
        return None
    if arr.dtype.itemsize > _ALIGN or _ALIGN % arr.dtype.itemsize:
        return None
    addr = int(arr.ctypes.data)
    off_bytes = addr % _ALIGN
    if off_bytes != 0 and arr.nbytes < _COPY_BELOW_BYTES:
        return None  # copied (cheap): the same program in every process (see _COPY_BELOW_BYTES)
    if off_bytes == 0:
        x = jax.device_put(arr)
        return x if _aliases(x, arr) else None
    off = off_bytes // arr.dtype.itemsize
    count = off + arr.size
    if count >= 2**31 - 1:
        return None
    span = np.asarray(_Span(arr, addr - off_bytes, count, arr.dtype))
    buf = jax.device_put(span)
    if not _aliases(buf, span):
        return None
    _register_alias(buf, arr, checked)
    return InPlaceArray(buf, off, arr.shape, arr.dtype)


def in_place_take(a: InPlaceArray, idx):
    """Rows ``idx`` (clipped into range, as ``jnp.take(..., mode="clip")``) of an :class:`InPlaceArray`:
    one gather of ``row``-element slices of the flat buffer."""
    idx = jnp.clip(jnp.asarray(idx).astype(jnp.int32), 0, a.shape[0] - 1)
    row = int(np.prod(a.shape[1:])) if a.ndim > 1 else 1
    starts = (a.offset + idx * row).reshape(-1)
    rows = jax.vmap(lambda s: jax.lax.dynamic_slice(a.buf, (s,), (row,)))(starts)
    return rows.reshape(tuple(idx.shape) + a.shape[1:])


def memmap_of(leaf):
    """The memory map behind an out-of-core leaf, or None for an in-memory leaf."""
    if isinstance(leaf, HostArray):
        try:
            return leaf.array
        except (KeyError, TypeError, jax.errors.ConcretizationTypeError):
            return None
    if isinstance(leaf, InPlaceArray):
        return leaf._host()
    if isinstance(leaf, jax.Array):
        return _aliased_host(leaf)
    if isinstance(leaf, np.memmap):
        return leaf
    return None


_ADVICE = {"normal": "MADV_NORMAL", "sequential": "MADV_SEQUENTIAL", "random": "MADV_RANDOM"}


def advise(data, pattern: str):
    """Tell the operating system how the files behind ``data``'s on-disk leaves will be read next:
    ``"sequential"`` (a set-up pass: read ahead), ``"random"`` (sampling: a page fault reads its own page
    only, not the 128 KiB around it, which for rows scattered over a file larger than RAM made each row
    read ~10x slower: 5.2 ms against 0.45-0.9 ms per row from a 48 GB file here, with another job
    reading the disk), or ``"normal"``. In-memory leaves, and platforms without ``madvise``, are left
    alone; returns how many maps were advised."""
    flag = getattr(mmap, _ADVICE[pattern], None)
    if flag is None:
        return 0
    done = 0
    seen = set()
    for leaf in leaves_of(data):
        mm = memmap_of(leaf)
        base = getattr(mm, "_mmap", None) if mm is not None else None
        if base is None or id(base) in seen:
            continue
        seen.add(id(base))
        try:
            base.madvise(flag)
            done += 1
        except (OSError, ValueError, AttributeError):  # closed map, or no madvise here
            pass
    return done


def host_view(leaf) -> Optional[np.ndarray]:
    """``leaf`` as a NumPy array without a copy where it lies in host memory (a NumPy array, the user's array
    read in place, a ``jax.Array`` on the CPU), else None (data read from disk by gathers, arrays on an
    accelerator, which NumPy would first copy whole to the host)."""
    if isinstance(leaf, HostArray):
        return None
    if isinstance(leaf, InPlaceArray):
        return np.asarray(leaf) if leaf._host() is not None else None
    if isinstance(leaf, np.ndarray):
        return leaf
    if isinstance(leaf, jax.Array) and all(d.platform == "cpu" for d in leaf.devices()):
        return np.asarray(leaf)
    return None


def is_host_leaf(leaf) -> bool:
    return isinstance(leaf, (HostArray, InPlaceArray)) or memmap_of(leaf) is not None


def is_data_leaf(x):
    return isinstance(x, (HostArray, InPlaceArray))


def leaves_of(data):
    """The data's leaves, a :class:`HostArray` counting as one leaf."""
    return jax.tree_util.tree_leaves(data, is_leaf=is_data_leaf)


def is_out_of_core(data) -> bool:
    """Whether any leaf of ``data`` lives in a file (memory map, zero-copy alias or :class:`HostArray`) or
    is an in-memory array read in place (:class:`InPlaceArray`): set-up then reads rows in blocks."""
    return any(is_host_leaf(a) for a in leaves_of(data))


def finite_checked(leaf) -> bool:
    if isinstance(leaf, HostArray):
        try:
            return int(np.asarray(leaf.token)) in _CHECKED
        except TypeError:
            return False
    if isinstance(leaf, InPlaceArray):
        leaf = leaf.buf
    ent = _ALIASED.get(id(leaf)) if isinstance(leaf, jax.Array) else None
    return bool(ent is not None and ent[0]() is leaf and ent[2])


def mark_checked(leaf):
    if isinstance(leaf, HostArray):
        _CHECKED.add(int(np.asarray(leaf.token)))
        return
    if isinstance(leaf, InPlaceArray):
        leaf = leaf.buf
    if isinstance(leaf, jax.Array) and id(leaf) in _ALIASED:
        ref, mm, _ = _ALIASED[id(leaf)]
        _ALIASED[id(leaf)] = (ref, mm, True)


def block_bounds(n: int, rows: Optional[int] = None):
    """``(start, stop)`` of nearly equal blocks of at most ``rows`` (default :data:`BLOCK_ROWS`) rows
    covering ``range(n)``."""
    rows = BLOCK_ROWS if rows is None else rows
    k = max(1, -(-n // rows))
    edges = [(n * i) // k for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k) if edges[i + 1] > edges[i]]


def progress_bar(total_rows: int, desc: str, out_of_core: bool = True):
    """A tqdm bar over rows for a long pass over on-disk data (None when the pass is short or bars are off)."""
    show = PROGRESS if PROGRESS is not None else bool(getattr(sys.stderr, "isatty", lambda: False)())
    if not (show and out_of_core and total_rows >= PROGRESS_MIN_ROWS):
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total_rows, desc=desc, unit="row", unit_scale=True, file=sys.stderr, mininterval=2.0,
                dynamic_ncols=True, leave=False)


def check_finite_streamed(mm: np.ndarray, name: str):
    """Raise :class:`DataError` if the memory map holds NaN or inf; reads it in blocks, never whole."""
    if not np.issubdtype(mm.dtype, np.inexact):
        return
    n = mm.shape[0]
    row_items = int(np.prod(mm.shape[1:])) if mm.ndim > 1 else 1
    rows = max(1, BLOCK_ROWS * 16 // max(1, row_items))  # about 16 M values per block
    bad = 0
    bar = progress_bar(n, f"tallmh: checking {name} is finite")
    try:
        for a, b in block_bounds(n, rows):
            block = np.asarray(mm[a:b])
            bad += int(block.size - np.count_nonzero(np.isfinite(block)))
            if bar is not None:
                bar.update(b - a)
    finally:
        if bar is not None:
            bar.close()
    if bad:
        raise DataError(f"data leaf {name} holds {bad} NaN or infinite value(s)")


# from_npy(check_finite="auto") checks files up to this many rows when it opens them; larger ones are checked by
# the call that first uses them (tallmh.sample: in its first full pass over the files)
CHECK_NOW_MAX_ROWS = 2**23


def from_npy(paths, gather: str = "auto", check_finite="auto"):
    """Open ``.npy`` files as out-of-core data: a pytree of the same structure as ``paths``.

    ``paths``: a path, or a dict / list / tuple of paths (``{"X": "X.npy", "y": "y.npy"}``). Each file is
    opened read-only with ``np.load(path, mmap_mode="r")``; nothing is read but the header. ``gather``:
    ``"auto"``, ``"zero_copy"`` or ``"callback"`` (module docstring). ``check_finite``: ``True`` scans every
    file once now, in blocks, for NaN or inf (a full read of the files, with a progress bar on long ones);
    ``"deferred"`` leaves that scan to the call that uses the data, made before any draw: :func:`tallmh.sample`
    makes it in its first full pass over the files (which it reads anyway; a NaN then stops the set-up with
    a :class:`DataError` naming the rows), other functions stream it first; ``"auto"`` (the default) is
    ``True`` for files of up to ``CHECK_NOW_MAX_ROWS`` rows and ``"deferred"`` above (at N = 10^9 the scan
    alone took ~30 s); ``False`` skips it (here and in :func:`tallmh.sample`), and then a non-finite value
    surfaces only as a non-finite log-likelihood (the step is rejected and counted in
    ``stats["nonfinite"]``).

    Raises :class:`DataError` for a missing or unreadable file, a non-numeric or scalar array, Fortran
    order, leading lengths that differ, ``gather="zero_copy"`` where aliasing is impossible, or (with
    ``check_finite=True``) non-finite values.
    """
    from ..errors import ConfigError

    if check_finite not in (True, False, "auto", "deferred"):
        raise ConfigError(f"check_finite must be True, False, 'auto' or 'deferred'; got {check_finite!r}")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(paths, is_leaf=lambda p: isinstance(p, (str, os.PathLike)))
    if not leaves:
        raise DataError("from_npy needs a path or a dict/list of paths to .npy files")
    out, lengths = [], {}
    for kp, path in leaves:
        name = jax.tree_util.keystr(kp) or "data"
        if not isinstance(path, (str, os.PathLike)):
            raise DataError(f"from_npy: {name} is {type(path).__name__}, not a path to a .npy file")
        path = os.fspath(path)
        if not os.path.exists(path):
            raise DataError(f"from_npy: no such file {path!r} (data leaf {name})")
        try:
            mm = np.load(path, mmap_mode="r", allow_pickle=False)
        except Exception as e:  # noqa: BLE001 - re-raised with the path
            raise DataError(f"from_npy: cannot open {path!r} as a .npy array ({type(e).__name__}: {e})") from e
        if not isinstance(mm, np.ndarray):
            raise DataError(f"from_npy: {path!r} is not a single .npy array (an .npz archive? extract its arrays)")
        if mm.ndim == 0:
            raise DataError(f"from_npy: {path!r} holds a scalar; every leaf needs a leading axis of length N")
        lengths[name] = mm.shape[0]
        out.append((name, mm))
    if len(set(lengths.values())) > 1:
        desc = ", ".join(f"{k}: {v}" for k, v in lengths.items())
        raise DataError(f"from_npy: the files have different numbers of rows ({desc}); all must share N")
    n = next(iter(lengths.values()))
    now = check_finite is True or (check_finite == "auto" and n <= CHECK_NOW_MAX_ROWS)
    res = []
    for name, mm in out:
        _check_array(mm, name)
        if now:
            check_finite_streamed(mm, name)
        # settled: checked now, or waived by the caller; else left to the call that uses the data
        res.append(host_leaf(mm, gather, name, checked=now or check_finite is False))
    return jax.tree_util.tree_unflatten(treedef, res)


def _rows_of(leaf, a: int, b: int):
    if isinstance(leaf, HostArray):
        return np.asarray(leaf.array[a:b], leaf.dtype)
    mm = memmap_of(leaf)
    if mm is not None:
        return np.asarray(mm[a:b], canonical_dtype(mm.dtype))
    view = host_view(leaf) if isinstance(leaf, jax.Array) else None
    if view is not None:  # (a NumPy slice: slicing a jax.Array compiles a program per shape)
        return view[a:b]
    return leaf[a:b]


def in_files(data) -> bool:
    """Whether any leaf of ``data`` is read from a file (a :class:`HostArray`, or a memory map read in place),
    as opposed to an in-memory array read in place (which :func:`is_out_of_core` also counts)."""
    for leaf in leaves_of(data):
        if isinstance(leaf, HostArray):
            return True
        mm = memmap_of(leaf) if is_host_leaf(leaf) else None
        if isinstance(mm, np.memmap) or isinstance(getattr(mm, "base", None), np.memmap):
            return True
    return False


def host_reader(data):
    """``read(a, b)``: rows ``[a, b)`` of every leaf as NumPy arrays in the dtype compiled code sees (the leaf's
    canonical dtype), where every leaf lies in host memory or in a file (read with no device program); None
    where a leaf lives on an accelerator (it would first be copied whole to the host)."""
    leaves, tree = jax.tree_util.tree_flatten(data, is_leaf=is_data_leaf)
    srcs = []
    for leaf in leaves:
        mm = memmap_of(leaf) if is_host_leaf(leaf) else None
        if isinstance(leaf, HostArray) and mm is not None:
            srcs.append((mm, np.dtype(leaf.dtype)))
            continue
        src = mm if mm is not None else host_view(leaf)
        if src is None:
            return None
        srcs.append((src, canonical_dtype(src.dtype)))

    def read(a: int, b: int):
        return jax.tree_util.tree_unflatten(tree, [np.asarray(src[a:b], dt) for src, dt in srcs])

    return read


def read_rows(data, a: int, b: int):
    """Rows ``[a, b)`` of every leaf, as in-memory arrays (outside compiled code)."""
    return jax.tree_util.tree_map(lambda x: _rows_of(x, a, b), data, is_leaf=is_data_leaf)


def _combine_default(a, b, path=""):
    if isinstance(a, dict):
        return {k: _combine_default(a[k], b[k], f"{path}.{k}" if path else str(k)) for k in a}
    if isinstance(a, (list, tuple)):
        return type(a)(_combine_default(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b)))
    name = path.split(".")[-1].lower()
    if "max" in name:
        return jnp.maximum(a, b)
    if "min" in name:
        return jnp.minimum(a, b)
    raise ModelError(f"the model's setup() statistic {path or 'stats'!r} cannot be streamed over on-disk data "
                     "(tallmh combines statistics named *max* or *min* blockwise); give the model a method "
                     "combine_setup(stats_a, stats_b) that merges two blocks' statistics, or pass the data in "
                     "memory")


def setup_stats(model, data, n: int):
    """The model's ``setup(data)`` statistics; streamed in blocks (``model.setup`` on each block, merged
    by ``model.combine_setup(a, b)`` or, by default, elementwise max/min for statistics so named) when the
    data is out of core. Returns None for a model without ``setup``."""
    setup = getattr(model, "setup", None)
    if not callable(setup):
        return None
    if not is_out_of_core(data):
        return setup(data)
    combine = getattr(model, "combine_setup", None)
    if not callable(combine) and all(isinstance(a, InPlaceArray) or not is_host_leaf(a) for a in leaves_of(data)):
        # in-memory data read in place: stream (no whole-array temporaries in setup) if the statistics can
        # be merged by name, else give setup the arrays themselves, as before
        try:
            return _setup_streamed(setup, _combine_default, data, n)
        except ModelError:
            return setup(jax.tree_util.tree_map(lambda a: np.asarray(a) if isinstance(a, InPlaceArray) else a,
                                                data, is_leaf=is_data_leaf))
    return _setup_streamed(setup, combine if callable(combine) else _combine_default, data, n)


class StatsTap:
    """The model's ``setup`` statistics over data in files (and the finiteness check of leaves ``from_npy``
    left unchecked), made from the blocks the set-up's first full pass reads anyway
    (:func:`tallmh.setup_passes.full_pass` feeds them while the tap is registered for the data:
    :func:`tapping`), so that the statistics cost no pass of their own over the files.

    ``probe``: ``setup`` on the first rows (their structure, shapes and dtypes: what the chain is compiled for
    before the statistics are known; it also checks those rows). :meth:`result` returns the statistics over all
    rows, streaming those no pass fed (all of them where the set-up made no full pass, e.g. a given start
    without control variates), and raises the error ``setup`` raised on a block (:class:`StatsFailed` stops
    the pass that fed it, so invalid data ends the set-up at that block)."""

    def __init__(self, model, data, n: int, unchecked=()):
        setup = getattr(model, "setup", None)
        setup = setup if callable(setup) else None  # (None: the finiteness check alone)
        combine = getattr(model, "combine_setup", None)
        self.setup, self.combine = setup, (combine if callable(combine) else _combine_default)
        self.model, self.data, self.n = model, data, int(n)
        self.next = 0  # rows [0, next) are in self.stats
        self.stats = None
        self.error: Optional[BaseException] = None
        self.fed_rows = 0  # rows fed by a pass (the rest, streamed by result(), cost a pass of their own)
        self.unchecked = _positions(data, unchecked)  # leaves whose finiteness check was deferred
        self.probe = setup(read_rows(data, 0, min(self.n, 16))) if setup is not None else None

    def _finite(self, rows, a, b, proven=()):
        """Raise :class:`DataError` if an unchecked leaf holds NaN or inf in rows ``[a, b)`` (the leaves under
        the data's top-level keys ``proven`` left out: the model's ``setup_checked`` found them finite)."""
        leaves = [u for u in self.unchecked if _top_key(self.data, u[0]) not in proven] if proven else self.unchecked
        _check_rows(rows, leaves, a, b, "found by the set-up's first pass over the files")

    def part(self, rows, a: int, b: int):
        """The finiteness check of rows ``[a, b)`` (host arrays) and ``setup`` of them, or the exception
        raised: made in any thread (a pass's reader threads), taken in row order by :meth:`add`.

        A model with ``setup_checked(rows) -> (statistics, keys)`` (the same statistics as ``setup``, and the
        data's top-level keys whose values its own sweep found all finite: a NaN or an infinity makes a sum of
        squares or a maximum not finite, or fails a check that the values are 0 or 1) saves the finiteness check those
        leaves' sweep; where ``setup_checked`` raises, the full check runs first, so that a non-finite value is
        reported, naming its rows and count, before any error of the model's, as where the check came first."""
        try:
            checked = _setup_checked(self.model) if self.setup is not None else None
            if checked is not None:
                try:
                    stats, proven = checked(rows)
                except Exception:
                    self._finite(rows, a, b)
                    raise
                self._finite(rows, a, b, tuple(proven))
                return jax.block_until_ready(stats)
            self._finite(rows, a, b)
            return jax.block_until_ready(self.setup(rows)) if self.setup is not None else None
        except Exception as e:  # noqa: BLE001 - raised by add(), in row order
            return _Failed(e)

    def add(self, a: int, b: int, part) -> None:
        """Take the statistics ``part`` of rows ``[a, b)`` if they continue the rows taken so far (else ignore
        them); a block whose ``setup`` raised ends the pass (:class:`StatsFailed`)."""
        if self.error is not None or a != self.next or b <= a:
            return
        try:
            if isinstance(part, _Failed):
                raise part.error
            if self.setup is not None:
                self.stats = part if self.stats is None else self.combine(self.stats, part)
                jax.block_until_ready(self.stats)
        except Exception as e:  # noqa: BLE001 - re-raised by result(), after the pass has stopped
            self.error = e
            raise StatsFailed(str(e)) from e
        self.next = b
        self.fed_rows += b - a

    def feed(self, a: int, b: int, rows) -> None:
        """:meth:`add` of :meth:`part` of rows ``[a, b)``."""
        self.add(a, b, self.part(rows, a, b))

    def result(self):
        """The statistics over all N rows (see the class docstring); the leaves whose finiteness the tap
        checked are then marked checked."""
        if self.error is not None:
            raise self.error
        if self.next < self.n:
            bar = progress_bar(self.n - self.next, "tallmh: model set-up pass" if self.setup is not None
                               else "tallmh: checking the data is finite")
            try:
                for a, b in block_bounds(self.n - self.next):
                    a, b = a + self.next, b + self.next
                    rows = read_rows(self.data, a, b)
                    self._finite(rows, a, b)
                    if self.setup is not None:
                        s = self.setup(rows)
                        self.stats = s if self.stats is None else self.combine(self.stats, s)
                        jax.block_until_ready(self.stats)
                    if bar is not None:
                        bar.update(b - a)
            finally:
                if bar is not None:
                    bar.close()
            self.next = self.n
        for _, _, leaf in self.unchecked:
            mark_checked(leaf)
        self.unchecked = []
        return self.stats


class _Failed:
    def __init__(self, error):
        self.error = error


class StatsFailed(BaseException):
    """The model's ``setup`` raised on a block a set-up pass fed to a :class:`StatsTap`: stops the pass (a
    BaseException, so that the mode search's fallbacks do not take it for a failed search); the tap's
    :meth:`~StatsTap.result` raises the model's error."""


_TAPS: dict = {}  # id(data) -> StatsTap, while a set-up runs on that data (tapping)


def _positions(data, leaves) -> list:
    """``(position among the data's leaves, name, leaf)`` of each of ``leaves``."""
    ids = {id(a) for a in leaves}
    paths = jax.tree_util.tree_flatten_with_path(data, is_leaf=is_data_leaf)[0]
    return [(i, jax.tree_util.keystr(p) or "data", a) for i, (p, a) in enumerate(paths) if id(a) in ids]


def _setup_checked(model):
    """``model.setup_checked`` where the class that defines it defines ``setup`` or derives from the one that does
    (a subclass with its own ``setup`` does not inherit another's), else None."""
    fn = getattr(model, "setup_checked", None)
    if not callable(fn) or "setup" in getattr(model, "__dict__", {}):
        return None

    def owner(name):
        return next((c for c in type(model).__mro__ if name in vars(c)), None)

    mine, setup = owner("setup_checked"), owner("setup")
    return fn if mine is not None and setup is not None and issubclass(mine, setup) else None


def _top_key(data, position):
    """The top-level dict key of the data's leaf at ``position`` (None where the data is not a dict)."""
    path = jax.tree_util.tree_flatten_with_path(data, is_leaf=is_data_leaf)[0][position][0]
    return getattr(path[0], "key", None) if path else None


def _check_rows(rows, unchecked, a, b, how):
    """Raise :class:`DataError` if a leaf ``(position, name, _)`` of ``unchecked`` holds NaN or inf in ``rows``
    (rows ``[a, b)`` of the data, host arrays)."""
    if not unchecked:
        return
    leaves = jax.tree_util.tree_leaves(rows, is_leaf=is_data_leaf)
    for i, name, _ in unchecked:
        block = np.asarray(leaves[i])
        if np.issubdtype(block.dtype, np.inexact):
            bad = int(block.size - np.count_nonzero(np.isfinite(block)))
            if bad:
                raise DataError(f"data leaf {name} holds {bad} NaN or infinite value(s) in rows {a:,} to {b - 1:,} "
                                f"({how}; the rows after them were not checked)")


def check_head(data, leaves, rows: int = 16) -> None:
    """The finiteness check of the first ``rows`` rows of ``leaves`` (a deferred check's first rows, checked
    before the model is first evaluated on them)."""
    if not leaves:
        return
    m = min(int(leaves[0].shape[0]), rows)
    _check_rows(read_rows(data, 0, m), _positions(data, leaves), 0, m, "found in the first rows")


def unchecked_leaves(data) -> list:
    """The leaves read from files or in place whose finiteness is not settled (from_npy's check deferred)."""
    return [a for a in leaves_of(data) if is_host_leaf(a) and not finite_checked(a)]


def check_leaves(data, leaves) -> None:
    """The streamed finiteness check of ``leaves`` (of ``data``), each then marked checked."""
    for _, name, leaf in _positions(data, leaves):
        check_finite_streamed(memmap_of(leaf), name)
        mark_checked(leaf)


def stats_tap(model, data, n: int, min_rows: int, unchecked=()) -> Optional[StatsTap]:
    """A :class:`StatsTap` for a model with ``setup`` on data in files of more than ``min_rows`` rows (where a
    pass over the files costs more than the statistics), else None. ``unchecked``: leaves whose finiteness
    check the tap makes too."""
    if not (callable(getattr(model, "setup", None)) or unchecked) or n <= min_rows or not in_files(data) \
            or host_reader(data) is None:
        return None
    return StatsTap(model, data, n, unchecked)


class tapping:
    """``with tapping(data, tap):`` full passes over ``data`` feed ``tap`` (None: nothing)."""

    def __init__(self, data, tap):
        self.key, self.tap = id(data), tap

    def __enter__(self):
        if self.tap is not None:
            _TAPS[self.key] = self.tap
        return self.tap

    def __exit__(self, *exc):
        if self.tap is not None:
            _TAPS.pop(self.key, None)
        return False


def tap_of(data) -> Optional[StatsTap]:
    """The :class:`StatsTap` registered for ``data``, or None."""
    tap = _TAPS.get(id(data))
    return tap if tap is not None and tap.data is data else None


def _setup_streamed(setup, combine, data, n):
    stats = None
    bar = progress_bar(n, "tallmh: model set-up pass")
    try:
        for a, b in block_bounds(n):
            s = setup(read_rows(data, a, b))
            stats = s if stats is None else combine(stats, s)
            # wait for this block: JAX dispatches asynchronously, so without this the loop would have every
            # block's copy and temporaries in flight at once (measured: +200 MB at N = 10^7)
            jax.block_until_ready(stats)
            if bar is not None:
                bar.update(b - a)
    finally:
        if bar is not None:
            bar.close()
    return stats


def describe(data) -> Any:
    """``{leaf: "zero_copy" | "callback" | "in_place" | "memory"}`` (for reports and tests)."""
    def kind(x):
        if isinstance(x, HostArray):
            return "callback"
        if isinstance(x, InPlaceArray):
            return "in_place"
        return "zero_copy" if memmap_of(x) is not None else "memory"

    return jax.tree_util.tree_map(kind, data, is_leaf=is_data_leaf)
