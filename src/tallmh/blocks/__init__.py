"""Inference programs: cycles of blocks over global parameters, local latents and hyperparameters.

The probabilistic-programs paper (Chen, Mansinghka & Ghahramani, "Sublinear-time approximate MCMC
transitions for probabilistic programs", Sec. 3-4, Fig. 7) runs subsampled MH on the *global* part of a
model's scaffold (a variable with N local sections that are conditionally independent given it) and
alternates it with ordinary kernels for the local latents: ``(cycle ((mh alpha all 1) (gibbs z one
step_z) (subsampled_mh w one Nbatch eps 'drift sigma 1)))``. This module is that ``cycle``::

    program = tm.Cycle([
        tm.blocks.MH("alpha", scale=0.5),                       # hyperparameter, exact MH
        tm.blocks.Gibbs("z", items_per_step=200),               # per-item assignments, O(items * K)
        tm.blocks.SubsampledMH("w", test=tm.acceptance.Austerity(epsilon=0.3, batch_size=100),
                               scale=0.1, group_by="z"),        # each cluster's weights, over its members
    ])
    result = tm.sample_program(program, model, data, num_samples=500, num_chains=2, seed=0)

Every block leaves the model's joint density invariant (for the subsampled block: up to the error of its
acceptance test), so the cycle does too (Tierney 1994, composition of kernels).

**The model** is a NumPyro model, ``model, data = tm.blocks.from_numpyro(numpyro_model, *args, state=("z",))``
(:mod:`tallmh.blocks.numpyro`: the blocks address its sample sites by name; per-item latents are kept in
the state by site name, item axis first), or a class written by hand to a small protocol (see
:mod:`tallmh.blocks.models` for the JointDPM, stochastic volatility and test models): the state is a dict of named sites ``values`` plus the
model's own ``aux`` pytree (e.g. per-cluster sufficient statistics, kept up to date in O(1) per move).
Which methods a model needs depends on the blocks used:

- :class:`SubsampledMH` on site ``s``: ``site_log_prior(s, value, values, aux)`` (the terms that are not
  per item, Jacobian included) and ``local_log_density(s, value, values, aux, data, idx) -> (b,)``, the
  per-item log densities of the items ``idx`` (the local sections ``l_i`` of the paper's eq. 5-6) with the
  site set to ``value`` (for a grouped site: the row of one group).
- :class:`MH` on site ``s``: ``log_conditional(s, value, values, aux, data)``, the log full conditional
  up to a constant (cheap for hyperparameters such as a CRP's alpha); otherwise prior + all N local terms.
- :class:`Gibbs` on a discrete per-item site ``z`` with K values: ``gibbs_remove(z, values, aux, data,
  i)``, ``gibbs_logits(z, values, aux, data, i) -> (K,)`` (with item i removed) and ``gibbs_add(z, values,
  aux, data, i, k)``, each O(K) or O(1); optionally ``gibbs_refresh(z, key, values, aux)`` (e.g. fresh
  prior draws for empty clusters, Neal 2000 Alg. 8).
- :class:`ParticleGibbs` on a path site ``h`` of shape (S, T): ``ssm_transition_sample(h, key, prev, t,
  values)``, ``ssm_transition_logpdf(h, x_t, prev, t, values)`` (t = 0 is the initial law; ``prev`` is
  then ignored) and ``ssm_obs_logpdf(h, x_t, t, values, data, series)``.

**Grouped sites and member lists.** ``SubsampledMH("w", group_by="z")`` updates each row ``w[k]`` with a
test whose population is cluster k's current members only (N_k items, the paper's Table 1). The members
are kept in the program state as per-cluster index lists with O(1) updates when an item moves
(:class:`Members`); the test reads ``members[k, pi(t)]`` for positions ``t < N_k`` of a keyed permutation
of ``range(N_k)``, so a step never costs O(N).

Run a program with :func:`sample_program` (jit + ``lax.scan`` over steps, ``lax.map`` over chains, data as
an argument). ``tm.Cycle`` and ``tm.sample_program`` are re-exported at the top level.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from ..data import make_permutation, num_items, permute, validate_data
from ..errors import ConfigError, ModelError

__all__ = [
    "Members", "ProgramState", "BlockInfo", "SubsampledMH", "MH", "Gibbs", "ParticleGibbs", "Repeat",
    "Cycle", "Runner", "ProgramResult", "sample_program", "build_members", "from_numpyro", "NumPyroProgramModel",
]


# ----------------------------------------------------------------------------------------------------
# State


class Members(NamedTuple):
    """Per-group member lists of a discrete per-item site z with K values.

    ``lists[k, :counts[k]]`` are the items with ``z_i = k`` (in no particular order); ``pos[i]`` is item
    i's slot in its list. Moving an item costs O(1): swap-remove from the old list, append to the new one.
    Memory is K x N int32 (each list has room for all N items).
    """

    lists: jax.Array  # (K, N) int32
    pos: jax.Array  # (N,) int32
    counts: jax.Array  # (K,) int32

    def move(self, i, old, new):
        # dynamic_slice / dynamic_update_slice (not gather / scatter): XLA updates these loop-carried
        # buffers in place, so a move costs O(1); a scatter here was copied whole, O(K N), on CPU
        def get(a, *ix):
            return jax.lax.dynamic_slice(a, ix, (1,) * len(ix)).reshape(())

        def put(a, v, *ix):
            return jax.lax.dynamic_update_slice(a, jnp.reshape(v, (1,) * len(ix)).astype(a.dtype), ix)

        i, old, new = (jnp.asarray(v, jnp.int32) for v in (i, old, new))
        p = get(self.pos, i)
        c_old = get(self.counts, old)
        last = get(self.lists, old, c_old - 1)
        lists = put(self.lists, last, old, p)
        pos = put(self.pos, p, last)
        counts = put(self.counts, c_old - 1, old)
        c_new = get(counts, new)
        lists = put(lists, i, new, c_new)
        pos = put(pos, c_new, i)
        counts = put(counts, c_new + 1, new)
        return Members(lists, pos, counts)


def build_members(z, k: int) -> Members:
    """Member lists of ``z`` (N,) with values in ``range(k)``: one O(N log N) sort, at set-up only."""
    z = jnp.asarray(z, jnp.int32)
    n = z.shape[0]
    order = jnp.argsort(z, stable=True).astype(jnp.int32)
    counts = jnp.bincount(z, length=k).astype(jnp.int32)
    starts = jnp.cumsum(counts) - counts
    zs = z[order]
    slot = jnp.arange(n, dtype=jnp.int32) - starts[zs]
    lists = jnp.zeros((k, n), jnp.int32).at[zs, slot].set(order)
    pos = jnp.zeros((n,), jnp.int32).at[order].set(slot)
    return Members(lists, pos, counts)


class ProgramState(NamedTuple):
    values: Dict[str, Any]
    aux: Any
    members: Dict[str, Members]
    blocks: tuple  # one state per block of the program


class BlockInfo(NamedTuple):
    """What one block did in one step: items of data read, proposals made and accepted."""

    n_data: jax.Array  # int32
    proposals: jax.Array  # int32
    accepted: jax.Array  # int32

    @staticmethod
    def zero():
        z = jnp.zeros((), jnp.int32)
        return BlockInfo(z, z, z)

    def __add__(self, other):
        return BlockInfo(self.n_data + other.n_data, self.proposals + other.proposals,
                         self.accepted + other.accepted)


def _require(model, names, block):
    missing = [m for m in names if not callable(getattr(model, m, None))]
    if missing:
        raise ModelError(f"{block} needs the model to define {', '.join(missing)}")


def _check_site(values, site, block):
    if site not in values:
        raise ConfigError(f"{block}: the model has no site {site!r} (sites: {', '.join(sorted(values))})")


# ----------------------------------------------------------------------------------------------------
# Blocks


def _random_walk_state(proposal, flat, n):
    return proposal.init(flat, n)


class _SiteProblem:
    """A global site's conditional problem as a model for the kernel: the prior terms of the site
    (``site_log_prior``) and its items' local log densities (``local_log_density``), the rest of the state
    held fixed. ``log_lik`` is given item indices (the kernel's reader maps positions to them)."""

    def __init__(self, model, site, full, values, aux, data):
        self.model, self.site, self.full, self.values, self.aux, self.data = model, site, full, values, aux, data

    def log_prior(self, value):
        return self.model.site_log_prior(self.site, self.full(value), self.values, self.aux)

    def log_lik(self, value, idx):
        return self.model.local_log_density(self.site, self.full(value), self.values, self.aux, self.data, idx)

    def log_lik_ratio(self, value, value_p, idx):  # (the difference of local densities, as the paper's l_i)
        return self.log_lik(value_p, idx) - self.log_lik(value, idx)


@dataclass(frozen=True)
class SubsampledMH:
    """MH on a global site, accepted by an acceptance test over its local sections (paper Alg. 2-3).

    ``test`` is any tallmh acceptance test (``Exact()``, ``Austerity(epsilon, batch_size)``,
    ``Confidence``, ``Barker``); it sees a :class:`~tallmh.acceptance.base.Problem` exactly as in
    :func:`tallmh.kernel.build_kernel`: ``log_base`` = prior ratio + proposal ratio, and
    ``lik_ratio(idx)`` = the local sections' log-density differences ``l_i`` (paper eq. 5-6). The proposal is
    a tallmh proposal (default ``RandomWalk(scale)``, the paper's Gaussian drift) on the flattened site.

    ``group_by="z"``: the site's leading axis indexes the values of the per-item site z, and row k is
    updated with population = cluster k's current members (N_k, Table 1 of the paper); ``groups="all"``
    updates every row in turn, ``"one"`` one occupied row drawn at random (the paper's ``subsampled_mh w
    one``). An empty group's row is updated against its prior alone (no data to read).
    """

    site: str
    test: Any = None
    scale: float = 0.1
    proposal: Any = None
    group_by: Optional[str] = None
    groups: str = "all"

    def __post_init__(self):
        if self.groups not in ("all", "one"):
            raise ConfigError(f"SubsampledMH groups must be 'all' or 'one', not {self.groups!r}")
        if self.test is None:
            from ..acceptance import Exact

            object.__setattr__(self, "test", Exact())
        if self.proposal is None:
            from ..proposals import RandomWalk

            object.__setattr__(self, "proposal", RandomWalk(self.scale))

    @property
    def label(self):
        return f"subsampled_mh({self.site}, {getattr(self.test, 'name', type(self.test).__name__)})"

    def validate(self, model, values, n):
        _check_site(values, self.site, self.label)
        _require(model, ["site_log_prior", "local_log_density"], self.label)
        if self.group_by is not None:
            _check_site(values, self.group_by, self.label)
            if getattr(self.test, "error", None) is not None and getattr(self.test, "epsilon", 0) is None:
                raise ConfigError(
                    f"{self.label}: a grouped site's population (a cluster's members) changes from step to step, "
                    "so Austerity's error= form (designed for a fixed N) does not apply; use Austerity(epsilon=...)")
        elif hasattr(self.test, "check"):
            self.test.check(n)

    def init(self, model, values, aux, data, n):
        v = values[self.site]
        row = v[0] if self.group_by is not None else v
        flat, _ = ravel_pytree(row)
        return _random_walk_state(self.proposal, flat, n)

    def _one(self, key, model, value, values, aux, data, n, idx_map, pstate, embed=None):
        """One MH step on the site's conditional problem, by the kernel's own step
        (:func:`tallmh.kernel.build_kernel`): the same support handling, test call and counting as a model's
        chain. The kernel reads items through ``idx_map`` (positions -> item indices)."""
        from ..kernel import KernelState, build_kernel

        flat, unravel = ravel_pytree(value)
        problem = _SiteProblem(model, self.site, embed if embed is not None else (lambda v: v), values, aux, data)
        kernel = build_kernel(problem, self.proposal, self.test, n, unravel, reader=lambda _, pos: idx_map(pos))
        lp = jnp.asarray(problem.log_prior(value), flat.dtype)
        state = KernelState(flat, lp, jnp.zeros((), flat.dtype), pstate)
        new, info = kernel.step(key, state, None, jnp.int32(0), False)
        return unravel(new.theta), BlockInfo(info.n_data, jnp.int32(1), info.accepted.astype(jnp.int32))

    def step(self, key, model, values, aux, members, bstate, data, n):
        v = values[self.site]
        if self.group_by is None:
            new, info = self._one(key, model, v, values, aux, data, n, lambda pos: pos, bstate)
            return {**values, self.site: new}, aux, members, bstate, info
        mem = members[self.group_by]
        k_groups = mem.counts.shape[0]

        def update_row(carry, kk):
            vals, info = carry
            k, key_k = kk
            row = vals[self.site][k]

            def idx_map(pos, k=k):
                return mem.lists[k, pos]

            embed = None
            if getattr(model, "wants_full_site", False):
                site_v = vals[self.site]

                def embed(r, k=k, site_v=site_v):
                    return site_v.at[k].set(r)

            new, inf = self._one(key_k, model, row, vals, aux, data, mem.counts[k], idx_map, bstate, embed)
            vals = {**vals, self.site: vals[self.site].at[k].set(new)}
            return (vals, info + inf), None

        if self.groups == "all":
            keys = jax.random.split(key, k_groups)
            (values, info), _ = jax.lax.scan(update_row, (values, BlockInfo.zero()),
                                             (jnp.arange(k_groups), keys))
        else:
            k_pick, k_step = jax.random.split(key)
            occupied = mem.counts > 0
            logits = jnp.where(occupied, 0.0, -jnp.inf)
            k = jax.random.categorical(k_pick, logits)
            (values, info), _ = update_row((values, BlockInfo.zero()), (k, k_step))
        return values, aux, members, bstate, info


@dataclass(frozen=True)
class MH:
    """Plain (exact) random-walk MH on one site, e.g. a hyperparameter (the paper's ``(mh alpha all 1)``).

    The target is the model's ``log_conditional(site, value, values, aux, data)`` when it has one (cheap,
    e.g. a CRP's alpha depends on the cluster counts only); otherwise ``site_log_prior`` plus all N local
    log densities (an O(N) step, counted in ``n_data``).
    """

    site: str
    scale: float = 0.1
    proposal: Any = None

    def __post_init__(self):
        if self.proposal is None:
            from ..proposals import RandomWalk

            object.__setattr__(self, "proposal", RandomWalk(self.scale))

    @property
    def label(self):
        return f"mh({self.site})"

    def validate(self, model, values, n):
        _check_site(values, self.site, self.label)
        if not callable(getattr(model, "log_conditional", None)):
            _require(model, ["site_log_prior", "local_log_density"], self.label)

    def init(self, model, values, aux, data, n):
        flat, _ = ravel_pytree(values[self.site])
        return _random_walk_state(self.proposal, flat, n)

    def _target(self, model, value, values, aux, data, n):
        own = getattr(model, "log_conditional", None)
        if callable(own):
            return own(self.site, value, values, aux, data), 0
        has_local = getattr(model, "has_local_sections", None)
        if callable(has_local) and not has_local(self.site):  # e.g. a DP's alpha: no item depends on it
            return model.site_log_prior(self.site, value, values, aux), 0
        idx = jnp.arange(n, dtype=jnp.int32)
        lp = model.site_log_prior(self.site, value, values, aux)
        return lp + jnp.sum(model.local_log_density(self.site, value, values, aux, data, idx)), n

    def step(self, key, model, values, aux, members, bstate, data, n):
        value = values[self.site]
        flat, unravel = ravel_pytree(value)
        k_prop, k_u = jax.random.split(key)
        flat_p, log_q = self.proposal.propose(k_prop, flat, bstate)
        value_p = unravel(flat_p)
        cur, cost = self._target(model, value, values, aux, data, n)
        new, _ = self._target(model, value_p, values, aux, data, n)
        log_a = new - cur + log_q
        acc = jnp.log(jax.random.uniform(k_u, (), flat.dtype)) < jnp.where(jnp.isnan(log_a), -jnp.inf, log_a)
        value = jax.tree_util.tree_map(lambda a, b: jnp.where(acc, a, b), value_p, value)
        info = BlockInfo(jnp.int32(2 * cost), jnp.int32(1), acc.astype(jnp.int32))
        return {**values, self.site: value}, aux, members, bstate, info


@dataclass(frozen=True)
class Gibbs:
    """Random-scan single-site Gibbs on a discrete per-item site z (the paper's ``(gibbs z one step_z)``).

    Each step updates ``items_per_step`` items drawn uniformly with replacement (default: N). For each item
    i: the model removes i from its group's statistics, returns the K log conditional weights
    ``log p(z_i = k | rest)``, the block draws k, the model adds i to group k, and the member lists move i
    in O(1). The cost is O(items_per_step * K) (plus the model's O(K) refresh), never a full-data pass.
    """

    site: str
    items_per_step: Optional[int] = None

    @property
    def label(self):
        return f"gibbs({self.site})"

    def validate(self, model, values, n):
        _check_site(values, self.site, self.label)
        if callable(getattr(model, "gibbs_logits_batch", None)):
            model.gibbs_check(self.site)
        else:
            _require(model, ["gibbs_remove", "gibbs_logits", "gibbs_add"], self.label)
        if self.items_per_step is not None and int(self.items_per_step) < 1:
            raise ConfigError(f"Gibbs items_per_step must be at least 1; got {self.items_per_step}")

    def init(self, model, values, aux, data, n):
        return ()

    def step(self, key, model, values, aux, members, bstate, data, n):
        m = int(self.items_per_step or n)
        site = self.site
        mem0 = members.get(site)
        refresh = getattr(model, "gibbs_refresh", None)
        k_items, k_loop = jax.random.split(key)
        items = jax.random.randint(k_items, (m,), 0, n, dtype=jnp.int32)
        if callable(getattr(model, "gibbs_logits_batch", None)):
            return self._step_batched(k_loop, model, values, aux, members, bstate, data, items)

        def body(j, c):
            vals, ax, mem = c
            kr, kd = jax.random.split(jax.random.fold_in(k_loop, j))
            i = items[j]
            if callable(refresh):
                vals, ax = refresh(site, kr, vals, ax)
            old = vals[site][i]
            vals, ax = model.gibbs_remove(site, vals, ax, data, i)
            logits = model.gibbs_logits(site, vals, ax, data, i)
            k = jax.random.categorical(kd, logits).astype(jnp.int32)
            vals, ax = model.gibbs_add(site, vals, ax, data, i, k)
            vals = {**vals, site: vals[site].at[i].set(k)}
            if mem is not None:
                mem = mem.move(i, old, k)
            return vals, ax, mem

        values, aux, mem = jax.lax.fori_loop(0, m, body, (values, aux, mem0))
        if mem0 is not None:
            members = {**members, site: mem}
        return values, aux, members, bstate, BlockInfo(jnp.int32(m), jnp.int32(m), jnp.int32(m))


    def _step_batched(self, key, model, values, aux, members, bstate, data, items):
        """Models whose per-item latents are conditionally independent given the globals (NumPyro models,
        :mod:`tallmh.blocks.numpyro`): the m items' K log weights in one batched evaluation (O(m K)), then
        the m draws applied in order (a repeated item is drawn twice from the same full conditional; the
        later draw stands, which is again a draw from it)."""
        site = self.site
        m = items.shape[0]
        logits = model.gibbs_logits_batch(site, values, data, items)  # (m, K)
        ks = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
        newv = model.gibbs_value(site, ks).astype(values[site].dtype)
        mem0 = members.get(site)

        def body(j, c):
            z, mem = c
            i = items[j]
            old = z[i]
            z = jax.lax.dynamic_update_slice(z, newv[j][None], (i,))
            if mem is not None:
                mem = mem.move(i, old.astype(jnp.int32), ks[j])
            return z, mem

        z, mem = jax.lax.fori_loop(0, m, body, (values[site], mem0))
        values = {**values, site: z}
        if mem0 is not None:
            members = {**members, site: mem}
        return values, aux, members, bstate, BlockInfo(jnp.int32(m), jnp.int32(m), jnp.int32(m))


@dataclass(frozen=True)
class ParticleGibbs:
    """Conditional SMC (particle Gibbs, Andrieu, Doucet & Holenstein 2010) on windows of a latent path.

    The site is a path ``h`` of shape (S, T): S independent series (the plate) of T steps. Each step picks
    a window ``[a, a + window)`` (a uniform, the same for all series) and ``series_per_step`` distinct series
    (default all; drawn by a keyed permutation, O(series_per_step)), and runs a bootstrap conditional SMC
    with ``particles`` particles on each chosen series' window, the current path as the reference
    particle. The window's law is conditioned on ``h[a-1]`` (through the transition) and on ``h[a+window]``
    (its transition density enters the last weight), as in the paper's ``(pgibbs h (ordered_range h
    h+L) P 1)``. Multinomial resampling; the reference keeps ancestor 0.
    """

    site: str
    particles: int = 20
    window: Optional[int] = None
    series_per_step: Optional[int] = None
    _ignore_future: bool = False  # a deliberately wrong variant, for the tests' negative control

    @property
    def label(self):
        return f"pgibbs({self.site})"

    def validate(self, model, values, n):
        _check_site(values, self.site, self.label)
        if callable(getattr(model, "pg_weights", None)):
            model.pg_check(self.site)
        else:
            _require(model, ["ssm_transition_sample", "ssm_transition_logpdf", "ssm_obs_logpdf"], self.label)
        h = values[self.site]
        if h.ndim != 2:
            raise ConfigError(f"{self.label}: the path must have shape (series, time); got {h.shape}")
        if int(self.particles) < 2:
            raise ConfigError(f"ParticleGibbs needs at least 2 particles; got {self.particles}")
        t = h.shape[1]
        if self.window is not None and not (1 <= int(self.window) <= t):
            raise ConfigError(f"ParticleGibbs window must be in 1..{t}; got {self.window}")
        if self.series_per_step is not None and not (1 <= int(self.series_per_step) <= h.shape[0]):
            raise ConfigError(f"ParticleGibbs series_per_step must be in 1..{h.shape[0]}")

    def init(self, model, values, aux, data, n):
        return ()

    def _window(self, key, h_all):
        s_all, t_len = h_all.shape
        win = int(self.window or t_len)
        m = int(self.series_per_step or s_all)
        k_a, k_s, k_run = jax.random.split(key, 3)
        a = jax.random.randint(k_a, (), 0, t_len - win + 1)
        if m < s_all:
            series = permute(make_permutation(k_s), jnp.arange(m, dtype=jnp.int32), s_all)
        else:
            series = jnp.arange(s_all, dtype=jnp.int32)
        return win, m, a, series, k_run

    def _step_paths(self, key, model, values, aux, members, bstate, data, n):
        """Conditional SMC carrying whole paths (models with ``pg_weights``/``pg_propose``, e.g. NumPyro
        models: :mod:`tallmh.blocks.numpyro`). Particles are full paths (m, P, T) that differ from the current
        path only inside the window; proposals come from the latent's own per-time law (so its density
        cancels in the weights; a Gaussian path whose steps are dependent, such as a ``GaussianRandomWalk``,
        runs on its innovations through the model's ``pg_innovations``/``pg_path``, and ``pg_check`` refuses
        other dependent paths), the weight at window step j is the other sites' log density at time a + j,
        and at the last window step every later time and the per-item terms are added (their dependence on
        the window). Resampling is multinomial; particle 0 is the reference and keeps ancestor 0."""
        site = self.site
        h_all = values[site]
        t_len = h_all.shape[1]
        p = int(self.particles)
        win, m, a, series, k_run = self._window(key, h_all)
        to_z = getattr(model, "pg_innovations", None)  # a Gaussian path runs on its innovations
        ref = h_all[series] if to_z is None else to_z(site, values, data, series, h_all[series])  # (m, T)
        k_prop, k_res, k_pick = jax.random.split(k_run, 3)
        paths0 = jnp.broadcast_to(ref[:, None, :], (m, p, t_len))
        draws = model.pg_propose(site, k_prop, values, data, series, paths0)  # (m, P, T)
        tt = jnp.arange(t_len)

        def weights(paths, j):
            t = a + j
            lt, li = model.pg_weights(site, values, data, series, paths)
            now = jax.lax.dynamic_index_in_dim(lt, t, axis=2, keepdims=False)
            rest = jnp.sum(jnp.where(tt >= t, lt, 0.0), axis=2) + li
            if self._ignore_future:  # negative control: the later times' dependence on the window dropped
                rest = now + li
            return jnp.where(j == win - 1, rest, now)

        def body(c, j):
            paths, lw = c
            t = a + j
            anc = jax.random.categorical(jax.random.fold_in(k_res, j), lw[:, None, :], axis=-1, shape=(m, p - 1))
            anc = jnp.concatenate([jnp.zeros((m, 1), jnp.int32), anc.astype(jnp.int32)], axis=1)
            anc = jnp.where(j == 0, jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (m, p)), anc)
            paths = jnp.take_along_axis(paths, anc[:, :, None], axis=1)
            col = jax.lax.dynamic_index_in_dim(draws, t, axis=2, keepdims=False)  # (m, P)
            col = col.at[:, 0].set(jax.lax.dynamic_index_in_dim(ref, t, axis=1, keepdims=False))
            paths = jax.lax.dynamic_update_index_in_dim(paths, col[:, :, None].astype(paths.dtype), t, axis=2)
            return (paths, weights(paths, j)), None

        lw0 = jnp.zeros((m, p), h_all.dtype)
        (paths, lw), _ = jax.lax.scan(body, (paths0, lw0), jnp.arange(win))
        b = jax.random.categorical(k_pick, lw, axis=-1).astype(jnp.int32)  # (m,)
        new = jnp.take_along_axis(paths, b[:, None, None], axis=1)[:, 0]
        if to_z is not None:
            new = model.pg_path(site, values, data, series, new)
        h_all = h_all.at[series].set(new.astype(h_all.dtype))
        info = BlockInfo(jnp.int32(m * win), jnp.int32(m), jnp.sum(b != 0).astype(jnp.int32))
        return {**values, site: h_all}, aux, members, bstate, info

    def step(self, key, model, values, aux, members, bstate, data, n):
        if callable(getattr(model, "pg_weights", None)):
            return self._step_paths(key, model, values, aux, members, bstate, data, n)
        site = self.site
        h_all = values[site]
        s_all, t_len = h_all.shape
        p = int(self.particles)
        win, m, a, series, k_run = self._window(key, h_all)
        h = h_all[series]  # (m, T)
        dtype = h.dtype

        def trans_sample(kk, prev, t):
            return model.ssm_transition_sample(site, kk, prev, t, values)

        def obs(x, t):
            return model.ssm_obs_logpdf(site, x, t, values, data, series)

        ref = jax.lax.dynamic_slice_in_dim(h, a, win, axis=1)  # (m, win)
        prev0 = jax.lax.dynamic_index_in_dim(h, jnp.maximum(a - 1, 0), axis=1, keepdims=False)
        prev0 = jnp.broadcast_to(prev0[:, None], (m, p))
        has_next = a + win < t_len
        h_next = jax.lax.dynamic_index_in_dim(h, jnp.minimum(a + win, t_len - 1), axis=1, keepdims=False)

        def future(x, t):
            if self._ignore_future:
                return jnp.zeros_like(x)
            lf = model.ssm_transition_logpdf(site, jnp.broadcast_to(h_next[:, None], x.shape), x, t + 1, values)
            return jnp.where(has_next, lf, 0.0)

        def weight(x, j):
            t = a + j
            lw = obs(x, t)
            return jnp.where(j == win - 1, lw + future(x, t), lw)

        keys = jax.random.split(k_run, win + 1)
        x0 = trans_sample(keys[0], prev0, a)
        x0 = x0.at[:, 0].set(ref[:, 0])
        lw0 = weight(x0, 0)

        def scan_body(c, j):
            x_prev, lw = c
            kr, kt = jax.random.split(keys[j])
            anc = jax.random.categorical(kr, lw[:, None, :], axis=-1, shape=(m, p - 1)) if p > 1 else None
            anc = jnp.concatenate([jnp.zeros((m, 1), jnp.int32), anc.astype(jnp.int32)], axis=1)
            xp = jnp.take_along_axis(x_prev, anc, axis=1)
            x = trans_sample(kt, xp, a + j)
            x = x.at[:, 0].set(jax.lax.dynamic_index_in_dim(ref, j, axis=1, keepdims=False))
            lw_new = weight(x, j)
            return (x, lw_new), (x, anc)

        if win > 1:
            (x_last, lw_last), (xs, ancs) = jax.lax.scan(scan_body, (x0, lw0), jnp.arange(1, win))
            xs = jnp.concatenate([x0[None], xs], axis=0)  # (win, m, p)
        else:
            x_last, lw_last = x0, lw0
            xs = x0[None]
            ancs = jnp.zeros((0, m, p), jnp.int32)
        b = jax.random.categorical(keys[win], lw_last, axis=-1).astype(jnp.int32)  # (m,)

        def back(bcur, j):  # j = win-1 .. 1
            anc_j = ancs[j - 1]  # ancestors of step j's particles at step j-1
            val = jnp.take_along_axis(xs[j], bcur[:, None], axis=1)[:, 0]
            return jnp.take_along_axis(anc_j, bcur[:, None], axis=1)[:, 0], val

        if win > 1:
            b0, vals_rev = jax.lax.scan(back, b, jnp.arange(win - 1, 0, -1))
            first = jnp.take_along_axis(xs[0], b0[:, None], axis=1)[:, 0]
            path = jnp.concatenate([first[None], vals_rev[::-1]], axis=0).T  # (m, win)
        else:
            path = jnp.take_along_axis(xs[0], b[:, None], axis=1)
        h = jax.lax.dynamic_update_slice_in_dim(h, path.astype(dtype), a, axis=1)
        h_all = h_all.at[series].set(h)
        info = BlockInfo(jnp.int32(m * win), jnp.int32(m), jnp.sum(b != 0).astype(jnp.int32))
        return {**values, site: h_all}, aux, members, bstate, info


