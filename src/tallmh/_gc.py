"""Fewer runs of Python's cyclic garbage collector while a run traces and compiles its programs.

Python collects its youngest generation of container objects after every 700 net allocations (``gc.get_threshold``)
and, every tenth and hundredth time, the older ones. Tracing and lowering a chain to XLA allocates millions of
short-lived objects, almost all freed by reference counting: a fresh ``tm.sample`` of the logistic regression at
N = 10^6 ran the collector about 120 times (once over every object the process holds), 0.10-0.17 s of its CPU, and
found next to nothing. :func:`fewer_collections` raises the youngest generation's threshold to ``YOUNG`` for the
duration of a call (the older generations' ratios unchanged) and puts the caller's thresholds back afterwards:
garbage in reference cycles is still collected, later. Nested and concurrent calls share one raise; thresholds the
caller changed meanwhile are left as the caller set them. Nothing else (what is collected, finalisers) changes.
"""

from __future__ import annotations

import contextlib
import gc
import threading

__all__ = ["fewer_collections", "YOUNG"]

YOUNG = 100_000  # the youngest generation's threshold during a call (Python's default: 700)
_LOCK = threading.Lock()
_STATE = {"depth": 0, "saved": None, "set": None}


@contextlib.contextmanager
def fewer_collections():
    """Within the block, the cyclic collector's youngest generation is collected after ``YOUNG`` allocations
    instead of the caller's threshold (unless the caller's is larger, or 0: automatic collection off)."""
    with _LOCK:
        if _STATE["depth"] == 0:
            old = gc.get_threshold()
            _STATE["saved"], _STATE["set"] = old, None
            if 0 < old[0] < YOUNG:
                new = (YOUNG,) + tuple(old[1:])
                gc.set_threshold(*new)
                _STATE["set"] = new
        _STATE["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0 and _STATE["set"] is not None and gc.get_threshold() == _STATE["set"]:
                gc.set_threshold(*_STATE["saved"])
