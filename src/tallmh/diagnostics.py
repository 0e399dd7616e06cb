"""Convergence diagnostics (thin wrappers over ArviZ) and Monte Carlo standard errors."""

from __future__ import annotations

import logging
import warnings

import numpy as np



def _arviz():
    import arviz as az

    # ArviZ logs a shape warning for single-chain input (set on import, so set after it); its messages go
    # through its own Logger instance (arviz._log), which logging.getLogger("arviz") does not return
    logging.getLogger("arviz").setLevel(logging.ERROR)
    own = getattr(az, "_log", None)
    if isinstance(own, logging.Logger):
        own.setLevel(logging.ERROR)
    return az

__all__ = ["ess", "rhat", "mcse_mean", "z_score"]


def _as_chain_draw(x):
    x = np.asarray(x, dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError(f"expected draws shaped (chain, draw); got {x.shape}")
    return x


def ess(x, method: str = "bulk") -> float:
    """Effective sample size of draws shaped ``(chain, draw)`` (rank-normalised, Vehtari et al. 2021)."""
    az = _arviz()
    x = _as_chain_draw(x)
    if x.shape[1] < 4:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(az.ess(x, method=method))


def rhat(x) -> float:
    """Rank-normalised split R-hat of draws shaped ``(chain, draw)``."""
    az = _arviz()
    x = _as_chain_draw(x)
    if x.shape[1] < 4:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(az.rhat(x))


def mcse_mean(x) -> float:
    """Monte Carlo standard error of the mean: ``sd / sqrt(ESS)``."""
    x = _as_chain_draw(x)
    return float(np.std(x, ddof=1) / np.sqrt(ess(x, method="mean")))


def z_score(x, true_mean) -> float:
    """``(mean - true_mean) / MCSE``: standard normal for a correct sampler after convergence."""
    x = _as_chain_draw(x)
    return float((np.mean(x) - true_mean) / mcse_mean(x))
