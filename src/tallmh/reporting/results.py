"""What a run returns: draws, per-step statistics, timings, and summaries."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import numpy as np

from . import diagnostics
from ..errors import ConfigError, TrustWarning
from ..labels import method_label  # noqa: F401 (re-exported: the runner and reports name methods by it)

__all__ = ["Result", "Summary", "TrustWarning", "load_result", "method_label"]

# Thresholds of the verdict: R-hat and bulk ESS as Vehtari et al. (2021) recommend; the normal
# approximation is doubted when the test's estimated error inflation (Austerity: tail_excess), averaged
# over the steps it decided from a subsample, exceeds EXCESS_MAX (the estimated wrong-decision rate is then
# 1.5 times the target or more; benchmarks/skewed_items.py: the symmetric boundary's excess on log-normal and
# Bernoulli(0.02) items, where it breaks the promise, was 0.63-2.9; the corrected boundary's at most 0.32).
RHAT_MAX = 1.01
ESS_MIN = 100.0
EXCESS_MAX = 0.5


def audit_line(o) -> str:
    """One line on the self-audit from a summary's ``overall`` dict ('' when there was none)."""
    m = o.get("audit_steps", 0)
    if not m:
        return ""
    tgt = o.get("audit_target")
    if o.get("audit_kind") == "distribution":
        lo, hi = o["audit_bias_ci"]
        s = f"self-audit: acceptance bias {o['audit_bias']:+.3f} (95% CI {lo:+.3f} to {hi:+.3f}) in {m} audits"
        return s + (f", bound {tgt:g}\n" if tgt else "\n")
    lo, hi = o["audit_ci"]
    s = (f"self-audit: {o['audit_wrong']} of {m} audited decisions differ from exact MH, rate {o['audit_rate']:.3f} "
         f"(95% CI {lo:.3f}-{hi:.3f})")
    if tgt:
        s += f", target {tgt:g}; power {o['audit_power']:.2f} to flag twice the target"
    else:
        s += " (this test makes no per-step promise)"
    est = o.get("excess_error", 0.0)
    if tgt and est > 0:
        s += f"; rate estimated from the items read {estimated_rate(tgt, est)} at most"
    return s + "\n"


def kind_line(o) -> str:
    """One line on what the verdict covers: an exact subsampled test's chain targets the exact posterior; an
    approximate test's audit checks each step's error, which does not bound a slow drift of the posterior."""
    if str(o.get("label", "")).startswith("exact-subsampled"):
        return "exact: the chain targets the exact posterior (subsampled MH with exact decisions; nothing to audit)\n"
    if o.get("audit_target"):
        return ("approximate: each step's error is audited, a slow drift of the posterior is not bounded "
                "(compare with test=tm.acceptance.Exact() where it matters)\n")
    return ""


def estimated_rate(target: float, excess: float) -> str:
    """The wrong-decision rate ``target * (1 + excess)`` as text, never above 1: where the estimate passes 1,
    the normal approximation it comes from does not hold, and the text says so."""
    rate = target * (1 + excess)
    return f"{rate:.3f}" if rate < 1 else "1 (the estimate passes 1: its normal approximation fails here)"


_BLOCK = 1 << 20  # draws per block where a run's statistics are summed


def _stat_sum(result, key) -> float:
    """The sum of a per-step statistic over warmup and sampling, read in blocks of draws (a long run's
    statistics are memory maps: never copied whole)."""
    total = 0
    for st in (result.warmup_stats, result.stats):
        v = st.get(key)
        if v is None or not np.size(v):
            continue
        v = v if np.ndim(v) == 2 else np.reshape(v, (1, -1))
        for a in range(0, v.shape[1], _BLOCK):
            total += np.asarray(v[:, a:a + _BLOCK]).sum()
    return total


def audit_power(m: int, target: float, factor: float = 2.0) -> float:
    """Probability that ``m`` audits flag a true wrong-decision rate of ``factor * target``.

    The verdict flags a run when the 95% Wilson interval of the audited rate lies above the target; with
    ``m`` audits that needs at least ``k*`` wrong decisions (the smallest k whose interval's lower end
    exceeds the target), and the power is ``P(Binomial(m, factor * target) >= k*)``.
    """
    if m <= 0 or not target:
        return 0.0
    k = next((k for k in range(m + 1) if _wilson(k, m)[0] > target), None)
    if k is None:
        return 0.0
    return _binom_sf(k - 1, m, min(1.0, factor * target))


