"""Subsampled MH on a global site (the probabilistic-programs paper, Alg. 2-3), by the kernel's own step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from ..errors import ConfigError
from .state import BlockInfo, check_site, require


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
        check_site(values, self.site, self.label)
        require(model, ["site_log_prior", "local_log_density"], self.label)
        if self.group_by is not None:
            check_site(values, self.group_by, self.label)
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
        return self.proposal.init(flat, n)

    audits = True  # its decisions can be audited against the exact test (``step(..., audit=True)``)

    def _one(self, key, model, value, values, aux, data, n, idx_map, pstate, embed=None, audit=False):
        """One MH step on the site's conditional problem, by the kernel's own step
        (:func:`tallmh.kernel.build_kernel`): the same support handling, test call and counting as a model's
        chain. The kernel reads items through ``idx_map`` (positions -> item indices)."""
        from ..kernel import KernelState, build_kernel

        flat, unravel = ravel_pytree(value)
        problem = _SiteProblem(model, self.site, embed if embed is not None else (lambda v: v), values, aux, data)
        kernel = build_kernel(problem, self.proposal, self.test, n, unravel, reader=lambda _, pos: idx_map(pos))
        lp = jnp.asarray(problem.log_prior(value), flat.dtype)
        state = KernelState(flat, lp, jnp.zeros((), flat.dtype), pstate)
        new, info = kernel.step(key, state, None, jnp.int32(0), False, None, audit)
        wrong = info.audited & (info.accepted != info.audit_exact)
        return unravel(new.theta), BlockInfo(info.n_data, jnp.int32(1), info.accepted.astype(jnp.int32),
                                             info.audited.astype(jnp.int32), wrong.astype(jnp.int32),
                                             info.audit_items)

    def step(self, key, model, values, aux, members, bstate, data, n, audit=False):
        v = values[self.site]
        if self.group_by is None:
            new, info = self._one(key, model, v, values, aux, data, n, lambda pos: pos, bstate, audit=audit)
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

            new, inf = self._one(key_k, model, row, vals, aux, data, mem.counts[k], idx_map, bstate, embed, audit)
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
