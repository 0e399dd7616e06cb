"""Regressions written as formulas, ``"y ~ x + C(g)"``, for ``tallmh run --formula ... --family ...``.

The formula is parsed and the design matrix built by formulaic (``pip install formulaic``): numeric
columns enter as they are, ``C(column)`` codes a categorical column as treatment contrasts against its
first level (columns named ``C(g)[T.b]``, ...), interactions and transforms follow formulaic's grammar,
and ``0 +`` or ``- 1`` drops the intercept. The response is the formula's left-hand side.

Families: ``bernoulli`` (logistic regression; the response holds 0 and 1), ``gaussian`` (linear
regression), ``poisson`` (log link; the response holds counts) and ``negativebinomial`` (NB2 with a log
link and a dispersion sampled on the log scale; counts), each with independent ``N(0, prior_scale^2)``
priors on the coefficients.

A table too large for memory is built block by block (:func:`design_blocks`): a first cheap pass over the
categorical columns gathers their levels, formulaic's model spec is made on the first block with those
levels, and every block is then coded by the same spec, so the columns agree across blocks.
"""

from __future__ import annotations

import os
from typing import List, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax.scipy.special import digamma, gammaln, polygamma

from ..console import first_line
from ..errors import ConfigError, DataError
from ..model import Model

__all__ = ["FAMILIES", "FormulaDesign", "load_design", "design_blocks", "PoissonRegression",
           "NegativeBinomialRegression"]

# family -> the CLI's regression model
FAMILIES = {"bernoulli": "logistic", "gaussian": "linear", "poisson": "poisson",
            "negativebinomial": "negativebinomial"}
COUNT_FAMILIES = ("poisson", "negativebinomial")


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


def _parse(formula: str, family: str):
    """The formulaic Formula of ``formula`` (with a response), or a one-line ConfigError."""
    if family not in FAMILIES:
        raise ConfigError(f"--family must be one of {sorted(FAMILIES)}; got {family!r}")
    formulaic = _formulaic()
    try:
        f = formulaic.Formula(formula)
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"--formula {formula!r} cannot be parsed: {e}") from None
    if not hasattr(f, "lhs") or len(f.lhs) == 0:
        raise ConfigError(f"--formula {formula!r} has no response: write it as 'y ~ x + C(g)'")
    return formulaic, f


def load_design(path: str, formula: str, family: str, *, min_rows: int = 1) -> FormulaDesign:
    """Read the columns ``formula`` names from the table at ``path`` and build its design (see the module).

    Raises :class:`~tallmh.DataError` (one line) for a missing file or column, missing values in the
    columns used, a response that does not fit ``family``, a constant design column, and fewer than
    ``min_rows`` rows; :class:`~tallmh.ConfigError` for a formula without a response or an unknown family.
    """
    formulaic, f = _parse(formula, family)
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
        raise DataError(f"--formula {formula!r} on {path}: {type(e).__name__}: {first_line(e)}") from None
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
    _check_response(y, family, target)
    return FormulaDesign(X, y, names, intercept, target)


def _check_response(y, family, target):
    if family == "bernoulli" and not np.all((y == 0) | (y == 1)):
        raise DataError(f"--family bernoulli needs a response {target!r} of 0 and 1")
    if family in COUNT_FAMILIES and not np.all((y >= 0) & (y == np.round(y))):
        raise DataError(f"--family {family} needs a response {target!r} of non-negative whole counts")


def _categorical_columns(formula: str, head):
    """The columns coded as categories: those not numeric in the table's first block, and those a ``C()``
    names."""
    import re

    named = set(re.findall(r"C\(\s*([A-Za-z_][A-Za-z0-9_.]*)", formula))
    return [c for c in head.columns
            if c in named or not (np.issubdtype(head[c].dtype, np.number) or head[c].dtype == bool)]


def _levels(path, cats, rows):
    """Pass 0: every level of each categorical column (only those columns are read), sorted."""
    from .tables import table_frames

    seen = {c: set() for c in cats}
    for frame in table_frames(path, cats, rows):
        for c in cats:
            seen[c].update(v for v in frame[c].unique() if not (isinstance(v, float) and np.isnan(v)))
    out = {}
    for c, vals in seen.items():
        try:
            out[c] = sorted(vals)
        except TypeError:  # mixed types: by their text
            out[c] = sorted(vals, key=str)
    return out


def _coded(frame, columns, levels):
    """A block with its missing values refused and its categorical columns given every level."""
    import pandas as pd

    for c in columns:
        if frame[c].isna().any():
            raise DataError(f"column {c!r} has missing values: drop or fill those rows first")
    for c, lv in levels.items():
        frame[c] = pd.Categorical(frame[c], categories=lv)
    return frame


