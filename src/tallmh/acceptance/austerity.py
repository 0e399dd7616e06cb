"""The sequential t-test of austerity MCMC (Korattikara, Chen & Welling 2014, Algorithm 1), per look or per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.scipy.special import betainc, ndtr, ndtri

from ..errors import ConfigError
from ..storage.data import make_permutation
from ._sequential import per_look_level, worst_case_error
from .base import CompSum, Decision, Moments, Problem, StreamReader, df_add, df_sum, draw_u
from .exact import exact_accept

__all__ = ["Austerity", "student_t_sf", "student_t_isf", "skew_adjusted_t", "stratified_decide", "rest_item"]


class MomentsPair(NamedTuple):
    """:class:`~tallmh.acceptance.base.Moments` and a compensated sum ``hi + lo`` of the same finite items, for the
    exact decision once all N are read. Each batch is summed by :func:`~tallmh.acceptance.base.df_sum`'s pairwise
    TwoSum tree (elementwise work) and added by double-float addition: about as exact as
    :class:`~tallmh.acceptance.base.CompSum` (whose sequential reduction made a default step ~35% slower at
    N = 10^6, all of it spent on decisions that seldom read all N)."""

    m: Moments
    hi: jax.Array
    lo: jax.Array

    @staticmethod
    def zero(dtype):
        z = jnp.zeros((), dtype)
        return MomentsPair(Moments.zero(dtype), z, z)

    @property
    def read(self):
        return self.m.read

    @property
    def nonfinite(self):
        return self.m.nonfinite

    def merge(self, l, mask):
        ok = mask & jnp.isfinite(l)
        hi, lo = df_add((self.hi, self.lo), df_sum(jnp.where(ok, l, jnp.zeros_like(l))))
        return MomentsPair(self.m.merge(l, mask), hi, lo)


def student_t_sf(t, nu):
    """``P(T > t)`` for Student's t with ``nu`` degrees of freedom, for ``t >= 0``.

    Regularised incomplete beta for ``nu <= 300``; above that, the normal tail at the
    Abramowitz-Stegun (26.7.8) transform ``z = t (1 - 1/(4 nu)) / sqrt(1 + t^2 / (2 nu))``, whose relative
    error is below 2e-3 for ``t <= 4`` at ``nu = 300`` and falls like 1/nu^2 (float32 betainc loses
    accuracy at large nu).
    """
    nu = jnp.asarray(nu, jnp.result_type(float))
    t = jnp.abs(t)
    small = 0.5 * betainc(jnp.minimum(nu, 300.0) / 2.0, 0.5, jnp.minimum(nu, 300.0) / (jnp.minimum(nu, 300.0) + t * t))
    z = t * (1.0 - 1.0 / (4.0 * nu)) / jnp.sqrt(1.0 + t * t / (2.0 * nu))
    large = ndtr(-z)
    return jnp.where(nu <= 300.0, small, large)


def student_t_isf(x, nu):
    """The upper-tail quantile of Student's t with ``nu`` degrees of freedom at the level whose normal quantile
    is ``x`` (``x = -ndtri(p)``): the Cornish-Fisher expansion in 1/nu to the fourth order (Abramowitz &
    Stegun 26.7.5; Fisher & Cornish 1960). ``|T| > student_t_isf(x, nu)`` is ``P(T > |T|) < p``: the
    austerity test's stopping rule (eq. 4) without the incomplete beta function, a loop evaluated at every
    look and compiled into the chain. Relative error below 1e-4 for ``nu >= 29`` and ``x <= 5`` (checked against SciPy in
    tests/acceptance/test_student_t.py); used where every look has read at least ``T_EXPANSION_MIN`` items.
    """
    x2 = x * x
    g1 = (x2 + 1.0) * x / 4.0
    g2 = ((5.0 * x2 + 16.0) * x2 + 3.0) * x / 96.0
    g3 = (((3.0 * x2 + 19.0) * x2 + 17.0) * x2 - 15.0) * x / 384.0
    g4 = ((((79.0 * x2 + 776.0) * x2 + 1482.0) * x2 - 1920.0) * x2 - 945.0) * x / 92160.0
    r = 1.0 / nu
    return x + r * (g1 + r * (g2 + r * (g3 + r * g4)))


# the smallest look (items read) at which the stopping rule uses student_t_isf; below, the incomplete beta
T_EXPANSION_MIN = 30
FAR_EXCESS = 0.01
# batch_size="auto": with the skewness-corrected boundary the per-step promise does not depend on the batch
# (where the items need more, the test reads more), so the batch only trades looks against items read. 100
# read the fewest items per step in our measurements (the README's example: 314 items per step at 100,
# 615 at 400, the same decisions), and the Brownian and Student-t approximations are good from there on.
AUTO_BATCH = 100


def skew_adjusted_t(t, skew, n, f, c):
    """The t statistic shifted so that both of its tails at +-c have the normal level, and the shift's size.

    For items drawn without replacement (sampling fraction ``f = n / N``) from a population with skewness
    ``g``, the studentised mean ``T`` (eq. 4, with the finite-population sd of eq. 3) has the one-term
    Edgeworth expansion ``P(T <= x) = Phi(x) + p(x) phi(x) + O(1/n)`` with

        p(x) = a [ (1 - f) / 2 + (2 - f) (x^2 - 1) / 6 ],   a = g / sqrt(n (1 - f)).

    (Derived from the bias ``E T = -a (1 - f) / 2`` and third cumulant ``k3(T) = -a (2 - f)`` of the
    delta-method expansion ``T = Z (1 + V)^(-1/2)``, with the without-replacement third cumulant of the
    mean, ``(1 - 2f) g / sqrt(n (1 - f))``, and covariance ``(1 - f) mu3 / n`` of the mean and the variance;
    at f = 0 it is the classical ``g (2x^2 + 1) / 6 sqrt(n)`` of Hall 1992, eq. 2.55.) Positive skewness
    makes the lower tail of T heavier. The stopping rule "first look with ``|T| > c``" therefore errs more
    often on one side; with ``T + p(c)`` in place of T, the two boundaries become ``c - p(c)`` (upper) and
    ``-c - p(c)`` (lower), each crossed with probability ``1 - Phi(c)`` at gap 0 (Cornish-Fisher). Returns
    ``(t + p(c), |p(c)|)``; ``|p(c)|`` measures how far from normal the statistic is at this look, and the
    test does not stop where it exceeds ``Austerity.max_skew_correction`` (the expansion is then no guide).
    """
    one_f = jnp.maximum(1.0 - f, 0.0)
    a = skew / jnp.sqrt(jnp.maximum(n * one_f, 1e-30))
    shift = a * (0.5 * one_f + (2.0 - f) * (c * c - 1.0) / 6.0)
    shift = jnp.where(jnp.isfinite(shift), shift, jnp.inf)
    return t + jnp.where(jnp.isfinite(shift), shift, 0.0), jnp.abs(shift)


def tail_excess(skew, n, f, c, alpha, corrected):
    """Estimated inflation of a look's one-sided error above its design level ``alpha``, relative to alpha.

    What the boundary leaves out, evaluated at ``c`` (the statistic where the test stopped, at least the
    critical value) with the skewness ``g`` of the items read and the effective size ``n (1 - f)``: the first Edgeworth term ``phi(c) |p(c)|`` when the boundary
    is not corrected for skewness (the paper's symmetric boundary), and, in either case, the ``g^2`` part
    of the second term of the studentised mean's expansion, ``phi(c) c g^2 (c^4 + 2 c^2 - 3) / (18 n (1-f))``
    (Hall 1992, eq. 2.57; the kurtosis part makes the t-test more conservative and is left out, so the
    estimate errs high). A whole step errs at most ``error`` by design; its error is then estimated as
    ``error * (1 + excess)`` (the looks' error probabilities scale together).
    """
    one_f = jnp.maximum(1.0 - f, 0.0)
    neff = jnp.maximum(n * one_f, 1.0)
    phi = jnp.exp(-0.5 * c * c) / jnp.sqrt(2.0 * jnp.pi)
    second = phi * c * skew * skew * (c**4 + 2.0 * c * c - 3.0) / (18.0 * neff)
    first = jnp.zeros_like(second)
    if not corrected:
        _, shift = skew_adjusted_t(jnp.zeros_like(c), skew, n, f, c)
        first = phi * jnp.where(jnp.isfinite(shift), shift, 1.0 / phi)
    return (first + second) / alpha


@dataclass(frozen=True, init=False, repr=False)
class Austerity:
    """Approximate MH test by a sequential Student-t test (austerity paper Alg. 1, eq. 2-4).

    ``Austerity(error=0.05, batch_size="auto")`` (the default; positionally ``Austerity(0.05, 500)``)
    bounds the probability that the *step's* decision differs from exact MH by ``error``;
    ``Austerity(epsilon=0.05, batch_size=500)`` is the paper's Alg. 1 exactly, whose epsilon bounds the
    error of *each look*. Passing both is a :class:`~tallmh.errors.ConfigError`. ``batch_size="auto"``
    takes 100 items per look (``AUTO_BATCH``; all N when N is smaller): with the skewness-corrected
    boundary below the promise holds at any batch, so the batch only trades looks against items read.

    The test. Accept iff ``mu > mu0`` with ``mu = mean_i l_i`` and ``mu0 = (log u - log_base) / N`` (eq. 2).
    Minibatches of ``batch_size`` items are read without replacement; after n items the test computes
    ``s = s_l / sqrt(n) * sqrt(1 - n/N)`` (eq. 3, finite population correction), ``t = (lbar - mu0)/s``
    (eq. 4) and decides once the p-value ``1 - phi_{n-1}(|t|)`` is below the per-look level (as ``|t|`` beyond
    the t quantile, :func:`student_t_isf`, where looks have at least 30 items). When the
    sample standard deviation ``s_l`` is 0 the t-test is skipped and more data is read (the guard of
    Alg. 2 of Chen, Mansinghka & Ghahramani), and at n = N the decision is exact: taken from the compensated
    sum of the items read, by the rule :class:`~tallmh.acceptance.Exact` uses (a float running mean compared
    with ``mu0`` rounds twice and could land on the other side of a close call).

    Per-look versus per-step error. In the epsilon form the per-look level is epsilon: a look that stops
    is wrong with probability at most epsilon (under the CLT), but a step makes up to ceil(N/m) - 1 looks
    that can err, and near the decision boundary the whole test errs far more often (11% at epsilon =
    0.05 on the README's benchmark, up to ~30% in the worst case at N/m = 25). In the error form the
    per-look level is designed, like Pocock's (1977) constant group-sequential boundary, so that the
    worst case over the unknown standardised gap ``(mu - mu0) / sigma_l`` of the whole test's error
    equals ``error``:

    * Brownian approximation (the error analysis of the austerity authors' later versions: Korattikara,
      Chen & Welling, ICML 2014; "Sequential tests for large-scale learning", Neural Computation 2016):
      drawing without replacement, the standardised running mean at look k is ``Z_k + d sqrt(n_k/(1-f_k))``
      with ``Z_k = W(tau_k) / sqrt(tau_k)``, W a Brownian motion, ``tau_k = n_k / (N - n_k)``,
      ``f_k = n_k / N`` and d the standardised gap.
    * The error is largest as d -> 0 (every t_k increases with d on every path), where it is half the
      probability that ``max_{k<K} |Z_k|`` exceeds the critical value c.
    * c (hence the per-look level ``1 - Phi(c)``) solves ``P(max_k |Z_k| > c) = 2 error`` for the given N
      and batch size: a recursion over the looks, computed in NumPy when the step is traced (N is static)
      and cached per (N, m, error); see :mod:`tallmh.acceptance._sequential` (0.05-2 s, checked against a
      simulation of every look in ``tests/acceptance/test_austerity_error.py``). :meth:`per_look_epsilon` returns it.

    Skewed items. The design above assumes a symmetric statistic. Skewed l_i (a rare one-hot feature,
    log-normal data, control-variate remainders) make one tail of t heavier, so the error form corrects
    its boundary for the skewness of the items read (:func:`skew_adjusted_t`: a one-term Edgeworth /
    Cornish-Fisher shift with the without-replacement cumulants) and does not stop where that shift exceeds
    ``max_skew_correction`` unless the statistic is far beyond the boundary; it reads more data instead.
    Measured (``benchmarks/skewed_items.py``): within the target on exponential, log-normal(0, 1),
    Bernoulli(0.02) and Student-t(3) items at the worst case, where the symmetric boundary
    (``skew_correction=False``) is not. ``Decision.excess_error`` estimates what the normal approximation
    still leaves out (:func:`tail_excess`); the run's verdict flags it. Other assumptions: the Brownian
    limit with a known sd (with
    m >= 30 the Student-t correction is negligible; with tiny batches it makes the test slightly more
    conservative). ``error`` bounds the error for every (theta, theta', u); averaged over u, a step's
    error is usually well below it. The error-targeted form reads more data than epsilon = error.

    Support: a proposal whose ``log_base`` is -inf or NaN (zero prior or proposal density) is rejected
    without reading data; an item whose l_i is NaN or infinite rejects at once (``Decision.n_nonfinite``
    counts the items read, ``n_data`` includes them). A subsample cannot see a data-dependent support
    (a NaN among unread items): such constraints belong in the prior.

    Stratified: where the problem names ``exact_rows`` (``ControlVariates(exact_rows=...)``: the items whose
    Taylor remainders can dominate the sum), those are summed exactly at every step and the test runs on the
    others (:func:`stratified_decide`).

    ``error`` in (0, 0.5); ``epsilon`` in (0, 1); ``batch_size`` between 2 and N.
    """

    error: Optional[float]
    batch_size: int
    epsilon: Optional[float]
    skew_correction: bool = True
    max_skew_correction: float = 0.25
    batch_auto: bool = False

    name = "austerity"
    tracks_log_lik = False

    def __init__(self, error: Optional[float] = None, batch_size="auto", *, epsilon: Optional[float] = None,
                 skew_correction: bool = True, max_skew_correction: float = 0.25):
        if error is not None and epsilon is not None:
            raise ConfigError(
                f"Austerity takes error= (per-step error target) or epsilon= (Alg. 1's per-look level), not both; "
                f"got error={error}, epsilon={epsilon}")
        if epsilon is not None:
            if not (0.0 < float(epsilon) < 1.0):
                raise ConfigError(f"Austerity epsilon must be in (0, 1); got {epsilon}")
            epsilon = float(epsilon)
        else:
            error = 0.05 if error is None else error
            if not (0.0 < float(error) < 0.5):
                raise ConfigError(f"Austerity error must be in (0, 0.5); got {error}")
            error = float(error)
        auto = isinstance(batch_size, str)
        if auto and batch_size != "auto":
            raise ConfigError(f"Austerity batch_size must be an integer >= 2 or 'auto'; got {batch_size!r}")
        if auto:
            batch_size = AUTO_BATCH
        elif isinstance(batch_size, bool) or int(batch_size) != batch_size or int(batch_size) < 2:
            raise ConfigError(f"Austerity batch_size must be at least 2 (or 'auto'); got {batch_size!r}")
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "batch_size", int(batch_size))
        object.__setattr__(self, "batch_auto", auto)
        object.__setattr__(self, "epsilon", epsilon)
        if not float(max_skew_correction) > 0.0:
            raise ConfigError(f"Austerity max_skew_correction must be positive; got {max_skew_correction}")
        on = bool(skew_correction) and epsilon is None
        object.__setattr__(self, "skew_correction", on)
        object.__setattr__(self, "max_skew_correction", float(max_skew_correction) if on else float("inf"))

    def __repr__(self):
        b = "'auto'" if self.batch_auto else repr(self.batch_size)
        if self.error is not None:
            return f"Austerity(error={self.error!r}, batch_size={b})"
        return f"Austerity(epsilon={self.epsilon!r}, batch_size={b})"

    @property
    def error_target(self) -> Optional[float]:
        """The per-step error the run can be audited against (None for the per-look epsilon form)."""
        return self.error

    @property
    def label(self) -> str:
        if self.error is not None:
            return f"austerity(error={self.error:g})"
        return f"austerity(eps={self.epsilon:g})"

    def per_look_epsilon(self, n: int) -> float:
        """Alg. 1's per-look level used at N = n (epsilon itself, or the level designed for ``error``)."""
        if self.epsilon is not None:
            return self.epsilon
        return per_look_level(self.error, int(n), min(self.batch_size, int(n)))

    def worst_case_error(self, n: int) -> float:
        """The whole step's worst-case error at N = n under the Brownian approximation (see above)."""
        return worst_case_error(self.per_look_epsilon(n), int(n), min(self.batch_size, int(n)))

    def check(self, n: int):
        if self.batch_size > n and not self.batch_auto:
            raise ConfigError(f"Austerity batch_size {self.batch_size} exceeds the number of data items N = {n}")

    def decide(self, key, problem: Problem) -> Decision:
        u, k_perm, _ = draw_u(key)
        if problem.exact_rows is not None:
            return stratified_decide(self, u, k_perm, problem)
        return self.sequential(u, k_perm, problem)

    def sequential(self, u, k_perm, problem: Problem, full_sum=None) -> Decision:
        """The sequential test on ``problem``'s N items with the uniform ``u`` and the permutation key ``k_perm``.

        ``full_sum``: a double-float pair ``(hi, lo)`` added to the items' compensated sum in the exact decision
        taken once all N are read, compared with the threshold ``log u - log_base0`` of ``log_base0 = full_sum[2]``
        (a stratum summed exactly, :func:`stratified_decide`, whose float sum is already in ``problem.log_base``).
        """
        n = problem.n
        # n may be a traced population size (tallmh.blocks: a cluster's current members); reads stop at n
        m = min(self.batch_size, n) if isinstance(n, int) else self.batch_size
        dtype = problem.log_base.dtype
        mu0 = (jnp.log(u) - problem.log_base) / n
        perm = make_permutation(k_perm)
        # every look asks for m more items, so only the ladder's first rung is ever used: the larger
        # rungs' loops (each a compiled copy of the model) would only cost compile time
        reader = StreamReader(n, m, problem.lik_ratio, ladder_base=None)
        eps = jnp.asarray(self.per_look_epsilon(n), dtype)
        nf = jnp.asarray(n, dtype)
        # zero prior or proposal density at theta' (or NaN): reject without reading data
        impossible = ~(problem.log_base > -jnp.inf)

        def cond(c):
            return ~c[1]

        # the error form corrects its boundary for the skewness of the items (skew_adjusted_t); the
        # epsilon form is the paper's Alg. 1 as published (symmetric boundary)
        crit = -ndtri(eps.astype(jnp.float32)).astype(dtype)
        skew_on = self.skew_correction
        expansion = isinstance(n, int) and m >= T_EXPANSION_MIN

        def body(c):
            both, _, _, rounds, _ = c
            both = reader.advance(perm, both, jnp.minimum(both.read + m, n))
            acc = both.m
            tf = acc.t.astype(dtype)
            var = acc.var()
            f = jnp.minimum(tf / nf, 1.0)
            s = jnp.sqrt(var / tf) * jnp.sqrt(jnp.maximum(1.0 - f, 0.0))
            tstat = (acc.mean - mu0) / jnp.where(s > 0, s, 1.0)
            skew = acc.skewness()
            if skew_on:
                tadj, doubt = skew_adjusted_t(tstat, skew, tf, f, crit)
            else:
                tadj, doubt = tstat, jnp.zeros((), dtype)
            # evaluated where the statistic stopped: a step that stops far beyond the boundary errs rarely
            excess = tail_excess(skew, tf, f, jnp.maximum(jnp.abs(tadj), crit), eps, skew_on)
            if expansion:  # every look has read >= T_EXPANSION_MIN items (N static): the quantile's expansion
                beyond = jnp.abs(tadj) > student_t_isf(crit, tf - 1.0)
            else:
                beyond = student_t_sf(tadj, tf - 1.0) < eps
            # Where the boundary's skewness shift is too large for the expansion to guide, stop only when the
            # statistic is so far beyond the boundary that even the uncorrected expansion's tail excess there
            # is negligible (FAR_EXCESS of the look's level); otherwise read more. (All N read: the exact
            # decision, not a t-test one, even where rounding leaves s a hair above 0.)
            far = tail_excess(skew, tf, f, jnp.abs(tadj), eps, False) <= FAR_EXCESS
            confident = ((var > 0) & (s > 0) & beyond & (acc.nonfinite == 0) & (acc.read < n)
                         & ((doubt <= self.max_skew_correction) | far))
            done = confident | (acc.nonfinite > 0) | (acc.read >= n)
            return both, done, confident, rounds + 1, jnp.where(confident, excess, 0.0).astype(dtype)

        init = (MomentsPair.zero(dtype), impossible, jnp.bool_(False), jnp.int32(0), jnp.zeros((), dtype))
        # every carry tied to a per-chain value (the same numbers): under vmap over chains the loop's batching
        # then needs no search for which carries vary by chain, a search that traced the body (and the reader's
        # loop inside it) several times over (0.15 s of a fresh process's chain trace)
        init = jax.tree_util.tree_map(lambda x: jnp.where(impossible, x, x), init)
        both, _, by_t_test, rounds, excess = jax.lax.while_loop(cond, body, init)
        acc = both.m
        # all N read: the exact decision from the compensated sum, as Exact() takes it (the float running mean
        # compared with mu0 rounds twice and can land on the other side of a close call)
        if full_sum is None:
            exact = exact_accept("metropolis", u, problem.log_base, (both.hi, both.lo))
        else:
            exact = exact_accept("metropolis", u, full_sum[2], df_add((both.hi, both.lo), full_sum[:2]))
        accept = jnp.where(by_t_test, acc.mean > mu0, exact) & (acc.nonfinite == 0) & ~impossible
        # the estimated error inflation of the look that decided (tail_excess); 0 when the decision did not
        # lean on the CLT (all N items read, a non-finite item, or no data read)
        excess = jnp.where(by_t_test, excess, jnp.zeros((), dtype))
        return Decision(accept, acc.read, rounds, n_nonfinite=acc.nonfinite, excess_error=excess)


def rest_item(exact_rows, j):
    """The item index of position ``j`` among the items not in ``exact_rows`` (sorted, distinct int32), in
    index order: ``j + #{k : exact_rows[k] - k <= j}``, by a binary search over the K rows (O(log K))."""
    k = exact_rows.shape[0]
    shifted = exact_rows - jnp.arange(k, dtype=exact_rows.dtype)
    return j + jnp.searchsorted(shifted, j, side="right").astype(j.dtype)


def stratified_decide(test: Austerity, u, k_perm, problem: Problem) -> Decision:
    """Stratified austerity: the items of ``problem.exact_rows`` summed exactly at every step, the rest subsampled.

    The log ratio is ``Lambda = S_E + sum_{i not in E} l_i`` with ``S_E`` the stratum's sum, computed exactly
    (compensated, :class:`~tallmh.acceptance.base.CompSum`) from its K items. Exact MH accepts iff
    ``mean_{i not in E} l_i > (log u - log_base - S_E) / (N - K)``: austerity's test (Korattikara, Chen & Welling
    2014, eq. 2-4) on the N - K other items with ``log_base + S_E`` as the data-free part. The sequential
    t-test, its per-step error design and its skewness correction then apply unchanged to the rest, whose
    variance (eq. 3, with the finite-population correction of N - K items) no longer holds the stratum's
    items: rows whose Taylor remainders dominate the sum (a rare feature's rows, rows with large features:
    :mod:`tallmh.strata` chooses them by their remainder weight) are never left to the t-test's
    normal approximation, which cannot see an item it has not read. With all N - K read, the decision is
    exact (the two compensated sums added). ``n_data`` counts the K items at every step.
    """
    n = problem.n
    if not isinstance(n, int):
        raise ValueError("stratified austerity needs a static number of items N")
    rows = problem.exact_rows
    k = int(rows.shape[0])
    dtype = problem.log_base.dtype
    impossible = ~(problem.log_base > -jnp.inf)
    stratum = CompSum.zero(dtype).merge(problem.lik_ratio(rows), jnp.ones((k,), bool))
    bad_e = stratum.nonfinite
    s_e = stratum.value()
    rest_n = n - k
    if rest_n <= 0:
        accept = exact_accept("metropolis", u, problem.log_base, (stratum.hi, stratum.lo)) & (bad_e == 0)
        read = jnp.where(impossible, 0, k).astype(jnp.int32)
        return Decision(accept & ~impossible, read, jnp.int32(1), n_nonfinite=jnp.where(impossible, 0, bad_e),
                        excess_error=jnp.zeros((), dtype))
    lik = problem.lik_ratio
    base = jnp.where(impossible | (bad_e > 0), -jnp.inf, problem.log_base + jnp.where(jnp.isfinite(s_e), s_e, 0.0))
    sub = problem._replace(n=rest_n, log_base=base, lik_ratio=lambda j: lik(rest_item(rows, j)), exact_rows=None,
                           lik_ratio_rows=None, log_lik_current=None)
    dec = test.sequential(u, k_perm, sub, (stratum.hi, stratum.lo, problem.log_base))
    read_e = jnp.where(impossible, 0, k).astype(jnp.int32)
    bad = jnp.where(impossible, 0, bad_e) + dec.n_nonfinite
    return dec._replace(accept=dec.accept & (bad == 0), n_data=dec.n_data + read_e, n_nonfinite=bad.astype(jnp.int32))
