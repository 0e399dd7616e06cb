"""Convergence diagnostics (rank-normalised ESS and R-hat, computed here) and Monte Carlo standard errors;
ArviZ's containers."""

from __future__ import annotations

import functools
import logging

from statistics import NormalDist

import math

import numpy as np

_STD_NORMAL = NormalDist()



def _arviz():
    import arviz as az

    # ArviZ logs a shape warning for single-chain input (set on import, so set after it); its messages go
    # through its own Logger instance (arviz._log), which logging.getLogger("arviz") does not return
    logging.getLogger("arviz").setLevel(logging.ERROR)
    own = getattr(az, "_log", None)
    if isinstance(own, logging.Logger):
        own.setLevel(logging.ERROR)
    return az

__all__ = ["thinned", "MAX_DIAG_DRAWS", "ess", "rhat", "ess_all", "bulk_ess_and_rhat", "summary_columns", "ess_interval", "rhat_all", "mcse_mean", "z_score", "arviz_major", "idata_from_dict", "label_dim", "group_names",
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


# ---------------------------------------------------------------------------------------------------
# Rank-normalised ESS and R-hat (Vehtari, Gelman, Simpson, Carpenter & Buerkner 2021, "Rank-normalization,
# folding, and localization: an improved R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2)),
# computed here with NumPy for every parameter at once: ``num_samples="auto"`` checks them as the draws grow,
# and ArviZ's per-variable path (one call per parameter, numba compiled on first use where installed) cost
# ~0.7 s of a 7 s call at N = 10^6. tests/test_diagnostics.py checks them against ArviZ.


# ESS and R-hat of a chain longer than this are computed from every t-th draw (t = ceil(draws / this)), so
# that ending a run of millions of draws takes bounded time and memory (the full draws stay on disk)
MAX_DIAG_DRAWS = 100_000


def thinned(x, most: int = MAX_DIAG_DRAWS):
    """``x`` (chain, draw, ...) thinned evenly along the draws to at most ``most`` per chain (a view; nothing
    copied). Thinning a positively autocorrelated chain can only lower its ESS estimate: an ESS computed
    from the thinned draws is a conservative estimate of the whole chain's."""
    n = np.shape(x)[1] if np.ndim(x) >= 2 else np.shape(x)[0]
    if n <= most:
        return x
    step = -(-n // most)
    return x[:, ::step] if np.ndim(x) >= 2 else x[::step]


def _as_chain_draw_k(x):
    """Draws as a float array shaped ``(chain, draw, k)`` (``(chain, draw)`` and ``(draw,)`` get k = 1); a
    chain longer than :data:`MAX_DIAG_DRAWS` thinned to it (:func:`thinned`) before it is copied."""
    x = np.asarray(thinned(x), dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim == 2:
        x = x[:, :, None]
    if x.ndim != 3:
        raise ValueError(f"expected draws shaped (chain, draw) or (chain, draw, k); got {x.shape}")
    return x


def _split_chains(x):
    """Each chain cut into its first and last halves (the middle draw dropped when the count is odd)."""
    h = x.shape[1] // 2
    return np.concatenate([x[:, :h], x[:, x.shape[1] - h:]], axis=0)


def _average_ranks(a):
    """Ranks 1..n down each column of ``a`` (n, k), ties given their average rank (scipy's
    ``rankdata(method="average")``; done here because importing scipy.stats takes ~0.5 s). Vectorised over the
    columns (each sorted as a contiguous row of the transpose): with thousands of parameters (a model's group
    effects) a loop over them, or a sort down the strided columns, cost most of a convergence check."""
    n, k = a.shape
    at = np.ascontiguousarray(np.asarray(a).T)
    order = np.argsort(at, axis=1, kind="stable")
    srt = np.take_along_axis(at, order, axis=1)
    new = np.ones((k, n), bool)
    new[:, 1:] = srt[:, 1:] != srt[:, :-1]
    del srt
    flat = new.reshape(-1)
    starts = np.flatnonzero(flat)  # each run of ties starts a column's first value or a new value: never spans columns
    ends = np.r_[starts[1:], k * n]
    first = (starts // n) * n  # the run's column's first position
    avg = ((starts - first) + (ends - first) + 1) / 2.0
    ranks = np.empty((k, n))
    np.put_along_axis(ranks, order, avg[np.cumsum(flat) - 1].reshape(k, n), axis=1)
    return ranks.T


def _z_scale(x):
    """Rank-normalised values: average ranks over all chains and draws (per parameter), Blom's offset 3/8,
    then the standard normal quantile (Vehtari et al. 2021, eq. 14)."""
    c, n, k = x.shape
    r = _average_ranks(x.reshape(c * n, k))
    # the quantile of each distinct rank (at most c n of them, halves included), by the standard library
    # (Wichura's AS 241, ~1e-16 relative; importing scipy.special took ~0.2 s of a fresh process); twice a rank is
    # an integer in [2, 2 c n]: a table of those present, marked without a sort
    twice = np.rint(2.0 * r).astype(np.int64)
    return _blom_table(c * n)[twice].reshape(c, n, k)


@functools.lru_cache(maxsize=4)
def _blom_table(total: int):
    """The normal quantile of each rank ``v / 2`` (``v`` = 2 .. 2 ``total``, halves for ties) with Blom's offset, indexed
    by ``v``: made once per draw count and shared by every block of columns and every rank normalisation of it (a
    loop of the standard library's ``inv_cdf`` over the present ranks of each block cost ~6% of a summary)."""
    table = np.zeros(2 * total + 2)
    table[2:] = [_STD_NORMAL.inv_cdf((v / 2.0 - 0.375) / (total + 0.25)) for v in range(2, 2 * total + 2)]
    table.setflags(write=False)
    return table


def _next_fast_len(m: int) -> int:
    """The smallest length >= m whose prime factors are all at most 11 (what ``scipy.fft.next_fast_len`` gives,
    the lengths pocketfft transforms fast)."""
    v = max(1, int(m))
    while True:
        r = v
        for f in (2, 3, 5, 7, 11):
            while r % f == 0:
                r //= f
        if r == 1:
            return v
        v += 1


def _autocov(x, max_lag=None):
    """Autocovariances of each chain at lags 0 .. ``max_lag`` (every lag by default; FFT, divided by the draw count),
    along axis 1. Zero-padded to at least ``n + max_lag`` values, so the circular products at those lags are the
    linear ones."""
    n = x.shape[1]
    lag = n - 1 if max_lag is None else min(int(max_lag), n - 1)
    size = 2 * _next_fast_len(-(-(n + lag + 1) // 2))  # (even: the real transform's fast case, and irfft's length)
    f = np.fft.rfft(x - x.mean(axis=1, keepdims=True), n=size, axis=1)
    return np.fft.irfft(f * np.conjugate(f), n=size, axis=1)[:, :lag + 1] / n


# lags first tried by ESS (then all lags for the columns whose Geyer sequence had not ended): an eighth of the
# draws, so that the FFTs run on about 1.1 times the draws instead of twice; a chain whose autocorrelation lasts
# that long has an ESS below about 8 per chain, and is computed in full
FIRST_LAGS_SHARE = 8


def _ess_core(x, lags=None):
    """ESS of each parameter of ``(chain, draw, k)`` draws, already split (and rank-normalised where
    wanted): the multi-chain autocorrelation, Geyer's initial positive and initial monotone sequences
    (Vehtari et al. 2021, eq. 10-13; Geyer 1992), the estimate capped at ``M N log10(M N)``. ``lags``, an
    array of k if given, receives the number of autocorrelation lags each estimate summed."""
    m, n, k = x.shape
    out = np.full(k, np.nan)
    ok = np.isfinite(x).all(axis=(0, 1))
    const = ok & (np.ptp(np.where(np.isfinite(x), x, 0.0), axis=(0, 1)) < np.finfo(float).resolution)
    out[const] = m * n
    todo = np.flatnonzero(ok & ~const)
    if not todo.size:
        return out
    y = x[:, :, todo]
    between = np.var(y.mean(axis=1), axis=0, ddof=1) if m > 1 else 0.0
    first = n // FIRST_LAGS_SHARE
    tau, max_t, rho1, done = _tau(_autocov(y, first if first >= 64 else None), n, between)
    if not done.all():  # (the sequence still going at the last lag tried: every lag for those columns)
        again = np.flatnonzero(~done)
        tau[again], max_t[again], rho1[again], _ = _tau(_autocov(y[:, :, again]), n, between if m == 1 else
                                                          between[again])
    tau = np.maximum(tau, 1.0 / np.log10(m * n))
    out[todo] = np.where(np.isnan(rho1), np.nan, m * n / tau)
    if lags is not None:
        lags[todo] = max_t + 2
    return out


def _tau(acov, n, between):
    """``(tau, max_t, rho_1, done)`` of each column from the chains' autocovariances ``acov`` (chain, lag, k) and the
    variance of the chain means ``between`` (:func:`_geyer_tau`)."""
    mean_var = acov[:, 0].mean(axis=0) * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n + between
    rho_all = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus  # (lags, k): rho_t of each lag
    tau, max_t, done = _geyer_tau(rho_all, n)
    return tau, max_t, rho_all[1], done


def _geyer_tau(rho, n):
    """``(tau, max_t)`` of each column of the autocorrelations ``rho`` (lags 0..n-1, k columns), all columns at
    once: the pair sums ``S_p = rho_2p + rho_2p+1`` (``rho_0`` taken as 1) are read from ``p = 1`` while the one
    before is positive and ``2p - 1 < n - 3`` (Geyer's initial positive sequence; the last pair read is kept when
    its sum is not negative), the kept pairs before the last are made non-increasing (initial monotone
    sequence: a running minimum of the sums), and ``tau = -1 + 2 sum_{p < last} S_p + rho_2last`` (that even
    lag where positive or its pair kept; 1 for ``last = 0``). ``max_t = 2 last - 1``: the last lag summed in
    pairs. ``rho`` may hold the first lags only: ``done`` is False for the columns whose sequence had not ended
    at its last pair (their tau needs more lags)."""
    k = rho.shape[1]
    full = max(0, (n - 3) // 2)
    pmax = min(full, max(0, (rho.shape[0] - 2) // 2))
    pairs = np.empty((pmax + 1, k))
    pairs[0] = 1.0 + rho[1]
    if pmax:
        pairs[1:] = rho[2:2 * pmax + 1:2] + rho[3:2 * pmax + 2:2]
    stop = ~(pairs > 0.0)  # (a NaN sum stops the sequence too)
    later = stop[1:]
    first = np.where(later.any(axis=0), np.argmax(later, axis=0) + 1, pmax) if pmax else np.zeros(k, np.int64)
    last = np.where(stop[0], 0, first)
    running = np.minimum.accumulate(np.where(np.isnan(pairs), -np.inf, pairs), axis=0)
    summed = np.sum(np.where(np.arange(pmax + 1)[:, None] < last[None, :], running, 0.0), axis=0)
    cols = np.arange(k)
    even = np.where(last == 0, 1.0, rho[2 * last, cols])
    kept = (last > 0) & (pairs[last, cols] >= 0.0)
    tail = np.where((even > 0.0) | kept, even, 0.0)
    done = stop[0] | later.any(axis=0) if pmax < full else np.ones(k, bool)
    return -1.0 + 2.0 * summed + tail, 2 * last - 1, done


DIAG_BLOCK_VALUES = 2**20  # values (chain x draw x parameter) per block of columns in ess_all, rhat_all, the summary


def _column_blocks(fn):
    """``fn(x, ...)`` of draws ``(chain, draw, k)`` computed on blocks of columns of at most ``DIAG_BLOCK_VALUES``
    values and joined: each column's result is its own (ranks, quantiles and autocovariances are per column), and
    the temporaries (float64 copies, ranks, the FFT's complex arrays: about ten times the block) stay bounded
    whatever the number of parameters (at 4 chains x 30,000 draws x 2,000 outputs the whole array was 1.9 GB)."""

    @functools.wraps(fn)
    def blocked(x, *args, **kwargs):
        if np.ndim(x) != 3:
            return fn(x, *args, **kwargs)
        c, m, k = np.shape(x)
        cols = max(1, DIAG_BLOCK_VALUES // max(1, c * min(m, MAX_DIAG_DRAWS)))
        if k <= cols:
            return fn(x, *args, **kwargs)
        return np.concatenate([fn(x[:, :, j:j + cols], *args, **kwargs) for j in range(0, k, cols)])

    return blocked


@_column_blocks
def ess_all(x, method: str = "bulk"):
    """ESS of every parameter of draws shaped ``(chain, draw, k)`` (or ``(chain, draw)``): an array of k.

    ``"bulk"``: of the split, rank-normalised draws; ``"tail"``: the smaller of the ESS of the indicators
    ``x <= q`` at the 5% and 95% quantiles (linear interpolation); ``"mean"``: of the split draws
    (Vehtari et al. 2021, Sec. 4.3). NaN for a parameter with a NaN draw, or with fewer than 4 draws.
    """
    x = _as_chain_draw_k(x)
    k = x.shape[2]
    if x.shape[1] < 4:
        return np.full(k, np.nan)
    bad = np.isnan(x).any(axis=(0, 1))
    if method == "bulk":
        out = _ess_core(_z_scale(_split_chains(np.where(bad, 0.0, x))))
    elif method == "mean":
        out = _ess_core(_split_chains(x))
    elif method == "tail":
        flat = np.where(bad, 0.0, x).reshape(-1, k)
        out = np.minimum(*(_ess_core(_split_chains((x <= np.quantile(flat, p, axis=0)).astype(float)))
                           for p in (0.05, 0.95)))
    else:
        raise ValueError(f"ESS method must be 'bulk', 'tail' or 'mean'; got {method!r}")
    out[bad] = np.nan
    return out


def ess_interval(x, level: float = 0.95):
    """``(ess, low, high)``: the bulk ESS of draws shaped ``(chain, draw)`` and an approximate interval for it.

    The ESS is ``M N / tau`` with ``tau = -1 + 2 sum_{t<W} rho_t`` summed over a window of ``W`` lags; the
    variance of that sum is about ``2 (2W + 1) tau^2 / (M N)`` (Madras and Sokal 1988, J. Stat. Phys. 50,
    eq. 2.21; Sokal 1997, eq. 3.19). The interval is ``ess * exp(-/+ z sd)`` with ``sd`` that relative
    standard error, so it stays positive: an ESS of 5 from a few hundred draws is known only within a
    factor of several, which this says.
    """
    x = _as_chain_draw_k(x)
    if x.shape[1] < 4 or np.isnan(x).any():
        return float("nan"), float("nan"), float("nan")
    s = _z_scale(_split_chains(x[:, :, :1]))
    lags = np.full(1, np.nan)
    e = float(_ess_core(s, lags)[0])
    if not (np.isfinite(e) and np.isfinite(lags[0])):
        return e, float("nan"), float("nan")
    rel = math.sqrt(2.0 * (2.0 * lags[0] + 1.0) / (s.shape[0] * s.shape[1]))
    zq = _STD_NORMAL.inv_cdf(0.5 + level / 2.0)
    return e, e * math.exp(-zq * rel), e * math.exp(zq * rel)


def _rhat_core(x):
    """Split R-hat of ``(chain, draw, k)`` draws already split: ``sqrt((B/W + n - 1) / n)`` (Gelman et al.)."""
    n = x.shape[1]
    within = np.var(x, axis=1, ddof=1).mean(axis=0)
    between = n * np.var(x.mean(axis=1), axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.sqrt((between / within + n - 1) / n)


@_column_blocks
def rhat_all(x):
    """Rank-normalised split R-hat of every parameter of draws shaped ``(chain, draw, k)``: the larger of the
    R-hat of the rank-normalised draws and of their folded (``|x - median|``) ranks (Vehtari et al. 2021,
    Sec. 4.1). NaN with one chain, fewer than 4 draws or a NaN draw."""
    x = _as_chain_draw_k(x)
    k = x.shape[2]
    if x.shape[0] < 2 or x.shape[1] < 4:
        return np.full(k, np.nan)
    bad = np.isnan(x).any(axis=(0, 1))
    s = _split_chains(np.where(bad, 0.0, x))
    folded = np.abs(s - np.median(s.reshape(-1, k), axis=0))
    out = np.maximum(_rhat_core(_z_scale(s)), _rhat_core(_z_scale(folded)))
    out[bad] = np.nan
    return out


def summary_columns(x) -> dict:
    """``{"mean", "sd", "ess_bulk", "ess_tail", "r_hat"}``, an array of k each, for draws shaped ``(chain, draw, k)``: the
    numbers of ``ess_all(x)``, ``ess_all(x, "tail")`` and ``rhat_all(x)`` in one pass over blocks of columns of at most
    :data:`DIAG_BLOCK_VALUES` values (the rank normalisation of the split draws, a sort of every column, made once for
    the bulk ESS and R-hat), with the mean and sd of all draws (in float64 whatever the draws' type)."""
    c, m, k = np.shape(x)
    cols = max(1, DIAG_BLOCK_VALUES // max(1, c * min(m, MAX_DIAG_DRAWS)))
    out = {key: np.full(k, np.nan) for key in ("mean", "sd", "ess_bulk", "ess_tail", "r_hat")}
    for j in range(0, k, cols):
        xb, part = x[:, :, j:j + cols], slice(j, min(k, j + cols))
        if c * m:
            out["mean"][part] = np.mean(xb, axis=(0, 1), dtype=np.float64)
        if c * m > 1:
            out["sd"][part] = np.std(xb, axis=(0, 1), ddof=1, dtype=np.float64)
        out["ess_bulk"][part], out["ess_tail"][part], out["r_hat"][part] = _summary_block(xb)
    return out


def _summary_block(x):
    """``(bulk ESS, tail ESS, R-hat)`` of a block of columns (:func:`summary_columns`)."""
    x = _as_chain_draw_k(x)
    k = x.shape[2]
    if x.shape[1] < 4:
        return np.full(k, np.nan), np.full(k, np.nan), np.full(k, np.nan)
    bad = np.isnan(x).any(axis=(0, 1))
    x0 = np.where(bad, 0.0, x) if bad.any() else x
    s = _split_chains(x0)
    z = _z_scale(s)
    bulk, rh = _ess_core(z), np.full(k, np.nan)
    if x.shape[0] >= 2:
        folded = np.abs(s - np.median(s.reshape(-1, k), axis=0))
        rh = np.maximum(_rhat_core(z), _rhat_core(_z_scale(folded)))
    del s, z
    flat = x0.reshape(-1, k)
    tail = np.minimum(*(_ess_core(_split_chains((x <= np.quantile(flat, p, axis=0)).astype(float)))
                        for p in (0.05, 0.95)))
    for a in (bulk, tail, rh):
        a[bad] = np.nan
    return bulk, tail, rh


def bulk_ess_and_rhat(x, min_ess=None):
    """:func:`_bulk_ess_and_rhat` on blocks of columns (as :func:`_column_blocks`): once a block's ESS is below
    ``min_ess``, the blocks after it compute their ESS only."""
    if np.ndim(x) != 3:
        return _bulk_ess_and_rhat(x, min_ess)
    c, m, k = np.shape(x)
    cols = max(1, DIAG_BLOCK_VALUES // max(1, c * min(m, MAX_DIAG_DRAWS)))
    if k <= cols:
        return _bulk_ess_and_rhat(x, min_ess)
    ess, rh, failed = [], [], False
    for j in range(0, k, cols):
        e, r = _bulk_ess_and_rhat(x[:, :, j:j + cols], np.inf if failed else min_ess)
        ess.append(e)
        rh.append(r)
        failed = failed or r is None
    return np.concatenate(ess), (None if failed else np.concatenate(rh))


def _bulk_ess_and_rhat(x, min_ess=None):
    """``(bulk ESS, R-hat)`` of every parameter of draws ``(chain, draw, k)``: :func:`ess_all` and :func:`rhat_all`
    sharing the rank normalisation of the split draws (the sort of every column, most of the cost with thousands of
    parameters). With ``min_ess`` given, R-hat is None unless every bulk ESS is at least ``min_ess`` (a convergence
    check that stops at the first failing part)."""
    x = _as_chain_draw_k(x)
    k = x.shape[2]
    if x.shape[1] < 4:
        return np.full(k, np.nan), (None if min_ess is not None else np.full(k, np.nan))
    bad = np.isnan(x).any(axis=(0, 1))
    s = _split_chains(np.where(bad, 0.0, x))
    z = _z_scale(s)
    ess = _ess_core(z)
    ess[bad] = np.nan
    if min_ess is not None and not (np.min(ess) >= min_ess):
        return ess, None
    if x.shape[0] < 2:
        return ess, np.full(k, np.nan)
    folded = np.abs(s - np.median(s.reshape(-1, k), axis=0))
    rh = np.maximum(_rhat_core(z), _rhat_core(_z_scale(folded)))
    rh[bad] = np.nan
    return ess, rh


def ess(x, method: str = "bulk") -> float:
    """Effective sample size of draws shaped ``(chain, draw)`` (rank-normalised, Vehtari et al. 2021):
    :func:`ess_all` of one parameter."""
    return float(ess_all(_as_chain_draw(x), method)[0])


def rhat(x) -> float:
    """Rank-normalised split R-hat of draws shaped ``(chain, draw)``: :func:`rhat_all` of one parameter."""
    return float(rhat_all(_as_chain_draw(x))[0])


def mcse_mean(x) -> float:
    """Monte Carlo standard error of the mean: ``sd / sqrt(ESS)``."""
    x = _as_chain_draw(x)
    return float(np.std(x, ddof=1) / np.sqrt(ess(x, method="mean")))


def z_score(x, true_mean) -> float:
    """``(mean - true_mean) / MCSE``: standard normal for a correct sampler after convergence."""
    x = _as_chain_draw(x)
    return float((np.mean(x) - true_mean) / mcse_mean(x))
