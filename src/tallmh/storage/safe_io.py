"""Files written so that a crash, a kill or a full disk never leaves a half-written file in place.

Each file is written to a temporary name beside its final path (``.NAME.tmp-PID-XXXX``), flushed to disk
(``fsync``), then renamed over the final path, and the folder is synced so that the rename survives a power
cut. A write that fails (``ENOSPC``, ``EIO``, a read-only file system) removes its temporary file and raises
:class:`WriteError`, whose one-line message names the path; the file at the final path is the previous one,
untouched. When the size of what is written is known, the free space is checked first: some writers
(libhdf5, which NetCDF uses) do not fail cleanly when the disk fills under them. Temporary files left by a
process that no longer exists (killed in the middle of a write) are removed by the next write in the folder.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
from typing import Callable, Optional

__all__ = ["WriteError", "atomic_write", "check_free_space", "clean_stale_temporaries"]

_TMP = re.compile(r"^\..+\.tmp-(\d+)-[^.]+$")
SPACE_MARGIN = 1 << 20  # bytes kept free beyond the estimate


class WriteError(OSError):
    """A file could not be written (message: one line naming the path and the reason)."""


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def clean_stale_temporaries(folder: str) -> int:
    """Remove temporary files of :func:`atomic_write` in ``folder`` whose writing process is gone; returns
    how many were removed."""
    removed = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        m = _TMP.match(name)
        if m and not _pid_alive(int(m.group(1))):
            try:
                os.remove(os.path.join(folder, name))
                removed += 1
            except OSError:
                pass
    return removed


def check_free_space(path: str, nbytes: int) -> None:
    """Raise :class:`WriteError` (ENOSPC) when the file system of ``path`` has less than ``nbytes`` (plus a
    margin) free."""
    folder = os.path.dirname(os.path.abspath(path))
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return
    need = int(nbytes) + SPACE_MARGIN
    if free < need:
        raise WriteError(errno.ENOSPC, f"cannot write {path}: not enough free space ({free / 1e6:.1f} MB free, "
                                       f"about {need / 1e6:.1f} MB needed)", path)


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str, write: Callable[[str], object], nbytes: Optional[int] = None,
                 mode: Optional[int] = None) -> str:
    """Call ``write(tmp_path)`` for a temporary file beside ``path``, sync it, then rename it to ``path``.

    ``nbytes``: the expected size, checked against the free space first. ``mode``: the file's permissions
    (default: 0666 less the umask, as ``open`` gives). Raises :class:`WriteError` naming ``path`` on any
    ``OSError``; the temporary file is removed whatever happens.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    clean_stale_temporaries(folder)
    if nbytes is not None:
        check_free_space(path, nbytes)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-{os.getpid()}-", dir=folder)
        os.close(fd)
        write(tmp)
        if mode is None:
            mask = os.umask(0)
            os.umask(mask)
            mode = 0o666 & ~mask
        os.chmod(tmp, mode)  # mkstemp makes 0600
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        tmp = None
        _fsync_folder(folder)
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(e.errno or errno.EIO, f"cannot write {path}: {e.strerror or e}", path) from None
    finally:
        if tmp is not None:
            try:
                os.remove(tmp)
            except OSError:
                pass
    return path
