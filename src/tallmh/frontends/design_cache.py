"""A table's design streamed into an on-disk cache and sampled from there (memory maps), for tables that
need not fit in memory.

One streamed pass over the table (in blocks of about 32 MB) checks the columns and accumulates their
means and sds; a second writes the standardised design (float32, intercept first) and the target as
``.npy`` files in the cache folder, which are then opened with :func:`tallmh.storage.data.from_npy`, so the chains
read only the rows they use. The cache is keyed by the file (path, size, modification time) and the
settings, so a second run on the same table skips both passes. A 2-D ``.npy`` table is read from its own
memory map in both passes.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import types

import numpy as np

from .degenerate import DesignCheck, binary_target
from .tables import header, scaling_of, split_features, table_blocks, table_frames  # noqa: F401 (table_frames: re-exported)
from ..errors import DataError
from ..method_options import batch_of
from ..storage.memory import available_memory as _available_memory

__all__ = ["BLOCK_BYTES", "MEMORY_SHARE", "is_npy_table", "npy_design", "should_stream", "table_blocks",
           "streamed_design"]

BLOCK_BYTES = 2**25  # float64 bytes of one block of rows, in each pass
MEMORY_SHARE = 8  # a CSV/Parquet table is streamed when its size in memory exceeds 1/8 of the available memory
STREAM_SUFFIXES = (".csv", ".parquet", ".pq")


def is_npy_table(args) -> bool:
    """A plain 2-D ``.npy`` table: sampled from disk (:func:`npy_design`) rather than read into memory."""
    if getattr(args, "formula", None) is not None or not str(args.data).lower().endswith(".npy"):
        return False
    try:
        mm = np.load(args.data, mmap_mode="r", allow_pickle=False)
    except Exception:  # noqa: BLE001 - the in-memory reader gives the one-line error
        return False
    return isinstance(mm, np.ndarray) and mm.ndim == 2 and mm.dtype.names is None


def _cache_folder(settings: dict) -> str:
    from ..reporting.compare import default_cache_dir

    key = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:24]
    root = os.path.join(os.path.abspath(os.path.expanduser(default_cache_dir())), "tables")
    return os.path.join(root, key)


def _read_meta(folder: str):
    """The cached design's ``design.json`` (None when there is no complete cache)."""
    meta_path = os.path.join(folder, "design.json")
    if not os.path.exists(meta_path):
        return None
    try:
        with open(meta_path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _check_block(z, a, ti, fi, colnames, binary):
    """One block's refusals: NaN or infinite values in the columns used, a target that is not 0/1."""
    bad = ~np.isfinite(z[:, [ti] + fi])
    if bad.any():
        r, c = np.argwhere(bad)[0]
        col = ([ti] + fi)[c]
        kind = "NaN or missing" if np.isnan(z[r, col]) else "infinite"
        raise DataError(f"column '{colnames[col]}' has {kind} value(s) (first at row {a + r}); drop or fill them "
                        "first")
    if binary and not np.all((z[:, ti] == 0) | (z[:, ti] == 1)):
        v = z[:, ti][(z[:, ti] != 0) & (z[:, ti] != 1)][0]
        raise DataError(f"target '{colnames[ti]}' is not binary: logistic regression needs 0/1 values, found {v:g}")


def _scan(blocks, ti, fi, colnames, binary, h, spool=None, check=None):
    """Pass 1: every block checked, hashed into ``h`` (and appended to ``spool`` as float64 when given, and
    given to ``check``, a :class:`~tallmh.frontends.degenerate.DesignCheck`, when given); returns ``(rows,
    mean, sd)`` of every column, merged block by block with the pairwise update of Chan, Golub and LeVeque
    (1979), which keeps them as accurate as a two-pass computation over the whole column."""
    n, mean, m2 = 0, None, None
    for raw in blocks:
        h.update(raw.tobytes())
        z = raw.astype(np.float64)
        if spool is not None:
            spool.write(z.tobytes())
        _check_block(z, n, ti, fi, colnames, binary)
        if check is not None:
            check.add(z[:, fi], z[:, ti])
        nb = len(z)
        if nb == 0:
            continue
        mb = z.mean(axis=0)
        m2b = ((z - mb) ** 2).sum(axis=0)
        if mean is None:
            mean, m2 = mb, m2b
        else:
            delta = mb - mean
            mean = mean + delta * (nb / (n + nb))
            m2 = m2 + m2b + delta**2 * (n * nb / (n + nb))
        n += nb
    return n, mean, (None if m2 is None else np.sqrt(m2 / n))


def _centre_and_scale(mean, sd, fi, fcols, first, standardise, intercept):
    """The features' ``(center, scale)`` from pass 1's moments; a constant feature is refused (``first``:
    the table's first row)."""
    mean, sd = mean[fi], sd[fi]
    for j, c in enumerate(fcols):
        if not (sd[j] > 0):
            raise DataError(f"feature {c!r} is constant (every row is {float(first[fi[j]]):g}); drop it")
    if standardise:
        return (mean if intercept else np.zeros_like(mean)), sd
    return np.zeros_like(mean), np.ones_like(sd)


def _write_design(blocks, folder, n, ti, fi, center, scale, intercept):
    """Pass 2: the standardised design ``X.npy`` (float32, intercept first) and ``y.npy`` in ``folder``."""
    d = len(fi) + int(intercept)
    X = np.lib.format.open_memmap(os.path.join(folder, "X.npy"), mode="w+", dtype=np.float32, shape=(n, d))
    y = np.lib.format.open_memmap(os.path.join(folder, "y.npy"), mode="w+", dtype=np.float32, shape=(n,))
    for name in ("X.npy", "y.npy"):  # the disk space taken now: a full disk is an OSError here, never a SIGBUS
        _allocate(os.path.join(folder, name))  # when the memory map's pages are written later
    a = 0
    for z in blocks:
        z = np.asarray(z, np.float64)
        b = a + len(z)
        if intercept:
            X[a:b, 0] = 1.0
        X[a:b, int(intercept):] = (z[:, fi] - center) / scale
        y[a:b] = z[:, ti]
        a = b
    X.flush()
    y.flush()


def _allocate(path):
    """Reserve the blocks of the (sparse) file at ``path``; ``OSError`` (ENOSPC, naming the file) when the disk
    cannot hold it."""
    if not hasattr(os, "posix_fallocate"):
        return
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            return  # a file system without it: as before
        raise OSError(e.errno, f"cannot write the table cache {path}: {e.strerror}", path) from None
    finally:
        os.close(fd)


def _publish(tmp, folder, meta):
    """Write ``design.json`` and move the finished cache into place (another run's copy wins a race)."""
    with open(os.path.join(tmp, "design.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
    try:
        os.replace(tmp, folder)
    except OSError:  # made meanwhile by another run: use it
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def _usable(folder, meta, d: int) -> bool:
    """Whether the cache in ``folder`` is whole: its design files there, readable and of the rows and columns
    ``design.json`` says. A cache that is not (a file deleted, truncated or damaged) is removed, and made
    again by the caller; caches may be deleted at any time."""
    import shutil

    try:
        X = np.load(os.path.join(folder, "X.npy"), mmap_mode="r", allow_pickle=False)
        y = np.load(os.path.join(folder, "y.npy"), mmap_mode="r", allow_pickle=False)
        rows = meta.get("rows")
        ok = X.ndim == 2 and X.shape[1] == d and y.shape == (X.shape[0],) and (rows is None or X.shape[0] == rows)
        del X, y
    except (OSError, ValueError, TypeError):
        ok = False
    if not ok:
        shutil.rmtree(folder, ignore_errors=True)
    return ok


def _open_cached(folder, meta, fcols, intercept, standardise):
    """``(data, on_disk, names, scaling, digest)`` of a finished cache (see :func:`npy_design`)."""
    import tallmh as tm

    files = {"X": os.path.join(folder, "X.npy"), "y": os.path.join(folder, "y.npy")}
    data = tm.data.from_npy(files, check_finite=False)  # checked in the first pass
    on_disk = {k: np.load(v, mmap_mode="r") for k, v in files.items()}
    names = (["intercept"] if intercept else []) + list(fcols)
    scaling = scaling_of(standardise, intercept, list(fcols), np.asarray(meta["center"]),
                         np.asarray(meta["scale"]))
    scaling["out_of_core"] = folder
    scaling["data_notes"] = list(meta.get("data_notes") or [])  # (found in pass 1; a cache made before: none)
    return data, on_disk, names, scaling, meta["digest"]


def _npy_columns(args, path, mm):
    """The target and feature columns of a 2-D ``.npy`` table (named ``"0"``, ``"1"``, ...), checked."""
    from ..datasets import choose_columns

    n, p = mm.shape
    if n == 0 or p == 0:
        raise DataError(f"{path} holds no rows")
    if not (np.issubdtype(mm.dtype, np.number) or mm.dtype == bool):
        raise DataError(f"{path}: a .npy table must be numeric; got dtype {mm.dtype}")
    frame = types.SimpleNamespace(columns=[str(j) for j in range(p)])
    tcol, fcols = choose_columns(frame, args.target, split_features(args.features), path)
    if n < batch_of(args.test, args):
        raise DataError(f"{path} has {n} rows, fewer than the batch size {batch_of(args.test, args)}; use a "
                        "smaller batch")
    return frame.columns, tcol, fcols


def npy_design(args, say):
    """The design of a 2-D ``.npy`` table built out of core (see the module) from ``args`` (the ``tallmh
    run`` options: data, target, features, model, test, no_intercept, no_standardize).

    Returns ``(data, on_disk, names, scaling, digest)``: the from_npy pytree, the same files as NumPy memory
    maps, the names, the standardisation (as :func:`tallmh.frontends.design.load_design`) and a SHA-256 of the file
    and settings.
    """
    path = os.path.abspath(args.data)
    mm = np.load(path, mmap_mode="r", allow_pickle=False)
    n, p = mm.shape
    colnames, tcol, fcols = _npy_columns(args, path, mm)
    ti, fi = int(tcol), [int(c) for c in fcols]
    intercept, standardise = not args.no_intercept, not args.no_standardize
    binary = args.model == "logistic"
    st = os.stat(path)
    settings = {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "target": ti, "features": fi,
                "intercept": intercept, "standardise": standardise, "binary": binary, "version": 1}
    folder = _cache_folder(settings)
    meta = _read_meta(folder)
    if meta is not None and _usable(folder, meta, len(fi) + int(intercept)):
        say(f"{os.path.basename(path)}: the design cached in {folder}")
        return _open_cached(folder, meta, fcols, intercept, standardise)
    block = max(1, BLOCK_BYTES // (8 * p))
    h = hashlib.sha256(json.dumps({k: settings[k] for k in ("target", "features", "intercept", "standardise",
                                                           "binary")}, sort_keys=True).encode())
    h.update(str((mm.shape, str(mm.dtype))).encode())
    say(f"{os.path.basename(path)}: {n:,} rows x {p} columns, read from disk in blocks (pass 1 of 2: checks, "
        "means and sds)")
    check = DesignCheck(list(fcols), colnames[ti], binary=binary, intercept=intercept)
    _, mean, sd = _scan((np.ascontiguousarray(mm[a:a + block]) for a in range(0, n, block)), ti, fi, colnames,
                        binary, h, check=check)
    center, scale = _centre_and_scale(mean, sd, fi, fcols, np.asarray(mm[0], np.float64), standardise, intercept)
    notes = check.notes()
    d = len(fi) + int(intercept)
    tmp = f"{folder}.tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    say(f"pass 2 of 2: writing the standardised design ({n * (d + 1) * 4 / 1e6:,.1f} MB) to {folder}")
    try:
        _write_design((mm[a:a + block] for a in range(0, n, block)), tmp, n, ti, fi, center, scale, intercept)
    except BaseException:  # (a full disk: no half-made cache left behind)
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    meta = {"settings": settings, "digest": h.hexdigest(), "center": center.tolist(), "scale": scale.tolist(),
            "rows": int(n), "data_notes": notes}
    _publish(tmp, folder, meta)
    return _open_cached(folder, meta, fcols, intercept, standardise)


# ---------------------------------------------------------------------------------------------------
# CSV and Parquet tables, streamed once


def _size_in_memory(path: str) -> int:
    """A table's size once read (CSV: the file's size, about what pandas holds as float64; Parquet, which is
    compressed: rows x columns x 8 bytes)."""
    if path.lower().endswith(".csv"):
        return os.path.getsize(path)
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    return meta.num_rows * meta.num_columns * 8


def should_stream(args) -> bool:
    """Whether ``tallmh run`` streams a CSV/Parquet table into the on-disk cache: always with ``--stream``,
    never with ``--no-stream``, and otherwise when the table's size in memory is more than 1/MEMORY_SHARE of
    the available memory (reading it whole takes about four times its size at the peak)."""
    if not str(args.data).lower().endswith(STREAM_SUFFIXES) or getattr(args, "stream", None) is False:
        return False
    if getattr(args, "stream", None):
        return True
    try:
        return _size_in_memory(args.data) * MEMORY_SHARE > _available_memory()
    except Exception:  # noqa: BLE001 - unreadable: the in-memory reader gives the one-line error
        return False


def _progress(tell, name):
    """A progress line every few seconds (and at the end) while a table is read."""
    import time

    last = [time.perf_counter()]

    def report(rows, share):
        t = time.perf_counter()
        if t - last[0] >= 2.0:
            last[0] = t
            tell(f"{name}: {rows:,} rows read ({share:.0%} of the file)")
    return report


def _spooled_pass(blocks, width, ti, fi, binary, h, tmp, path, n_min, tell, check=None):
    """Pass 1 over a streamed table: checks and moments (as :func:`_scan`), the columns used spooled to
    ``tmp/raw.f64`` (float64, ``width`` columns) for pass 2. Returns ``(rows, mean, sd, spool)``, the spool
    as a read-only memory map."""
    spool = os.path.join(tmp, "raw.f64")
    with open(spool, "wb") as f:
        n, mean, sd = _scan(blocks, ti, fi, blocks.names, binary, h, spool=f, check=check)
    tell(f"{os.path.basename(path)}: {n:,} rows read")
    if n == 0:
        raise DataError(f"{path} holds no rows")
    if n < n_min:
        raise DataError(f"{path} has {n} rows, fewer than the batch size {n_min}; use a smaller batch")
    return n, mean, sd, np.memmap(spool, dtype=np.float64, mode="r", shape=(n, width))


class _Named:
    """An iterator of blocks that knows its columns' names (for the refusals' messages)."""

    def __init__(self, it, names):
        self.it, self.names = iter(it), [str(c) for c in names]

    def __iter__(self):
        return self.it


def _plan(args, path, rows, tell):
    """What to stream: ``(target, features, formula has an intercept, blocks of [target, features...] as
    float64, target must be 0/1)``; a formula's design is built block by block by :mod:`tallmh.frontends.formula`."""
    progress = _progress(tell, os.path.basename(path))
    if getattr(args, "formula", None):
        from .formula import design_blocks

        target, names, has_intercept, blocks = design_blocks(path, args.formula, args.family, rows, progress)
        return target, names, has_intercept, _Named(blocks, [target] + names), False
    from ..datasets import choose_columns

    frame = types.SimpleNamespace(columns=header(path))
    tcol, fcols = choose_columns(frame, args.target, split_features(args.features), path)
    columns = [tcol] + list(fcols)
    return tcol, list(fcols), True, _Named(table_blocks(path, columns, rows, progress), columns), \
        args.model == "logistic"


def _stream_settings(args, path) -> dict:
    """What the cache of a streamed table is keyed by: the file and the settings that shape its design."""
    st = os.stat(path)
    what = ({"formula": args.formula, "family": args.family} if getattr(args, "formula", None) else
            {"target": str(args.target), "features": split_features(args.features),
             "binary": args.model == "logistic"})
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, **what,
            "intercept": not args.no_intercept, "standardise": not args.no_standardize, "version": 1,
            "reader": "table blocks"}


def streamed_design(args, say):
    """The design of a CSV or Parquet table (columns, or ``args.formula``), streamed once in row blocks into
    the on-disk cache (see the module): pass 1 reads the table (with a progress line), checks it,
    accumulates the columns' moments and spools the columns used as float64 to the cache folder; pass 2
    writes the standardised float32 design from that spool, which is then removed. Disk needed while it is
    made: rows x (columns used) x 12 bytes. Returns what :func:`npy_design` returns.
    """
    import shutil

    path = os.path.abspath(args.data)
    standardise = not args.no_standardize
    settings = _stream_settings(args, path)
    folder = _cache_folder(settings)
    meta = _read_meta(folder)
    if meta is not None and _usable(folder, meta, len(meta.get("features", ())) + int(bool(meta.get("intercept")))):
        say(f"{os.path.basename(path)}: the design cached in {folder}")
        return _open_cached(folder, meta, meta["features"], meta["intercept"], standardise)
    h = hashlib.sha256(json.dumps({k: v for k, v in settings.items() if k not in ("path", "size", "mtime_ns")},
                                  sort_keys=True).encode())
    tmp = f"{folder}.tmp-{os.getpid()}"
    os.makedirs(tmp, exist_ok=True)
    try:
        say(f"{os.path.basename(path)}: streamed in blocks into {folder} (pass 1 of 2: checks, means and sds)")
        rows = max(1, BLOCK_BYTES // (8 * len(header(path))))
        target, fcols, has_intercept, blocks, binary = _plan(args, path, rows, say)
        intercept = settings["intercept"] and has_intercept
        ti, fi = 0, list(range(1, len(fcols) + 1))
        check = DesignCheck(list(fcols), str(target), binary=binary_target(args), intercept=intercept)
        n, mean, sd, raw = _spooled_pass(blocks, len(fcols) + 1, ti, fi, binary, h, tmp, path,
                                         batch_of(args.test, args), say, check=check)
        center, scale = _centre_and_scale(mean, sd, fi, fcols, np.asarray(raw[0]), standardise, intercept)
        notes = check.notes()
        say(f"pass 2 of 2: writing the standardised design ({n * (len(fi) + intercept + 1) * 4 / 1e6:,.1f} MB)")
        block = max(1, BLOCK_BYTES // (8 * (len(fcols) + 1)))
        _write_design((raw[a:a + block] for a in range(0, n, block)), tmp, n, ti, fi, center, scale, intercept)
        del raw
        os.remove(os.path.join(tmp, "raw.f64"))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    meta = {"settings": settings, "digest": h.hexdigest(), "center": center.tolist(), "scale": scale.tolist(),
            "target": target, "features": list(fcols), "intercept": intercept, "rows": int(n), "data_notes": notes}
    _publish(tmp, folder, meta)
    return _open_cached(folder, meta, fcols, intercept, standardise)
