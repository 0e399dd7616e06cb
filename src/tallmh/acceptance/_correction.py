"""The correction distribution ``X_corr`` of the minibatch Barker test (Seita et al. 2017, Sec. 4).

The minibatch Barker test (Seita, Pan, Chen, Canny 2017, eq. 12-13) writes the logistic variable of the
exact Barker test as ``X_log = X_norm + X_corr`` with ``X_norm ~ N(0, sigma^2)`` supplied by the minibatch
noise (topped up to unit variance by ``X_nc``, Algorithm 1) and ``X_corr`` an independent zero-mean
correction with density ``C_sigma`` solving eq. 14, ``min |Phi_sigma * C_sigma - S|``. Section 4
discretises that deconvolution on a grid and solves the regularised least squares of eq. 15; the paper's
Table 1 reports the resulting L_inf errors between the CDF of ``X_norm + X_corr`` and the logistic CDF
``S`` (1e-4 at sigma 0.9, 5e-6 at sigma 0.8).

The table for sigma = 1 (``C_1`` of Algorithm 1) is precomputed offline by
``scripts/make_barker_correction.py`` and shipped as ``barker_correction.npz`` next to this module: a
discrete distribution with point masses ``probs`` at support points ``values``. See that script for the
construction and its measured L_inf error (stored as ``linf_error``).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CorrectionTable", "load_correction", "sample_correction", "mixture_cdf", "DEFAULT_TABLE"]

DEFAULT_TABLE = Path(__file__).resolve().parent / "barker_correction.npz"


class CorrectionTable(NamedTuple):
    """A discrete correction distribution ``X_corr`` (Seita et al. 2017, Sec. 4).

    ``values``: support points, ascending (float64, read-only); ``probs``: their probabilities (sum 1);
    ``cdf``: ``cumsum(probs)`` with ``cdf[-1] == 1.0`` exactly; ``sigma``: the sd of ``X_norm`` the table
    was built for; ``linf_error``: ``max_x |P(X_norm + X_corr <= x) - S(x)|`` as measured by the script.
    """

    values: np.ndarray
    probs: np.ndarray
    cdf: np.ndarray
    sigma: float
    linf_error: float


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


@functools.lru_cache(maxsize=8)
def _load(path: Path) -> CorrectionTable:
    with np.load(path, allow_pickle=False) as d:
        values = np.asarray(d["values"], dtype=np.float64).copy()
        probs = np.asarray(d["probs"], dtype=np.float64).copy()
        sigma = float(d["sigma"])
        linf = float(d["linf_error"])
    if values.ndim != 1 or values.shape != probs.shape or values.size == 0:
        raise ValueError(f"{path}: values and probs must be non-empty 1-d arrays of the same length")
    if np.any(np.diff(values) < 0):
        raise ValueError(f"{path}: values must be sorted ascending")
    if np.any(probs < 0) or not np.isclose(probs.sum(), 1.0, rtol=0, atol=1e-9):
        raise ValueError(f"{path}: probs must be non-negative and sum to 1")
    probs = probs / probs.sum()
    cdf = np.cumsum(probs)
    cdf = np.minimum(cdf, 1.0)
    cdf[-1] = 1.0
    return CorrectionTable(_readonly(values), _readonly(probs), _readonly(cdf), sigma, linf)


def load_correction(path: str | Path | None = None) -> CorrectionTable:
    """Load (and cache) the correction table; ``path=None`` loads the packaged ``barker_correction.npz``.

    The table is ``C_1`` of Seita et al. 2017 (Sec. 4, eq. 14-15; Algorithm 1): ``N(0, 1) + X_corr`` is
    approximately standard logistic. Loading is cached per resolved path (``functools.lru_cache``); the
    returned arrays are read-only.
    """
    return _load(Path(DEFAULT_TABLE if path is None else path).resolve())


def sample_correction(key, values, cdf, shape=()):
    """Draw ``X_corr`` by inverse-CDF lookup in the table (Seita et al. 2017, Algorithm 1).

    ``values`` / ``cdf`` are the table's arrays as JAX arrays (``CorrectionTable.values`` / ``.cdf``; cast
    them to the working dtype once, outside the hot loop). Draws ``u ~ U[0, 1)`` from ``key`` in
    ``cdf``'s dtype and returns ``values[k]`` with ``k = searchsorted(cdf, u, side='right')`` (the first
    index with ``cdf[k] > u``), clipped to ``[0, K-1]``: a binary search, O(log K) per draw, and
    jit/vmap compatible (``shape`` must be static under jit). Returns an array of ``shape`` with
    ``values``' dtype.
    """
    values = jnp.asarray(values)
    cdf = jnp.asarray(cdf)
    dtype = cdf.dtype if jnp.issubdtype(cdf.dtype, jnp.floating) else jnp.result_type(float)
    u = jax.random.uniform(key, shape, dtype)
    idx = jnp.searchsorted(cdf.astype(dtype), u, side="right", method="scan")
    idx = jnp.clip(idx, 0, values.shape[0] - 1)
    return values[idx]


def mixture_cdf(x, table: CorrectionTable, sigma: float | None = None, chunk: int = 4096) -> np.ndarray:
    """CDF of ``N(0, sigma^2) + X_corr`` at ``x``: ``sum_j p_j Phi((x - v_j) / sigma)`` (numpy/scipy).

    This is ``M u`` of Seita et al. 2017, Sec. 4 (eq. 14-15) evaluated at arbitrary points; compare it
    with the logistic CDF ``S(x) = 1 / (1 + exp(-x))`` to measure the table's error (Table 1).
    ``sigma`` defaults to the table's own. Returns a float64 array of ``x``'s shape.
    """
    from scipy.special import ndtr  # (here: importing scipy.special costs a fresh process ~0.2 s)

    s = float(table.sigma if sigma is None else sigma)
    xs = np.asarray(x, dtype=np.float64)
    flat = xs.reshape(-1)
    out = np.empty_like(flat)
    v = np.asarray(table.values, dtype=np.float64)
    p = np.asarray(table.probs, dtype=np.float64)
    for start in range(0, flat.size, chunk):
        out[start : start + chunk] = ndtr((flat[start : start + chunk, None] - v[None, :]) / s) @ p
    return out.reshape(xs.shape)
