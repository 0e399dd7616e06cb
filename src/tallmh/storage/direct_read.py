"""A set-up pass's blocks of rows read from ``.npy`` files with direct I/O, for files larger than memory.

A full pass over files through their memory maps reads the disk by page faults: the kernel allocates each page of
the page cache, fills it and maps it, and later evicts it again (a file larger than memory cannot stay cached
between passes). Measured here, per block of 2^20 rows of d = 11 in float32 (46 MB) read from a disk whose pages
were dropped: 30-55 CPU ms through the memory map (or ``read`` into a buffer), 3-6 ms with ``O_DIRECT``, which
moves the bytes from the disk into the process's own buffer and skips the page cache. On a machine of two cores,
where the pass's arithmetic already fills both, that is the difference between a pass bound by the disk and one
bound by the reads' own CPU.

:func:`reader` gives ``read(a, b)`` with the same rows, bytes for bytes, as
:func:`tallmh.storage.datasource.host_reader`'s (each block read as one aligned range of the file into a
page-aligned buffer; the rows are a view of it), where every leaf is a C-contiguous memory map of a file in the
dtype compiled code sees and the files together are larger than ``RAM_FRACTION`` times the machine's memory
(``MODE = "auto"``): a file that fits in memory is read from the page cache, where a second pass (and the chain's
rows) may find it; one larger than memory is read from the disk by every pass anyway.
Buffers are reused once every array that views one (the block's rows, the compiled call's zero-copy input, the
statistics' and weights' parts) has gone. Where the file system refuses ``O_DIRECT`` (tmpfs, some network file
systems), or a read fails, the caller keeps the memory maps (:func:`reader` returns None).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref
from typing import Optional

import jax
import numpy as np

__all__ = ["MODE", "RAM_FRACTION", "reader"]

MODE = "auto"  # "auto": files larger than RAM_FRACTION of memory; "always"; "never"
RAM_FRACTION = 1.0
_ALIGN = 4096  # offsets, lengths and addresses of O_DIRECT reads: multiples of the disk's block size


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _new_buffer(nbytes: int):
    return mmap.mmap(-1, nbytes)  # (page-aligned, zero-filled on first touch)


class _Pool:
    """Page-aligned buffers (anonymous maps), each taken again once every array that views it has gone."""

    def __init__(self):
        self.free: dict = {}
        self.lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        with self.lock:
            got = self.free.get(nbytes)
            buf = got.pop() if got else None
        if buf is None:
            buf = _new_buffer(nbytes)
        arr = np.frombuffer(buf, np.uint8)
        weakref.finalize(arr, self._give, nbytes, buf)  # (views of arr, jax's zero-copy arrays of them, keep it)
        return arr

    def _give(self, nbytes, buf):
        with self.lock:
            self.free.setdefault(nbytes, []).append(buf)


def _sources(data):
    """``(tree, [(path, offset, row bytes, dtype, row shape, rows)])`` for the data's leaves, or None where a leaf is
    not a whole ``.npy`` memory map in the dtype compiled code sees."""
    from .datasource import canonical_dtype, is_data_leaf, is_host_leaf, memmap_of

    leaves, tree = jax.tree_util.tree_flatten(data, is_leaf=is_data_leaf)
    srcs = []
    for leaf in leaves:
        mm = memmap_of(leaf) if is_host_leaf(leaf) else None
        if not isinstance(mm, np.memmap) or getattr(mm, "filename", None) is None or not mm.flags.c_contiguous \
                or canonical_dtype(mm.dtype) != mm.dtype or mm.ndim < 1:
            return None
        if not isinstance(getattr(mm, "offset", None), int) or mm.offset < 0:
            return None
        row = int(mm.dtype.itemsize * int(np.prod(mm.shape[1:], dtype=np.int64)))
        if os.path.getsize(mm.filename) < mm.offset + row * mm.shape[0]:  # (not the whole array of its file)
            return None
        srcs.append((mm.filename, int(mm.offset), row, mm.dtype, tuple(mm.shape[1:]), int(mm.shape[0])))
    return tree, srcs


def _pread(fd, buf: np.ndarray, pos: int, need: int) -> None:
    """Read at least ``need`` bytes of the file from the aligned ``pos`` into ``buf`` (aligned, of an aligned size)."""
    view = memoryview(buf)
    got = 0
    while got < need:
        n = os.preadv(fd, [view[got:]], pos + got)
        if n <= 0:
            raise EOFError(f"direct read: the file ended {need - got} bytes early")
        got += n


def reader(data, mode: Optional[str] = None):
    """``read(a, b)``: rows ``[a, b)`` of every leaf by direct I/O (see the module docstring), or None (then the
    memory maps: :func:`tallmh.storage.datasource.host_reader`). ``mode``: :data:`MODE` by default."""
    mode = MODE if mode is None else mode
    if mode == "never" or not hasattr(os, "O_DIRECT"):
        return None
    got = _sources(data)
    if got is None:
        return None
    tree, srcs = got
    if mode == "auto":
        size = sum(off + row * n for _, off, row, _, _, n in srcs)
        mem = _memory_bytes()
        if not mem or size <= RAM_FRACTION * mem:
            return None
    fds = []
    try:
        for path, *_ in srcs:
            fds.append(os.open(path, os.O_RDONLY | os.O_DIRECT))
        probe = _Pool().take(_ALIGN)
        for fd in fds:
            os.preadv(fd, [memoryview(probe)], 0)  # (a file system that refuses direct reads says so here)
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    from .datasource import host_reader

    pool = _Pool()
    srcs = [(fd,) + s[1:5] for fd, s in zip(fds, srcs)]
    mapped = host_reader(data)

    def read(a: int, b: int):
        out = []
        try:
            for fd, off, row, dt, shape in srcs:
                start, stop = off + a * row, off + b * row
                pos = start // _ALIGN * _ALIGN
                buf = pool.take(-(-(stop - pos) // _ALIGN) * _ALIGN)
                _pread(fd, buf, pos, stop - pos)
                out.append(buf[start - pos:stop - pos].view(dt).reshape((b - a,) + shape))
        except (OSError, EOFError):  # (a direct read refused midway: these rows through the memory maps)
            return mapped(a, b)
        return jax.tree_util.tree_unflatten(tree, out)

    for fd in fds:
        weakref.finalize(read, os.close, fd)
    return read
