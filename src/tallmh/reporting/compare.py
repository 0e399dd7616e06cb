"""Compare samplers on your own model and data: equal wall-clock budgets, a reference posterior, a report.

This is the workflow behind ``tallmh demo``, as a library, for a notebook::

    import tallmh as tm
    from tallmh import compare

    data, _ = tm.models.LogisticRegression.simulate(50_000, d=5)
    model = tm.models.LogisticRegression()
    cmp = compare.compare(model, data, {
        "exact": tm.acceptance.Exact(),
        "austerity": tm.acceptance.Austerity(epsilon=0.05, batch_size=500),
        "austerity-cv": (tm.acceptance.Austerity(epsilon=0.05, batch_size=500), tm.ControlVariates()),
    }, budget_s=10, reference_draws=5000)
    print(cmp.table())           # sorted: accurate methods first, then by ESS per second
    cmp.write_report("my-report")

Pieces, each usable alone:

- :func:`posterior_mode`: the mode and the Laplace covariance (inverse negative Hessian) there, with the
  full passes over the data counted. Logistic and linear regression in float64 from sums over the rows;
  any other model by damped Newton with autodiff (:func:`tallmh.setup_passes.find_center`).
- :func:`reference_posterior`: an exact-MH run (the Langevin proposal with the control-variate drift,
  chains from dispersed Laplace draws), cached on disk by data and settings.
- :func:`run_budgeted`: one method for a fixed number of seconds of sampling (``tm.sample(budget_s=...)``).
- :class:`Comparison`: the runs, the table against the reference and the report (``report.html`` with
  traces, marginals, data per step, and each method's verdict at the top).

Accuracy against the reference: the largest distance of a posterior mean from the reference mean in
reference sd, the same in Monte Carlo standard errors (z), and the range of sd ratios. A method counts as
*accurate* when no mean is more than 0.1 reference sd plus 3 Monte Carlo standard errors (of the difference:
this run's and the reference's) off and every sd is within 20% of the reference's (thresholds
:data:`ACCURATE_MEAN_SD` and :data:`ACCURATE_SD_RATIO`; the README's rule), and it is *trusted* by its own checks (``result.trusted``: R-hat, ESS, audited error, the estimated normal-approximation error, non-finite items, partial run, approximate target).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ..errors import ConfigError, ModelError

__all__ = [
    "Mode", "posterior_mode", "laplace_proposal", "reference_posterior", "run_budgeted", "compare", "Comparison",
    "default_cache_dir", "data_digest", "method_label", "verdict_of", "sort_rows", "ACCURATE_MEAN_SD",
    "ACCURATE_SD_RATIO",
]

ACCURATE_MEAN_SD = 0.1
ACCURATE_SD_RATIO = (0.8, 1.2)


def _n(count: int, word: str) -> str:
    """``1 chain``, ``2 chains``."""
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def _times(v: float) -> str:
    """``360x``, ``20,000x``, ``3.4x``: an interval's end as the lesson prints it (two significant digits)."""
    return f"{float(f'{v:.2g}'):,.0f}x" if v >= 10 else f"{v:.2g}x"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def machine() -> dict:
    """Where the numbers were made: platform, Python, CPUs, JAX and its backend, load average."""
    import jax

    try:
        load = [round(v, 2) for v in os.getloadavg()]  # other work on the machine slows every timing
    except (AttributeError, OSError):
        load = None
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
            "jax": jax.__version__, "jax_backend": jax.default_backend(), "load_average_1_5_15min": load}


# ---------------------------------------------------------------------------------------------------
# the posterior mode and the Laplace approximation


@dataclass
class Mode:
    """Posterior mode ``theta`` (flat, float64), Laplace covariance ``cov`` there, full ``passes`` over the
    data used to find them, and the ``seconds`` it took."""

    theta: np.ndarray
    cov: np.ndarray
    passes: int
    seconds: float = 0.0

    @property
    def sd(self):
        return np.sqrt(np.diag(self.cov))


def _row_chunks(n, size=262_144):
    for a in range(0, n, size):
        yield slice(a, min(n, a + size))


