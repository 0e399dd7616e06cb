"""The report of a run: the comparison table, PNG plots, ``results.json`` and ``report.html``.

Everything here is computed from the draws it is given; nothing is cached or typed in. The plots use
matplotlib's Agg backend (no screen needed). Files are written to a temporary name in the output folder
and then moved into place, so a failure never leaves half a file and never removes anything else there.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence

import numpy as np

from . import diagnostics

__all__ = [
    "MethodRun", "Reference", "method_row", "format_table", "predictive_risk", "plot_traces", "plot_marginals",
    "plot_data_use", "plot_risk", "write_json", "write_html", "atomic_write", "COLUMNS", "COLUMNS_HELP",
    "write_netcdf", "idata_with_names", "param_table", "frame_html",
]

# (key in a row, header printed, format)
COLUMNS = [
    ("method", "method", "{}"),
    ("trusted_col", "trusted", "{}"),
    ("accurate_col", "accurate", "{}"),
    ("draws", "draws", "{:d}"),
    ("seconds", "seconds", "{:.1f}"),
    ("draws_per_s", "draws/s", "{:.1f}"),
    ("acceptance_rate", "accept", "{:.3f}"),
    ("data_fraction", "data/step", "share"),  # (a percentage; two significant digits below 0.1%)
    ("ess_min", "ESS min", "{:.1f}"),
    ("ess_per_s", "ESS/s", "{:.2f}"),
    ("rhat_max", "R-hat", "{:.3f}"),
    ("max_mean_err_sd", "max|mean-ref|/sd", "{:.3f}"),
    ("max_err_z", "max z", "{:.1f}"),
    ("sd_ratio_range", "sd/ref sd", "{}"),
]


COLUMNS_HELP = (
    "<i>trusted</i>: the method's own checks passed (its verdict: R-hat, ESS, the audited error rate, ...), "
    "without looking at the reference; <i>accurate</i>: checked against the reference: no posterior mean is "
    "more than 0.1 reference sd plus 3 Monte Carlo standard errors (this run's and the reference's) from the "
    "reference mean, and every sd within 20% of the reference sd; <i>unclear</i> where no error shows "
    "but the method's bulk ESS is under 100 (too few effective draws to tell); the table lists the methods that "
    "are both trusted and accurate first, then "
    "by ESS/s. <i>draws</i>: kept sampling draws, all chains; <i>seconds</i>: "
    "warmup and sampling, compilation excluded; <i>accept</i>: acceptance rate; <i>data/step</i>: mean share of "
    "the N items read by one accept/reject decision; <i>ESS min</i>: smallest bulk effective sample size over "
    "the parameters (rank-normalised, ArviZ); <i>R-hat</i>: largest rank-normalised split R-hat; "
    "<i>max|mean-ref|/sd</i>: largest distance between a posterior mean and the reference mean, in reference "
    "posterior sd; <i>max z</i>: the same distances divided by their Monte Carlo standard error (this run's and "
    "the reference's), so that values well above 3 point to bias (or a chain too short to mix) rather than "
    "noise; <i>sd/ref sd</i>: smallest and largest ratio of a posterior sd to the reference sd (1 is right; an "
    "approximate test that accepts too often widens the posterior).")


@dataclass
class MethodRun:
    """One method's run: its :class:`tallmh.Result` and when each draw was made.

    ``times``: ``(chain, draw)`` seconds from the start of that chain's run (compilation excluded) at which
    each kept sampling draw was made; ``warmup_times`` likewise for the warmup draws. ``seconds``: wall
    time the method ran, all chains, warmup included, compilation excluded; ``compile_s``: compilation.
    """

    name: str
    result: Any
    times: np.ndarray
    warmup_times: np.ndarray
    seconds: float
    compile_s: float
    steps: int = 0  # steps made, all chains, warmup included
    steps_dropped: int = 0  # sampling draws made but dropped to give every chain the same number
    config: Dict[str, Any] = field(default_factory=dict)
    _table: Any = field(default=None, repr=False)

    def table(self):
        """Per-parameter summary (mean, sd, ess_bulk, ess_tail, r_hat, as in ``Result.summary().table``),
        computed once, with one ArviZ call per column for all parameters together."""
        if self._table is None:
            self._table = param_table(self.result.flat_samples, self.result.param_names)
        return self._table


@dataclass
class Reference:
    """A reference posterior: draws ``(chain, draw, d)`` and how they were made (``info``)."""

    draws: np.ndarray
    info: Dict[str, Any]

    @property
    def flat(self):
        return self.draws.reshape(-1, self.draws.shape[-1])

    @property
    def mean(self):
        return self.flat.mean(axis=0, dtype=np.float64)

    @property
    def sd(self):
        return self.flat.std(axis=0, ddof=1, dtype=np.float64)

    def ess(self):
        return diagnostics.ess_all(self.draws)


# ---------------------------------------------------------------------------------------------------
# numbers


def param_table(x, names):
    """mean, sd, ess_bulk, ess_tail (rank-normalised) and r_hat of draws ``x`` shaped (chain, draw, d)."""
    import pandas as pd

    c, k, d = x.shape
    cols = {"mean": np.full(d, np.nan), "sd": np.full(d, np.nan), "ess_bulk": np.full(d, np.nan),
            "ess_tail": np.full(d, np.nan), "r_hat": np.full(d, np.nan)}
    if k:  # (one column at a time: a long run's draws are never copied whole)
        for j in range(d):
            col = np.asarray(x[..., j], np.float64).ravel()
            cols["mean"][j] = col.mean()
            if col.size > 1:
                cols["sd"][j] = col.std(ddof=1)
    if k >= 4:
        xf = np.asarray(diagnostics.thinned(x), np.float64)  # (ESS and R-hat of a long chain: every t-th draw)
        cols["ess_bulk"] = diagnostics.ess_all(xf)
        cols["ess_tail"] = diagnostics.ess_all(xf, "tail")
        if c >= 2:
            cols["r_hat"] = diagnostics.rhat_all(xf)
    df = pd.DataFrame(cols, index=pd.Index(list(names), name="param"))
    return df


def _finite(v):
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def method_row(run: MethodRun, ref: Optional[Reference] = None) -> Dict[str, Any]:
    """Every number of the table for one method (a dict, JSON-ready apart from NaN)."""
    r = run.result
    x = r.flat_samples
    c, k, d = x.shape
    tab = run.table()
    ess_bulk = tab["ess_bulk"].to_numpy(float) if k else np.full(d, np.nan)
    rhat = tab["r_hat"].to_numpy(float) if k else np.full(d, np.nan)
    ess_min = float(np.nanmin(ess_bulk)) if np.any(np.isfinite(ess_bulk)) else float("nan")
    secs = float(run.seconds)
    draws = int(c * k)
    row = {
        "method": run.name,
        "chains": int(c),
        "draws": draws,
        "steps": int(run.steps),
        "seconds": secs,
        "compile_s": float(run.compile_s),
        "draws_per_s": draws / secs if secs > 0 else float("nan"),
        "acceptance_rate": float(np.mean(r.stats["accepted"])) if k else float("nan"),
        "data_fraction": float(np.mean(r.stats["n_data"])) / r.n if k else float("nan"),
        "mean_items_per_step": float(np.mean(r.stats["n_data"])) if k else float("nan"),
        "N": int(r.n),
        "ess_min": ess_min,
        "ess_per_s": ess_min / secs if secs > 0 else float("nan"),
        "rhat_max": float(np.nanmax(rhat)) if np.any(np.isfinite(rhat)) else float("nan"),
        "max_mean_err_sd": float("nan"),
        "max_err_z": float("nan"),
        "setup_items": int(r.setup_items),
        "steps_dropped": int(run.steps_dropped),
        "partial": bool(r.partial),
    }
    if k >= 4 and np.isfinite(ess_min):
        # how well the smallest ESS is known (a short exact-MH chain's ESS of ~5 is known within a factor of
        # several): the interval of the parameter that has it
        j = int(np.nanargmin(ess_bulk))
        _, lo, hi = diagnostics.ess_interval(np.asarray(diagnostics.thinned(x[..., j:j + 1]), np.float64)[..., 0])
        row["ess_min_interval"] = [float(lo), float(hi)]
        row["ess_per_s_interval"] = [float(lo) / secs, float(hi) / secs] if secs > 0 else [float("nan")] * 2
    if ref is not None and k:
        # summed in float64: a float32 column sum over 10^5 draws or more (numpy adds a column in order, not
        # pairwise) is off by ~1e-3 relative, a fifth of a posterior sd at N = 3 x 10^5
        flat = x.reshape(-1, d)
        mean = flat.mean(axis=0, dtype=np.float64)
        err = np.abs(mean - ref.mean) / ref.sd
        row["max_mean_err_sd"] = float(np.max(err))
        row["worst_param"] = int(np.argmax(err))
        # the error in units of its Monte Carlo standard error (this run's and the reference's): an
        # unbiased sampler gives |z| mostly below 3; a larger value is bias (or a run too short to mix)
        sd_run = flat.std(axis=0, ddof=1, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            mcse = sd_run / np.sqrt(ess_bulk)
            mcse_ref = ref.sd / np.sqrt(ref.info.get("ess", ref.ess()))
            z = np.abs(mean - ref.mean) / np.sqrt(mcse**2 + np.asarray(mcse_ref) ** 2)
        row["max_err_z"] = float(np.nanmax(z)) if np.any(np.isfinite(z)) else float("nan")
        ratio = sd_run / ref.sd
        if np.all(np.isfinite(ratio)):
            row["sd_ratio_min"] = float(np.min(ratio))
            row["sd_ratio_max"] = float(np.max(ratio))
            row["sd_ratio_range"] = f"{np.min(ratio):.2f}-{np.max(ratio):.2f}"
        # per parameter, for judging accuracy beyond Monte Carlo noise (tallmh.reporting.compare)
        with np.errstate(divide="ignore", invalid="ignore"):
            ess_ref = np.asarray(ref.info.get("ess", ref.ess()), float)
            # se of a ratio of two sds: about ratio * sqrt(1/(2 ESS) + 1/(2 ESS_ref))
            ratio_se = ratio * np.sqrt(0.5 / ess_bulk + 0.5 / ess_ref)
        with np.errstate(divide="ignore", invalid="ignore"):
            mcse_sd = np.sqrt(mcse**2 + np.asarray(mcse_ref) ** 2) / ref.sd  # the error's MCSE, in reference sd
        row["per_param"] = {"err_sd": err, "err_z": z, "mcse_sd": mcse_sd, "sd_ratio": ratio, "sd_ratio_se": ratio_se}
    return row


def _cell(f, v) -> str:
    """One cell of the table: a string as is, ``-`` for a missing number, a share of the data (``f`` "share") as
    a percentage (``0.00024%`` where three decimals would print 0.000%), else ``f.format``."""
    if isinstance(v, str):
        return v
    if not _finite(v):
        return "-"
    if f == "share":
        return f"{v:.3%}" if v == 0 or v >= 1e-3 else f"{100 * v:.2g}%"
    return f.format(int(v)) if "d}" in f else f.format(v)


def format_table(rows: Sequence[Dict[str, Any]], columns=COLUMNS) -> str:
    """The rows as a fixed-width text table (``-`` where a number is missing)."""
    cols = [(k, h, f) for k, h, f in columns if any(k in r for r in rows)]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        cells.append([_cell(f, r.get(k)) for k, _, f in cols])
    widths = [max(len(row[j]) for row in cells) for j in range(len(cols))]
    out = []
    for i, row in enumerate(cells):
        out.append("  ".join(c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def predictive_risk(run: MethodRun, X_test: np.ndarray, p_ref: np.ndarray, grid: np.ndarray):
    """Risk of the predictive mean on held-out rows versus wall-clock time (austerity paper, Fig. 3).

    For each chain, the estimate of ``P(y = 1 | x_j)`` at time t is the mean of ``sigmoid(x_j . theta)``
    over the sampling draws made by t; its risk is the mean over rows j of the squared difference from the
    reference ``p_ref``. Returns the risk at each time of ``grid`` averaged over chains (NaN before a
    chain's first sampling draw).
    """
    x = run.result.flat_samples
    c, k, _ = x.shape
    out = np.full((c, len(grid)), np.nan)
    for ch in range(c):
        if k == 0:
            continue
        p = _sigmoid(x[ch].astype(np.float64) @ X_test.T.astype(np.float64))  # (k, m)
        running = np.cumsum(p, axis=0) / np.arange(1, k + 1)[:, None]
        risk = np.mean((running - p_ref[None, :]) ** 2, axis=1)  # (k,)
        idx = np.searchsorted(run.times[ch], grid, side="right") - 1
        ok = idx >= 0
        out[ch, ok] = risk[idx[ok]]
    with np.errstate(all="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return np.nanmean(out, axis=0)


# ---------------------------------------------------------------------------------------------------
# files


def atomic_write(path: str, write, nbytes=None):
    """Call ``write(tmp_path)`` for a temporary file beside ``path``, sync it, then move it to ``path``
    (:func:`tallmh.storage.safe_io.atomic_write`: free space checked first when ``nbytes`` is given; an
    ``OSError`` becomes a one-line :class:`~tallmh.storage.safe_io.WriteError` naming the path)."""
    from ..storage.safe_io import atomic_write as write_safely

    return write_safely(path, write, nbytes)


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.ndarray):
        return _jsonable(v.tolist())
    if isinstance(v, (np.bool_, bool)):
        return bool(v)
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        v = float(v)
        return v if math.isfinite(v) else None
    return v


def write_json(path: str, obj) -> str:
    text = json.dumps(_jsonable(obj), indent=2, allow_nan=False)

    def w(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")

    return atomic_write(path, w)


def _savefig(fig, path):
    import matplotlib.pyplot as plt

    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    finally:
        plt.close(fig)
    return path


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


COLORS = {"exact": "#000000", "austerity": "#1f77b4", "confidence": "#2ca02c", "barker": "#d62728",
          "recommended": "#ff7f0e"}
# other methods: matplotlib's cycle without the colours above (a method never shares one with another)
_OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")


def _n(count: int, word: str) -> str:
    """``1 chain``, ``2 chains``."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _color(name, i):
    return COLORS.get(name, _OTHER_COLORS[i % len(_OTHER_COLORS)])


FIG_WIDTH = 9.6  # inches: at 110 dpi, 1,056 px, which fits the report's 1,100 px column at its natural size
DPI = 110


def _shown_params(d, names, max_params):
    idx = list(range(min(d, max_params)))
    return idx, [names[j] for j in idx]


def plot_traces(runs: Sequence[MethodRun], names: Sequence[str], path: str, max_params: int = 12,
                max_points: int = 1500) -> str:
    """Trace of each parameter against seconds into the run: one block of small panels per method (a
    titled row group, at most four panels a row), one colour per chain, warmup in grey.

    The figure is :data:`FIG_WIDTH` inches wide whatever the number of methods, so it shows at its natural
    size in the report. Long chains are thinned for drawing only (every k-th draw, at most about
    ``max_points`` per chain and phase).
    """
    plt = _plt()
    d = runs[0].result.flat_samples.shape[-1]
    idx, shown = _shown_params(d, names, max_params)
    ncol = min(4, len(idx))
    rows_per = int(math.ceil(len(idx) / ncol))
    panel_h = 1.35
    heights = [0.45 + panel_h * rows_per + 0.35 for _ in runs]
    note = "" if len(idx) == d else f"; first {len(idx)} of {d} parameters"
    fig = plt.figure(figsize=(FIG_WIDTH, sum(heights)))
    subs = fig.subfigures(len(runs), 1, height_ratios=heights, squeeze=False)[:, 0]
    for run, sub, hgt in zip(runs, subs, heights):
        r = run.result
        c, k = r.flat_samples.shape[:2]
        kw = r.flat_warmup.shape[1]
        tw = max(1, kw // max_points)
        ts = max(1, k // max_points)
        axes = sub.subplots(rows_per, ncol, squeeze=False, sharex=True)
        sub.suptitle(f"{run.name}: {_n(c, 'chain')} x {_n(k, 'draw')}"
                     + (f" after {_n(kw, 'warmup step')} (grey)" if kw else "")
                     + (" (PARTIAL: interrupted)" if getattr(r, "partial", False) else "") + note
                     + "; one colour per chain",
                     fontsize=9, fontweight="bold", x=0.01, ha="left", y=1 - 0.08 / hgt, va="top")
        for p, j in enumerate(idx):
            ax = axes[p // ncol, p % ncol]
            for ch in range(c):
                if kw:
                    ax.plot(run.warmup_times[ch, ::tw], r.flat_warmup[ch, ::tw, j], lw=0.5, color="0.6")
                if k:
                    ax.plot(run.times[ch, ::ts], r.flat_samples[ch, ::ts, j], lw=0.5, color=f"C{ch % 10}")
            if kw and run.warmup_times.size:
                ax.axvspan(0, float(np.max(run.warmup_times[:, -1])), color="0.93", zorder=-1)
            ax.set_title(shown[p], fontsize=8, pad=2)
            ax.tick_params(labelsize=7)
            ax.locator_params(axis="y", nbins=4)
            if p // ncol == rows_per - 1 or p + ncol >= len(idx):  # last panel of its column: label the axis
                ax.set_xlabel("seconds into the run", fontsize=7)
                ax.tick_params(labelbottom=True)
        for p in range(len(idx), rows_per * ncol):
            axes[p // ncol, p % ncol].axis("off")
        sub.subplots_adjust(left=0.07, right=0.99, bottom=0.45 / hgt, top=1 - 0.5 / hgt, wspace=0.3, hspace=0.55)
    for sub in subs:
        sub.set_facecolor("none")
    return _savefig(fig, path)


def _plot_range(pools, ref_flat=None):
    """Axis range covering the central 99.8% of every method's draws (and the reference's)."""
    lows, highs = [], []
    for v in ([ref_flat] if ref_flat is not None else []) + [v for v in pools if v.size]:
        lo, hi = np.quantile(v, [0.001, 0.999])
        lows.append(lo)
        highs.append(hi)
    if not lows:
        return -1.0, 1.0
    lo, hi = min(lows), max(highs)
    span = hi - lo if hi > lo else max(abs(hi), 1.0)
    return lo - 0.08 * span, hi + 0.08 * span


MIN_ESS_SHOWN = 100  # a method whose smallest bulk ESS is below this is drawn grey in the marginals


def _density(v, grid, max_points: int = 4000):
    """Gaussian kernel density estimate of draws ``v`` on ``grid`` (Scott's bandwidth; at most
    ``max_points`` draws, evenly thinned)."""
    v = np.asarray(v, np.float64)
    v = v[np.isfinite(v)]
    if v.size < 2:
        return None
    if v.size > max_points:
        v = v[np.linspace(0, v.size - 1, max_points).astype(int)]
    sd = v.std(ddof=1)
    iqr = np.subtract(*np.quantile(v, [0.75, 0.25]))
    spread = min(sd, iqr / 1.349) if iqr > 0 else sd
    if not (spread > 0):
        return None
    h = 1.06 * spread * v.size ** (-0.2)
    z = (grid[:, None] - v[None, :]) / h
    return np.exp(-0.5 * z * z).sum(axis=1) / (v.size * h * np.sqrt(2 * np.pi))


def _run_ess_min(run) -> float:
    x = run.result.flat_samples
    if x.shape[1] < 4:
        return 0.0
    try:
        return float(np.nanmin(diagnostics.ess_all(x)))
    except Exception:  # noqa: BLE001 - a plot, not a verdict
        return 0.0


def plot_marginals(runs: Sequence[MethodRun], names: Sequence[str], path: str, ref: Optional[Reference] = None,
                   laplace=None, max_params: int = 12) -> str:
    """Density of each parameter (one panel each): the reference (exact MH) as a grey area, each method as
    a line over it (a Gaussian kernel density estimate), or a dashed Laplace curve without a reference. A
    method whose smallest bulk ESS is under :data:`MIN_ESS_SHOWN` is drawn as a thin grey dotted line,
    labelled with its ESS: its curve is mostly noise. The range covers the central 99.8% of every method's
    draws; draws outside it are left out and their share is written in the panel."""
    plt = _plt()
    d = runs[0].result.flat_samples.shape[-1]
    idx, shown = _shown_params(d, names, max_params)
    ncol = min(4, len(idx))
    nrow = int(math.ceil(len(idx) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(FIG_WIDTH, 2.3 * nrow + 0.9), squeeze=False)
    ess = [_run_ess_min(run) for run in runs]
    for p, j in enumerate(idx):
        ax = axes[p // ncol, p % ncol]
        pools = [run.result.flat_samples[:, :, j].ravel() for run in runs]
        base = ref.flat[:, j] if ref is not None else None
        lo, hi = _plot_range(pools, base)
        grid = np.linspace(lo, hi, 200)
        outside = []
        if base is not None:
            dens = _density(base, grid, max_points=20000)
            if dens is not None:
                ax.fill_between(grid, dens, color="0.82", lw=0, label="reference (exact MH)")
        if laplace is not None and np.isfinite(laplace[0][j]) and np.isfinite(laplace[1][j]):
            mu, sd = laplace[0][j], laplace[1][j]
            ax.plot(grid, np.exp(-0.5 * ((grid - mu) / sd) ** 2) / (sd * np.sqrt(2 * np.pi)), color="0.4", ls="--",
                    lw=1, label="Laplace approx.")
        order = sorted(range(len(runs)), key=lambda i: ess[i] >= MIN_ESS_SHOWN)  # greyed ones underneath
        grey_styles = iter([":", "-.", (0, (1, 3)), "--"] * len(runs))
        for i in order:
            run, v = runs[i], pools[i]
            dens = _density(v, grid) if v.size else None
            if dens is None:
                continue
            if ess[i] >= MIN_ESS_SHOWN:
                ax.plot(grid, dens, lw=1.4, color=_color(run.name, i), label=run.name)
            else:
                ax.plot(grid, dens, lw=0.9, ls=next(grey_styles), color="0.55",
                        label=f"{run.name}: too few draws (ESS {ess[i]:.0f})")
            out = float(np.mean((v < lo) | (v > hi)))
            if out >= 0.0005:
                outside.append(f"{run.name}: {out:.1%}")
        if outside:
            ax.text(0.02, 0.97, "outside: " + ", ".join(outside), transform=ax.transAxes, fontsize=6, va="top",
                    color="0.3")
        ax.set_ylim(bottom=0)
        ax.set_title(shown[p], fontsize=9)
        ax.tick_params(labelsize=7)
        ax.locator_params(axis="x", nbins=4)
        ax.locator_params(axis="y", nbins=3)
        ax.set_xlabel("value", fontsize=7)
        if p % ncol == 0:
            ax.set_ylabel("density", fontsize=8)
    for p in range(len(idx), nrow * ncol):
        axes[p // ncol, p % ncol].axis("off")
    h, lab = axes[0, 0].get_legend_handles_labels()
    fh = fig.get_figheight()
    if lab:
        fig.legend(h, lab, loc="upper center", ncol=min(len(lab), 4), fontsize=8, frameon=False,
                   bbox_to_anchor=(0.5, 1 - 0.05 / fh))
    else:
        fig.text(0.5, 1 - 0.1 / fh, "no draws yet", ha="center", va="top", fontsize=9, color="0.3")
    note = "" if len(idx) == d else f" (first {len(idx)} of {d} parameters)"
    if note:
        fig.text(0.99, 0.01, note.strip(), ha="right", fontsize=7, color="0.3")
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.5 / fh, top=1 - (0.35 + 0.2 * max(1, math.ceil(len(lab) / 4))) / fh,
                        wspace=0.25, hspace=0.7)
    return _savefig(fig, path)


def plot_data_use(runs: Sequence[MethodRun], n: int, path: str) -> str:
    """Histogram of the data items read per sampling step, one panel per method (at most four a row),
    log-log axes shared by all panels."""
    plt = _plt()
    ncol = min(4, len(runs))
    nrow = int(math.ceil(len(runs) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(FIG_WIDTH, 2.5 * nrow + 0.7), sharex=True, sharey=True,
                             squeeze=False)
    allv = [np.asarray(run.result.stats["n_data"]).ravel() for run in runs]
    lo = max(1, min([int(v.min()) for v in allv if v.size] + [n // 10] or [1]))
    edges = np.unique(np.geomspace(lo * 0.9, n * 1.1, 40))
    for i, (run, v) in enumerate(zip(runs, allv)):
        ax = axes[i // ncol, i % ncol]
        if v.size:
            counts, _ = np.histogram(np.maximum(v, 1), bins=edges)
            ax.stairs(counts, edges, fill=True, color=_color(run.name, i))
            ax.axvline(v.mean(), color="k", ls="--", lw=1)
            ax.set_title(f"{run.name}\nmean {v.mean():,.0f} items ({v.mean() / n:.1%} of N)", fontsize=8)
        else:
            ax.set_title(f"{run.name}\n(no draws)", fontsize=8)
        ax.axvline(n, color="0.5", ls=":", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        if i // ncol == nrow - 1 or i + ncol >= len(runs):
            ax.set_xlabel("items read in one step", fontsize=8)
        if i % ncol == 0:
            ax.set_ylabel("steps", fontsize=8)
        ax.tick_params(labelsize=7)
    for i in range(len(runs), nrow * ncol):
        axes[i // ncol, i % ncol].axis("off")
    fh = fig.get_figheight()
    fig.suptitle(f"Data used per step (N = {n:,}: dotted line; dashed: the mean)", fontsize=10, y=1 - 0.08 / fh,
                 va="top")
    fig.subplots_adjust(left=0.08, right=0.99, bottom=0.55 / fh, top=1 - 0.75 / fh, wspace=0.12, hspace=0.75)
    return _savefig(fig, path)


def plot_risk(curves: Dict[str, tuple], path: str, budget_note: str = "") -> str:
    """``curves[name] = (t, risk)``: log risk of the predictive mean against seconds."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, (name, (t, risk)) in enumerate(curves.items()):
        ok = np.isfinite(risk) & (risk > 0)
        if ok.any():
            ax.plot(t[ok], risk[ok], color=_color(name, i), label=name, lw=1.5)
    ax.set_yscale("log")
    ax.set_xlabel("seconds into the run (warmup and sampling; compilation excluded)")
    ax.set_ylabel("risk of predictive mean (held-out rows)")
    ax.set_title("Risk of the predictive mean vs wall-clock time" + (f"\n{budget_note}" if budget_note else ""),
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return _savefig(fig, path)


# ---------------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:0.9em;margin:0.6em 0}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:right;white-space:nowrap}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}
img{max-width:100%;height:auto;border:1px solid #eee;margin:0.4em 0}
.note{color:#555;font-size:0.92em}figure{margin:0}
.verdicts ul{list-style:none;padding-left:0}.verdicts li{margin:0.2em 0;padding:2px 8px;border-left:4px solid}
.verdicts li.ok{border-color:#2ca02c}.verdicts li.bad{border-color:#d62728;background:#fff3f3}code,pre{background:#f6f6f6;padding:1px 4px}
pre{padding:8px;overflow-x:auto}.scroll{overflow-x:auto}
"""


def _rows_html(rows, columns=COLUMNS):
    cols = [(k, h, f) for k, h, f in columns if any(k in r for r in rows)]
    out = ["<div class=\"scroll\"><table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for _, h, _ in cols) + "</tr>"]
    for r in rows:
        cells = [f"<td>{html.escape(_cell(f, r.get(k)))}</td>" for k, _, f in cols]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _frame_html(df, digits=4):
    df = df.copy()
    df.index.name = None  # no extra header row for the index name
    return ("<div class=\"scroll\">" + df.to_html(float_format=lambda v: f"{v:.{digits}g}", border=0, na_rep="-")
            + "</div>")


def write_html(path: str, *, title: str, intro: Sequence[str], rows, table_text: str, sections: Sequence[tuple],
               images: Sequence[tuple], details: Sequence[tuple] = (), tables: Sequence[tuple] = (),
               verdicts: Sequence[tuple] = ()) -> str:
    """Write ``report.html``: a title, the verdicts, paragraphs, the table, images and notes.

    Plain text (escaped here, once): ``title``, headings, image file names and alt texts, ``details``
    summaries, ``verdicts``. HTML (written as given; escape what you put in): ``intro`` paragraphs,
    ``sections`` paragraphs, image captions, ``details`` and ``tables`` bodies.

    ``verdicts``: ``(method, trusted, line)`` shown first, one line per method; ``sections``: ``(heading,
    [paragraph html, ...])``; ``images``: ``(heading, file name, alt text, caption html)``; ``details``:
    ``(summary text, html)`` shown folded; ``tables``: ``(heading, html)`` shown after the results.
    """
    e = html.escape
    parts = [f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
             f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
             f"<title>{e(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{e(title)}</h1>"]
    if verdicts:
        items = []
        for method, ok, line in verdicts:
            cls = "ok" if ok else "bad"
            items.append(f"<li class=\"{cls}\"><b>{e(str(method))}</b>: {e(str(line))}</li>")
        parts.append("<div class=\"verdicts\"><h2>Verdict</h2><ul>" + "".join(items) + "</ul></div>")
    parts += [f"<p>{p}</p>" for p in intro]
    parts.append("<h2>Results</h2>")
    parts.append(_rows_html(rows))
    parts.append(f"<details><summary>as printed</summary><pre>{e(table_text)}</pre></details>")
    for heading, body in tables:
        parts.append(f"<h2>{e(heading)}</h2>")
        parts.append(body)
    for heading, paras in sections:
        parts.append(f"<h2>{e(heading)}</h2>")
        parts += [f"<p class=\"note\">{p}</p>" for p in paras]
    for heading, fname, alt, caption in images:
        parts.append(f"<h2>{e(heading)}</h2>")
        parts.append(f"<figure><img src=\"{e(fname)}\" alt=\"{e(alt)}\">"
                     + (f"<figcaption class=\"note\">{caption}</figcaption>" if caption else "") + "</figure>")
    for summary, body in details:
        parts.append(f"<details><summary>{e(summary)}</summary>{body}</details>")
    parts.append("</body></html>")
    text = "\n".join(parts)

    def w(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return atomic_write(path, w)


def idata_with_names(result, names, extra: Optional[Dict[str, tuple]] = None, dim: str = "parameter"):
    """``result.to_arviz()`` with the parameter axis of ``theta`` named ``dim`` and labelled by ``names``;
    ``extra``: more posterior variables ``{name: (draws (chain, draw, k), coordinate labels)}`` (e.g.
    coefficients on the original scale of the data; the axis is named ``<name>_dim``, or the third item
    of the tuple when given), or ``(chain, draw)`` arrays with labels None."""
    from .diagnostics import label_dim

    idata = result.to_arviz()
    if len(names) == result.flat_samples.shape[-1]:
        try:
            idata = label_dim(idata, "theta_dim_0", dim, names)
        except Exception:  # noqa: BLE001 - names are a convenience; the draws are written regardless
            idata = result.to_arviz()
    if extra:
        import xarray as xr

        for var, spec in extra.items():
            arr, labels = np.asarray(spec[0]), spec[1]
            if arr.ndim == 3:
                axis = spec[2] if len(spec) > 2 else f"{var}_dim"
                da = xr.DataArray(arr, dims=("chain", "draw", axis), coords={axis: list(labels)})
            else:
                da = xr.DataArray(arr, dims=("chain", "draw"))
            idata.posterior[var] = da
    return idata


def write_netcdf(path: str, result, names, extra: Optional[Dict[str, tuple]] = None, dim: str = "parameter") -> str:
    """The draws as ArviZ InferenceData in NetCDF (``arviz.from_netcdf``), written atomically
    (:func:`idata_with_names`)."""
    idata = idata_with_names(result, names, extra, dim=dim)
    # libhdf5 does not fail cleanly on a full disk (it can crash the process): check the space first, for
    # the file as written (ArviZ compresses it: the arrays' own size overstated it about 4 times)
    nbytes = sum(_compressed_size(v) for g in diagnostics.group_names(idata) for v in idata[g].variables.values())
    atomic_write(path, lambda tmp: idata.to_netcdf(tmp), nbytes=int(1.25 * nbytes) + (1 << 20))
    return path


def _compressed_size(variable, sample: int = 1 << 18) -> int:
    """The bytes ``variable`` takes compressed with zlib (as ArviZ's NetCDF writer does): its size times the
    ratio measured on evenly spaced runs of it (never more than its own size)."""
    import zlib

    a = np.asarray(variable.values)
    if a.dtype.kind not in "biuf" or a.nbytes <= sample:
        return int(a.nbytes)
    flat = a.reshape(-1)
    per = max(1, sample // (8 * a.itemsize))
    starts = np.linspace(0, flat.size - per, 8).astype(int)
    raw = b"".join(np.ascontiguousarray(flat[s:s + per]).tobytes() for s in starts)
    ratio = len(zlib.compress(raw, 4)) / max(len(raw), 1)
    return int(min(1.0, ratio) * a.nbytes)


def frame_html(df, digits=4):
    """A pandas DataFrame as an HTML table for :func:`write_html` details."""
    return _frame_html(df, digits)