@dataclass(frozen=True)
class Repeat:
    """Run ``block`` ``times`` times per step (the paper gives the latent states 10x the time in Sec. 4.3)."""

    block: Any
    times: int = 1

    @property
    def label(self):
        return f"{self.block.label} x{self.times}"

    def validate(self, model, values, n):
        if int(self.times) < 1:
            raise ConfigError(f"Repeat times must be at least 1; got {self.times}")
        self.block.validate(model, values, n)

    def init(self, model, values, aux, data, n):
        return self.block.init(model, values, aux, data, n)

    def step(self, key, model, values, aux, members, bstate, data, n):
        def body(j, c):
            vals, ax, mem, bs, info = c
            vals, ax, mem, bs, inf = self.block.step(jax.random.fold_in(key, j), model, vals, ax, mem, bs, data, n)
            return vals, ax, mem, bs, info + inf

        return jax.lax.fori_loop(0, int(self.times), body, (values, aux, members, bstate, BlockInfo.zero()))


@dataclass(frozen=True)
class Cycle:
    """An inference program: its blocks run in order, once each per step (the paper's ``cycle``)."""

    blocks: Sequence[Any]

    def __post_init__(self):
        object.__setattr__(self, "blocks", tuple(self.blocks))
        if not self.blocks:
            raise ConfigError("Cycle needs at least one block")
        for b in self.blocks:
            if not callable(getattr(b, "step", None)):
                raise ConfigError(f"Cycle: {b!r} is not a block (it has no step method)")

    name = "program"

    @property
    def labels(self):
        return [b.label for b in self.blocks]

    @property
    def label(self):
        return "cycle(" + ", ".join(self.labels) + ")"

    def grouped_sites(self):
        """{per-item site: grouped site} for every SubsampledMH with group_by (they need member lists)."""
        out = {}
        for b in self.blocks:
            inner = b.block if isinstance(b, Repeat) else b
            if isinstance(inner, SubsampledMH) and inner.group_by is not None:
                out[inner.group_by] = inner.site
        return out

    def validate(self, model, values, n):
        for b in self.blocks:
            b.validate(model, values, n)

    def init(self, model, values, aux, data, n) -> ProgramState:
        members = {}
        for zsite, gsite in self.grouped_sites().items():
            members[zsite] = build_members(values[zsite], values[gsite].shape[0])
        bstates = tuple(b.init(model, values, aux, data, n) for b in self.blocks)
        return ProgramState(values, aux, members, bstates)

    def step(self, key, model, state: ProgramState, data, n):
        values, aux, members = state.values, state.aux, state.members
        keys = jax.random.split(key, len(self.blocks))
        new_b, infos = [], []
        for b, kb, bs in zip(self.blocks, keys, state.blocks):
            values, aux, members, bs, info = b.step(kb, model, values, aux, members, bs, data, n)
            new_b.append(bs)
            infos.append(info)
        return ProgramState(values, aux, members, tuple(new_b)), tuple(infos)