def _logistic_mode(X, y, prior_scale: float, max_iter: int = 50):
    """Newton's method with step halving in float64 from 0, rows read in chunks (O(chunk * d) memory)."""
    n, d = X.shape
    prior_prec = 1.0 / prior_scale**2

    def logpost_grad_hess(theta):
        lp = -0.5 * prior_prec * theta @ theta
        g = -prior_prec * theta
        H = np.eye(d) * prior_prec
        for s in _row_chunks(n):
            Xs = np.asarray(X[s], np.float64)
            ys = np.asarray(y[s], np.float64)
            z = Xs @ theta
            lp += float(np.sum(ys * z - np.logaddexp(0.0, z)))
            p = 0.5 * (1.0 + np.tanh(0.5 * z))
            g += Xs.T @ (ys - p)
            H += (Xs * (p * (1.0 - p))[:, None]).T @ Xs
        return lp, g, H

    theta = np.zeros(d)
    lp, g, H = logpost_grad_hess(theta)
    passes = 1
    for _ in range(max_iter):
        try:
            step = np.linalg.solve(H, g)
        except np.linalg.LinAlgError:
            raise ModelError("Newton's method for the posterior mode failed (singular Hessian)") from None
        t = 1.0
        while True:  # step halving until the log posterior does not decrease
            cand = theta + t * step
            lp_c, g_c, H_c = logpost_grad_hess(cand)
            passes += 1
            if lp_c >= lp - 1e-12 * abs(lp) or t < 1e-6:
                break
            t *= 0.5
        theta, lp, g, H = cand, lp_c, g_c, H_c
        if np.max(np.abs(t * step)) < 1e-9 * (1.0 + np.max(np.abs(theta))):
            break
    else:
        raise ModelError(f"Newton's method for the posterior mode did not converge in {max_iter} iterations")
    if not np.all(np.isfinite(theta)):
        raise ModelError("Newton's method for the posterior mode diverged")
    cov = np.linalg.inv(H)
    return theta, 0.5 * (cov + cov.T), passes


def posterior_mode(model, data, init=None, max_iter: int = 50) -> Mode:
    """The posterior mode and the Laplace covariance of ``model`` given ``data``; see :class:`Mode`.

    :class:`~tallmh.models.LogisticRegression`: Newton's method in float64. :class:`~tallmh.models.
    LinearRegression`: from ``X'X, X'y, y'y`` (one pass; closed form when the noise sd is fixed). Any
    other model: damped Newton with autodiff from ``init`` (default ``model.init(data)``), then one more
    pass for the Hessian sums (:mod:`tallmh.control_variates`); the Laplace covariance needs the log
    posterior to be strictly concave there (a :class:`tallmh.ModelError` otherwise).
    """
    from ..models import LinearRegression, LogisticRegression

    t0 = time.perf_counter()
    if isinstance(model, LogisticRegression):
        theta, cov, passes = _logistic_mode(data["X"], data["y"], model.prior_scale, max_iter)
    elif isinstance(model, LinearRegression):
        theta, cov, passes = model.posterior_mode(data)
    else:
        import jax
        import jax.numpy as jnp
        from jax.flatten_util import ravel_pytree

        from .. import control_variates as cvm
        from .. import setup_passes as setup
        from ..storage.data import num_items, validate_data

        data = validate_data(data)
        n = num_items(data)
        if init is None:
            if not callable(getattr(model, "init", None)):
                raise ModelError("the model has no init(data); pass init=... to posterior_mode()")
            init = model.init(data)
        init = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(float)), init)
        flat0, unravel = ravel_pytree(init)
        found = setup.mode_search(model, data, n, unravel, flat0, max_iter)
        center, passes, sums = found.center, found.passes, cvm.state_at_mode(found)
        if sums is None:
            sums = cvm.proxy_sums(model, data, n, unravel, center, 2)
            passes += 1
        cov = setup.laplace_cov(model, unravel, sums)
        if cov is None:
            raise ModelError("the negative Hessian of the log posterior at the mode is not positive definite: "
                             "no Laplace approximation there")
        theta, cov = np.asarray(center, np.float64), np.asarray(cov, np.float64)
    return Mode(np.asarray(theta, np.float64), np.asarray(cov, np.float64), int(passes), time.perf_counter() - t0)


def laplace_proposal(cov):
    """Gaussian random walk with covariance ``2.38^2/d`` times ``cov`` (Roberts & Rosenthal's scaling)."""
    import tallmh as tm

    cov = np.asarray(cov, np.float64)
    d = cov.shape[0]
    return tm.proposals.RandomWalk(scale=(2.38**2 / d) * cov)


# ---------------------------------------------------------------------------------------------------
# names and verdicts


def method_label(test, control_variates=None) -> str:
    """The method with its options, e.g. ``austerity(batch_size=200)+cv`` (:func:`tallmh.reporting.results.method_label`:
    options at their defaults are left out)."""
    from .results import method_label as label

    return label(test, control_variates)


def _public_fields(obj) -> dict:
    try:
        items = vars(obj)
    except TypeError:
        items = {k: getattr(obj, k) for k in getattr(obj, "__slots__", ())}
    return {k: v for k, v in items.items() if not k.startswith("_") and k != "name"}


