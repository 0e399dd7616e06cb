"""The exact default's set-up in one full pass where that is cheaper than a second one.

The exact subsampled test (SMH: Cornish et al., ICML 2019, eq. 4 and Alg. 2; :class:`tallmh.acceptance.PoissonThinning`)
is exact for **any** Taylor centre ``c``: the centre only decides how large the remainders' bound is, and so how
many items a step reads. At large N the set-up's first full Newton pass is made at the last warm-start
sub-sample's mode ``c``, about ``sqrt(d N / m)`` posterior sds (Laplace metric) from the full mode for ``m``
sub-sampled rows. That pass can give everything the chain needs at ``c``: the control variates' sums, the
Hessian, and (fused into the same compiled call, :mod:`tallmh.fused_table`) the table of the items' bound
weights. The chains and the Laplace proposals are then centred at that pass's Newton point ``c* = c +
(-H)^-1 g``, the mode of the quadratic surrogate the test already uses, which at these N lies within a small
fraction of a posterior sd of the mode. What the one-pass centre costs is reads: the bound's ``phi(z, z')``
grows like the offset squared times the step (``z = A^T (theta - c)``).

So the set-up decides by a predicted cost, not by N (:func:`keep_one_pass`): after the first pass it predicts
the expected reads per step at ``c`` and at a centre at the mode from the table just made (no data read: the
table's total weight times the mean of ``phi`` over proposal pairs drawn from the Laplace approximation
``N(c*, H^-1)``, the independence proposal the warmup starts with; a pair outside the bound's trust region
costs a full pass of N reads), and takes the second pass only where the extra reads over the run's steps, at
this data source's cost per read (:func:`read_cost`: a random row of a file not in the page cache costs far
more than one in memory), and the steps that would win back the ESS a lower acceptance loses
(:func:`extra_cost`), cost more than the pass just timed.

Before the first pass, :func:`prescreen` makes the same prediction from a few thousand of the last warm
sub-sample's rows and the offset expected from it, and skips the one-pass table where even a slow pass would
cost less (the first pass then computes the value and gradient only, as without the rule).

The trust region: a bound whose region is ``||z||, ||z'|| <= r`` (the local logistic bound, the Poisson and
NB2 bounds) holds for any whitening ``A`` (``any_whitening``); whitening by ``s A`` with ``s < 1`` gives the
same bound with the region ``||A^T (theta - c)|| <= r / s`` (the weights ``rho_i^3 K_i`` then take ``K_i`` over
the wider region; ``phi`` scales by ``s^3``, ``rho_i^3`` by ``s^-3``). The one-pass table is whitened with
``s = r / (r + reach)``, ``reach`` the offset the set-up expects (:func:`reach_of`), so that a chain around
``c*`` leaves the region no more often than one around ``c`` would.
"""

from __future__ import annotations

import math
import time
from typing import NamedTuple, Optional

import numpy as np

MODE = "auto"  # "auto": the predicted cost decides; "always" / "never": forced (tests and benchmarks)
REACH_MARGIN = 3.0  # the table's region reaches this many times the predicted offset sqrt(d N / m) beyond r
PAIRS = 4096  # proposal pairs the predicted reads average over
LOOP_READ_S = 5e-6  # the thinning loop's cost per item read from memory (an iteration: one row's remainder)
PROBE_ROWS = 8  # random rows timed to price a read from files
# The factorised test's acceptance falls as the remainders grow, and ESS per step with it: the rule prices that as
# the steps that would win the ESS back, with the acceptance taken to fall by exp(-ACCEPT_DECAY) per extra item read
# per step (a lower envelope of the measured ratios to the acceptance at the mode, logistic, d = 11,
# benchmarks/centre_offset.py --test default and out_of_core.py: 0.99 at 0.5 extra items at N = 10^6, 0.92 at 4.9,
# 0.34 at 25; 0.78 at 12 at 10^7; 0.95 at 3.8 at 10^8), each such step costing STEP_S plus its reads
ACCEPT_DECAY = 0.045
STEP_S = 3e-5  # a chain's step without reads (one chain at N = 10^8: 27 us)

