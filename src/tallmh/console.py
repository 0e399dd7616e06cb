"""What the ``tallmh`` commands print and how they set up the process (no JAX imported here at load).

Lines for the user go to stdout through :func:`print_line`, which survives a closed pipe; progress goes to
stderr through :func:`say`. :func:`quiet_libraries` and :func:`use_compile_cache` are called once the
arguments have been checked, so that refusals stay quick.
"""

from __future__ import annotations

import datetime
import logging
import os
import sys
import warnings

PROG = "tallmh"

__all__ = ["PROG", "print_line", "say", "now", "plural", "one_line", "first_line", "quiet_libraries", "use_compile_cache",
           "SafeStream", "guard_streams"]


class SafeStream:
    """A terminal stream whose writes never raise: once the terminal is gone (a closed SSH session: the writes
    fail with EIO after the hang-up; a closed pipe: EPIPE), what is written later is dropped, so that a stop
    is handled to its end (outputs and checkpoint written) instead of failing on its own message."""

    def __init__(self, stream):
        self._stream = stream
        self.dead = False

    def _die(self):
        self.dead = True

    def write(self, text):
        if not self.dead:
            try:
                return self._stream.write(text)
            except (OSError, ValueError):  # EIO, EPIPE, a closed file
                self._die()
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if not self.dead:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._die()

    def isatty(self):
        if self.dead:
            return False
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def __getattr__(self, name):
        return getattr(self._stream, name)


def guard_streams():
    """Put :class:`SafeStream` around ``sys.stdout`` and ``sys.stderr`` (the real command line); returns a
    function that puts the original streams back."""
    before = sys.stdout, sys.stderr
    if not isinstance(sys.stdout, SafeStream):
        sys.stdout = SafeStream(sys.stdout)
    if not isinstance(sys.stderr, SafeStream):
        sys.stderr = SafeStream(sys.stderr)

    def restore():
        sys.stdout, sys.stderr = before

    return restore


def print_line(*parts):
    """print() to stdout that survives a closed pipe (``tallmh ... | head``): the run goes on silently."""
    try:
        print(*parts, flush=True)
    except OSError:  # EPIPE; EIO once the terminal is gone
        sys.stdout = open(os.devnull, "w")


def say(args, msg, end="\n"):
    """A progress line on stderr, unless ``args.quiet``."""
    if not getattr(args, "quiet", False):
        try:
            print(msg, file=sys.stderr, end=end, flush=True)
        except OSError:  # the terminal is gone (EIO after a hang-up): the run goes on
            pass


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def plural(count: int, word: str) -> str:
    """``1 draw``, ``2 draws``, ``1,000 warmup steps``."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def one_line(e) -> str:
    """An exception's message on one line (its type's name if it has none)."""
    msg = str(e).strip()
    if not msg:
        return type(e).__name__
    return " ".join(msg.split())


def first_line(e, limit: int = 0) -> str:
    """The first line of an exception's message (its type's name if it has none), cut at ``limit`` characters
    when ``limit`` > 0."""
    msg = str(e).strip()
    line = msg.splitlines()[0] if msg else type(e).__name__
    return line[:limit] if limit > 0 else line


def quiet_libraries():
    """ArviZ's notes (e.g. that one chain gives no R-hat) and shape-validation warnings stay off the terminal;
    imported here, after the arguments are checked, so that refusals are quick."""
    import arviz  # imported now so that the level below holds (ArviZ sets its own on import)

    logging.getLogger("arviz").setLevel(logging.ERROR)
    if isinstance(getattr(arviz, "_log", None), logging.Logger):  # ArviZ logs through its own Logger instance
        arviz._log.setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning, module="arviz")


def use_compile_cache(cache_dir: str):
    """Keep JAX's compiled programs in ``cache_dir/jax`` so a second run skips most compilation (the
    compile seconds reported are then the time to load them). Left alone if the user set a cache."""
    import jax

    if os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir:
        return  # the user's own, or tallmh's default (tallmh._cache), set at import
    if os.environ.get("TALLMH_COMPILATION_CACHE", "").strip().lower() in ("0", "off", "false", "no"):
        return  # opted out
    path = os.path.join(cache_dir, "jax")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