def verdict_of(result) -> Tuple[bool, str, List[str]]:
    """``(trusted, verdict line, warnings)`` from a :class:`tallmh.Result` (``result.trusted``,
    ``result.verdict``, ``result.warnings``); a Result without them is judged on R-hat and ESS here."""
    warns = list(getattr(result, "warnings", None) or [])
    trusted = getattr(result, "trusted", None)
    verdict = getattr(result, "verdict", None)
    if trusted is not None and verdict is not None:
        return bool(trusted), str(verdict), warns
    from .report import param_table

    tab = param_table(result.flat_samples, result.param_names)
    rhat = np.nanmax(tab["r_hat"].to_numpy(float)) if np.any(np.isfinite(tab["r_hat"])) else float("nan")
    ess = np.nanmin(tab["ess_bulk"].to_numpy(float)) if np.any(np.isfinite(tab["ess_bulk"])) else float("nan")
    if getattr(result, "partial", False):
        warns.append("partial run (interrupted)")
    if np.isfinite(rhat) and rhat > 1.01:
        warns.append(f"R-hat {rhat:.3f} > 1.01")
    if not (np.isfinite(ess) and ess >= 100):
        warns.append(f"bulk ESS {ess:.0f} < 100")
    return (not warns), ("trusted" if not warns else "NOT trusted: " + "; ".join(warns)), warns


def _accuracy_problems(row) -> List[str]:
    """Why a method's draws disagree with the reference beyond Monte Carlo noise (empty: they agree).

    The README's rule: a mean counts as off when it is more than :data:`ACCURATE_MEAN_SD` reference sd plus 3
    Monte Carlo standard errors of the difference (this run's and the reference's, in reference sd) from the
    reference mean; an sd when its ratio to the reference sd is outside :data:`ACCURATE_SD_RATIO`.
    """
    pp = row.get("per_param")
    if not pp:
        return ["no draws to compare"]
    err, z = np.asarray(pp["err_sd"], float), np.asarray(pp["err_z"], float)
    mcse = np.asarray(pp["mcse_sd"], float)
    ratio = np.asarray(pp["sd_ratio"], float)
    out = []
    off = ~(err <= ACCURATE_MEAN_SD + 3 * mcse)  # (NaN counts as off)
    if np.any(off):
        worst = int(np.argmax(np.where(off & np.isfinite(err), err, -np.inf)))
        out.append(f"a mean {err[worst]:.2f} reference sd off (z = {z[worst]:.1f}; allowed "
                   f"{ACCURATE_MEAN_SD:g} + 3 x {mcse[worst]:.2f})")
    lo, hi = ACCURATE_SD_RATIO
    bad = ~((ratio >= lo) & (ratio <= hi))
    if np.any(bad):
        out.append(f"sd {np.nanmin(ratio):.2f}-{np.nanmax(ratio):.2f}x the reference")
    return out


# a method with a smallest bulk ESS under this that shows no error against the reference is "unclear": its
# Monte Carlo error is too large for the check to mean much (its marginals are greyed in the report)
MIN_ESS_TO_TELL = 100


def sort_rows(rows: Sequence[dict]) -> List[dict]:
    """Rows sorted by what matters: trusted and accurate first, then by ESS per second, largest first."""
    def key(r):
        acc = r.get("accurate", True)
        ok = bool(r.get("trusted", True)) and bool(acc)
        eps = r.get("ess_per_s")
        eps = eps if isinstance(eps, (int, float)) and np.isfinite(eps) else -1.0
        return (0 if ok else 1, -eps)

    return sorted(rows, key=key)


# ---------------------------------------------------------------------------------------------------
# a run on a wall-clock budget


def run_budgeted(model, data, test, budget_s: float, *, proposal=None, init=None, num_chains: int = 2,
                 num_warmup: Optional[int] = None, burn_in: float = 0.1, max_samples: int = 10_000_000,
                 seed: int = 0, control_variates=None, name: Optional[str] = None, progress=None,
                 **sample_kwargs):
    """Run ``test`` for a wall-clock budget of ``budget_s`` seconds (compilation and set-up excluded).

    One :func:`tallmh.sample` call with ``budget_s``: chains side by side, stopping after the first chunk
    (about a second) that ends past the budget; ``max_samples`` draws per chain at most.

    - ``num_warmup=None`` (for proposals that do not adapt, e.g. the Laplace random walk): no warmup phase;
      the whole budget samples, and the draws of its first ``burn_in`` share are discarded as burn-in
      (moved to the result's warmup arrays). So every method spends the same seconds, as in the
      austerity paper's risk-versus-time comparison.
    - ``num_warmup`` steps: a warmup phase first (the proposal adapts), outside the budget.

    Draws are placed evenly in time over each phase (chunks last about a second) for the time plots.
    Returns a :class:`tallmh.reporting.report.MethodRun`; ``run.result`` is the :class:`tallmh.Result`.
    """
    import dataclasses

    import tallmh as tm
    from .report import MethodRun

    if not (budget_s > 0):
        raise ConfigError(f"budget_s must be positive; got {budget_s}")
    if not (0 <= burn_in < 1):
        raise ConfigError(f"burn_in must be in [0, 1); got {burn_in}")
    kw = dict(test=test, proposal=proposal, num_samples=int(max_samples), num_warmup=int(num_warmup or 0),
              num_chains=int(num_chains), seed=seed, init=init, progress=progress,
              control_variates=control_variates, **sample_kwargs)
    result = tm.sample(model, data, budget_s=float(budget_s), **kw)
    t = dict(result.timings)
    if num_warmup is None and burn_in > 0 and result.flat_samples.shape[1] > 1:
        k_all = result.flat_samples.shape[1]
        b = int(round(burn_in * k_all))
        samp_s = float(t.get("sampling_s", 0.0))
        t["warmup_s"], t["sampling_s"] = samp_s * b / k_all, samp_s * (k_all - b) / k_all
        result = dataclasses.replace(
            result, flat_warmup=result.flat_samples[:, :b], warmup_stats={k: v[:, :b] for k, v in result.stats.items()},
            flat_samples=result.flat_samples[:, b:], stats={k: v[:, b:] for k, v in result.stats.items()},
            timings=t, _cache={})
    c, k, _ = result.flat_samples.shape
    kw_ = result.flat_warmup.shape[1]
    warm_s, samp_s = float(t.get("warmup_s", 0.0)), float(t.get("sampling_s", 0.0))
    warm_times = np.tile((np.arange(1, kw_ + 1) / max(kw_, 1)) * warm_s, (c, 1))
    times = np.tile(warm_s + (np.arange(1, k + 1) / max(k, 1)) * samp_s, (c, 1))
    label = name or method_label(test, control_variates)
    return MethodRun(name=label, result=result, times=times, warmup_times=warm_times, seconds=warm_s + samp_s,
                     compile_s=float(t.get("compile_s", 0.0)), steps=c * (k + kw_),
                     config={"label": method_label(test, control_variates)})


