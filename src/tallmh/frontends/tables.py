"""Reading a table's columns in blocks (CSV or Parquet, never whole), and the record of a design's scaling.

The primitives that both the in-memory design (:mod:`.design`), the formula front end (:mod:`.formula`) and
the on-disk design cache (:mod:`.design_cache`) build on; nothing here imports them.
"""

from __future__ import annotations

import os

import numpy as np

from ..console import first_line
from ..errors import DataError

__all__ = ["split_features", "scaling_of", "header", "as_numbers", "table_frames", "table_blocks"]


def split_features(values):
    """``--features a b,c`` as ``["a", "b", "c"]`` (None when none are named)."""
    if values is None:
        return None
    out = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out or None


def scaling_of(standardised: bool, intercept: bool, features, center, scale) -> dict:
    """The record of how the features were scaled (saved in results.json as ``standardisation``)."""
    return {"standardised": standardised, "intercept": intercept, "features": features,
            "center": center, "scale": scale,
            "how": ("x_std = (x - center) / scale for each feature; coefficients on the original scale: "
                    "beta_j = b_j / scale_j" + ("; intercept = b_0 - sum_j b_j center_j / scale_j" if intercept
                                               else ""))}


def header(path: str):
    """The column names of a CSV or Parquet table (read without its rows)."""
    try:
        if path.lower().endswith(".csv"):
            import pandas as pd

            return [str(c) for c in pd.read_csv(path, nrows=0).columns]
        import pyarrow.parquet as pq

        return list(pq.read_schema(path).names)
    except ImportError:
        raise DataError("reading Parquet needs pyarrow: pip install pyarrow") from None
    except Exception as e:  # noqa: BLE001 - the reader's own error, in one line
        msg = first_line(e)
        raise DataError(f"cannot read {path}: {msg}") from None


def as_numbers(frame, columns, roles):
    """A block's columns as one float64 array; a column that is not numeric is refused."""
    out = np.empty((len(frame), len(columns)))
    for j, (c, role) in enumerate(zip(columns, roles)):
        v = frame[c].to_numpy()
        if v.dtype != bool and not np.issubdtype(v.dtype, np.number):
            example = next((x for x in v[:50] if isinstance(x, str)), None)
            what = f" (e.g. {example!r})" if example is not None else ""
            raise DataError(f"{role} column {c!r} is not numeric{what}; encode it as numbers first")
        out[:, j] = v
    return out


def table_frames(path: str, columns, rows: int, progress=None):
    """The ``columns`` of a CSV or Parquet table as pandas DataFrames of at most ``rows`` rows each, read in
    order and never whole; ``progress(rows_so_far, share_of_the_file)`` after each block."""
    done = 0
    if path.lower().endswith(".csv"):
        import pandas as pd

        with open(path, "rb") as fh:
            size = max(os.fstat(fh.fileno()).st_size, 1)
            for chunk in pd.read_csv(fh, usecols=list(columns), chunksize=rows):
                done += len(chunk)
                if progress:
                    progress(done, min(fh.tell() / size, 1.0))
                yield chunk
        return
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    total = max(pf.metadata.num_rows, 1)
    for batch in pf.iter_batches(batch_size=rows, columns=list(columns)):
        done += batch.num_rows
        if progress:
            progress(done, done / total)
        yield batch.to_pandas()


def table_blocks(path: str, columns, rows: int, progress=None):
    """:func:`table_frames` as float64 arrays (the columns in the order given; the first is the target)."""
    roles = ["target"] + ["feature"] * (len(columns) - 1)
    for frame in table_frames(path, columns, rows, progress):
        yield as_numbers(frame, columns, roles)
