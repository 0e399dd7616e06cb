"""Draws streamed to disk as they are made, so that a long run's memory and checkpoints stay flat.

A :class:`DrawStore` is a folder beside the checkpoint (``<checkpoint>.draws``) with one append-only raw
file per phase and array: ``sampling.theta.bin``, ``sampling.accepted.bin``, ... Each compiled chunk's
output is appended in draw-major order (``(draw, chain, ...)``, C order), so the file only grows at its
end; :meth:`DrawStore.view` maps its first ``k`` draws read-only as a ``(chain, draw, ...)`` array (a
transposed ``np.memmap``: nothing is read into memory until used). A checkpoint then stores a reference to
those files and the number of draws it covers, not the draws themselves (:mod:`tallmh.storage.checkpoint`);
draws appended after the last checkpoint (a run killed between two) are cut off when the run resumes.
"""

from __future__ import annotations

import os
from typing import Dict

import numpy as np

__all__ = ["DrawStore", "SUFFIX", "stream_ref", "open_ref"]

SUFFIX = ".draws"
PHASES = ("warmup", "sampling")


class DrawStore:
    """Append-only files of one run's draws and per-step statistics (module docstring)."""

    def __init__(self, folder: str, num_chains: int, d: int, dtype):
        self.folder = os.path.abspath(folder)
        self.num_chains = int(num_chains)
        self.d = int(d)
        self.dtype = np.dtype(str(dtype))
        self.counts = {p: 0 for p in PHASES}
        self.stat_dtypes: Dict[str, np.dtype] = {}
        self._files: Dict[str, object] = {}
        os.makedirs(self.folder, exist_ok=True)

    def _path(self, phase, name):
        return os.path.join(self.folder, f"{phase}.{name}.bin")

    def _row_bytes(self, name):
        if name == "theta":
            return self.num_chains * self.d * self.dtype.itemsize
        return self.num_chains * self.stat_dtypes[name].itemsize

    def start(self, counts: Dict[str, int], stat_dtypes: Dict[str, np.dtype], keep: bool):
        """Open the files. With ``keep`` the first ``counts`` draws already there are kept and the next ones
        written after them (over whatever a killed run appended beyond its last checkpoint: a resumed run
        makes the same draws again, bit for bit); raises ``OSError`` when the files hold fewer. Without
        ``keep`` the files start empty (old ones are unlinked, never truncated, so arrays still mapping
        them stay valid)."""
        self.stat_dtypes = {k: np.dtype(v) for k, v in stat_dtypes.items()}
        for phase in PHASES:
            for name in ("theta", *self.stat_dtypes):
                path = self._path(phase, name)
                want = counts.get(phase, 0) * self._row_bytes(name) if keep else 0
                if keep:
                    if not os.path.exists(path) or os.path.getsize(path) < want:
                        raise OSError(f"the draws file {path} holds fewer draws than the checkpoint says")
                    f = open(path, "r+b")
                    f.seek(want)
                else:
                    if os.path.exists(path):
                        os.remove(path)
                    f = open(path, "wb")
                self._files[(phase, name)] = f
            self.counts[phase] = counts.get(phase, 0) if keep else 0

    def add(self, phase, theta, stats, block: int = 1 << 16):
        """Append draws already made elsewhere (a resumed run's), ``block`` draws at a time."""
        for a in range(0, int(np.shape(theta)[1]), block):
            self.append(phase, theta[:, a:a + block], {k: v[:, a:a + block] for k, v in stats.items()})

    def append(self, phase, theta, stats):
        """Append a chunk: ``theta`` ``(chain, k, d)`` and ``stats`` ``{name: (chain, k)}``."""
        k = int(np.shape(theta)[1])
        if k == 0:
            return
        self._files[(phase, "theta")].write(np.ascontiguousarray(np.swapaxes(np.asarray(theta, self.dtype), 0, 1))
                                            .tobytes())
        for name, dt in self.stat_dtypes.items():
            v = stats.get(name)
            v = np.zeros((self.num_chains, k), dt) if v is None else np.asarray(v, dt)
            self._files[(phase, name)].write(np.ascontiguousarray(v.T).tobytes())
        self.counts[phase] += k

    def sync(self):
        """Flush every file to disk (before a checkpoint refers to their contents)."""
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())

    def flush(self):
        for f in self._files.values():
            f.flush()

    def view(self, phase):
        """``(theta, stats)`` of the phase's draws so far: read-only ``(chain, draw, ...)`` memory maps."""
        self.flush()
        k = self.counts[phase]
        return (_map(self._path(phase, "theta"), self.dtype, k, (self.num_chains, self.d)),
                {name: _map(self._path(phase, name), dt, k, (self.num_chains,)) for name, dt in self.stat_dtypes.items()})

    def close(self):
        for f in self._files.values():
            try:
                f.close()
            except OSError:
                pass
        self._files = {}


def _map(path, dtype, k, row_shape):
    if k == 0:
        return np.zeros((row_shape[0], 0) + tuple(row_shape[1:]), dtype)
    m = np.memmap(path, dtype=dtype, mode="r", shape=(k,) + tuple(row_shape))
    return np.swapaxes(m, 0, 1)


def stream_ref(a, base: str):
    """A JSON reference to ``a`` when it is a store's view (a draw-major file mapped from its start, swapped
    to ``(chain, draw, ...)``) in a folder under ``base``; else None."""
    if not isinstance(a, np.memmap) or a.ndim < 2 or getattr(a, "filename", None) is None or a.offset != 0:
        return None
    path = os.path.abspath(a.filename)
    base = os.path.abspath(base)
    if not path.startswith(base + os.sep) or not path.endswith(".bin"):
        return None
    shape = (a.shape[1], a.shape[0]) + a.shape[2:]
    item = a.dtype.itemsize
    expect = [item] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        expect[i] = expect[i + 1] * shape[i + 1]
    expect[0], expect[1] = expect[1], expect[0]
    if list(a.strides) != expect:
        return None
    return {"file": os.path.relpath(path, base), "draws": int(shape[0]), "row_shape": [int(s) for s in shape[1:]],
            "dtype": a.dtype.str}


def open_ref(ref: dict, base: str):
    """The array a :func:`stream_ref` reference stands for (read-only memory map); ``ValueError`` when the
    reference leaves ``base`` or the file is too short."""
    rel = str(ref["file"])
    if os.path.isabs(rel) or ".." in rel.replace("\\", "/").split("/") or not rel.endswith(".bin"):
        raise ValueError(f"a draws file outside the checkpoint's folder ({rel!r})")
    path = os.path.join(os.path.abspath(base), rel)
    dtype = np.dtype(str(ref["dtype"]))
    if dtype.hasobject or dtype.kind not in "biufc":
        raise ValueError(f"draws file of dtype {dtype}")
    k = int(ref["draws"])
    row_shape = tuple(int(s) for s in ref["row_shape"])
    need = k * int(np.prod(row_shape)) * dtype.itemsize
    if not os.path.exists(path):
        raise ValueError(f"its draws file {path} is missing")
    if os.path.getsize(path) < need:
        raise ValueError(f"its draws file {path} holds fewer draws than it says (truncated?)")
    return _map(path, dtype, k, row_shape)
