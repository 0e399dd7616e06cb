"""Degenerate regression data named before sampling, one line each: a constant target (refused), exactly
collinear columns and columns that separate a binary target (kept, with a note saying what is then
decided by the prior rather than the data).

For a table read into memory the checks read it once more (``O(N d^2)`` for the collinearity, ``O(N d)``
for the rest), before any sampling; for a streamed or ``.npy`` table they are accumulated in the set-up's
first pass (:class:`DesignCheck`, block by block), which reads nothing more. They are part of the set-up,
not of a sampler's steps.
"""

from __future__ import annotations

from typing import List

import numpy as np

from ..models._target import check_target

__all__ = ["check_target", "design_notes", "DesignCheck", "binary_target", "COLLINEAR_RTOL"]

# the smallest singular value of the standardised design, relative to its largest, below which columns are
# taken as exactly collinear (float64 rounding of a dependence that holds exactly in the data)
COLLINEAR_RTOL = 1e-9


def binary_target(args) -> bool:
    """Whether ``tallmh run``'s target is 0/1 (the separation checks apply): logistic regression, or a formula
    of the Bernoulli family."""
    if getattr(args, "formula", None):
        return getattr(args, "family", None) == "bernoulli"
    return getattr(args, "model", "logistic") == "logistic"


class DesignCheck:
    """What the notes on degenerate data need, accumulated block by block (in memory: one block; a streamed or
    ``.npy`` table: the blocks of a pass the set-up already makes): the columns' means and centred
    cross-products (merged by the pairwise update of Chan, Golub and LeVeque, 1979, for the covariance),
    their raw cross-products without an intercept, and for a 0/1 target each column's range per outcome and,
    for a column of two values, which outcomes each value has. ``O(N d^2)`` flops, ``O(d^2)`` memory.

    ``names``: the feature columns (no intercept column); ``intercept``: whether the model adds one."""

    def __init__(self, names, target: str = "y", binary: bool = False, intercept: bool = True):
        d = len(names)
        self.names, self.target, self.binary, self.intercept = list(names), target, binary, intercept
        self.n = 0
        self.mean = np.zeros(d)
        self.m2 = np.zeros((d, d))  # centred cross-products
        self.raw = np.zeros((d, d))  # raw cross-products (no intercept)
        self.lo = np.full((2, d), np.inf)  # [outcome 0, outcome 1] x column
        self.hi = np.full((2, d), -np.inf)
        self.values = np.full((d, 2), np.nan)  # the first two distinct values of each column
        self.two = np.ones(d, bool)  # no third value seen
        self.seen = np.zeros((d, 2, 2), bool)  # column x value (first, second) x outcome
        self.count = np.zeros((d, 2), np.int64)

    def add(self, Z, y=None) -> "DesignCheck":
        """One block of rows: ``Z`` (rows, d) the features, ``y`` the target (needed for the separation)."""
        Z = np.asarray(Z)
        nb = Z.shape[0]
        if nb == 0 or Z.shape[1] == 0:
            return self
        k0 = None
        if self.binary and y is not None:  # rows of outcome 0 first, then 1: each outcome's rows a slice
            ones = np.asarray(y) == 1
            k0 = nb - int(ones.sum())
            Z = Z[np.concatenate([np.flatnonzero(~ones), np.flatnonzero(ones)])]
        ZT = np.array(Z, np.float64, order="F").T  # (d, rows), each column's values contiguous
        mb = ZT.mean(axis=1)
        C = ZT - mb[:, None]
        if self.n == 0:
            self.mean, self.m2 = mb, C @ C.T
        else:
            delta = mb - self.mean
            tot = self.n + nb
            self.m2 = self.m2 + C @ C.T + np.outer(delta, delta) * (self.n * nb / tot)
            self.mean = self.mean + delta * (nb / tot)
        self.n += nb
        if not self.intercept:
            self.raw += ZT @ ZT.T
        if k0 is not None:
            self._add_outcomes(ZT, k0)
        return self

    def _add_outcomes(self, ZT, k0):
        """``ZT`` (d, rows): the rows of outcome 0 are ``ZT[:, :k0]``, those of outcome 1 the rest."""
        for k, part in ((0, ZT[:, :k0]), (1, ZT[:, k0:])):
            if part.shape[1]:
                self.lo[k] = np.minimum(self.lo[k], part.min(axis=1))
                self.hi[k] = np.maximum(self.hi[k], part.max(axis=1))
        cols = np.flatnonzero(self.two)  # only the columns that have shown at most two values so far
        if not cols.size:
            return
        Zc = ZT[cols]
        v = self.values[cols]
        first = np.isnan(v[:, 0])
        v[first, 0] = Zc[first, 0]
        other = Zc != v[:, :1]
        need = np.isnan(v[:, 1]) & other.any(axis=1)
        if need.any():
            at = np.argmax(other[need], axis=1)
            v[need, 1] = Zc[np.flatnonzero(need), at]
        self.values[cols] = v
        is0, is1 = ~other, Zc == v[:, 1:]
        self.two[cols] &= np.all(is0 | is1, axis=1)
        for i, hit in enumerate((is0, is1)):
            self.count[cols, i] += hit.sum(axis=1)
            self.seen[cols, i, 0] |= hit[:, :k0].any(axis=1)
            self.seen[cols, i, 1] |= hit[:, k0:].any(axis=1)

    def collinear(self) -> List[str]:
        """The columns of one exact linear dependence among the design's columns (the intercept included)."""
        n, d = self.n, len(self.names)
        if n == 0 or d == 0:
            return []
        if self.intercept:
            # with an intercept, a dependence is one among the centred columns (plus a constant): their
            # correlation matrix is singular; the intercept takes part when the combination is not 0
            sd = np.sqrt(np.maximum(np.diag(self.m2), 0.0) / n)
            if np.any(sd == 0):  # a constant column beside the intercept
                return ["intercept", self.names[int(np.flatnonzero(sd == 0)[0])]]
            G = self.m2 / n / np.outer(sd, sd)
        else:
            rms = np.sqrt(np.diag(self.raw) / n)
            if np.any(rms == 0):
                return [self.names[int(np.flatnonzero(rms == 0)[0])]]
            G = self.raw / n / np.outer(rms, rms)
        w, vec = np.linalg.eigh(G)
        if w[-1] <= 0 or w[0] > COLLINEAR_RTOL * w[-1]:
            return []
        null = vec[:, 0]
        big = np.abs(null).max()
        out = [self.names[j] for j in np.flatnonzero(np.abs(null) > 0.05 * big)]
        if self.intercept:
            const = abs(float(null @ (self.mean / sd)))  # the constant the centred combination equals
            if const > 0.05 * max(big, const):
                out.insert(0, "intercept")
        return out

    def separating(self) -> List[str]:
        """Notes for the columns that separate a 0/1 target, completely or quasi-completely."""
        notes = []
        if not self.binary or not (np.isfinite(self.lo[0]).all() and np.isfinite(self.lo[1]).all()):
            return notes  # (a target of one outcome is refused before)
        target = self.target
        for j, nm in enumerate(self.names):
            if self.two[j] and not np.isnan(self.values[j, 1]):  # a 0/1 (dummy) column
                for i in np.argsort(self.values[j]):  # (values in increasing order)
                    s0, s1 = self.seen[j, i]
                    if s0 != s1:
                        out, v = (1 if s1 else 0), self.values[j, i]
                        notes.append(f"column {nm!r} separates the target: every row with {nm} = {v:g} has {target} = "
                                     f"{out:g} ({self.count[j, i]:,} rows), so its coefficient is decided by the prior "
                                     "in that direction (a larger |coefficient| fits the data as well)")
                        break
            elif self.hi[0, j] <= self.lo[1, j] or self.hi[1, j] <= self.lo[0, j]:
                side = "above" if self.hi[0, j] <= self.lo[1, j] else "below"
                cut = self.hi[0, j] if side == "above" else self.lo[0, j]
                notes.append(f"column {nm!r} separates the target: {target} = 1 {side} {nm} = {cut:g} and 0 on the "
                             "other side, so its coefficient is decided by the prior (the likelihood grows without bound)")
        return notes

    def notes(self) -> List[str]:
        """One line per degenerate feature: exactly collinear columns, and for a 0/1 target the columns that
        separate it."""
        notes = []
        dep = self.collinear()
        if dep:
            notes.append(f"columns {', '.join(dep)} are exactly collinear (one is a linear combination of the "
                         "others): only their combinations are identified by the data; each coefficient alone is "
                         "decided by the prior (drop one column, e.g. one level of a one-hot coding, to avoid it)")
        return notes + self.separating()


def design_notes(Z, y, names, target: str, binary: bool, intercept: bool, block: int = 1 << 16) -> List[str]:
    """One line per degenerate feature of the design ``Z`` (N, p) (the features as read, no intercept
    column): exactly collinear columns, and for a 0/1 target the columns that separate it. Read in blocks of
    ``block`` rows (a bounded copy)."""
    check = DesignCheck(names, target, binary, intercept)
    for a in range(0, len(Z), block):
        check.add(Z[a:a + block], None if y is None else np.asarray(y[a:a + block]))
    return check.notes()
