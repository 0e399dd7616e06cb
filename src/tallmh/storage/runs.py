"""Rows gathered from a host array as runs of contiguous rows, the runs read by several threads.

The set-up's warm sub-samples (:func:`tallmh.setup_passes.warm_rows`) are up to 1,024 runs of contiguous rows
spread over the data. NumPy's ``a[idx]`` on a memory-mapped file reads them one page fault at a time in one
thread: at N = 10^9 from disk (48 GB), the 2^24 rows of the last sub-sample took most of the half-minute before
the first full pass. Here, where the array is a file's memory map, the kernel is first told every run it will
read (``posix_fadvise(WILLNEED)``: it queues their reads at once), then each run is one slice copied into its
place in the result, the runs shared among threads (NumPy copies without holding the interpreter lock). The
result is the same array as ``a[idx]``. Measured on the 2^24 rows of N = 10^9 (0.8 GB in 1,024 runs of 48 GB of
files, their pages dropped from the page cache, load 6-7): ``a[idx]`` 14.5-18.3 s, the runs in 8 threads 11-12
s, with the reads advised first 2.2 s (32 threads) and 3.5 s (8).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import os

import numpy as np

READERS = 16  # threads copying runs (their page faults wait on the disk, not the cores)
_MIN_ROWS = 1 << 16  # below this many rows, a[idx] as it is
_MIN_ROWS_MEMORY = 1 << 22  # ... and below this many for an array in memory (no page faults to wait on: the threads'
# start-up cost more than the copy at N = 10^6, beside the chain's trace in another thread)


def gather(a: np.ndarray, idx, source=None) -> np.ndarray:
    """``a[idx]`` for a host array ``a`` and integer row indices ``idx``, read run by run in threads where ``idx``
    is long and mostly runs of consecutive rows. ``source``: the file's memory map behind ``a`` (``np.memmap``,
    C order), whose runs' reads are advised first; None for none."""
    idx = np.asarray(idx)
    paged = source is not None or isinstance(a, np.memmap)  # (a file's pages, else rows in memory)
    if idx.ndim != 1 or idx.size < (_MIN_ROWS if paged else _MIN_ROWS_MEMORY) \
            or not isinstance(a, np.ndarray) or a.ndim < 1:
        return a[idx]
    i64 = idx.astype(np.int64)
    if i64.min() < 0 or i64.max() >= a.shape[0]:
        return a[idx]  # (NumPy's own error, or its negative indices)
    breaks = np.flatnonzero(np.diff(i64) != 1) + 1
    if breaks.size + 1 > idx.size // 64:  # (not runs: no gain)
        return a[idx]
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [idx.size]])
    out = np.empty((idx.size,) + a.shape[1:], a.dtype)
    _advise(source, a, i64[starts], ends - starts)

    def copy(j):
        s, e = int(starts[j]), int(ends[j])
        r = int(i64[s])
        out[s:e] = a[r:r + (e - s)]

    with ThreadPoolExecutor(min(READERS, starts.size), thread_name_prefix="tallmh-gather") as ex:
        for f in [ex.submit(copy, j) for j in range(starts.size)]:
            f.result()
    return out


def _advise(source, a, first, count) -> None:
    """``posix_fadvise(WILLNEED)`` for the rows ``[first, first + count)`` of each run, where ``source`` is a C-order
    memory map of a file with the same rows as ``a`` (anything else: nothing; a failure: nothing)."""
    name, off = getattr(source, "filename", None), getattr(source, "offset", None)
    if name is None or off is None or not hasattr(os, "posix_fadvise") or source.shape != a.shape \
            or not source.flags.c_contiguous:
        return
    row = source.dtype.itemsize * int(np.prod(source.shape[1:], dtype=np.int64))
    try:
        fd = os.open(name, os.O_RDONLY)
    except OSError:
        return
    try:
        for r, c in zip(first.tolist(), count.tolist()):
            os.posix_fadvise(fd, int(off) + r * row, c * row, os.POSIX_FADV_WILLNEED)
    except OSError:
        pass
    finally:
        os.close(fd)