def _binom_sf(k: int, m: int, p: float) -> float:
    """``P(Binomial(m, p) > k)`` for ``0 <= k``: the upper tail summed term by term in log space (m is an audit
    count, at most a few thousand; importing scipy.stats or scipy.special cost a fresh process 0.2-1 s)."""
    if k >= m:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    lp, lq = math.log(p), math.log1p(-p)
    base = math.lgamma(m + 1)
    logs = [base - math.lgamma(j + 1) - math.lgamma(m - j + 1) + j * lp + (m - j) * lq for j in range(k + 1, m + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * math.fsum(math.exp(v - top) for v in logs))


def audit_first_stage(target: Optional[float], loss: float = 0.01, factor: float = 2.0) -> Optional[int]:
    """The first stage of the default self-audit: the fewest audits ``m1`` with ``(1 - factor * target)^m1 <=
    loss``, i.e. a true wrong-decision rate of ``factor * target`` finds no wrong decision in ``m1`` audits with
    probability at most ``loss`` (44 at a target of 0.05). A run whose first ``m1`` audits find none stops
    auditing; the design's power to flag that rate is then at least the full plan's power less ``loss``.
    None without a target."""
    if not target or factor * target >= 1.0:
        return None
    return int(math.ceil(math.log(loss) / math.log1p(-factor * target)))


def design_power(design: Optional[Dict[str, Any]], m: int, target: float, factor: float = 2.0) -> float:
    """Power of the audit as run to flag a true wrong-decision rate of ``factor * target``: the fixed-sample
    :func:`audit_power` of its ``m`` audits, or, where the two-stage default stopped after its first stage,
    the whole plan's power less the probability of passing that stage at that rate (a lower bound)."""
    if not design or design.get("cleared_after") is None:
        return audit_power(m, target, factor)
    first = int(design["first_stage"])
    return max(0.0, audit_power(int(design["planned"]), target, factor) - (1.0 - factor * target) ** first)


def audits_for_power(target: float, power: float = 0.8, factor: float = 2.0, most: int = 100_000) -> int:
    """The fewest audits with :func:`audit_power` >= ``power`` (binomial power is not monotone in m:
    the first m from which it stays above, checked over the next 10% of m)."""
    m = max(1, int(4.0 / target))
    while m < most:
        if audit_power(m, target, factor) >= power and all(
                audit_power(m + j, target, factor) >= power - 0.03 for j in range(1, max(2, m // 10))):
            return m
        m = int(m * 1.05) + 1
    return most


def _wilson(k: int, m: int, z: float = 1.96):
    """Wilson score interval for a binomial proportion k/m (95% by default)."""
    if m == 0:
        return (float("nan"), float("nan"))
    p = k / m
    den = 1 + z * z / m
    c = (p + z * z / (2 * m)) / den
    h = z * math.sqrt(p * (1 - p) / m + z * z / (4 * m * m)) / den
    return (max(0.0, c - h), min(1.0, c + h))


def _param_names(unravel, d, coords=None):
    """Names of the flat coordinates, like ``theta[0]`` or ``w[1, 2]`` (or ``a[g000]`` with ``coords``)."""
    return _tree_names(jax.eval_shape(unravel, jax.ShapeDtypeStruct((d,), np.float32)), coords)  # (shapes only)


def _tree_names(template, coords=None):
    """Names of the coordinates of a parameter pytree, in ``ravel_pytree`` order. ``coords`` (``{site: [labels of
    axis 0, labels of axis 1, ...]}``, e.g. a Bambi group term's levels) names a site's entries by label
    (``1|g[g000]``) instead of by position (``1|g[0]``); an axis whose labels do not match its length keeps
    positions."""
    coords = coords or {}
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]:
        base = jax.tree_util.keystr(path).strip("[]'\"") or "theta"
        shape = np.shape(leaf)
        if shape == ():
            names.append(base)
            continue
        labels = list(coords.get(base) or [])
        axes = [[str(v) for v in labels[a]] if a < len(labels) and labels[a] is not None
                and len(labels[a]) == k else [str(i) for i in range(k)] for a, k in enumerate(shape)]
        for idx in np.ndindex(*shape):
            names.append(f"{base}[{', '.join(axes[a][i] for a, i in enumerate(idx))}]")
    return names


# the printed summary shows a site in one line (not one row per entry) where it is a group-level term with more
# than SUMMARY_LEVELS entries (its entries labelled by a front end's coords, e.g. Bambi's 1|g levels), or where
# any site has more than SUMMARY_LARGE entries; an ordinary parameter vector (a regression's coefficients) is
# printed entry by entry
SUMMARY_LEVELS = 10
SUMMARY_LARGE = 50


def _site_of(name: str) -> str:
    """The site of a coordinate's name: ``1|g`` for ``1|g[g000]``, ``x1`` for ``x1``."""
    return name.split("[", 1)[0] if name.endswith("]") else name


def group_lines(rows, labelled=()) -> Tuple[list, list]:
    """``(rows shown one by one, [summary of each large site])``. A site is summarised when it is in
    ``labelled`` (its entries named by a front end's coords: group-level effects) with more than
    ``SUMMARY_LEVELS`` entries, or has more than ``SUMMARY_LARGE`` entries; every other row (fixed effects,
    scales, a regression's coefficient vector) is shown one by one, in order. A summary holds the site's number
    of entries, the worst R-hat and the smallest bulk and tail ESS over them, and its largest ``|mean|`` with
    that entry's name."""
    sites: Dict[str, list] = {}
    for r in rows:
        sites.setdefault(_site_of(r["param"]), []).append(r)
    small, large = [], []
    for site, rs in sites.items():
        if len(rs) <= (SUMMARY_LEVELS if site in labelled else SUMMARY_LARGE):
            small.extend(rs)
            continue

        def worst(key, fn):
            vals = np.array([r[key] for r in rs], float)
            return float(fn(vals)) if np.any(np.isfinite(vals)) else float("nan")

        means = np.abs(np.array([r["mean"] for r in rs], float))
        top = int(np.nanargmax(means)) if np.any(np.isfinite(means)) else 0
        large.append({"site": site, "levels": len(rs), "r_hat_max": worst("r_hat", np.nanmax),
                      "ess_bulk_min": worst("ess_bulk", np.nanmin), "ess_tail_min": worst("ess_tail", np.nanmin),
                      "max_abs_mean": float(means[top]), "at": rs[top]["param"]})
    return small, large


class Summary:
    """Per-parameter table (``table``, a pandas DataFrame) and run-level numbers (``overall``, a dict).

    ``table`` is made on first use from the rows (a list of dicts, or a DataFrame as is): the verdict that
    every call computes needs only ``overall``, and pandas takes ~0.3 s to import."""

    def __init__(self, table, overall: Dict[str, float], labelled=()):
        self._table = table
        self.overall = overall
        self.labelled = frozenset(labelled)  # sites whose entries a front end named (group-level terms)

    @property
    def table(self):
        if isinstance(self._table, list):
            import pandas as pd

            self._table = pd.DataFrame(self._table).set_index("param")
        return self._table

    @property
    def groups(self):
        """One row per site printed in one line (:func:`group_lines`: a group-level term of more than
        ``SUMMARY_LEVELS`` levels, or any site of more than ``SUMMARY_LARGE`` entries): ``site``, ``levels``,
        ``r_hat_max``, ``ess_bulk_min``, ``ess_tail_min``, ``max_abs_mean`` and the entry ``at`` which it is;
        ``table`` keeps every entry's row."""
        return group_lines(self._rows(), self.labelled)[1]

    def _rows(self):
        if isinstance(self._table, list):
            return self._table
        return [{"param": k, **v} for k, v in self._table.to_dict("index").items()]

    def __str__(self):
        o = self.overall
        head = (
            f"method {o['label']}: {o['chains']} chain{'' if o['chains'] == 1 else 's'} x {o['draws']} "
            f"draw{'' if o['draws'] == 1 else 's'}, N = {o['N']}"
            + (" [PARTIAL: interrupted]" if o["partial"] else "")
            + f"\nacceptance {o['acceptance_rate']:.3f}, mean data fraction per step {o['data_fraction']:.4g}"
            f" (mean items {o['mean_n_data']:.1f}), ESS min {o['ess_min']:.1f}, ESS/s {o['ess_per_s']:.2f}"
            f", R-hat max {o['rhat_max']:.3f}\n{audit_line(o)}{o['verdict']}\n"
            + "".join(m + "\n" for m in o.get("notes") or () if m.startswith("data note: "))  # (degenerate columns)
            + f"{kind_line(o)}sampling {o['sampling_s']:.2f}s, warmup {o['warmup_s']:.2f}s, "
            f"compile {o['compile_s']:.2f}s, set-up items {o['setup_items']}\n"
        )
        small, large = group_lines(self._rows(), self.labelled)
        if not large:
            return head + self.table.to_string(float_format=lambda v: f"{v:.4g}")
        import pandas as pd

        text = head + (pd.DataFrame(small).set_index("param").to_string(float_format=lambda v: f"{v:.4g}")
                       if small else "")
        for g in large:
            text += (f"\n{g['site']}: {g['levels']} entries (summary().table has each), R-hat max {g['r_hat_max']:.3f}, "
                     f"ESS bulk min {g['ess_bulk_min']:.1f}, tail min {g['ess_tail_min']:.1f}, largest |mean| "
                     f"{g['max_abs_mean']:.4g} at {g['at']}")
        return text

    def _repr_html_(self):  # pragma: no cover - notebook display
        return "<pre>" + str(self) + "</pre>"


@dataclass
class Result:
    """Output of :func:`tallmh.sample`.

    ``samples``: pytree of arrays shaped ``(chain, draw, ...)``; ``stats``: dict of ``(chain, draw)`` arrays
    ``accepted``, ``n_data`` (items read by the test, including any full pass for a bound) and ``rounds``.
    ``warmup_samples`` / ``warmup_stats`` hold the warmup phase. ``timings``: ``compile_s``, ``warmup_s``,
    ``sampling_s``, ``total_s``. ``setup_items``: items read once before sampling (model set-up, the exact
    test's initial full log-likelihood). ``partial``: True when the run was interrupted.
    """

    flat_samples: np.ndarray
    stats: Dict[str, np.ndarray]
    flat_warmup: np.ndarray
    warmup_stats: Dict[str, np.ndarray]
    unravel: Callable
    n: int
    method: str
    test: Any
    proposal: Any
    timings: Dict[str, float]
    setup_items: int
    partial: bool = False
    final_state: Any = None
    notes: List[str] = field(default_factory=list)
    resume_info: Dict[str, Any] = field(default_factory=dict)
    control_variates: Any = None
    # Optional output map (e.g. NumPyro models: unconstrained theta -> {site: constrained value}); when set,
    # ``samples``, ``summary()`` and ``to_arviz()`` show its output (``flat_output``, ``output_names``), while
    # ``flat_samples``/``param_names`` stay the chain's own (unconstrained) coordinates.
    constrain: Optional[Callable] = field(default=None, repr=False)
    # a loaded run's reported draws ({"sampling": tree, "warmup": tree}), saved because ``constrain`` (a
    # model's function) is not: ``load_result`` keeps the named, constrained view of the run it reads
    stored_output: Optional[Dict[str, Any]] = field(default=None, repr=False)
    # labels of a site's entries ({site: [labels of axis 0, ...]}, e.g. a Bambi group term's levels): the names of
    # ``output_names``, the summary's rows and ``to_arviz()``'s coordinates
    coords: Optional[Dict[str, Any]] = None
    _names: Any = field(default=None, repr=False)
    _cache: Dict[str, Any] = field(default_factory=dict, repr=False)

    def _tree(self, flat):
        c, k, d = flat.shape
        if self.constrain is None and self.stored_output is not None:
            return self.stored_output["warmup" if flat is self.flat_warmup else "sampling"]
        if c * k == 0:
            template = self.unravel(np.zeros(d, flat.dtype))
            return jax.tree_util.tree_map(lambda a: np.zeros((c, k) + np.shape(a), flat.dtype), template)
        if self.constrain is not None:
            un = jax.jit(jax.vmap(jax.vmap(lambda f: self.constrain(self.unravel(f)))))
        else:
            un = jax.vmap(jax.vmap(self.unravel))
        return jax.tree_util.tree_map(np.asarray, un(flat))

    @property
    def samples(self):
        return self._tree(self.flat_samples)

    @property
    def warmup_samples(self):
        return self._tree(self.flat_warmup)

    @property
    def param_names(self):
        if self._names is None:
            self._names = _param_names(self.unravel, self.flat_samples.shape[-1], self.coords)
        return self._names

    @property
    def flat_output(self) -> np.ndarray:
        """Draws ``(chain, draw, D)`` as reported: ``flat_samples`` unless a ``constrain`` map is set (then in the sites'
        common floating type: float32 as the chains store them, float64 in 64-bit mode)."""
        if self.constrain is None and self.stored_output is None:
            return self.flat_samples
        if "flat_output" not in self._cache:
            c, k, _ = self.flat_samples.shape
            leaves = jax.tree_util.tree_leaves(self.samples)
            # (filled site by site: no float64 copy of every site beside the joined array; the sites' own type,
            # float32 draws stay float32: the summary's means and sds are taken in float64 column block by block)
            widths = [int(np.prod(np.shape(a)[2:], dtype=np.int64)) for a in leaves]
            out = np.empty((c, k, sum(widths)), np.result_type(np.float32, *(np.dtype(getattr(a, "dtype", float)) for a in leaves)))
            j = 0
            for a, w in zip(leaves, widths):
                out[:, :, j:j + w] = np.reshape(a, (c, k, w))
                j += w
            self._cache["flat_output"] = out
        return self._cache["flat_output"]

    @property
    def output_names(self):
        """Names of the columns of ``flat_output``."""
        if self.constrain is None and self.stored_output is None:
            return self.param_names
        if "output_names" not in self._cache:
            d = self.flat_samples.shape[-1]
            if self.constrain is None:
                template = jax.tree_util.tree_map(lambda a: np.zeros(np.shape(a)[2:]), self.stored_output["sampling"])
            else:
                template = jax.tree_util.tree_map(
                    np.asarray, self.constrain(self.unravel(np.zeros(d, self.flat_samples.dtype))))
            self._cache["output_names"] = _tree_names(template, self.coords)
        return self._cache["output_names"]

    @property
    def num_chains(self):
        return self.flat_samples.shape[0]

    @property
    def num_draws(self):
        return self.flat_samples.shape[1]

    @property
    def data_fraction(self) -> float:
        """Mean fraction of the N items read per sampling step."""
        if self.num_draws == 0:
            return float("nan")
        return float(np.mean(self.stats["n_data"])) / self.n

    def summary(self) -> Summary:
        """Per-parameter table and run-level numbers, with the verdict (computed once, then cached)."""
        if "summary" not in self._cache:
            self._cache["summary"] = self._summary()
        return self._cache["summary"]

    def _summary(self) -> Summary:
        cols = diagnostics.summary_columns(self.flat_output)
        bulk, rh = cols["ess_bulk"], cols["r_hat"]
        keys = ("mean", "sd", "ess_bulk", "ess_tail", "r_hat")
        rows = [{"param": name, **{key: float(cols[key][j]) for key in keys}} for j, name in enumerate(self.output_names)]
        ess_min = float(np.nanmin(bulk)) if len(rows) and np.any(np.isfinite(bulk)) else float("nan")
        secs = self.timings.get("sampling_s", float("nan"))
        overall = {
            "method": self.method,
            "N": self.n,
            "chains": self.num_chains,
            "draws": self.num_draws,
            "partial": self.partial,
            "acceptance_rate": float(np.mean(self.stats["accepted"])) if self.num_draws else float("nan"),
            "data_fraction": self.data_fraction,
            "mean_n_data": float(np.mean(self.stats["n_data"])) if self.num_draws else float("nan"),
            "ess_min": ess_min,
            "ess_per_s": ess_min / secs if secs and secs > 0 else float("nan"),
            "rhat_max": float(np.nanmax(rh)) if len(rows) and np.any(np.isfinite(rh)) else float("nan"),
            "setup_items": int(self.setup_items),
            **{k: float(v) for k, v in self.timings.items()},
        }
        overall["ess_per_s_total"] = ess_min / self.timings["total_s"] if self.timings.get("total_s") else float("nan")
        overall["label"] = self.label
        overall.update(self.audit)
        overall["excess_error"] = self.excess_error
        overall["nonfinite_items"] = self.nonfinite_items
        overall["notes"] = list(self.notes)
        warns = self._warnings(overall)
        overall["warnings"] = warns
        overall["trusted"] = not warns
        overall["verdict"] = "trusted" if not warns else "NOT trusted: " + "; ".join(warns)
        labelled = [s for s, axes in (self.coords or {}).items() if any(ax is not None for ax in axes or ())]
        return Summary(rows, overall, labelled)

    # ---- trust ------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """The method with its options, e.g. ``austerity(error=0.05)+cv``."""
        return method_label(self.test, self.control_variates)

    def _all_stats(self, key):
        parts = [st[key] for st in (self.warmup_stats, self.stats) if key in st and np.size(st[key])]
        return np.concatenate([np.ravel(p) for p in parts]) if parts else np.zeros(0)

    @property
    def audit(self) -> Dict[str, Any]:
        """The self-audit: steps where the exact test also decided with the same u (warmup and sampling).

        ``audit_steps``, ``audit_wrong`` (decisions that differ), ``audit_rate`` and its 95% Wilson interval
        ``audit_ci``; ``audit_items`` (items the audits read, not in ``n_data``). For the minibatch Barker
        test, whose noise differs from the exact Barker test's, decisions are compared in distribution:
        ``audit_bias`` = mean(approximate accept - exact accept) with a 95% interval ``audit_bias_ci``.
        ``audit_target``: the per-step error the test promises (None if it makes no such promise).
        """
        aud = self._all_stats("audited").astype(bool)
        acc = self._all_stats("accepted").astype(bool)
        ex = self._all_stats("audit_exact").astype(bool)
        m = int(aud.sum()) if aud.size else 0
        out: Dict[str, Any] = {"audit_steps": m, "audit_items": int(_stat_sum(self, "audit_items"))}
        counts = self._all_stats("audit_count")
        if counts.size:  # an inference program: several decisions per step, counted by its blocks
            m = int(counts.sum())
            wrong = int(self._all_stats("audit_wrong").sum())
            out.update(audit_steps=m, audit_wrong=wrong, audit_rate=wrong / m if m else float("nan"),
                       audit_ci=_wilson(wrong, m) if m else (float("nan"), float("nan")),
                       audit_bias=float("nan"), audit_bias_ci=(float("nan"), float("nan")))
        elif m and acc.size == aud.size:
            a, e = acc[aud], ex[aud]
            wrong = int(np.sum(a != e))
            out["audit_wrong"] = wrong
            out["audit_rate"] = wrong / m
            out["audit_ci"] = _wilson(wrong, m)
            diff = a.astype(float) - e.astype(float)
            sd = float(np.std(diff, ddof=1)) if m > 1 else float("nan")
            bias = float(np.mean(diff))
            out["audit_bias"] = bias
            out["audit_bias_ci"] = (bias - 1.96 * sd / math.sqrt(m), bias + 1.96 * sd / math.sqrt(m))
        else:
            out.update(audit_wrong=0, audit_rate=float("nan"), audit_ci=(float("nan"), float("nan")),
                       audit_bias=float("nan"), audit_bias_ci=(float("nan"), float("nan")))
        out["audit_kind"] = "distribution" if getattr(self.test, "name", "") == "barker" else "decision"
        out["audit_target"] = tgt = error_target(self.test)
        out["audit_power"] = design_power((self.resume_info or {}).get("audit_design"), m, tgt) \
            if (tgt and out["audit_kind"] == "decision") else float("nan")
        return out

    @property
    def excess_error(self) -> float:
        """Mean over sampling steps (warmup if none) that decided from a subsample of the test's estimated
        error inflation at its stopping look (:func:`tallmh.acceptance.austerity.tail_excess`): the run's
        wrong-decision rate is estimated as ``target * (1 + excess_error)``. 0 when the test does not lean on
        the CLT or read everything."""
        for st in (self.stats, self.warmup_stats):
            if "excess_error" not in st or not np.size(st["excess_error"]):
                continue
            total, count = 0.0, 0
            ee, nds = st["excess_error"], st["n_data"]
            k = np.shape(ee)[-1]
            for a in range(0, k, _BLOCK):  # (in blocks of draws: a long run's statistics are memory maps)
                c = np.asarray(ee[..., a:a + _BLOCK], float).ravel()
                nd = np.asarray(nds[..., a:a + _BLOCK]).ravel()
                ok = (nd > 0) & (nd < self.n)
                c = c[ok]
                total += float(np.sum(np.where(np.isfinite(c), c, 1e6)))
                count += int(ok.sum())
            return total / count if count else 0.0
        return 0.0

    @property
    def nonfinite_items(self) -> int:
        return int(_stat_sum(self, "nonfinite"))

    def _warnings(self, o) -> List[str]:
        """Reasons not to trust the run, each with what to do about it."""
        w = []
        if self.partial:
            w.append(f"partial run (interrupted after {o['draws']} draws per chain): resume it with "
                     f"sample(..., resume=result) or tallmh run --resume")
        if o["draws"] < 4:
            w.append("too few draws to judge convergence: run longer")
        else:
            more = _more_draws(o["draws"], o["ess_min"])
            if np.isfinite(o["rhat_max"]) and o["rhat_max"] > RHAT_MAX:
                w.append(f"R-hat {o['rhat_max']:.3f} > {RHAT_MAX}: chains have not mixed; run longer "
                         f"(num_samples={more}, --samples {more})")
            if not np.isfinite(o["ess_min"]) or o["ess_min"] < ESS_MIN:
                w.append(f"bulk ESS {o['ess_min']:.0f} < {ESS_MIN:.0f}: run longer (num_samples={more}, --samples {more})")
        approx = getattr(self.test, "approximate_target", None)
        if approx:
            w.append(f"approximate target: {approx}; check it against exact MH on a subset before reporting")
        tgt = o.get("audit_target")
        batch = getattr(self.test, "batch_size", None)
        raise_batch = f"raise the batch to {2 * batch}" if isinstance(batch, int) else "read larger batches"
        cv_hint = "" if self.control_variates is not None else " or add control variates"
        if o.get("audit_steps", 0) > 0 and tgt is not None:
            if o["audit_kind"] == "decision" and o["audit_ci"][0] > tgt:
                w.append(f"audited wrong-decision rate {o['audit_rate']:.3f} (95% CI {o['audit_ci'][0]:.3f}-"
                         f"{o['audit_ci'][1]:.3f}, {o['audit_steps']} audits) above the test's target {tgt:g}: "
                         f"{raise_batch}{cv_hint}, or use test=Exact()")
            if o["audit_kind"] == "distribution" and (o["audit_bias_ci"][0] > tgt or o["audit_bias_ci"][1] < -tgt):
                w.append(f"audited acceptance bias {o['audit_bias']:+.3f} (95% CI {o['audit_bias_ci'][0]:+.3f} to "
                         f"{o['audit_bias_ci'][1]:+.3f}) beyond the test's bound {tgt:g}: {raise_batch}{cv_hint}")
        if o["excess_error"] > EXCESS_MAX:
            est = f" (estimated rate {estimated_rate(tgt, o['excess_error'])} against {tgt:g})" if tgt else ""
            form = ("; the error form (Austerity(error=...)) corrects for it"
                    if getattr(self.test, "name", "") == "austerity" and not getattr(self.test, "skew_correction", True)
                    else "")
            w.append(f"skewed per-item log-likelihood ratios: the normal approximation behind the test's decisions "
                     f"inflates their error by an estimated {100 * o['excess_error']:.0f}%{est}; {raise_batch}{cv_hint}{form}")
        if o["nonfinite_items"] > 0:
            w.append(f"{o['nonfinite_items']} item(s) with a non-finite log-likelihood were read (those proposals "
                     f"were rejected; data-dependent support cannot be seen by a subsample: put such constraints "
                     f"in the prior)")
        for note in self.notes:
            if note.startswith("all chains started at the same point"):
                w.append(note)
        return w

    @property
    def warnings(self) -> List[str]:
        """Reasons not to trust this run (empty when trusted): see :attr:`verdict`."""
        return self.summary().overall["warnings"]

    @property
    def trusted(self) -> bool:
        return not self.warnings

    @property
    def verdict(self) -> str:
        """One line: ``trusted``, or ``NOT trusted: reason; reason``."""
        return self.summary().overall["verdict"]

    # ---- checkpoints --------------------------------------------------------------------

    def save(self, path: str) -> str:
        """Write the run (draws, statistics, final chain state, settings) to ``path`` atomically.

        The format (:mod:`tallmh.storage.checkpoint`) is an ``.npz`` archive of plain arrays with JSON metadata: loading
        it runs no code. :func:`load_result` reads it back; ``tallmh.sample(model, data, resume=loaded)``
        continues it, after checking that the data, model and settings are the run's (its fingerprint). The
        model and data are not stored: pass them again when resuming. A failed write raises
        :class:`tallmh.storage.safe_io.WriteError` (an ``OSError``) and leaves any earlier file at ``path`` as it was.
        """
        from ..storage import checkpoint

        payload = _payload(self)
        return checkpoint.write(os.fspath(path), payload)

    def to_arviz(self):
        """ArviZ's container (``InferenceData``; a ``DataTree`` with ArviZ 1.x) with ``posterior``,
        ``sample_stats`` and ``warmup_*`` groups.

        ``sample_stats`` has ``is_accepted`` (bool), ``acceptance_rate`` (1.0 or 0.0: the realised
        decision; the approximate tests give no acceptance probability), ``n_data`` and ``data_fraction``.
        """
        return _to_arviz(self)


def _plain_coords(coords):
    """``coords`` as lists of strings (what a checkpoint's JSON holds), or None."""
    if not coords:
        return None
    return {str(k): [None if ax is None else [str(v) for v in ax] for ax in axes] for k, axes in coords.items()}


def _more_draws(draws: int, ess: float, goal: float = 400.0) -> int:
    """Draws per chain that should reach bulk ESS ``goal``, from this run's ESS per draw (rounded up)."""
    if not np.isfinite(ess) or ess <= 0:
        n = 10 * max(draws, 100)
    else:
        n = int(math.ceil(1.25 * draws * goal / ess))
    mag = 10 ** max(0, len(str(max(n, 1))) - 2)
    return int(math.ceil(max(n, 2 * draws) / mag) * mag)


def _plain_tree(tree):
    """A pytree of draws as plain dicts/lists of NumPy arrays (what a checkpoint stores)."""
    if isinstance(tree, dict):
        return {str(k): _plain_tree(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_plain_tree(v) for v in tree]
    return np.asarray(tree)


def error_target(test) -> Optional[float]:
    """The per-step error an approximate test promises, to audit it against (None: no promise)."""
    t = getattr(test, "error_target", None)
    if t is not None:
        return float(t)
    name = getattr(test, "name", "")
    if name == "confidence":
        return float(test.delta)
    if name == "austerity":  # the per-look (epsilon) form makes no per-step promise
        return None
    if name == "barker":
        return float(test.delta)
    return None


def _payload(self) -> dict:
    """What :meth:`Result.save` writes: the run's parts as plain arrays, trees and settings."""
    d = self.flat_samples.shape[-1]
    template = jax.tree_util.tree_map(np.asarray, self.unravel(np.zeros(d, self.flat_samples.dtype)))
    payload = {
        "flat_samples": self.flat_samples, "stats": self.stats, "flat_warmup": self.flat_warmup,
        "warmup_stats": self.warmup_stats, "template": template, "n": int(self.n), "method": self.method,
        "test": self.test, "proposal": self.proposal, "timings": {k: float(v) for k, v in self.timings.items()},
        "setup_items": int(self.setup_items), "partial": bool(self.partial),
        "final_state": self.final_state, "notes": list(self.notes),
        "resume_info": dict(self.resume_info), "control_variates": self.control_variates,
        "coords": _plain_coords(self.coords),
    }
    streamed = isinstance(self.flat_samples, np.memmap) or isinstance(self.flat_warmup, np.memmap)
    if self.stored_output is not None or (self.constrain is not None and not streamed):
        # the named, constrained draws (the model's ``constrain`` itself cannot be stored)
        payload["output"] = {"sampling": _plain_tree(self.samples), "warmup": _plain_tree(self.warmup_samples)}
    elif self.constrain is not None:
        # draws streamed to disk stay out of memory and out of the checkpoint: the loaded run names its
        # coordinates as what they are (unconstrained) rather than by the constrained sites' names
        payload["unconstrained_names"] = True
    return payload


def _to_arviz(self):
    """:meth:`Result.to_arviz`."""
    from .diagnostics import idata_from_dict

    samples = self.samples
    if isinstance(samples, dict):
        post = {str(k): np.asarray(v) for k, v in samples.items()}
    else:
        leaves = jax.tree_util.tree_leaves(samples)
        post = {"theta": np.asarray(leaves[0])} if len(leaves) == 1 else {
            f"theta_{i}": np.asarray(v) for i, v in enumerate(leaves)}

    def stats_dict(st):
        return {
            "is_accepted": st["accepted"].astype(bool),
            "acceptance_rate": st["accepted"].astype(float),
            "n_data": st["n_data"].astype(np.int64),
            "data_fraction": st["n_data"].astype(float) / self.n,
            "rounds": st["rounds"].astype(np.int64),
            **({"nonfinite_items": st["nonfinite"].astype(np.int64)} if "nonfinite" in st else {}),
            **({"excess_error": st["excess_error"].astype(float)} if "excess_error" in st else {}),
            **({"audited": st["audited"].astype(bool), "audit_exact": st["audit_exact"].astype(bool),
                "audit_items": st["audit_items"].astype(np.int64)} if "audited" in st else {}),
        }

    warm = self.warmup_samples
    if isinstance(warm, dict):
        wpost = {str(k): np.asarray(v) for k, v in warm.items()}
    else:
        leaves = jax.tree_util.tree_leaves(warm)
        wpost = {"theta": np.asarray(leaves[0])} if len(leaves) == 1 else {
            f"theta_{i}": np.asarray(v) for i, v in enumerate(leaves)}
    groups = {"posterior": post, "sample_stats": stats_dict(self.stats)}
    if self.flat_warmup.shape[1] > 0:
        groups.update(warmup_posterior=wpost, warmup_sample_stats=stats_dict(self.warmup_stats))
    attrs = {
        "inference_library": "tallmh",
        "method": self.method,
        "N": int(self.n),
        "partial": int(self.partial),
        "setup_items": int(self.setup_items),
        **{k: float(v) for k, v in self.timings.items()},
        "label": self.label,
        "verdict": self.verdict,
    }
    return _label_levels(idata_from_dict(groups, attrs=attrs, save_warmup=self.flat_warmup.shape[1] > 0), post,
                         self.coords)


def _label_levels(idata, post, coords):
    """``idata`` with each site's axes labelled by ``coords`` (e.g. a group term's levels) where they fit."""
    from .diagnostics import label_dim

    for site, axes in (coords or {}).items():
        shape = np.shape(post.get(site, ()))[2:]
        for a, labels in enumerate(axes):
            if labels is not None and a < len(shape) and len(labels) == shape[a]:
                idata = label_dim(idata, f"{site}_dim_{a}", f"{site}_dim_{a}", [str(v) for v in labels])
    return idata


def load_result(path: str) -> Result:
    """Read a run saved by :meth:`Result.save` (a checkpoint): resume it with ``sample(..., resume=r)``.

    A checkpoint written while the run was still going (a run killed before it finished) loads with
    ``partial = True``. Raises :class:`ConfigError` in one line for anything that is not such a file (a
    pickle is refused unread)."""
    from jax.flatten_util import ravel_pytree

    from ..storage import checkpoint

    path = os.fspath(path)
    p = checkpoint.read(path)
    need = ("flat_samples", "stats", "flat_warmup", "warmup_stats", "template", "n", "resume_info")
    missing = [k for k in need if p.get(k) is None]
    if missing:
        raise ConfigError(f"{path} is an incomplete tallmh checkpoint (no {', '.join(missing)})")
    try:
        template = p["template"]
        if p.get("unconstrained_names") and isinstance(template, dict):
            template = {f"unconstrained_{k}": v for k, v in template.items()}  # (a prefix keeps the order)
        _, unravel = ravel_pytree(jax.tree_util.tree_map(lambda a: np.asarray(a), template))
        return Result(flat_samples=p["flat_samples"], stats=p["stats"], flat_warmup=p["flat_warmup"],
                      warmup_stats=p["warmup_stats"], unravel=unravel, n=int(p["n"]), method=p["method"],
                      test=p["test"], proposal=p["proposal"], timings=p["timings"] or {},
                      setup_items=int(p["setup_items"] or 0), partial=bool(p["partial"]),
                      final_state=p["final_state"], notes=list(p["notes"] or []), resume_info=p["resume_info"],
                      control_variates=p["control_variates"], stored_output=p.get("output"),
                      coords=p.get("coords"))
    except (TypeError, ValueError, KeyError) as e:
        raise ConfigError(f"{path} is not a usable tallmh checkpoint ({type(e).__name__}: {e})") from None