def design_blocks(path: str, formula: str, family: str, rows: int, progress=None):
    """The design of ``formula`` on a CSV or Parquet table built block by block, never whole (see the module).

    Returns ``(target, names, intercept, blocks)``: the response's name, the design columns' names
    (without the intercept), whether the formula has an intercept, and an iterator of float64 arrays
    ``[y, X without the intercept]`` of at most ``rows`` rows. Refusals as :func:`load_design`, raised
    from the block where the problem is found.
    """
    from .tables import table_frames

    formulaic, f = _parse(formula, family)
    columns = sorted(f.required_variables)
    frames = table_frames(path, columns, rows, progress)
    first = next(frames, None)
    if first is None:
        raise DataError(f"{path} holds no rows")
    levels = _levels(path, _categorical_columns(formula, first), rows)
    try:
        mm = formulaic.model_matrix(f, _coded(first, columns, levels), na_action="raise")
    except DataError:
        raise
    except Exception as e:  # noqa: BLE001
        raise DataError(f"--formula {formula!r} on {path}: {type(e).__name__}: {first_line(e)}") from None
    spec = mm.model_spec
    if mm.lhs.shape[1] != 1:
        raise ConfigError(f"--formula {formula!r}: the response must be one column (it gives {mm.lhs.shape[1]})")
    target = str(mm.lhs.columns[0])
    names = [str(c) for c in mm.rhs.columns]
    keep = [j for j, nm in enumerate(names) if nm != "Intercept"]
    if not keep:
        raise DataError(f"--formula {formula!r} has no predictor column")

    def as_block(m):
        y = np.asarray(m.lhs, dtype=np.float64).reshape(-1)
        _check_response(y, family, target)
        return np.column_stack([y, np.asarray(m.rhs, dtype=np.float64)[:, keep]])

    def blocks():
        yield as_block(mm)
        for frame in frames:
            yield as_block(spec.get_model_matrix(_coded(frame, columns, levels), na_action="raise"))

    return target, [names[j] for j in keep], "Intercept" in names, blocks()


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

    def lik_value_grad_hess(self, theta, batch, mask):
        """``(sum l_i, sum grad l_i, sum hess l_i)`` over the items where ``mask`` is true, in closed form
        (``grad = X^T (y - mu)``, ``hess = -X^T diag(mu) X``, ``mu = exp(X theta)``): one matrix product each,
        used by the set-up passes in place of autodiff (``tests/test_formula.py`` checks it against autodiff)."""
        X = batch["X"]
        m = mask.astype(X.dtype)
        mu = jnp.exp(X @ theta)
        v = jnp.sum(jnp.where(mask, self.log_lik(theta, batch), 0.0))
        return v, X.T @ (m * (batch["y"] - mu)), -(X * (m * mu)[:, None]).T @ X

    def init(self, data):
        return jnp.zeros(np.shape(data["X"])[1])

    def factor_bound(self):
        """The remainders' bound on the trust region ``||z||, ||z'|| <= 6`` Laplace sds around the centre, with the
        exact decision outside it (:class:`~tallmh.factor_bounds.PoissonTrustBound`)."""
        from ..factor_bounds import PoissonTrustBound

        return PoissonTrustBound(radius=6.0)

    def describe_prior(self):
        return f"N(0, {self.prior_scale:g}^2) on each coefficient"