# ----------------------------------------------------------------------------------------------------
# Runner


class Runner:
    """Compiled runs of ``program`` on ``model``: ``init`` once, then ``run`` chunks of steps.

    ``run(states, data, num_steps, key, thin)`` is ``jit`` of a ``lax.scan`` over steps, mapped over
    chains with ``lax.map`` (see the comment in ``run``), with the data an argument (never a constant); the compiled function is cached per
    (num_steps, thin), so chunks of equal size reuse it. It returns the final states, the records
    (``model.record(values, aux)`` every ``thin`` steps, or all sites) and per-block :class:`BlockInfo`
    sums per recorded draw.
    """

    def __init__(self, program: Cycle, model):
        if not isinstance(program, Cycle):
            program = Cycle(list(program) if isinstance(program, (list, tuple)) else [program])
        self.program = program
        self.model = model
        self._compiled = {}

    def _record(self, state):
        rec = getattr(self.model, "record", None)
        if callable(rec):
            return rec(state.values, state.aux)
        return state.values

    def init(self, data, num_chains: int = 1, seed: int = 0, init=None):
        data = validate_data(data)
        n = num_items(data)
        self.n = n
        key = jax.random.PRNGKey(seed)
        keys = jax.random.split(key, num_chains)
        if init is None:
            if not callable(getattr(self.model, "init", None)):
                raise ModelError("the model needs init(key, data) -> (values, aux), or pass init=(values, aux)")
            values0, _ = self.model.init(keys[0], data)
        else:
            values0 = init[0]
        self.program.validate(self.model, values0, n)

        def one(k):
            vals, aux = self.model.init(k, data) if init is None else init
            return self.program.init(self.model, vals, aux, data, n)

        return jax.jit(jax.vmap(one))(keys), data

    def run(self, states, data, num_steps: int, key, thin: int = 1):
        num_steps, thin = int(num_steps), int(thin)
        if num_steps % thin:
            raise ConfigError(f"num_steps ({num_steps}) must be a multiple of thin ({thin})")
        fn = self._compiled.get((num_steps, thin))
        if fn is None:
            program, model, n = self.program, self.model, self.n

            def chain(key, state, data):
                def inner(st, k):
                    st, info = program.step(k, model, st, data, n)
                    return st, info

                def outer(st, k):
                    st, infos = jax.lax.scan(inner, st, jax.random.split(k, thin))
                    infos = jax.tree_util.tree_map(lambda x: jnp.sum(x, axis=0), infos)
                    return st, (self._record(st), infos)

                return jax.lax.scan(outer, state, jax.random.split(key, num_steps // thin))

            # chains run one after another (lax.map), not vmap-ed: under vmap the member lists' O(1)
            # dynamic updates become batched scatters that XLA copies whole (O(K N) per move on CPU), and
            # every lane would wait for the slowest lane's sequential-test loop
            def chains(keys, states, data):
                return jax.lax.map(lambda ks: chain(ks[0], ks[1], data), (keys, states))

            fn = jax.jit(chains)
            self._compiled[(num_steps, thin)] = fn
        num_chains = jax.tree_util.tree_leaves(states)[0].shape[0]
        keys = jax.random.split(key, num_chains)
        states, (records, infos) = fn(keys, states, data)
        return states, records, infos


@dataclass
class ProgramResult:
    """Draws of an inference program: ``samples[name]`` shaped (chain, draw, ...), per-block stats."""

    samples: Dict[str, np.ndarray]
    stats: Dict[str, Dict[str, np.ndarray]]  # block label -> {"n_data", "proposals", "accepted"} (chain, draw)
    labels: List[str]
    timings: Dict[str, float]
    final_state: Any = None
    n: int = 0
    run: Any = None  # the tallmh.Result of the run

    def to_arviz(self):
        from ..diagnostics import idata_from_dict

        st = {}
        for lab, d in self.stats.items():
            key = lab.replace("(", "_").replace(")", "").replace(", ", "_").replace(" ", "")
            st[f"{key}__n_data"] = d["n_data"]
            st[f"{key}__acceptance_rate"] = d["accepted"] / np.maximum(d["proposals"], 1)
        return idata_from_dict({"posterior": dict(self.samples), "sample_stats": st})

    def summary(self):
        import arviz as az

        return az.summary(self.to_arviz(), kind="all")

    def items_per_step(self):
        """Mean data items read per step, by block."""
        thin = self.timings.get("thin", 1)
        return {lab: float(np.mean(d["n_data"]) / thin) for lab, d in self.stats.items()}


def sample_program(program, model, data, num_samples: int = 1000, num_warmup: int = 0, num_chains: int = 1,
                   seed: int = 0, thin: int = 1, init=None, **kwargs) -> ProgramResult:
    """Run an inference program; a thin alias of ``tm.sample(model, data, program=program, ...)``.

    It returns the older :class:`ProgramResult` view (``samples`` by site, ``stats`` by block label): the
    run itself is :func:`tallmh.sample`'s (chunks, progress, Ctrl-C, checkpoints, verdict), and
    ``result.run`` is its :class:`tallmh.Result`. ``thin`` > 1 keeps every ``thin``-th draw (the stats are
    summed over the steps between kept draws). Other keyword arguments go to :func:`tallmh.sample`.
    """
    from ..sampling import sample
    from .kernel import block_stats

    thin = int(thin)
    if thin < 1:
        raise ConfigError(f"thin must be at least 1; got {thin}")
    if int(num_samples) < 1 or int(num_chains) < 1 or int(num_warmup) < 0:
        raise ConfigError("num_samples and num_chains must be at least 1, num_warmup at least 0")
    kwargs.setdefault("progress", False)
    run = sample(model, data, program=program, num_samples=int(num_samples) * thin, num_warmup=int(num_warmup),
                 num_chains=int(num_chains), seed=seed, init=init, **kwargs)
    prog = run.test
    stats = {lab: {k: _thin_sum(v, thin) for k, v in d.items()}
             for lab, d in block_stats(run.stats, prog.labels).items()}
    samples = {k: np.asarray(v)[:, thin - 1::thin] for k, v in run.samples.items()}
    t = run.timings
    timings = {"init": t.get("setup_s", 0.0) + t.get("compile_s", 0.0), "warmup": t.get("warmup_s", 0.0),
               "sampling": t.get("sampling_s", 0.0), "total": t.get("total_s", 0.0), "thin": thin}
    final = run.final_state.program if run.final_state is not None else None
    out = ProgramResult(samples, stats, prog.labels, timings, final, run.n)
    out.run = run
    return out


def _thin_sum(a, thin):
    a = np.asarray(a)
    if thin == 1:
        return a
    k = a.shape[1] // thin
    return a[:, :k * thin].reshape(a.shape[0], k, thin, *a.shape[2:]).sum(axis=2)


from . import models  # noqa: E402  (the built-in models use the blocks' protocol)
from .numpyro import NumPyroProgramModel, from_numpyro  # noqa: E402,F401