__all__ = ["MODE", "OnePassPlan", "Prediction", "radius_of", "whitening_scale", "reach_of", "predict_reads",
           "extra_cost", "keep_one_pass", "read_cost"]


class OnePassPlan(NamedTuple):
    """What the rule needs from the run: the steps the chains will take (all chains, warmup included) and the
    data, whose read cost is measured when the rule is asked (:func:`read_cost`)."""

    steps: int
    data: object


class Prediction(NamedTuple):
    """The rule's inputs and verdict, for the run's notes."""

    one_pass: bool
    offset: float  # sqrt of the Newton decrement at the centre (posterior sds from the surrogate's mode)
    reads_one: float  # expected items per step with the centre at the first pass's point
    reads_two: float  # ... with the centre at the mode (after a second pass)
    steps: int
    read_s: float
    pass_s: float
    forced: bool = False  # (MODE "always" or "never")
    probed: int = 0  # rows read to price a read (counted in the set-up's items)


def radius_of(bound, d: int) -> Optional[float]:
    """The radius ``r`` of a bound's trust region ``||z||, ||z'|| <= r`` (None: a global bound)."""
    if hasattr(bound, "radius_for"):
        return float(bound.radius_for(d))
    r = getattr(bound, "radius", None)
    return None if r is None else float(r)


def whitening_scale(bound, d: int, reach: float) -> float:
    """``s = r / (r + reach)`` (1 for a bound without a region, or one that does not hold for any whitening)."""
    r = radius_of(bound, d)
    if r is None or not getattr(bound, "any_whitening", False) or not reach > 0:
        return 1.0
    return r / (r + float(reach))


def reach_of(n: int, d: int, m: int) -> float:
    """The offset the region is widened by for a centre at the mode of ``m`` of ``n`` rows: ``REACH_MARGIN``
    times the expected ``sqrt(d N / m)`` (measured at N = 10^9 with d = 11 and m = 2^24: 31 against 25.6)."""
    return REACH_MARGIN * math.sqrt(max(1, d) * n / max(1, m))


def _phi_region(bound):
    import jax

    key = (type(bound), tuple(sorted((k, repr(v)) for k, v in vars(bound).items())))  # (by value: compiled once)
    fn = _FNS.get(key)
    if fn is None:
        fn = jax.jit(jax.vmap(lambda z, zp: (bound.phi(z, zp), bound.region(z, zp))))
        if len(_FNS) >= 8:
            _FNS.pop(next(iter(_FNS)))
        _FNS[key] = fn
    return fn


_FNS: dict = {}


def predict_reads(bound, total: float, at, center, mean, chol, n: int, pairs: int = PAIRS, seed: int = 0) -> float:
    """Expected items read per step: ``total`` (the table's ``Lambda / phi``) times the mean of ``phi(z, z')``
    over independent pairs ``theta, theta' ~ N(mean, chol chol^T)`` (``z = at (theta - center)``), plus N for each
    pair outside the bound's region (the exact fallback's full pass). An upper estimate: a step stops at its
    first kept point and reads nothing where the surrogate's factor already rejects."""
    rng = np.random.default_rng(seed)
    d = len(mean)
    u = rng.standard_normal((2, pairs, d))
    th = np.asarray(mean, np.float64) + u @ np.asarray(chol, np.float64).T
    z = (th - np.asarray(center, np.float64)) @ np.asarray(at, np.float64).T
    phi, inside = _phi_region(bound)(z[0].astype(np.float32), z[1].astype(np.float32))
    phi, inside = np.asarray(phi, np.float64), np.asarray(inside, bool)
    return float(np.mean(np.where(inside, total * phi, n)))


def table_total(tb) -> float:
    """``Lambda / phi`` of the table's weights (a :func:`tallmh.factor_bounds.builder`'s: the grouped table's rates to
    within its grouping, or the large-N sampler's, bulk and heavy items)."""
    return tb.rate_total()


