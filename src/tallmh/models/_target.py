"""The target check the regression models make before sampling (a constant target is refused)."""

from __future__ import annotations

import numpy as np

from ..errors import DataError


def check_target(y, target: str = "y") -> None:
    """:class:`DataError` when the target is constant: there is nothing to regress, and every coefficient
    would follow its prior. Reads the target in growing runs from its start and stops at the first value that
    differs from the first (a few values for most targets, all N only for a constant one: at N = 10^9 in a
    file, reading all of it took seconds before the set-up's first pass)."""
    y = np.asarray(y) if not isinstance(y, np.ndarray) else y
    flat = y.reshape(-1) if y.ndim != 1 else y
    if flat.size <= 1:
        return
    first = flat[0]
    at, step = 0, 64
    while at < flat.size:
        if not np.all(flat[at:at + step] == first):
            return
        at += step
        step = min(step * 4, 1 << 22)
    raise DataError(f"the target {target!r} is constant (every one of its {y.size:,} values is "
                    f"{float(first):g}): there is nothing to learn from it; check the column")
