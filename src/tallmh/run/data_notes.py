"""Degenerate columns of a built-in regression's design named before sampling, through ``tallmh.sample``.

For the built-in logistic, linear and Poisson regressions (``data = {"X": (N, d), "y": (N,)}``) held in
memory, one extra pass over ``X`` on the host (``O(N d^2)`` flops, in blocks of 65,536 rows; counted in the
run's set-up items; made in a thread while the set-up's passes and the chain's compile run, and awaited before
the first draw) finds exactly collinear columns (a one-hot coding of every level beside a column of ones)
and, for the logistic regression, columns that separate the 0/1 target, with
:class:`tallmh.frontends.degenerate.DesignCheck`, the check ``tallmh run`` makes. Each is said in one line
(``result.notes``, a ``UserWarning`` before sampling, and a ``data note:`` line of ``summary()``): along
those directions the posterior is the prior's, not the data's. Data in files (``tallmh.data.from_npy``)
is not checked here (an extra pass over a table on disk costs as much as the set-up's own passes); the
command line checks such tables in its first pass.
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np

__all__ = ["start", "name_degenerate", "checked_by_caller", "BLOCK_ROWS", "PREFIX"]

_CALLERS_CHECK = [0]  # > 0 while a caller that named the columns itself (tallmh run) calls tm.sample


@contextlib.contextmanager
def checked_by_caller():
    """Within this block ``tallmh.sample`` leaves the check to its caller (``tallmh run`` names a table's
    columns by their names, in its own set-up), so nothing is said twice or read twice."""
    _CALLERS_CHECK[0] += 1
    try:
        yield
    finally:
        _CALLERS_CHECK[0] -= 1

BLOCK_ROWS = 1 << 16
PREFIX = "data note: "
_MODELS = {"LogisticRegression": True, "LinearRegression": False, "PoissonRegression": False}  # binary target?


def _kind(model):
    """Whether ``model`` is one of the built-in regressions (the class or a subclass): ``None`` if not, else
    whether its target is 0/1."""
    for cls in type(model).__mro__:
        if cls.__name__ in _MODELS and cls.__module__.startswith("tallmh."):
            return _MODELS[cls.__name__]
    return None


def _in_memory(a) -> bool:
    import jax

    from ..storage import datasource as ds

    return (isinstance(a, np.ndarray) and not isinstance(a, np.memmap)) or isinstance(a, (jax.Array, ds.InPlaceArray))


def notes_of(X, y, binary: bool) -> list:
    """The notes for a design ``X`` (N, d) and target ``y``: a constant column of ones (or of any non-zero
    value) is taken as the intercept; other constant columns are named as collinear with it."""
    from ..frontends.degenerate import DesignCheck

    n, d = X.shape
    if n < 2 or d == 0:
        return []
    names = [f"X[:, {j}]" for j in range(d)]
    head = np.asarray(X[:BLOCK_ROWS])
    maybe = np.flatnonzero(np.all(head == head[:1], axis=0))  # constant in the first block; then in all rows
    const = np.array([j for j in maybe if np.all(np.asarray(X[:, j]) == head[0, j])], int)
    nonzero = [j for j in const if X[0, j] != 0]
    if len(const) > 1 or (len(const) == 1 and not nonzero):
        return [f"columns {', '.join(names[j] for j in const)} are exactly collinear (constant columns: one "
                "is a multiple of another, or all zeros): each coefficient alone is decided by the prior; "
                "keep one column of ones at most"]
    keep = [j for j in range(d) if j not in const]
    check = DesignCheck([names[j] for j in keep], "y", binary=binary, intercept=bool(nonzero))
    for a in range(0, n, BLOCK_ROWS):
        block = np.asarray(X[a:a + BLOCK_ROWS], np.float64)
        if not np.all(np.isfinite(block)):  # (the data's finiteness check names such rows, with their place)
            return []
        check.add(block[:, keep], np.asarray(y[a:a + BLOCK_ROWS]) if y is not None else None)
    notes = check.notes()
    if nonzero:
        notes = [m.replace("columns intercept,", f"columns {names[nonzero[0]]} (the intercept),") for m in notes]
    return notes


def start(run) -> None:
    """Start the check of a built-in regression's in-memory design in a thread (``run.degenerate``), where it
    applies (not for data read from files, nor where the caller checks the table itself): its notes are taken by
    :func:`name_degenerate` before sampling."""
    from ..storage import datasource as ds
    from . import threads

    run.degenerate = None
    binary = _kind(run.model)
    data = run.data
    if _CALLERS_CHECK[0] or binary is None or not isinstance(data, dict) or "X" not in data or ds.in_files(data):
        return
    X, y = data["X"], data.get("y")
    if not _in_memory(X) or np.ndim(X) != 2 or (y is not None and not _in_memory(y)):
        return
    X = np.asarray(X)
    y = None if y is None else np.asarray(y)
    run.degenerate = (X.shape[0], threads.started(lambda: notes_of(X, y, binary)))


def name_degenerate(run) -> None:
    """Adds a note for each degenerate column that :func:`start`'s check found to ``run.notes`` (warned once,
    before sampling), and its pass to ``run.setup_items``."""
    pending = getattr(run, "degenerate", None)
    if pending is None:
        return
    run.degenerate = None
    rows, job = pending
    notes = job.result()
    run.setup_items = int(getattr(run, "setup_items", 0) or 0) + rows
    for m in notes:
        msg = PREFIX + m + f" (found in one extra pass over the {rows:,} rows before sampling)"
        if msg not in run.notes:
            run.notes.append(msg)
            warnings.warn(msg, UserWarning, stacklevel=3)