def read_cost(data, n: int):
    """``(seconds per item the chain reads, rows read to find it)``: the thinning loop's iteration, plus for data in
    files the median time of reading ``PROBE_ROWS`` random rows there, with the maps advised as the chain reads
    them (``MADV_RANDOM``: with the default advice a page fault reads the disk's whole read-ahead window, 8 MB and
    ~12 ms a row on this machine's disk against ~0.15 ms; a file the page cache holds costs microseconds a row)."""
    from .storage import datasource as ds

    if not ds.in_files(data):
        return LOOP_READ_S, 0
    read = ds.host_reader(data)
    if read is None:
        return LOOP_READ_S, 0
    rng = np.random.default_rng(0)
    times = []
    ds.advise(data, "random")  # (as the chain reads them: a page fault reads its own page, not the read-ahead)
    try:
        for i in rng.integers(0, n, PROBE_ROWS):
            t = time.perf_counter()
            rows = read(int(i), int(i) + 1)
            for a in _leaves(rows):
                float(np.asarray(a).ravel()[0])  # (touch it: a memory map reads the page here)
            times.append(time.perf_counter() - t)
    finally:
        ds.advise(data, "normal")
    return LOOP_READ_S + float(np.median(times)), len(times)


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def extra_cost(reads_one: float, reads_two: float, steps: int, read_s: float) -> float:
    """Seconds a one-pass centre is predicted to add to the run: its extra reads over ``steps`` steps, and the steps
    that would make up the ESS its lower acceptance loses (``exp(-ACCEPT_DECAY * extra reads)`` of the acceptance
    at the mode), each at ``STEP_S`` plus its reads."""
    extra = max(0.0, reads_one - reads_two)
    lost = math.expm1(min(ACCEPT_DECAY * extra, 60.0))  # (1 / ratio - 1)
    return steps * (extra * read_s + lost * (STEP_S + reads_one * read_s))


def keep_one_pass(plan: OnePassPlan, bound, tb, at, center, step, neg_h, n: int, pass_s: float) -> Prediction:
    """Whether the set-up stops after its first full pass, the centre at that pass's point ``center`` and the
    chains' Laplace approximation at ``center + step`` (``neg_h``: minus the log posterior's Hessian there;
    ``tb``, ``at``: that pass's table and whitening). See the module's docstring; ``MODE`` forces either side."""
    h = 0.5 * (np.asarray(neg_h, np.float64) + np.asarray(neg_h, np.float64).T)
    chol = np.linalg.cholesky(np.linalg.inv(h))
    c = np.asarray(center, np.float64)
    offset = float(np.sqrt(max(0.0, np.asarray(step, np.float64) @ h @ np.asarray(step, np.float64))))
    total = table_total(tb)
    reads_one = predict_reads(bound, total, at, c, c + step, chol, n)
    reads_two = predict_reads(bound, total, at, c, c, chol, n)
    read_s, probed = read_cost(plan.data, n)
    if MODE in ("always", "never"):
        one = MODE == "always"
    else:
        one = extra_cost(reads_one, reads_two, plan.steps, read_s) < pass_s
    return Prediction(bool(one), offset, reads_one, reads_two, int(plan.steps), read_s, float(pass_s),
                      MODE in ("always", "never"), probed)


def note(p: Prediction) -> str:
    """The run's note on the decision."""
    if p.forced:
        return (f"set-up in {'one full pass' if p.one_pass else 'two full passes'} (forced): the first pass's point "
                f"was {p.offset:.1f} posterior sd from the surrogate's mode; predicted {p.reads_one:.3g} items per "
                f"step with the centre there, {p.reads_two:.3g} at the mode")
    if p.one_pass:
        return (f"set-up in one full pass: the control variates' centre is the first pass's point, {p.offset:.1f} "
                f"posterior sd from the surrogate's mode (where the chains and proposals are centred); predicted "
                f"{p.reads_one:.3g} items per step against {p.reads_two:.3g} after a second pass, cheaper over "
                f"{p.steps:,} steps at {p.read_s * 1e6:.3g} us a read (and the acceptance it loses) than the "
                f"{p.pass_s:.1f} s pass")
    return (f"set-up made a second full pass: the first pass's point was {p.offset:.1f} posterior sd from the mode, "
            f"predicted {p.reads_one:.3g} items per step there against {p.reads_two:.3g} at the mode, over "
            f"{p.steps:,} steps at {p.read_s * 1e6:.3g} us a read (and the acceptance it loses) dearer than the "
            f"{p.pass_s:.1f} s pass")