class NegativeBinomialRegression(Model):
    """NB2 regression: ``y_i ~ NegBin(mean mu_i = exp(x_i . beta), dispersion alpha)``, so that
    ``Var(y_i) = mu_i + alpha mu_i^2`` (Cameron and Trivedi, *Regression Analysis of Count Data*, 2013,
    eq. 3.26; alpha -> 0 is the Poisson regression). The parameter vector is ``theta = (beta, log alpha)``
    with ``beta ~ N(0, prior_scale^2 I)`` and ``log alpha ~ N(0, dispersion_prior_scale^2)``.

    Per-row log-likelihood, with ``r = 1/alpha``:
    ``lgamma(y + r) - lgamma(r) - lgamma(y + 1) + r log(r / (r + mu)) + y log(mu / (r + mu))``.
    Data: ``{"X": (N, d), "y": (N,) counts}``; add a column of ones to X for an intercept.
    """

    name = "negative-binomial-regression"
    extra_parameter = ("log_alpha", "alpha")  # the last coordinate, and its name on the natural scale

    def __init__(self, prior_scale: float = 10.0, dispersion_prior_scale: float = 5.0):
        for nm, v in (("prior_scale", prior_scale), ("dispersion_prior_scale", dispersion_prior_scale)):
            if not (np.isfinite(v) and v > 0):
                raise ConfigError(f"{nm} must be positive; got {v}")
        self.prior_scale = float(prior_scale)
        self.dispersion_prior_scale = float(dispersion_prior_scale)

    def log_prior(self, theta):
        s, t = self.prior_scale, self.dispersion_prior_scale
        beta, log_alpha = theta[:-1], theta[-1]
        return (-0.5 * jnp.sum(beta**2) / s**2 - beta.shape[0] * (np.log(s) + 0.5 * np.log(2 * np.pi))
                - 0.5 * log_alpha**2 / t**2 - (np.log(t) + 0.5 * np.log(2 * np.pi)))

    def log_lik(self, theta, batch):
        eta = batch["X"] @ theta[:-1]
        log_r = -theta[-1]
        r = jnp.exp(log_r)
        y = batch["y"]
        log_r_plus_mu = jnp.logaddexp(log_r, eta)  # log(r + mu), stable for large mu or r
        return (gammaln(y + r) - gammaln(r) - gammaln(y + 1.0) + r * (log_r - log_r_plus_mu)
                + y * (eta - log_r_plus_mu))

    def lik_value_grad_hess(self, theta, batch, mask):
        """``(sum l_i, sum grad l_i, sum hess l_i)`` over the items where ``mask`` is true, in closed form, for
        ``theta = (beta, psi = log alpha)``, ``r = exp(-psi)``, ``eta = x . beta``, ``mu = exp(eta)``:

        - ``dl/deta = r (y - mu) / (r + mu)``, ``d2l/deta2 = -r mu (y + r) / (r + mu)^2``,
        - ``dl/dr = digamma(y + r) - digamma(r) + log(r / (r + mu)) + 1 - (y + r) / (r + mu)``,
          ``d2l/dr2 = trigamma(y + r) - trigamma(r) + 1/r - 1/(r + mu) + (y - mu) / (r + mu)^2``,
          ``d2l/deta dr = mu (y - mu) / (r + mu)^2``, and by ``dr/dpsi = -r``: ``dl/dpsi = -r dl/dr``,
          ``d2l/dpsi2 = r dl/dr + r^2 d2l/dr2``, ``d2l/deta dpsi = -r d2l/deta dr``.

        The set-up passes use it in place of autodiff's Hessian through ``gammaln`` (``tests/test_formula.py``
        checks it against autodiff)."""
        X = batch["X"]
        m = mask.astype(X.dtype)
        eta = X @ theta[:-1]
        log_r = -theta[-1]
        r = jnp.exp(log_r)
        y = batch["y"]
        log_rm = jnp.logaddexp(log_r, eta)
        p_r = jnp.exp(log_r - log_rm)  # r / (r + mu)
        p_mu = jnp.exp(eta - log_rm)  # mu / (r + mu)
        inv = jnp.exp(-log_rm)  # 1 / (r + mu)
        d_eta = (y - jnp.exp(eta)) * p_r
        d2_eta = -p_r * p_mu * (y + r)
        d_r = digamma(y + r) - digamma(r) + (log_r - log_rm) + 1.0 - (y + r) * inv
        d2_r = polygamma(1, y + r) - polygamma(1, r) + 1.0 / r - inv + (y - jnp.exp(eta)) * inv * inv
        d_eta_r = p_mu * (y - jnp.exp(eta)) * inv
        d_psi = -r * d_r
        d2_psi = r * d_r + r * r * d2_r
        d_eta_psi = -r * d_eta_r
        v = jnp.sum(jnp.where(mask, self.log_lik(theta, batch), 0.0))
        g = jnp.concatenate([X.T @ (m * d_eta), jnp.sum(m * d_psi)[None]])
        h_bb = (X * (m * d2_eta)[:, None]).T @ X
        h_bp = X.T @ (m * d_eta_psi)
        h = jnp.block([[h_bb, h_bp[:, None]], [h_bp[None, :], jnp.sum(m * d2_psi)[None, None]]])
        return v, g, h

    def init(self, data):
        return jnp.zeros(np.shape(data["X"])[1] + 1)

    def factor_bound(self):
        """The remainders' bound on a trust region of ``sqrt(d) + 6.5`` Laplace sds around the centre, with the exact
        decision outside it (:class:`~tallmh.models.nb2_bound.NB2TrustBound`; reading a row costs ``O(y_i)``)."""
        from ..models.nb2_bound import NB2TrustBound

        return NB2TrustBound()

    def describe_prior(self):
        return (f"N(0, {self.prior_scale:g}^2) on each coefficient, N(0, {self.dispersion_prior_scale:g}^2) on "
                "log alpha")
