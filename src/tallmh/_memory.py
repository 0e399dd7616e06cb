"""Freed heap memory handed back to the operating system between the stages of a run.

glibc's ``malloc`` keeps memory that a program frees inside its heaps (one per thread that allocated, up to
eight per core) unless it lies at the top of the main heap, so that the next allocation can reuse it. A freed
block in one thread's heap is not reused by another thread's allocations: a run's stages (the conversion in the
calling thread, the set-up's passes, the chain's compile in a thread of its own, the convergence checks) each
leave hundreds of MB freed but resident, and the process's peak resident size is their sum rather than the
largest stage's. :func:`release` calls ``malloc_trim(0)``, which returns every heap's free pages (glibc 2.8 and
later), at the boundaries where a stage's temporaries have just been freed. It costs a few milliseconds and
changes no result. Elsewhere (musl, macOS, Windows: no ``malloc_trim``) it does nothing.
"""

from __future__ import annotations

__all__ = ["release"]

_TRIM: list = []  # [the C function or None], looked up once


def _trim_fn():
    if not _TRIM:
        fn = None
        try:
            import ctypes

            fn = getattr(ctypes.CDLL(None), "malloc_trim", None)  # (the process's own symbols: glibc's, if loaded)
            if fn is not None:
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
        except Exception:  # pragma: no cover - no C library to look in: nothing to trim
            fn = None
        _TRIM.append(fn)
    return _TRIM[0]


def release() -> bool:
    """Return the C heap's freed pages to the operating system (``malloc_trim(0)`` where glibc has it). True when
    the call was made."""
    fn = _trim_fn()
    if fn is None:
        return False
    fn(0)
    return True
