"""The target check the regression models make before sampling (a constant target is refused)."""

from __future__ import annotations

import numpy as np

from ..errors import DataError


def check_target(y, target: str = "y") -> None:
    """:class:`DataError` when the target is constant: there is nothing to regress, and every coefficient
    would follow its prior. Reads the target once (N values)."""
    y = np.asarray(y)
    if y.size > 1 and np.all(y == y.flat[0]):
        raise DataError(f"the target {target!r} is constant (every one of its {y.size:,} values is "
                        f"{float(y.flat[0]):g}): there is nothing to learn from it; check the column")
