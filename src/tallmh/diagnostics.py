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

__all__ = ["ess", "rhat", "mcse_mean", "z_score", "arviz_major", "idata_from_dict", "label_dim", "group_names",
           "ess_kwargs", "read_netcdf"]


def arviz_major(az=None) -> int:
    """ArviZ's major version: 0 (``InferenceData``) or 1 and later (``xarray.DataTree``)."""
    az = az or _arviz()
    try:
        return int(str(az.__version__).split(".")[0])
    except ValueError:  # pragma: no cover - a development version string
        return 0


def ess_kwargs(method, az=None) -> dict:
    """Extra keywords for ``az.ess``: ArviZ 1.x needs the tail quantiles that 0.x fixes at 5% and 95%."""
    return {"prob": (0.05, 0.95)} if method == "tail" and arviz_major(az) >= 1 else {}


def idata_from_dict(groups, attrs=None, save_warmup=False, attrs_groups=("posterior", "sample_stats")):
    """ArviZ's container from ``{group: {variable: (chain, draw, ...) array}}``, with ``attrs`` on ``attrs_groups``.

    ArviZ 0.x: an ``InferenceData`` (``az.from_dict(posterior=..., sample_stats=...)``); ArviZ 1.x: an
    ``xarray.DataTree`` (``az.from_dict({"posterior": ..., ...})``). Both are read the same way:
    ``idata.posterior``, ``idata.posterior.data_vars``, ``idata.posterior.attrs``, ``idata.to_netcdf``.
    """
    az = _arviz()
    if arviz_major(az) >= 1:
        idata = az.from_dict(dict(groups), save_warmup=save_warmup)
    else:
        idata = az.from_dict(**groups, save_warmup=save_warmup)
    for g in attrs_groups if attrs else ():
        if g in groups:
            node = idata[g] if arviz_major(az) >= 1 else getattr(idata, g)
            node.attrs.update(attrs)
    return idata


def label_dim(idata, old, new, labels, groups=("posterior", "warmup_posterior")):
    """Rename dimension ``old`` to ``new`` with coordinate ``labels`` in the given groups (either container)."""
    present = [g for g in groups if g in group_names(idata)]
    if callable(getattr(idata, "groups", None)):  # InferenceData
        idata = idata.rename({old: new})
        return idata.assign_coords({new: list(labels)}, groups=present)
    for g in present:  # DataTree: rebuild each group's dataset
        ds = idata[g].to_dataset()
        if old in ds.dims:
            idata[g] = ds.rename({old: new}).assign_coords({new: list(labels)})
    return idata


def read_netcdf(path):
    """Read draws written by ``to_netcdf`` (the CLI's ``posterior.nc``): an ``InferenceData`` with ArviZ 0.x
    (``az.from_netcdf``), an ``xarray.DataTree`` with 1.x (``xarray.open_datatree``, loaded)."""
    az = _arviz()
    if arviz_major(az) >= 1:
        import xarray as xr

        with xr.open_datatree(path) as dt:
            return dt.load()
    return az.from_netcdf(path)


def group_names(idata):
    groups = getattr(idata, "groups", None)
    if callable(groups):
        return list(groups())
    return [str(k) for k in getattr(idata, "children", {})]


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
        return float(np.ravel(az.ess(x, method=method, **ess_kwargs(method, az)))[0])


def rhat(x) -> float:
    """Rank-normalised split R-hat of draws shaped ``(chain, draw)``."""
    az = _arviz()
    x = _as_chain_draw(x)
    if x.shape[1] < 4:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(np.ravel(az.rhat(x))[0])


def mcse_mean(x) -> float:
    """Monte Carlo standard error of the mean: ``sd / sqrt(ESS)``."""
    x = _as_chain_draw(x)
    return float(np.std(x, ddof=1) / np.sqrt(ess(x, method="mean")))


def z_score(x, true_mean) -> float:
    """``(mean - true_mean) / MCSE``: standard normal for a correct sampler after convergence."""
    x = _as_chain_draw(x)
    return float((np.mean(x) - true_mean) / mcse_mean(x))
