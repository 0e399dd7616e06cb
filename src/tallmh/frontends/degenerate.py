"""Degenerate regression data named before sampling, one line each: a constant target (refused), exactly
collinear columns and columns that separate a binary target (kept, with a note saying what is then
decided by the prior rather than the data).

These checks read the table once more in memory (``O(N d^2)`` for the collinearity, ``O(N d)`` for the
rest), before any sampling; they are part of ``tallmh run``'s set-up, not of a sampler's steps.
"""

from __future__ import annotations

from typing import List

import numpy as np

from ..models._target import check_target

__all__ = ["check_target", "design_notes", "COLLINEAR_RTOL"]

# the smallest singular value of the standardised design, relative to its largest, below which columns are
# taken as exactly collinear (float64 rounding of a dependence that holds exactly in the data)
COLLINEAR_RTOL = 1e-9


def _collinear(Z: np.ndarray, names: List[str], intercept: bool) -> List[str]:
    """The columns of one exact linear dependence among the design's columns (with the intercept)."""
    n = Z.shape[0]
    cols = np.column_stack([np.ones(n), Z]) if intercept else Z
    full = (["intercept"] if intercept else []) + list(names)
    sd = cols.std(axis=0)
    scale = np.where(sd > 0, sd, np.abs(cols).max(axis=0))
    scale = np.where(scale > 0, scale, 1.0)
    if intercept:
        scale[0] = 1.0
    C = cols / scale
    G = C.T @ C / n
    w, v = np.linalg.eigh(G)
    if w[-1] <= 0 or w[0] > COLLINEAR_RTOL * w[-1]:
        return []
    null = np.abs(v[:, 0])
    return [full[j] for j in np.flatnonzero(null > 0.05 * null.max())]


def _separating(Z: np.ndarray, y: np.ndarray, names: List[str], target: str) -> List[str]:
    """Notes for the columns that separate a 0/1 target, completely or quasi-completely."""
    notes = []
    ones = y == 1
    if ones.all() or not ones.any():
        return notes
    for j, nm in enumerate(names):
        x = Z[:, j]
        a, b = x[~ones], x[ones]
        values = np.unique(x)
        if values.size == 2:  # a 0/1 (dummy) column: one of its values with only one outcome
            for v in values:
                hit = y[x == v]
                if hit.size and np.all(hit == hit[0]):
                    notes.append(f"column {nm!r} separates the target: every row with {nm} = {v:g} has {target} = "
                                 f"{hit[0]:g} ({hit.size:,} rows), so its coefficient is decided by the prior in "
                                 "that direction (a larger |coefficient| fits the data as well)")
                    break
        elif a.max() <= b.min() or b.max() <= a.min():
            side = "above" if a.max() <= b.min() else "below"
            cut = a.max() if side == "above" else a.min()
            notes.append(f"column {nm!r} separates the target: {target} = 1 {side} {nm} = {cut:g} and 0 on the other "
                         "side, so its coefficient is decided by the prior (the likelihood grows without bound)")
    return notes


def design_notes(Z, y, names, target: str, binary: bool, intercept: bool) -> List[str]:
    """One line per degenerate feature of the design ``Z`` (N, p) (the features as read, no intercept
    column): exactly collinear columns, and for a 0/1 target the columns that separate it."""
    Z = np.asarray(Z, np.float64)
    y = np.asarray(y, np.float64)
    notes = []
    if Z.shape[0] and Z.shape[1]:
        dep = _collinear(Z, list(names), intercept)
        if dep:
            notes.append(f"columns {', '.join(dep)} are exactly collinear (one is a linear combination of the "
                         "others): only their combinations are identified by the data; each coefficient alone is "
                         "decided by the prior (drop one column, e.g. one level of a one-hot coding, to avoid it)")
        if binary:
            notes.extend(_separating(Z, y, list(names), target))
    return notes
