"""The ``--out`` folder of a ``tallmh`` command: the files that mark a run, the checks made before anything
is written, the folder made only when a file is written (and removed again if the command fails first), and
an exclusive lock on it for the command's whole life."""

from __future__ import annotations

import json
import os

from ..errors import CLIError

__all__ = ["CHECKPOINT", "OLD_CHECKPOINT", "RUN_FILES", "RUN_SETTINGS", "OUTPUTS", "LOCK_FILE", "complete_run",
           "OutFolder"]

CHECKPOINT = "checkpoint.npz"
OLD_CHECKPOINT = "checkpoint.pkl"  # the pickled checkpoints of earlier versions: never read (a pickle can run code)
RUN_FILES = ("results.json", "report.html", "posterior.nc", CHECKPOINT, OLD_CHECKPOINT, "run.json")  # what marks a run
RUN_SETTINGS = "run.json"
OUTPUTS = ("posterior.nc", "results.json", "report.html")  # what a finished run writes at its end
LOCK_FILE = ".tallmh.lock"  # held (flock) by the command writing to the folder


def complete_run(folder) -> bool:
    """Whether ``folder`` holds a finished run (results.json says it is not partial)."""
    try:
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            return json.load(f).get("partial") is False
    except (OSError, ValueError, AttributeError):
        return False


class OutFolder:
    """The ``--out`` folder: checked at the start, made only when a file is written, and removed again if
    the command fails before anything was written into it."""

    def __init__(self, path: str, overwrite: bool = False, resuming: bool = False):
        self.path = os.path.abspath(os.path.expanduser(path))
        self.made = []  # folders this command created
        self._lock = None
        if os.path.exists(self.path):
            if not os.path.isdir(self.path):
                raise CLIError(f"output folder {self.path} exists and is not a folder")
            self._probe(self.path)
            self.lock()  # before looking at what the folder holds: no second run between the check and the writes
            held = [f for f in RUN_FILES if os.path.exists(os.path.join(self.path, f))]
            if held and not (overwrite or resuming):
                hint = (f"continue it with 'tallmh run --resume {self.path}', "
                        if CHECKPOINT in held and not complete_run(self.path) else "")
                self.release()
                raise CLIError(f"output folder {self.path} holds an earlier run ({', '.join(held)}); {hint}choose "
                               "another --out, or pass --overwrite to replace its files")
        else:
            parent = self.path
            while not os.path.exists(parent):
                parent = os.path.dirname(parent)
            if not os.path.isdir(parent):
                raise CLIError(f"cannot write to output folder {self.path}: {parent} is not a folder")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise CLIError(f"cannot write to output folder {self.path}: {parent} is not writable")

    @staticmethod
    def _probe(path):
        import tempfile

        try:
            fd, probe = tempfile.mkstemp(prefix=".tallmh-probe-", dir=path)
            os.close(fd)
            os.remove(probe)
        except OSError as e:
            raise CLIError(f"cannot write to output folder {path}: {e.strerror or e}") from None

    def lock(self):
        """Hold an exclusive lock on the folder (``.tallmh.lock`` in it, removed again at the end) for the
        command's lifetime; another tallmh command on the same folder is refused in one line. The operating
        system releases the lock when the process ends, however it ends (a file left by ``kill -9`` is
        simply locked again by the next command)."""
        if self._lock is not None:
            return
        try:
            import fcntl
        except ImportError:  # no flock on this platform: unlocked, as before
            return
        path = os.path.join(self.path, LOCK_FILE)
        for _ in range(10):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise CLIError(f"cannot write to output folder {self.path}: {e.strerror or e}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise CLIError(f"output folder {self.path} is in use by another tallmh run; wait for it to end or "
                               "choose another --out") from None
            except OSError:  # a file system without locks (some network mounts): go on unlocked
                self._lock = fd
                return
            try:  # the holder before us may have removed the file between our open and our lock: lock anew
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    self._lock = fd
                    return
            except OSError:
                pass
            os.close(fd)
        raise CLIError(f"output folder {self.path}: cannot take its lock file {path}")

    def release(self):
        """Remove the lock file and release the lock."""
        if self._lock is not None:
            try:
                os.remove(os.path.join(self.path, LOCK_FILE))
            except OSError:
                pass
            try:
                os.close(self._lock)
            except OSError:
                pass
            self._lock = None

    def make(self) -> str:
        if not os.path.isdir(self.path):
            todo = []
            p = self.path
            while not os.path.exists(p):
                todo.append(p)
                p = os.path.dirname(p)
            try:
                os.makedirs(self.path, exist_ok=True)
            except OSError as e:
                raise CLIError(f"cannot write to output folder {self.path}: {e.strerror or e}") from None
            self.made = todo
        self.lock()
        return self.path

    def file(self, name: str) -> str:
        return os.path.join(self.make(), name)

    def clean_up(self):
        """Remove the folders this command made if they are still empty (but for the lock file)."""
        self.release()
        for p in self.made:  # deepest first
            try:
                os.rmdir(p)
            except OSError:
                break
