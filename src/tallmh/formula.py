"""Regressions written as formulas, ``"y ~ x + C(g)"``, for ``tallmh run --formula ... --family ...``.

The formula is parsed and the design matrix built by formulaic (``pip install formulaic``): numeric
columns enter as they are, ``C(column)`` codes a categorical column as treatment contrasts against its
first level (columns named ``C(g)[T.b]``, ...), interactions and transforms follow formulaic's grammar,
and ``0 +`` or ``- 1`` drops the intercept. The response is the formula's left-hand side.

Families: ``bernoulli`` (logistic regression; the response holds 0 and 1), ``gaussian`` (linear
regression) and ``poisson`` (log link; the response holds counts), each with independent
``N(0, prior_scale^2)`` priors on the coefficients.
"""

from __future__ import annotations

import os
from typing import List, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import gammaln

from .errors import ConfigError, DataError
from .model import Model

__all__ = ["FAMILIES", "FormulaDesign", "load_design", "PoissonRegression"]

# family -> the CLI's regression model
FAMILIES = {"bernoulli": "logistic", "gaussian": "linear", "poisson": "poisson"}


class FormulaDesign(NamedTuple):
    """``X`` (N, p) float64 without the intercept column, ``y`` (N,), the columns' ``names``, whether the
    formula has an ``intercept``, and the ``target`` (the left-hand side)."""

    X: np.ndarray
    y: np.ndarray
    names: List[str]
    intercept: bool
    target: str


def _formulaic():
    try:
        import formulaic  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError("--formula needs formulaic: pip install formulaic (or pip install 'tallmh[formula]')") from e
    import formulaic

    return formulaic


def _read(path: str, columns):
    import pandas as pd

    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    ext = os.path.splitext(path)[1].lower()
    try:
        if ext == ".csv":
            head = pd.read_csv(path, nrows=0)
            missing = [c for c in columns if c not in head.columns]
            if missing:
                raise DataError(f"{path} has no column {missing[0]!r} (its columns: {list(head.columns)})")
            return pd.read_csv(path, usecols=list(columns))
        if ext == ".parquet":
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names
            missing = [c for c in columns if c not in names]
            if missing:
                raise DataError(f"{path} has no column {missing[0]!r} (its columns: {names})")
            return pd.read_parquet(path, columns=list(columns))
        if ext == ".npz":
            with np.load(path, allow_pickle=False) as z:
                missing = [c for c in columns if c not in z.files]
                if missing:
                    raise DataError(f"{path} has no column {missing[0]!r} (its columns: {list(z.files)})")
                return pd.DataFrame({c: z[c] for c in columns})
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001 - one line
        raise DataError(f"cannot read {path}: {type(e).__name__}: {e}") from None
    raise DataError(f"{path}: --formula reads .csv, .parquet or .npz tables (named columns)")


def load_design(path: str, formula: str, family: str, *, min_rows: int = 1) -> FormulaDesign:
    """Read the columns ``formula`` names from the table at ``path`` and build its design (see the module).

    Raises :class:`~tallmh.DataError` (one line) for a missing file or column, missing values in the
    columns used, a response that does not fit ``family``, a constant design column, and fewer than
    ``min_rows`` rows; :class:`~tallmh.ConfigError` for a formula without a response or an unknown family.
    """
    if family not in FAMILIES:
        raise ConfigError(f"--family must be one of {sorted(FAMILIES)}; got {family!r}")
    formulaic = _formulaic()
    try:
        f = formulaic.Formula(formula)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"--formula {formula!r} cannot be parsed: {e}") from None
    if not hasattr(f, "lhs") or len(f.lhs) == 0:
        raise ConfigError(f"--formula {formula!r} has no response: write it as 'y ~ x + C(g)'")
    columns = sorted(f.required_variables)
    frame = _read(os.fspath(path), columns)
    bad = [c for c in columns if frame[c].isna().any()]
    if bad:
        raise DataError(f"column {bad[0]!r} has missing values: drop or fill those rows first")
    if len(frame) < min_rows:
        raise DataError(f"the table has {len(frame)} rows, fewer than the batch size {min_rows}")
    try:
        mm = formulaic.model_matrix(f, frame, na_action="raise")
    except Exception as e:  # noqa: BLE001
        raise DataError(f"--formula {formula!r} on {path}: {type(e).__name__}: {str(e).splitlines()[0]}") from None
    lhs, rhs = mm.lhs, mm.rhs
    if lhs.shape[1] != 1:
        raise ConfigError(f"--formula {formula!r}: the response must be one column (it gives {lhs.shape[1]})")
    target = str(lhs.columns[0])
    y = np.asarray(lhs, dtype=np.float64).reshape(-1)
    names = [str(c) for c in rhs.columns]
    X = np.asarray(rhs, dtype=np.float64)
    intercept = "Intercept" in names
    if intercept:
        j = names.index("Intercept")
        X = np.delete(X, j, axis=1)
        names.pop(j)
    if X.shape[1] == 0:
        raise DataError(f"--formula {formula!r} has no predictor column")
    sd = X.std(axis=0)
    if np.any(sd == 0):
        raise DataError(f"design column {names[int(np.argmax(sd == 0))]!r} is constant on this table")
    if family == "bernoulli" and not np.all((y == 0) | (y == 1)):
        raise DataError(f"--family bernoulli needs a response {target!r} of 0 and 1")
    if family == "poisson" and not np.all((y >= 0) & (y == np.round(y))):
        raise DataError(f"--family poisson needs a response {target!r} of non-negative whole counts")
    return FormulaDesign(X, y, names, intercept, target)


class PoissonRegression(Model):
    """``y_i ~ Poisson(exp(x_i . theta))``, ``theta ~ N(0, prior_scale^2 I)``.

    Data: ``{"X": (N, d), "y": (N,) counts}``; add a column of ones to X for an intercept.
    """

    name = "poisson-regression"

    def __init__(self, prior_scale: float = 10.0):
        if not (np.isfinite(prior_scale) and prior_scale > 0):
            raise ConfigError(f"prior_scale must be positive; got {prior_scale}")
        self.prior_scale = float(prior_scale)

    def log_prior(self, theta):
        s = self.prior_scale
        return -0.5 * jnp.sum(theta**2) / s**2 - theta.shape[0] * (np.log(s) + 0.5 * np.log(2 * np.pi))

    def log_lik(self, theta, batch):
        eta = batch["X"] @ theta
        y = batch["y"]
        return y * eta - jnp.exp(eta) - gammaln(y + 1.0)

    def init(self, data):
        return jnp.zeros(np.shape(data["X"])[1])

    def describe_prior(self):
        return f"N(0, {self.prior_scale:g}^2) on each coefficient"