# ---------------------------------------------------------------------------------------------------
# the reference posterior


def default_cache_dir() -> str:
    """``$TALLMH_CACHE``, else ``$XDG_CACHE_HOME/tallmh``, else ``~/.cache/tallmh``."""
    if os.environ.get("TALLMH_CACHE"):
        return os.environ["TALLMH_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tallmh")


def data_digest(data) -> str:
    """SHA-256 of every array of the data pytree (bytes, shapes, dtypes and the tree structure)."""
    import jax

    h = hashlib.sha256()
    leaves, treedef = jax.tree_util.tree_flatten(data)
    h.update(str(treedef).encode())
    for a in leaves:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(str((a.shape, str(a.dtype))).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _model_config(model) -> dict:
    cfg = {"model": type(model).__name__}
    for k, v in _public_fields(model).items():
        if isinstance(v, (int, float, str, bool)) or v is None:
            cfg[k] = v
    return cfg


REFERENCE_PROPOSAL = "langevin-cv"  # in the reference's cache key: references made another way are not reused


def reference_posterior(model, data, mode: Mode, *, draws: int = 1000, chains: int = 2, seed: int = 0,
                        cache_dir: Optional[str] = None, refresh: bool = False, config: Optional[dict] = None,
                        say: Optional[Callable[[str], None]] = None, progress=None):
    """A long exact-MH run, cached in ``cache_dir`` (default :func:`default_cache_dir`) by data and settings.

    Exact Metropolis-Hastings (:class:`tallmh.acceptance.Exact`: every step reads all N items) with the
    preconditioned Langevin proposal (:class:`tallmh.proposals.Langevin`, MALA: Roberts & Tweedie 1996;
    preconditioner the Laplace covariance, step size adapted during warmup only), whose drift is the
    control-variate estimate of the gradient (Taylor terms at the mode plus a 100-item minibatch of
    remainders). Each minibatch defines its own proposal kernel and the test uses the same minibatch both
    ways, so every step is an exact MH step (austerity paper, Sec. 5.4); the drift only makes it mix far
    better than a random walk (about 10x the ESS per step here), so the same ESS costs far fewer full
    passes. The ``chains`` chains run side by side and start at overdispersed Laplace draws around the mode
    (:func:`tallmh.sample`'s default start); the first ``max(100, draws // 5)`` steps of each are warmup
    (discarded). The key of the cache is the data's digest, the model's settings, ``config`` and the run's
    settings. Returns ``(Reference, cache stem or None, was_cached)``; the ``.json`` beside the draws says
    how they were made (with their ESS and R-hat). A cache that cannot be written costs only a message
    (``say``). ``mode`` is used for its dimension; the run finds the mode itself.
    """
    import tallmh as tm
    from .report import Reference, atomic_write, write_json

    say = say or (lambda m: None)
    cache_dir = cache_dir or default_cache_dir()
    digest = data_digest(data)
    d = int(mode.theta.shape[0])
    settings = {"draws_per_chain": int(draws), "chains": int(chains), "seed": int(seed), **_model_config(model),
                "proposal": REFERENCE_PROPOSAL, **(config or {})}
    key = hashlib.sha256((digest + json.dumps(settings, sort_keys=True, default=str)).encode()).hexdigest()[:20]
    stem = os.path.join(cache_dir, f"reference-{key}")
    if not refresh and os.path.exists(stem + ".npz") and os.path.exists(stem + ".json"):
        try:
            with open(stem + ".json", encoding="utf-8") as f:
                info = json.load(f)
            with np.load(stem + ".npz") as z:
                arr = np.asarray(z["draws"])
            if arr.shape == (chains, draws, d) and info.get("data_sha256") == digest:
                return Reference(arr, info), stem, True
            say(f"cached reference at {stem}.npz does not match; recomputing it")
        except (OSError, ValueError, KeyError) as e:
            say(f"cached reference at {stem}.npz is unreadable ({e}); recomputing it")

    n = int(np.shape(next(iter(_leaves(data))))[0])
    burn = max(100, draws // 5)
    batch = min(100, n)
    t0 = time.perf_counter()
    say(f"reference: exact MH with the Langevin proposal, {_n(chains, 'chain')} side by side, {burn} warmup steps + "
        f"{draws} draws on N = {n:,}")
    with warnings.catch_warnings():  # the reference's own ESS and R-hat are recorded below and shown with it
        warnings.simplefilter("ignore", getattr(tm, "TrustWarning", UserWarning))
        r = tm.sample(model, data, test=tm.acceptance.Exact(), proposal=tm.proposals.Langevin(batch_size=batch),
                      control_variates=tm.ControlVariates(order=2), num_samples=draws, num_warmup=burn,
                      num_chains=chains, seed=seed + 1000, progress=progress)
    if getattr(r, "partial", False):
        raise KeyboardInterrupt
    seconds = time.perf_counter() - t0
    arr = np.asarray(r.flat_samples).astype(np.float32)
    ref = Reference(arr, {})
    ess = ref.ess()
    rhat = [tm.diagnostics.rhat(arr[:, :, j]) for j in range(d)] if chains > 1 else [float("nan")] * d
    info = {
        "how": (f"exact Metropolis-Hastings (tallmh Exact test, all N = {n:,} rows every step), "
                f"{_n(chains, 'chain')} x {_n(draws, 'draw')} after {_n(burn, 'warmup step')} each; the chains "
                f"start at overdispersed draws from the Laplace approximation at the posterior mode; proposal: "
                f"preconditioned Langevin (MALA, Laplace covariance, step size adapted in warmup) with the "
                f"control-variate gradient ({batch}-item minibatch), corrected by the exact test"),
        "method": "exact-mh", "proposal": REFERENCE_PROPOSAL, "chains": chains, "draws_per_chain": draws,
        "burn_in": burn, "seed": seed, "N": n, "d": d, "data_sha256": digest, "settings": settings,
        "acceptance_rate": float(np.mean(r.stats["accepted"])), "ess": [float(v) for v in ess],
        "ess_min": float(np.nanmin(ess)),
        "rhat_max": float(np.nanmax(rhat)) if np.any(np.isfinite(rhat)) else None,
        "seconds": seconds, "compile_s": float(r.timings["compile_s"]), "setup_s": float(r.timings["setup_s"]),
        "created": _now(), "tallmh_version": tm.__version__, "machine": machine(),
    }
    ref.info = info
    try:
        os.makedirs(cache_dir, exist_ok=True)
        atomic_write(stem + ".npz", lambda tmp: _save_npz(tmp, arr))
        write_json(stem + ".json", info)
        return ref, stem, False
    except OSError as e:
        say(f"warning: could not cache the reference in {cache_dir}: {e.strerror or e}")
        return ref, None, False


def _leaves(data):
    import jax

    return jax.tree_util.tree_leaves(data)


def _save_npz(tmp, arr):
    with open(tmp, "wb") as f:
        np.savez(f, draws=arr)


# ---------------------------------------------------------------------------------------------------
# the comparison


@dataclass
class Comparison:
    """Runs of several methods on one posterior, their table against the reference, and the report.

    ``runs``: :class:`tallmh.reporting.report.MethodRun` in the order run; ``rows``: one dict of numbers per run
    (:func:`tallmh.reporting.report.method_row` plus ``label``, ``trusted``, ``verdict``, ``warnings``, ``accurate``,
    ``problems``), sorted by :func:`sort_rows`; ``names``: parameter names.
    """

    runs: List[Any]
    rows: List[dict]
    names: List[str]
    n: int
    reference: Any = None
    reference_stem: Optional[str] = None
    reference_cached: bool = False
    mode: Optional[Mode] = None
    budget_s: float = float("nan")
    partial: bool = False
    settings: Dict[str, Any] = field(default_factory=dict)

    def table(self) -> str:
        """The comparison table as fixed-width text (sorted: accurate first, then ESS/s)."""
        from .report import format_table

        return format_table(self.rows)

    def lesson(self, recommended: str = "recommended", baseline: str = "exact") -> str:
        """One line computed from this comparison: which method to use and how much faster per effective
        draw it was than ``baseline``, or, where the recommended method failed here, that and why."""
        rows = {r["method"]: r for r in self.rows}
        rec = rows.get(recommended)
        if rec is None:
            good = [r for r in self.rows if r["trusted_all"]]
            return (f"use {good[0]['method']}: the fastest per ESS of the methods trusted and accurate here"
                    if good else "no method was both trusted and accurate here: give them a larger budget")
        label = rec.get("label", recommended)
        if not rec["trusted_all"]:
            why = rec["verdict_line"][len("NOT trusted: "):] if rec["verdict_line"].startswith("NOT") else ""
            return (f"the recommended method ({label}) was not trusted and accurate here ({why}); give it a larger "
                    "budget before relying on it")
        base = rows.get(baseline)
        eps, beps = rec.get("ess_per_s"), (base or {}).get("ess_per_s")
        if base is None or not (isinstance(beps, (int, float)) and np.isfinite(beps) and beps > 0):
            return f"use {recommended} ({label}): trusted and accurate against the reference here"
        sp = self.speedup(recommended, baseline)
        ratio, (lo, hi) = sp["ratio"], sp["interval"]
        how = f"{ratio:,.0f}x faster" if ratio >= 1.5 else (f"{ratio:.1f}x as fast" if ratio >= 0.67
                                                              else f"{1 / ratio:.1f}x slower")
        known = ""
        if np.isfinite(lo) and np.isfinite(hi):
            how = "about " + how
            known = (f"; 95% interval {_times(lo)}-{_times(hi)}, as {baseline}'s ESS of "
                     f"{base.get('ess_min', float('nan')):,.1f} is itself uncertain")
        checked = ("trusted and accurate against the reference" if rec.get("accurate", True) is not False
                   and rec.get("accurate", True) is not None else
                   "trusted (too few effective draws here to check it against the reference)")
        return (f"use {recommended} ({label}); it was {how} per ESS than {baseline} here "
                f"({eps:,.0f} vs {beps:,.1f} ESS/s{known}), {checked}")

    def speedup(self, recommended: str = "recommended", baseline: str = "exact") -> Optional[dict]:
        """``recommended``'s ESS per second over ``baseline``'s, with an approximate 95% interval: the ratio
        of the ESS-per-second intervals' ends (each from :func:`tallmh.reporting.diagnostics.ess_interval`,
        the smallest ESS over the parameters), the low end over the other's high end and the other way
        round. ``None`` without both methods."""
        rows = {r["method"]: r for r in self.rows}
        rec, base = rows.get(recommended), rows.get(baseline)
        if rec is None or base is None:
            return None
        eps, beps = rec.get("ess_per_s", float("nan")), base.get("ess_per_s", float("nan"))
        ratio = eps / beps if isinstance(beps, (int, float)) and beps > 0 else float("nan")
        (rlo, rhi), (blo, bhi) = (r.get("ess_per_s_interval", [float("nan")] * 2) for r in (rec, base))
        with np.errstate(divide="ignore", invalid="ignore"):
            interval = [float(rlo / bhi) if bhi > 0 else float("nan"), float(rhi / blo) if blo > 0 else float("inf")]
        return {"recommended": recommended, "baseline": baseline, "ratio": float(ratio), "interval": interval,
                "level": 0.95, "ess_min": [rec.get("ess_min"), base.get("ess_min")],
                "ess_min_interval": [rec.get("ess_min_interval"), base.get("ess_min_interval")]}

    def verdicts(self) -> List[str]:
        """One line per method: ``name: trusted`` or ``name: NOT trusted: why``."""
        return [f"{r['method']}: {r['verdict_line']}" for r in self.rows]

    def to_json(self) -> dict:
        """Every number of the comparison (JSON-ready through :func:`tallmh.reporting.report.write_json`)."""
        out = {"parameters": self.names, "N": self.n, "budget_s": self.budget_s, "settings": self.settings,
               "methods": self.rows, "speedup": self.speedup(),
               "per_parameter": {r.name: per_param(r, self.names) for r in self.runs}}
        if self.mode is not None:
            out["mode"] = {"theta": self.mode.theta, "laplace_sd": self.mode.sd, "passes": self.mode.passes,
                           "seconds": self.mode.seconds}
        if self.reference is not None:
            ref = {k: v for k, v in self.reference.info.items() if k != "settings"}
            ref.update({"cache_file": (self.reference_stem + ".npz") if self.reference_stem else None,
                        "was_cached": self.reference_cached, "mean": self.reference.mean, "sd": self.reference.sd})
            out["reference"] = ref
        return out

    def write_report(self, out: str, *, title: str = "tallmh: methods compared", intro: Sequence[str] = (),
                     sections: Sequence[tuple] = (), extra_images: Sequence[tuple] = (), write_draws: bool = True,
                     results_extra: Optional[dict] = None) -> List[str]:
        """Write ``report.html``, the plots, ``results.json`` and ``posterior-<method>.nc`` to folder ``out``
        (created if missing; only these files are written). ``extra_images``: ``(heading, file, alt,
        caption)`` of plots already written to ``out``. Returns the paths written."""
        import html as _html

        from . import report as rp

        os.makedirs(out, exist_ok=True)
        files = []
        files.append(rp.plot_traces(self.runs, self.names, os.path.join(out, "traces.png")))
        files.append(rp.plot_marginals(self.runs, self.names, os.path.join(out, "marginals.png"),
                                       ref=self.reference))
        files.append(rp.plot_data_use(self.runs, self.n, os.path.join(out, "data_per_step.png")))
        if write_draws:
            for r in self.runs:
                files.append(rp.write_netcdf(os.path.join(out, f"posterior-{_file_safe(r.name)}.nc"), r.result,
                                             self.names))
        results = {"created": _now(), "machine": machine(), **self.to_json(), "table_text": self.table(),
                   **(results_extra or {})}
        files.append(rp.write_json(os.path.join(out, "results.json"), results))
        e = _html.escape
        secs = list(sections)
        if self.reference is not None:
            info = self.reference.info
            secs.insert(0, ("Reference posterior", [
                f"{e(info['how'])}. ESS min {info['ess_min']:.0f}, acceptance {info['acceptance_rate']:.3f}"
                + (f", R-hat max {info['rhat_max']:.3f}" if info.get("rhat_max") is not None else "")
                + f"; made in {info['seconds']:.0f} s on {e(str(info['created']))}"
                + (f", cached at <code>{e(self.reference_stem)}.npz</code>" if self.reference_stem else "")
                + (" and reused by this run." if self.reference_cached else ".")]))
        secs.append(("Columns", [rp.COLUMNS_HELP]))
        images = [
            ("Traces", "traces.png", "trace plots of each parameter for each method",
             "Each panel: one parameter of one method against seconds into the run; one colour per chain, "
             "warmup in grey."),
            ("Marginals against the reference" if self.reference is not None else "Marginals", "marginals.png",
             "marginal densities of each method", "Density of each parameter"
             + (": the exact-MH reference as a grey area, each method as a line over it" if self.reference is not None
                else ", each method as a line")
             + " (kernel density estimates). A method with a bulk ESS under 100 is a grey dotted line, labelled "
             "with its ESS: its curve is mostly noise. Draws outside the plotted range are counted in the panel's "
             "note."),
            ("Data used per step", "data_per_step.png", "histograms of data items read per step",
             "Items read by each accept/reject decision, log-log axes (compare Fig. 2 of the minibatch Barker "
             "paper)."),
            *extra_images,
        ]
        details = []
        if self.reference is not None:
            import pandas as pd

            ref_df = pd.DataFrame({"mean": self.reference.mean, "sd": self.reference.sd,
                                   "ess": self.reference.info.get("ess", self.reference.ess())},
                                  index=list(self.names))
            details.append(("Reference: mean and sd per parameter", rp.frame_html(ref_df)))
        for r in self.runs:
            s = r.table().copy()
            s.index = list(self.names)
            details.append((f"{r.name}: per-parameter summary", rp.frame_html(s)))
        files.append(rp.write_html(os.path.join(out, "report.html"), title=title, intro=list(intro), rows=self.rows,
                                   table_text=self.table(), sections=secs, images=images, details=details,
                                   verdicts=[(r["method"], r["trusted_all"], r["verdict_line"]) for r in self.rows]))
        return files


def _file_safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def per_param(run, names):
    s = run.table().copy()
    s.index = list(names)
    return {nm: {k: float(v) for k, v in s.loc[nm].items()} for nm in names}


def finish_rows(runs, ref=None, names=None) -> List[dict]:
    """The table's rows for ``runs`` (against ``ref`` if given), with the verdicts, sorted."""
    from .report import method_row

    rows = []
    for r in runs:
        row = method_row(r, ref)
        row["label"] = r.config.get("label", r.name)
        row["config"] = r.config
        trusted, verdict, warns = verdict_of(r.result)
        row.update({"trusted": trusted, "verdict": verdict, "warnings": warns})
        problems = _accuracy_problems(row) if ref is not None else []
        row["problems"] = problems
        # two separate questions: does the method trust itself (its verdict), and do its draws agree with the
        # reference (accuracy; None without a reference, or when too few effective draws can tell nothing)
        ess_min = row.get("ess_min")
        few = not (isinstance(ess_min, (int, float)) and ess_min >= MIN_ESS_TO_TELL)
        if ref is not None and not (float((ref.info or {}).get("ess_min", np.inf)) >= MIN_ESS_TO_TELL):
            few = True  # a reference this short cannot confirm anything either
        row["accurate"] = None if ref is None or (few and not problems) else (not problems)
        all_ok = trusted and not problems
        reasons = ([verdict[len("NOT trusted: "):]] if not trusted and verdict.startswith("NOT trusted: ")
                   else ([] if trusted else [verdict])) + problems
        row["trusted_all"] = all_ok
        row["verdict_line"] = "trusted" if all_ok else "NOT trusted: " + "; ".join(reasons)
        row["trusted_col"] = "yes" if trusted else "no"
        row["accurate_col"] = ("-" if ref is None else "unclear") if row["accurate"] is None else \
            ("yes" if row["accurate"] else "no")
        if names is not None and "worst_param" in row:
            row["worst_param"] = names[row["worst_param"]]
        rows.append(row)
    return sort_rows(rows)


def _as_method(spec):
    """``test`` or ``(test, ControlVariates)`` or ``{"test": ..., "control_variates": ..., "proposal": ...}``."""
    if isinstance(spec, Mapping):
        return spec["test"], spec.get("control_variates"), spec.get("proposal")
    if isinstance(spec, tuple):
        return spec[0], (spec[1] if len(spec) > 1 else None), (spec[2] if len(spec) > 2 else None)
    return spec, None, None


def compare(model, data, methods: Mapping[str, Any], budget_s: float, *, num_chains: int = 2,
            num_warmup: Optional[int] = None, burn_in: float = 0.1, seed: int = 0, proposal: str = "laplace", start: str = "mode",
            reference: bool = True, reference_draws: int = 1000, reference_chains: int = 2,
            cache_dir: Optional[str] = None, refresh_reference: bool = False, names: Optional[Sequence[str]] = None,
            mode: Optional[Mode] = None, say: Optional[Callable[[str], None]] = None, progress=None,
            **sample_kwargs) -> Comparison:
    """Run every method of ``methods`` for ``budget_s`` seconds of sampling and compare them.

    ``methods``: ``{name: test}``, ``{name: (test, ControlVariates())}`` or ``{name: {"test": ...,
    "control_variates": ..., "proposal": ...}}``. Every method gets the same start and proposal:
    ``start="mode"`` (the posterior mode, :func:`posterior_mode`, shared and not in any budget) or
    ``"init"`` (``model.init(data)``); ``proposal="laplace"`` (random walk with the Laplace covariance,
    the same for all) or ``"adaptive"`` (adaptive Metropolis learnt in warmup), unless a method names its
    own. With ``start="mode"`` each :func:`tallmh.sample` call finds the mode itself (its passes counted in
    ``setup_items``, not in the budget), starts the chains at dispersed Laplace draws (the same for every
    method: same seed) and centres any control variates there. ``reference``: also make (or load
    from the cache) a long exact-MH run to measure each method's error. Returns a :class:`Comparison`.
    """

    import tallmh as tm

    say = say or (lambda m: None)
    if not methods:
        raise ConfigError("methods is empty")
    from ..storage.data import num_items

    n = num_items(data)
    if (proposal == "laplace" or reference) and mode is None:
        mode = posterior_mode(model, data)
        say(f"posterior mode: {mode.passes} full pass{'' if mode.passes == 1 else 'es'} over N = {n:,} items, "
            f"{mode.seconds:.1f} s")
    ref = stem = None
    cached = False
    if reference:
        ref, stem, cached = reference_posterior(model, data, mode, draws=reference_draws, chains=reference_chains,
                                                seed=seed, cache_dir=cache_dir, refresh=refresh_reference, say=say,
                                                progress=progress)
        say(("using cached reference " if cached else "reference made ") + (f"{stem}.npz" if stem else "(not cached)"))
    # start="mode": tm.sample finds the mode and starts the chains dispersed around it (Laplace draws), the
    # same starts for every method (same seed); otherwise every chain starts at model.init(data)
    init = None if start == "mode" else model.init(data)
    runs = []
    for label, spec in methods.items():
        test, cv, prop = _as_method(spec)
        if prop is None:
            prop = laplace_proposal(mode.cov) if proposal == "laplace" else tm.proposals.AdaptiveMetropolis()
        warm = num_warmup
        if warm is None and (isinstance(prop, tm.proposals.AdaptiveMetropolis)
                             or getattr(prop, "adapt", False) is True):
            warm = 500  # adaptation (adaptive Metropolis, Langevin's step size) needs a warmup phase
        say(f"{label}: compiling, then " + (f"{_n(warm, 'warmup step')} and {budget_s:g} s of sampling" if warm is not None
                                             else f"{budget_s:g} s (the first {burn_in:.0%} burn-in)")
            + f" ({_n(num_chains, 'chain')} side by side)")
        run = run_budgeted(model, data, test, budget_s, proposal=prop, init=init, num_chains=num_chains,
                           num_warmup=warm, burn_in=burn_in, seed=seed, control_variates=cv, name=label,
                           progress=progress, **sample_kwargs)
        runs.append(run)
        if getattr(run.result, "partial", False):  # Ctrl-C: stop here, keep what was made
            say(f"{label}: interrupted; the comparison holds the methods run so far")
            break
    names = list(names) if names is not None else list(runs[0].result.param_names)
    rows = finish_rows(runs, ref, names)
    return Comparison(runs=runs, rows=rows, names=names, n=n, reference=ref, reference_stem=stem,
                      reference_cached=cached, mode=mode, budget_s=float(budget_s),
                      partial=any(getattr(r.result, "partial", False) for r in runs), settings={"num_chains": num_chains, "num_warmup": num_warmup, "burn_in": burn_in, "seed": seed,
                                "proposal": proposal, "start": start, "budget_s": budget_s})
