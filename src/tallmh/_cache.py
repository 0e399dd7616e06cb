"""JAX's persistent compilation cache, on by default, so that a program is compiled once per machine.

A fresh Python process otherwise compiles every program again (the chain's chunk, the set-up passes, the
kernel's init): seconds per call before the first draw. With the cache, the second process reads the
compiled executables from disk.

- **Where**: ``$XDG_CACHE_HOME/tallmh/jax/<key>`` (``~/.cache/tallmh/jax/<key>`` without XDG), where
  ``<key>`` names the jax, jaxlib and tallmh versions, so that an upgrade starts a new folder instead of
  reading entries written by another version (JAX's own cache keys also hash the compiler version; the
  separate folder keeps old entries from piling up in the one in use, and can simply be deleted).
- **Opt out**: ``TALLMH_COMPILATION_CACHE=0`` (or ``off``, ``false``, ``no``) in the environment before
  ``import tallmh``; any other non-empty value other than ``1`` is taken as the cache folder. In a
  running process, :func:`set_compilation_cache` with a path, or ``None`` to turn it off.
- **A user's own cache wins**: when ``jax_compilation_cache_dir`` is already set (``JAX_COMPILATION_CACHE_DIR``
  or ``jax.config.update``) before tallmh is imported, tallmh leaves it and JAX's thresholds alone.
- **What is cached**: every program whose compile takes at least ``MIN_COMPILE_TIME_S`` (JAX's default,
  1 s, would skip most of the set-up passes, which compile in 0.1-1 s each but add up). Programs with host
  callbacks (on-disk data sources) are never cached by JAX.

The cache folder is trusted code in effect (JAX's warning applies: do not point it at a folder others may
write to).
"""

from __future__ import annotations

import os
from typing import Optional

import jax

ENV = "TALLMH_COMPILATION_CACHE"
MIN_COMPILE_TIME_S = 0.0
_OFF = ("0", "off", "false", "no")

# what tallmh set, so that set_compilation_cache(None) undoes only its own setting
_state = {"dir": None, "owner": None}


def default_dir() -> str:
    """The default cache folder: ``$XDG_CACHE_HOME/tallmh/jax/<jax>-<jaxlib>-<tallmh>``."""
    from . import __version__

    try:
        import jaxlib

        jaxlib_v = jaxlib.__version__
    except Exception:  # pragma: no cover - jaxlib always ships with jax
        jaxlib_v = "unknown"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    key = f"jax{jax.__version__}-jaxlib{jaxlib_v}-tallmh{__version__}"
    return os.path.join(base, "tallmh", "jax", key)


def _reset_jax_cache():
    """Make JAX open the cache folder again at its next compile (it opens it once per process)."""
    try:
        from jax._src import compilation_cache as cc

        if cc.is_initialized():
            cc.reset_cache()
    except Exception:  # pragma: no cover - private API moved: the new folder takes effect in new processes
        pass


def set_compilation_cache(path: Optional[str]) -> Optional[str]:
    """Use ``path`` as JAX's persistent compilation cache for this process, or turn it off with ``None``.

    Compiled programs (the chains, the set-up passes) are written there and read back by later processes
    instead of being compiled again. Returns the folder in use (``None`` when off). Overrides a folder set
    by the user through JAX as well; to keep a folder of your own, set it in JAX and do not call this.
    """
    if path is None:
        jax.config.update("jax_compilation_cache_dir", None)
        _state.update(dir=None, owner=None)
        _reset_jax_cache()
        return None
    path = os.path.abspath(os.path.expanduser(str(path)))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_TIME_S)
    _state.update(dir=path, owner="tallmh")
    _reset_jax_cache()
    return path


def compilation_cache_dir() -> Optional[str]:
    """The persistent compilation cache folder JAX uses now (tallmh's or the user's), or ``None``."""
    return jax.config.jax_compilation_cache_dir


_SET_UP = []


def setup_default() -> Optional[str]:
    """Once per process, before tallmh first compiles: turn the cache on in the default folder, unless opted
    out or the user has their own (a later ``set_compilation_cache`` call is never overridden)."""
    if _SET_UP:
        return compilation_cache_dir()
    _SET_UP.append(True)
    value = os.environ.get(ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if jax.config.jax_compilation_cache_dir:  # the user's own folder: leave it and JAX's thresholds alone
        return None
    path = value if value and value != "1" else default_dir()
    try:
        return set_compilation_cache(path)
    except OSError:  # e.g. a read-only home: run without the cache
        return None
