"""One BLAS thread for the calling thread while tallmh's host passes run.

NumPy's OpenBLAS splits each matrix product over all cores. The set-up's host passes (the Newton passes in
blocks of 65,536 rows, the check of degenerate columns, the exact test's table) make many small products,
beside the chain's compile on the same cores: there OpenBLAS's threads waited for each other. Measured on
the logistic model's gradient-and-Hessian pass at N = 10^6, d = 11, 2 cores shared with other jobs (load 10):
0.69-0.72 s wall and 0.27-0.28 CPU s per pass with OpenBLAS's default threads, 0.15-0.17 s wall and 0.06-0.07
CPU s with one (``benchmarks/host_pass_blas.py``). The sums then no longer depend on the number of cores
either: with several threads OpenBLAS split the gradient's product ``X^T r`` over rows, and its last bits with
them (the Hessian's product was split over its 11 columns, the same bits).

OpenBLAS 0.3.27 and later sets a thread count for the calling thread alone (``openblas_set_num_threads_local``):
:func:`one_thread` uses it for tallmh's own threads and the call's, and restores the previous count after.
Elsewhere (another BLAS, an older OpenBLAS, no ``/proc``) it does nothing.
"""

from __future__ import annotations

import contextlib

__all__ = ["one_thread"]

_SETTERS: list = []  # [list of ctypes functions], found once


def _setters() -> list:
    if _SETTERS:
        return _SETTERS[0]
    found = []
    try:
        import ctypes

        import numpy  # noqa: F401 - (its OpenBLAS is loaded with it)

        paths = []
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1] if line.strip() else ""
                if "openblas" in p.lower() and ".so" in p and p not in paths:
                    paths.append(p)
        for p in paths:
            fn = getattr(ctypes.CDLL(p), "openblas_set_num_threads_local", None)
            if fn is not None:
                fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_int]
                found.append(fn)
    except (OSError, AttributeError, ImportError):
        found = []
    _SETTERS.append(found)
    return found


@contextlib.contextmanager
def one_thread():
    """Within this block, OpenBLAS (NumPy's) runs the calling thread's products on one thread."""
    saved = []
    for fn in _setters():
        try:
            saved.append((fn, fn(1)))
        except Exception:  # noqa: BLE001 - (a foreign library of the same name): left alone
            pass
    try:
        yield
    finally:
        for fn, prev in saved:
            try:
                fn(max(1, int(prev)))
            except Exception:  # noqa: BLE001
                pass