def widened(model, unravel, cv, mean):
    """``cv`` with its Hessian sum changed so that the table's whitening (:func:`tallmh.factor_bounds.laplace_factors`)
    is the Laplace factor at the centre scaled by :func:`whitening_scale` for chains centred at ``mean`` (the
    region then reaches them); ``cv`` itself where the model's bound has no region. The surrogate's sums are
    the chains' own ``cv``, not this one: only the table is made from it."""
    from .factor_bounds import laplace_factors
    from .setup_passes import prior_hessian

    bound = model.factor_bound()
    rt, _, _ = laplace_factors(model, unravel, cv)
    reach = float(np.linalg.norm(rt @ (np.asarray(mean, np.float64) - np.asarray(cv.center, np.float64))))
    s = whitening_scale(bound, len(np.asarray(mean)), reach)
    if s == 1.0:
        return cv
    hp = np.asarray(prior_hessian(model, unravel, cv.center), np.float64)
    h = s * s * (np.asarray(cv.hess_sum, np.float64) + hp) - hp
    return cv._replace(hess_sum=np.asarray(h, np.asarray(cv.hess_sum).dtype))


PRESCREEN_ROWS = 1 << 16  # rows of the warm sub-sample whose weights estimate the table before the first pass
PASS_ROW_S_MAX = 1e-6  # a generous bound on a full pass's seconds per row (measured 0.07-0.21 us: 10^8 and 10^9)


def prescreen(plan: OnePassPlan, bound, model, unravel, rows, m: int, n: int, center, h_lik, probed=None) -> bool:
    """Whether the first full pass should make the one-pass table at all: False only where, predicted before it
    from ``rows`` of the last warm sub-sample (``m`` rows; their weights at ``center`` scaled by ``N / len(rows)``)
    and an offset of the expected ``sqrt(d N / m)`` in a random direction, the one-pass centre's cost
    (:func:`extra_cost`) exceeds what even a slow pass (``PASS_ROW_S_MAX`` a row) would cost; the first pass then
    computes the value and gradient only, as without the rule. True where the bound has no host weights.
    ``probed``: a list to which the rows read to price a read are appended (the set-up counts them)."""
    from .setup_passes import prior_hessian

    if MODE != "auto" or not hasattr(bound, "weights_host"):
        return MODE != "never"
    c = np.asarray(center, np.float64)
    d = c.shape[0]
    neg = -(np.asarray(h_lik, np.float64) + prior_hessian(model, unravel, center))
    try:
        a = np.linalg.cholesky(0.5 * (neg + neg.T)) * whitening_scale(bound, d, reach_of(n, d, m))
    except np.linalg.LinAlgError:
        return True
    w = np.asarray(bound.weights_host(c, np.linalg.inv(a), rows), np.float64)
    if not np.all(np.isfinite(w)):
        return True  # (the pass itself decides: its table is dropped where its weights overflow)
    total = float(np.sum(w)) * n / max(1, w.shape[0])
    chol = np.linalg.cholesky(np.linalg.inv(0.5 * (neg + neg.T)))
    u = np.random.default_rng(1).standard_normal(d)
    mean = c + chol @ (u / np.linalg.norm(u) * math.sqrt(d * n / max(1, m)))
    reads_one = predict_reads(bound, total, a.T, c, mean, chol, n, PAIRS // 4)
    reads_two = predict_reads(bound, total, a.T, c, c, chol, n, PAIRS // 4)
    read_s, rows_read = read_cost(plan.data, n) if reads_one > reads_two else (LOOP_READ_S, 0)
    if probed is not None:
        probed.append(rows_read)
    return extra_cost(reads_one, reads_two, plan.steps, read_s) <= n * PASS_ROW_S_MAX
