"""The sequential t-test of austerity MCMC (Korattikara, Chen & Welling 2014, Algorithm 1), per look or per step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp
from jax.scipy.special import betainc, ndtr

from ..errors import ConfigError
from ..data import make_permutation
from ._sequential import per_look_level, worst_case_error
from .base import Decision, Moments, Problem, StreamReader, clt_error, draw_u

__all__ = ["Austerity", "student_t_sf"]


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


@dataclass(frozen=True, init=False, repr=False)
class Austerity:
    """Approximate MH test by a sequential Student-t test (austerity paper Alg. 1, eq. 2-4).

    ``Austerity(error=0.05, batch_size=500)`` (the default; positionally ``Austerity(0.05, 500)``) bounds
    the probability that the *step's* decision differs from exact MH by ``error``; ``Austerity(epsilon=0.05,
    batch_size=500)`` is the paper's Alg. 1 exactly, whose epsilon bounds the error of *each look*.
    Passing both is a :class:`~tallmh.errors.ConfigError`.

    The test. Accept iff ``mu > mu0`` with ``mu = mean_i l_i`` and ``mu0 = (log u - log_base) / N`` (eq. 2).
    Minibatches of ``batch_size`` items are read without replacement; after n items the test computes
    ``s = s_l / sqrt(n) * sqrt(1 - n/N)`` (eq. 3, finite population correction), ``t = (lbar - mu0)/s``
    (eq. 4) and decides once the p-value ``1 - phi_{n-1}(|t|)`` is below the per-look level. When the
    sample standard deviation ``s_l`` is 0 the t-test is skipped and more data is read (the guard of
    Alg. 2 of Chen, Mansinghka & Ghahramani), and at n = N the decision is exact.

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

    Assumptions: the CLT for the mean of the items read (see ``Decision.clt_error``; heavy-tailed l_i
    break it and neither form then keeps its promise), and the Brownian limit with a known sd (with
    m >= 30 the Student-t correction is negligible; with tiny batches it makes the test slightly more
    conservative). ``error`` bounds the error for every (theta, theta', u); averaged over u, a step's
    error is usually well below it. The error-targeted form reads more data than epsilon = error.

    Support: a proposal whose ``log_base`` is -inf or NaN (zero prior or proposal density) is rejected
    without reading data; an item whose l_i is NaN or infinite rejects at once (``Decision.n_nonfinite``
    counts the items read, ``n_data`` includes them). A subsample cannot see a data-dependent support
    (a NaN among unread items): such constraints belong in the prior.

    ``error`` in (0, 0.5); ``epsilon`` in (0, 1); ``batch_size`` between 2 and N.
    """

    error: Optional[float]
    batch_size: int
    epsilon: Optional[float]

    name = "austerity"
    tracks_log_lik = False

    def __init__(self, error: Optional[float] = None, batch_size: int = 500, *, epsilon: Optional[float] = None):
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
        if int(batch_size) != batch_size or int(batch_size) < 2:
            raise ConfigError(f"Austerity batch_size must be at least 2; got {batch_size}")
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "batch_size", int(batch_size))
        object.__setattr__(self, "epsilon", epsilon)

    def __repr__(self):
        if self.error is not None:
            return f"Austerity(error={self.error!r}, batch_size={self.batch_size!r})"
        return f"Austerity(epsilon={self.epsilon!r}, batch_size={self.batch_size!r})"

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
        if self.batch_size > n:
            raise ConfigError(f"Austerity batch_size {self.batch_size} exceeds the number of data items N = {n}")

    def decide(self, key, problem: Problem) -> Decision:
        n = problem.n
        # n may be a traced population size (tallmh.blocks: a cluster's current members); reads stop at n
        m = min(self.batch_size, n) if isinstance(n, int) else self.batch_size
        u, k_perm, _ = draw_u(key)
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

        def body(c):
            acc, _, _, rounds = c
            acc = reader.advance(perm, acc, jnp.minimum(acc.read + m, n))
            tf = acc.t.astype(dtype)
            var = acc.var()
            s = jnp.sqrt(var / tf) * jnp.sqrt(jnp.maximum(1.0 - tf / nf, 0.0))
            tstat = (acc.mean - mu0) / jnp.where(s > 0, s, 1.0)
            pval = student_t_sf(tstat, tf - 1.0)
            # (all N read: the exact decision, not a t-test one, even where rounding leaves s a hair above 0)
            confident = (var > 0) & (s > 0) & (pval < eps) & (acc.nonfinite == 0) & (acc.read < n)
            done = confident | (acc.nonfinite > 0) | (acc.read >= n)
            return acc, done, confident, rounds + 1

        init = (Moments.zero(dtype), impossible, jnp.bool_(False), jnp.int32(0))
        acc, _, by_t_test, rounds = jax.lax.while_loop(cond, body, init)
        accept = (acc.mean > mu0) & (acc.nonfinite == 0) & ~impossible
        # Berry-Esseen-type CLT check of the items read, for decisions that leaned on the CLT; 0 when the
        # decision did not (all N items read, a non-finite item, or no data read)
        clt = jnp.where(by_t_test, clt_error(acc), jnp.zeros((), dtype))
        return Decision(accept, acc.read, rounds, n_nonfinite=acc.nonfinite, clt_error=clt)
