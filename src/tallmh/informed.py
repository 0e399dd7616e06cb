"""Informed sub-sampling MCMC (ISS-MCMC; Maire, Friel & Alquier, Statistics and Computing 29, 2019).

Summarised in ``informed-subsampling-iss-mcmc-report.md`` (Mwakima & Zhang, Stats 230 report, 2023),
whose equations are cited below as "report eq. (k)".

The chain lives on the extended space Theta x U_n, where U_n is the set of subsets of n of the N items.
One iteration (report Sec. 3.3, the algorithm box):

1. *Subset move.* Propose U' from U by swapping ``swap`` = k uniformly chosen members for k uniformly
   chosen non-members (a symmetric kernel R, as the report's Sec. 3.2 asks: R(U, U') = R(U', U) =
   1 / (C(n, k) C(N - n, k)) for subsets k swaps apart), and accept it with probability
   ``min(1, exp(eps (||Delta(U)||^2 - ||Delta(U')||^2)))`` (report eq. (4)-(5)), where

       Delta(U) = sum_{i=1..N} S(y_i) - (N/n) sum_{i in U} S(y_i)            (report eq. (1))

   compares the subset's (rescaled) summary statistic with the full data's. The U-marginal of the
   chain is therefore exactly ``nu_{n,eps}(U) ∝ exp(-eps ||Delta(U)||^2)`` (report eq. (3)): the subset
   move does not look at theta, as in the report's algorithm (lines 3-9).
2. *Parameter move.* An MH step on theta for the subset posterior

       pi_n(theta | Y_U) ∝ p(theta) prod_{i in U} p(y_i | theta)^(N/n)          (report eq. (7))

   with the library's proposal (any symmetric or asymmetric ``propose``; its ``log q`` ratio is used).

**Target.** This is the report's (and Maire et al.'s) algorithm as stated, with no likelihood factor in
the subset move, so the joint chain has no simple product target: U is a nu_{n,eps}-reversible chain on
its own, and theta is an MH chain on pi_n(. | Y_U) driven by it. The theta-marginal is a *noisy MCMC*
approximation of the posterior (Alquier et al. 2016; Maire et al. 2019, Sec. 3-4): when theta mixes
within the life of a subset it is close to the mixture ``sum_U nu_{n,eps}(U) pi_n(theta | Y_U)``. It is
the exact posterior when every subset that nu_{n,eps} charges has ``Delta(U) = 0`` for a *sufficient*
statistic (an exponential family with ``statistic`` = its sufficient statistic and eps -> inf:
pi_n(. | Y_U) then equals pi(. | Y) for such U). Otherwise it is biased: wider than the posterior and
shifted by the selected subsets' errors. The self-audit against exact MH is therefore meaningless here
and the kernel never audits (``audit = False``; ``StepInfo.audited`` stays False).

**Statistics.** ``statistic(batch) -> (b,)`` or ``(b, s)`` per-item values, summed over items (the
report's additive S). The default (``statistic=None``) is *ours, not the report's*: per-item scores at
the posterior mode theta_hat, whitened by the inverse square root of the negative Hessian of the log
posterior there, ``S(y_i) = P^{-1/2} grad log p(y_i | theta_hat)`` with ``P = -hess log pi(theta_hat)``.
To first order, the mode of pi_n(. | Y_U) is ``theta_hat - P^{-1} Delta_raw(U)``, so with this statistic
``||Delta(U)||`` is the distance of the subset posterior's mode from the posterior mode *in posterior
standard deviations* (Mahalanobis), and eps has a model-free scale: under uniform U,
``E ||Delta||^2 ≈ dim(theta) (N/n - 1)``, and nu_{n,eps} keeps ``||Delta||^2`` of order
``dim(theta) / (2 eps)`` for eps >> n/N (a Gaussian-mixture estimate of the theta-marginal's sd inflation
is ``sqrt(1 + 1/(n/(N-n) + 2 eps))`` per direction when the subset chain mixes). For models with a
sufficient statistic linear in the data (e.g. a Gaussian mean with known variance), the scores are
such a statistic.

**Choosing k.** A swap of k items moves the whitened Delta by about ``sqrt(2 k N) / n`` per coordinate,
while nu_{n,eps} keeps it within about ``1 / sqrt(2 eps)``: with ``k`` much above ``n^2 / (4 eps N)`` almost
every subset move is rejected and the subset stays put (chains then disagree: R-hat shows it). k = 1 is
the safe choice at large N (``benchmarks/papers/iss_mcmc.py``: at N = 1e6, n = 1000, eps = 1, k = 10 gave
an ESS of 5 where k = 1 gave 327).

The mode and Hessian come, in this order, from ``center=`` (a flat vector; the Hessian is then computed
in one full pass), from the ``cv`` that ``kernel.init`` receives (``tallmh.sample`` passes the mode and
Hessian it found for its start when the test sets ``wants_mode``), or from damped Newton inside
``kernel.init`` started at the chain's theta (at most ``newton_steps`` full passes per chain).

**Cost.** Set-up: one O(N) pass for ``sum_i S(y_i)`` (plus the Newton passes above, if any), shared by the
chains except Newton's. Per iteration: k candidate items read (their statistic and their
log-likelihood at the current theta), then the n members at the proposed theta: ``n_data = n + k``
(``k`` alone when the proposal is outside the prior's support). Cached in ``KernelState.extra``: the
subset's indices, the per-member statistics (centred at the full-data mean) and the per-member
log-likelihoods at the current theta. Non-members are drawn by rejection against the member list
(O(n k) comparisons, or a sort for k > 16), never O(N).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from .storage.data import take
from .acceptance.none import AlwaysAccept
from .acceptance.informed import Informed
from .errors import ConfigError, ModelError
from .kernel import Kernel, KernelState, StepInfo, build_kernel

__all__ = ["Informed", "ISSState"]


class ISSState(NamedTuple):
    """What the informed sub-sampling kernel keeps in ``KernelState.extra`` (per chain)."""

    idx: jax.Array  # (n,) int32: the subset U
    stat: jax.Array  # (n, s): S(y_i) - mean_j S(y_j) of the members (whitened scores by default)
    ll: jax.Array  # (n,): log p(y_i | theta) of the members at the current theta
    mean_stat: jax.Array  # (s,): mean over all N items of S(y_i)
    center: jax.Array  # (d,): theta_hat of the default statistic (zeros for a user statistic)
    whiten: jax.Array  # (d, d): P^{-1/2} of the default statistic (zeros for a user statistic)
    delta_sq: jax.Array  # ||Delta(U)||^2 of the current subset
    subset_accepted: jax.Array  # int32: subset moves accepted so far (warmup included)
    steps: jax.Array  # int32: iterations made so far
    chain_passes: jax.Array  # int32: full passes this chain's init made alone (Newton)
    shared_passes: jax.Array  # int32: full passes of the init shared by all chains (the statistic's sum)


def _hash_key(theta):
    """A PRNG key derived from the bits of ``theta`` (``kernel.init`` has no key): the initial subset."""
    bits = jax.lax.bitcast_convert_type(theta.astype(jnp.float32), jnp.uint32)
    mult = (jnp.arange(bits.shape[0], dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)) * jnp.uint32(0x9E3779B1)
    h = jax.lax.reduce(bits * mult, jnp.uint32(0), jax.lax.bitwise_xor, (0,))
    h = h ^ (h >> 15)
    return jax.random.fold_in(jax.random.PRNGKey(0x1555), h)


def _distinct_draw(key, count, high, exclude=None):
    """``count`` distinct ints uniform in ``[0, high)`` and not in ``exclude`` (an int array), by rejection.

    Each round redraws the values that repeat an earlier one or hit ``exclude``; the result is uniform over
    the ``count``-subsets of the allowed values (the procedure only compares values for equality, so its
    law is invariant under every permutation of the allowed values). Cost per round O(count log count +
    count * len(exclude)) (a sort of ``exclude`` when ``count > 16``); expected rounds about
    ``1 / (1 - (count + len(exclude)) / high)``.
    """
    if exclude is not None and count > 16:
        excl_sorted = jnp.sort(exclude)

    def bad_of(c):
        order = jnp.argsort(c)
        sc = c[order]
        dup_sorted = jnp.concatenate([jnp.zeros((1,), bool), sc[1:] == sc[:-1]])
        bad = jnp.zeros((count,), bool).at[order].set(dup_sorted)
        if exclude is not None:
            if count > 16:
                pos = jnp.clip(jnp.searchsorted(excl_sorted, c), 0, exclude.shape[0] - 1)
                bad = bad | (excl_sorted[pos] == c)
            else:
                bad = bad | jnp.any(c[:, None] == exclude[None, :], axis=1)
        return bad

    k0, key = jax.random.split(key)
    c = jax.random.randint(k0, (count,), 0, high, dtype=jnp.int32)

    def cond(s):
        return jnp.any(s[2])

    def body(s):
        c, key, bad = s
        key, sub = jax.random.split(key)
        c = jnp.where(bad, jax.random.randint(sub, (count,), 0, high, dtype=jnp.int32), c)
        return c, key, bad_of(c)

    c, _, _ = jax.lax.while_loop(cond, body, (c, key, bad_of(c)))
    return c


def _chunk_starts(n_items, chunk):
    return jnp.arange(0, n_items, chunk, dtype=jnp.int32)


def build_informed_kernel(test, model, proposal, n_items, unravel, stats=None, cv_order=None):
    """The ISS-MCMC kernel of ``test`` (an :class:`~tallmh.acceptance.Informed`): subset moves and parameter moves
    on the subset's posterior (module docstring); ``init`` and ``step`` as :func:`tallmh.kernel.build_kernel`'s."""
    if cv_order:
        raise ConfigError("Informed does not use control variates (its subset is fixed between subset "
                          "moves); leave control_variates=None")
    if getattr(proposal, "needs_data", False):
        raise ConfigError("Informed works with data-free proposals (AdaptiveMetropolis, RandomWalk), "
                          f"not {type(proposal).__name__}")
    test.check(n_items)
    iss = _ISSKernel(test, model, proposal, n_items, unravel)
    base = build_kernel(model, proposal, AlwaysAccept(), n_items, unravel, stats, None)
    return Kernel(iss.init, iss.step, base.full_log_lik, base.grad_estimate)


def _inv_sqrt(prec):
    """``(P^{-1/2}, P^{-1})`` of a symmetric ``P`` whose eigenvalues are floored at 1e-12 of the largest."""
    prec = 0.5 * (prec + prec.T)
    lam, vec = jnp.linalg.eigh(prec)
    lam = jnp.maximum(lam, 1e-12 * jnp.maximum(jnp.max(jnp.abs(lam)), 1e-30))
    return (vec * (1.0 / jnp.sqrt(lam))) @ vec.T, (vec * (1.0 / lam)) @ vec.T


class _ISSKernel:
    """The ISS-MCMC kernel of one ``Informed`` test for one model, proposal and N, stage by stage.

    Set-up (``init``): the whitening of the default statistic (``_whitening``: from ``center=``, the
    ``cv``, or Newton), the full-data mean of the statistic (``_mean_stat``), the first subset
    (``_first_subset``). One iteration (``step``): the subset move (``_swap_positions``,
    ``_subset_move``; report eq. (4)-(5)), then the theta move on pi_n(theta | Y_U) (``_theta_move``;
    report eq. (7)) and the proposal's adaptation (``_adapt``).
    """

    def __init__(self, test: Informed, model, proposal, n_items, unravel):
        self.model, self.proposal, self.unravel = model, proposal, unravel
        self.N, self.m, self.k = int(n_items), test.subset_size, test.swap
        self.scale = self.N / self.m
        self.eps = test.epsilon
        self.user_stat = test.statistic
        self.chunk = int(min(test.chunk, self.N))
        self.fixed_center = None if test.center is None else np.asarray(test.center, float)
        self.newton_steps = test.newton_steps

    # --- model terms ---------------------------------------------------------------------------------

    def loglik(self, theta, batch):
        return self.model.log_lik(self.unravel(theta), batch)

    def log_prior(self, theta):
        return jnp.asarray(self.model.log_prior(self.unravel(theta)), theta.dtype)

    def item_stats(self, batch, center, whiten, dtype):
        """Per-item statistics S(y_i), shape (b, s): the user's, or the whitened scores at ``center``."""
        if self.user_stat is not None:
            s = jnp.asarray(self.user_stat(batch), dtype)
            b = jax.tree_util.tree_leaves(batch)[0].shape[0]
            if s.ndim == 1:
                s = s[:, None]
            if s.ndim != 2 or s.shape[0] != b:
                raise ModelError(f"Informed statistic(batch) must return shape (b,) or (b, s) for a batch "
                                 f"of b = {b} items; it returned shape {s.shape}")
            return s
        scores = jax.jacfwd(lambda t: self.loglik(t, batch))(center)  # (b, d)
        return scores.astype(dtype) @ whiten.T

    # --- full passes (set-up only) -------------------------------------------------------------------

    def full_pass(self, data, fn, zero):
        """Sum of ``fn(batch, mask)`` over the N items in chunks (one pass), starting from ``zero``."""
        N, chunk = self.N, self.chunk

        def body(acc, start):
            idx = start + jnp.arange(chunk, dtype=jnp.int32)
            mask = idx < N
            batch = take(data, jnp.minimum(idx, N - 1))
            return jax.tree_util.tree_map(jnp.add, acc, fn(batch, mask)), None

        out, _ = jax.lax.scan(body, zero, _chunk_starts(N, chunk))
        return out

    def grad_hess(self, theta, data):
        """Gradient and Hessian of the log posterior (one full pass)."""
        d = theta.shape[0]

        def fn(batch, mask):
            def tot(t):
                return jnp.sum(jnp.where(mask, self.loglik(t, batch), 0.0))

            return jax.grad(tot)(theta), jax.hessian(tot)(theta)

        g, h = self.full_pass(data, fn, (jnp.zeros(d, theta.dtype), jnp.zeros((d, d), theta.dtype)))
        return g + jax.grad(self.log_prior)(theta), h + jax.hessian(self.log_prior)(theta)

    def newton(self, theta, data):
        """Damped-free Newton from theta (eigenvalues of -H floored); returns (theta_hat, -H, passes)."""
        d = theta.shape[0]

        def cond(s):
            return (s[2] < self.newton_steps) & ~s[3]

        def body(s):
            th, _, it, _ = s
            g, h = self.grad_hess(th, data)
            _, cov = _inv_sqrt(-h)
            step = cov @ g
            dec = g @ step
            done = ~(dec >= 1e-8) | ~jnp.all(jnp.isfinite(step))
            th = jnp.where(done, th, th + step)
            return th, -h, it + 1, done

        th, prec, it, _ = jax.lax.while_loop(
            cond, body, (theta, jnp.eye(d, dtype=theta.dtype), jnp.int32(0), jnp.bool_(False)))
        return th, prec, it

    # --- init ----------------------------------------------------------------------------------------

    def _whitening(self, theta, data, cv):
        """``(center, whiten, chain_passes, shared_passes)`` of the statistic (zeros for a user statistic)."""
        dtype = theta.dtype
        d = theta.shape[0]
        chain_passes = jnp.int32(0)
        shared = 1  # the statistic's sum
        if self.user_stat is not None:
            return jnp.zeros(d, dtype), jnp.zeros((d, d), dtype), chain_passes, shared
        if self.fixed_center is not None:
            if self.fixed_center.shape[0] != d:
                raise ConfigError(f"Informed center has {self.fixed_center.shape[0]} coordinates; the "
                                  f"parameter has {d}")
            center = jnp.asarray(self.fixed_center, dtype)
            _, h = self.grad_hess(center, data)
            prec = -h
            shared += 1
        elif cv is not None:
            center = cv.center.astype(dtype)
            prec = -(cv.hess_sum.astype(dtype) + jax.hessian(self.log_prior)(center))
        else:
            center, prec, chain_passes = self.newton(theta, data)
        whiten, _ = _inv_sqrt(prec)
        return center, whiten, chain_passes, shared

    def _mean_stat(self, data, center, whiten, dtype):
        """Mean over all N items of S(y_i) (one full pass)."""
        s_sum = self.full_pass(data, lambda batch, mask: jnp.sum(
            jnp.where(mask[:, None], self.item_stats(batch, center, whiten, dtype), 0.0), axis=0),
            jnp.zeros(jax.eval_shape(lambda b: self.item_stats(b, center, whiten, dtype),
                                     take(data, jnp.arange(1))).shape[1:], dtype))
        return s_sum / self.N

    def _first_subset(self, theta):
        """The initial subset: m distinct items, drawn with a key hashed from ``theta``."""
        N, m = self.N, self.m
        if m > N // 2:
            return jax.random.choice(_hash_key(theta), N, (m,), replace=False).astype(jnp.int32)
        return _distinct_draw(_hash_key(theta), m, N)

    def init(self, theta, data=None, cv=None, cov_hint=None) -> KernelState:
        if data is None:
            raise ConfigError("Informed's kernel.init needs the data")
        dtype = theta.dtype
        lp = self.log_prior(theta)
        N = self.N
        pstate = self.proposal.init(theta, N, cov_hint) if cov_hint is not None else self.proposal.init(theta, N)
        center, whiten, chain_passes, shared = self._whitening(theta, data, cv)
        mean_stat = self._mean_stat(data, center, whiten, dtype)
        idx = self._first_subset(theta)
        batch = take(data, idx)
        stat = self.item_stats(batch, center, whiten, dtype) - mean_stat
        ll = self.loglik(theta, batch).astype(dtype)
        delta = -self.scale * jnp.sum(stat, axis=0)
        ex = ISSState(idx, stat, ll, mean_stat, center, whiten, jnp.sum(delta**2), jnp.int32(0), jnp.int32(0),
                      jnp.asarray(chain_passes, jnp.int32), jnp.int32(shared))
        return KernelState(theta, lp, jnp.zeros((), dtype), pstate, None, ex)

    # --- step ----------------------------------------------------------------------------------------

    def _swap_positions(self, key):
        """The k positions in the subset whose members are swapped out (distinct, uniform)."""
        k, m = self.k, self.m
        if k == 1:
            return jax.random.randint(key, (1,), 0, m, dtype=jnp.int32)
        if k == m:
            return jnp.arange(m, dtype=jnp.int32)
        if 2 * k > m:  # rejection would need many rounds: a permutation, O(n log n)
            return jax.random.permutation(key, m)[:k].astype(jnp.int32)
        return _distinct_draw(key, k, m)

    def _subset_move(self, k_pos, k_cand, k_u1, ex: ISSState, theta, data, dtype):
        """Swap k members for k non-members, accepted with prob. min(1, exp(eps (|Delta|^2 - |Delta'|^2))).

        Returns the subset's ``(idx, stat, ll, delta_sq)`` after the move and whether it was taken.
        """
        scale = self.scale
        pos = self._swap_positions(k_pos)
        cand = _distinct_draw(k_cand, self.k, self.N, ex.idx)
        batch_new = take(data, cand)
        stat_new = self.item_stats(batch_new, ex.center, ex.whiten, dtype) - ex.mean_stat
        ll_new = self.loglik(theta, batch_new).astype(dtype)
        sum_cur = jnp.sum(ex.stat, axis=0)
        dsq_cur = jnp.sum((scale * sum_cur) ** 2)
        sum_new = sum_cur - jnp.sum(ex.stat[pos], axis=0) + jnp.sum(stat_new, axis=0)
        dsq_new = jnp.sum((scale * sum_new) ** 2)
        log_b = self.eps * (dsq_cur - dsq_new) if self.eps > 0 else jnp.zeros((), dtype)
        u1 = jax.random.uniform(k_u1, (), dtype, minval=jnp.finfo(dtype).tiny, maxval=1.0)
        take_u = (jnp.log(u1) < log_b) & jnp.isfinite(dsq_new) & jnp.all(jnp.isfinite(stat_new))
        idx = jnp.where(take_u, ex.idx.at[pos].set(cand), ex.idx)
        stat = jnp.where(take_u, ex.stat.at[pos].set(stat_new), ex.stat)
        ll = jnp.where(take_u, ex.ll.at[pos].set(ll_new), ex.ll)
        dsq = jnp.where(take_u, dsq_new, dsq_cur)
        return idx, stat, ll, dsq, take_u

    def _theta_move(self, k_prop, k_u2, state: KernelState, idx, ll, data, dtype):
        """MH on pi_n(theta | Y_U) ∝ p(theta) p(Y_U | theta)^(N/n) for the subset ``idx``.

        Returns ``(theta, log_prior, ll, accepted, nonfinite)`` after the move.
        """
        theta_p, log_q = self.proposal.propose(k_prop, state.theta, state.proposal)
        lp_p = self.log_prior(theta_p)
        in_support = jnp.isfinite(lp_p) & jnp.isfinite(log_q) & jnp.isfinite(theta_p).all()

        def read():
            llp = self.loglik(theta_p, take(data, idx)).astype(dtype)
            return llp, jnp.sum(~jnp.isfinite(llp)).astype(jnp.int32), jnp.int32(self.m)

        def skip():
            return ll, jnp.int32(0), jnp.int32(0)

        # selected, not branched on: a lax.cond on this per-chain flag would, under vmap over chains,
        # broadcast the data to one copy per chain at every step (see tallmh.kernel). The m items are
        # read either way, and counted.
        ll_p, nonfinite, _ = jax.tree_util.tree_map(lambda a, b: jnp.where(in_support, a, b), read(), skip())
        log_a = (lp_p - state.log_prior + log_q
                 + self.scale * jnp.sum(jnp.where(jnp.isfinite(ll_p), ll_p - ll, 0.0)))
        u2 = jax.random.uniform(k_u2, (), dtype, minval=jnp.finfo(dtype).tiny, maxval=1.0)
        acc = in_support & (nonfinite == 0) & (jnp.log(u2) < log_a)
        theta = jnp.where(acc, theta_p, state.theta)
        lp = jnp.where(acc, lp_p, state.log_prior)
        ll = jnp.where(acc, ll_p, ll)
        return theta, lp, ll, acc, nonfinite

    def _adapt(self, pstate, theta, acc, step_index, adapt):
        """The proposal's state after this step (``adapt``: a Python bool or a traced flag)."""
        if isinstance(adapt, bool):
            return self.proposal.update(pstate, theta, acc, step_index) if adapt else pstate
        return jax.lax.cond(adapt, lambda: self.proposal.update(pstate, theta, acc, step_index), lambda: pstate)

    def step(self, key, state: KernelState, data, step_index, adapt, stats=None, audit=False):
        ex: ISSState = state.extra
        dtype = state.theta.dtype
        k_pos, k_cand, k_u1, k_prop, k_u2 = jax.random.split(key, 5)
        # 1. subset move: swap k members (positions pos) for k non-members (cand)
        idx, stat, ll, dsq, take_u = self._subset_move(k_pos, k_cand, k_u1, ex, state.theta, data, dtype)
        # 2. theta move on pi_n(theta | Y_U) ∝ p(theta) p(Y_U | theta)^(N/n)
        theta, lp, ll, acc, nonfinite = self._theta_move(k_prop, k_u2, state, idx, ll, data, dtype)
        pstate = self._adapt(state.proposal, theta, acc, step_index, adapt)
        ex = ex._replace(idx=idx, stat=stat, ll=ll, delta_sq=dsq,
                         subset_accepted=ex.subset_accepted + take_u.astype(jnp.int32), steps=ex.steps + 1)
        z = jnp.zeros((), jnp.int32)
        info = StepInfo(acc, jnp.int32(self.m) + jnp.int32(self.k), jnp.int32(1), nonfinite, jnp.zeros((), dtype),
                        jnp.bool_(False), jnp.bool_(False), z)
        return KernelState(theta, lp, state.log_lik, pstate, None, ex), info
