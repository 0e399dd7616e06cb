"""What a run returns: draws, per-step statistics, timings, and summaries."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict

import jax
import numpy as np

from . import diagnostics

__all__ = ["Result", "Summary"]


def _param_names(unravel, d):
    """Names of the flat coordinates, like ``theta[0]`` or ``w[1, 2]``."""
    template = unravel(np.zeros(d))
    names = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(template)[0]:
        base = jax.tree_util.keystr(path).strip("[]'\"") or "theta"
        shape = np.shape(leaf)
        if shape == ():
            names.append(base)
        else:
            for idx in np.ndindex(*shape):
                names.append(f"{base}[{', '.join(map(str, idx))}]")
    return names


@dataclass
class Summary:
    """Per-parameter table (``table``, a pandas DataFrame) and run-level numbers (``overall``, a dict)."""

    table: Any
    overall: Dict[str, float]

    def __str__(self):
        o = self.overall
        head = (
            f"method {o['method']}: {o['chains']} chain(s) x {o['draws']} draws, N = {o['N']}"
            + (" [PARTIAL: interrupted]" if o["partial"] else "")
            + f"\nacceptance {o['acceptance_rate']:.3f}, mean data fraction per step {o['data_fraction']:.4g}"
            f" (mean items {o['mean_n_data']:.1f}), ESS min {o['ess_min']:.1f}, ESS/s {o['ess_per_s']:.2f}"
            f", R-hat max {o['rhat_max']:.3f}\nsampling {o['sampling_s']:.2f}s, warmup {o['warmup_s']:.2f}s, "
            f"compile {o['compile_s']:.2f}s, set-up items {o['setup_items']}\n"
        )
        return head + self.table.to_string(float_format=lambda v: f"{v:.4g}")

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
    _names: Any = field(default=None, repr=False)

    def _tree(self, flat):
        c, k, d = flat.shape
        if c * k == 0:
            template = self.unravel(np.zeros(d, flat.dtype))
            return jax.tree_util.tree_map(lambda a: np.zeros((c, k) + np.shape(a), flat.dtype), template)
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
            self._names = _param_names(self.unravel, self.flat_samples.shape[-1])
        return self._names

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
        import pandas as pd

        x = self.flat_samples
        names = self.param_names
        rows = []
        for j, name in enumerate(names):
            xj = x[:, :, j]
            rows.append({
                "param": name,
                "mean": float(np.mean(xj)) if xj.size else float("nan"),
                "sd": float(np.std(xj, ddof=1)) if xj.size > 1 else float("nan"),
                "ess_bulk": diagnostics.ess(xj),
                "ess_tail": diagnostics.ess(xj, method="tail"),
                "r_hat": diagnostics.rhat(xj),
            })
        table = pd.DataFrame(rows).set_index("param")
        ess_min = float(np.nanmin(table["ess_bulk"])) if len(table) and np.any(np.isfinite(table["ess_bulk"])) else float("nan")
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
            "rhat_max": float(np.nanmax(table["r_hat"])) if len(table) and np.any(np.isfinite(table["r_hat"])) else float("nan"),
            "setup_items": int(self.setup_items),
            **{k: float(v) for k, v in self.timings.items()},
        }
        return Summary(table, overall)

    def to_arviz(self):
        """An ``arviz.InferenceData`` with ``posterior``, ``sample_stats`` and ``warmup_*`` groups.

        ``sample_stats`` has ``is_accepted`` (bool), ``acceptance_rate`` (1.0 or 0.0: the realised
        decision; the approximate tests give no acceptance probability), ``n_data`` and ``data_fraction``.
        """
        import arviz as az

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
            }

        warm = self.warmup_samples
        if isinstance(warm, dict):
            wpost = {str(k): np.asarray(v) for k, v in warm.items()}
        else:
            leaves = jax.tree_util.tree_leaves(warm)
            wpost = {"theta": np.asarray(leaves[0])} if len(leaves) == 1 else {
                f"theta_{i}": np.asarray(v) for i, v in enumerate(leaves)}
        kwargs = {}
        if self.flat_warmup.shape[1] > 0:
            kwargs = {"warmup_posterior": wpost, "warmup_sample_stats": stats_dict(self.warmup_stats),
                      "save_warmup": True}
        idata = az.from_dict(posterior=post, sample_stats=stats_dict(self.stats), **kwargs)
        attrs = {
            "inference_library": "tallmh",
            "method": self.method,
            "N": int(self.n),
            "partial": int(self.partial),
            "setup_items": int(self.setup_items),
            **{k: float(v) for k, v in self.timings.items()},
        }
        idata.posterior.attrs.update(attrs)
        idata.sample_stats.attrs.update(attrs)
        return idata
