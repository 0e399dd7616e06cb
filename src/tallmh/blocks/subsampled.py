"""Subsampled MH on a global site (the probabilistic-programs paper, Alg. 2-3), by the kernel's own step,
optionally with Taylor control variates kept current per group (:class:`SiteCV`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from ..storage.data import take
from ..errors import ConfigError
from .state import BlockInfo, check_site, require

_CHUNK = 2048  # items per chunk of a full pass over the population (bounds its memory, not its cost)


class SiteCV(NamedTuple):
    """Control-variate state of a :class:`SubsampledMH` block: one Taylor centre per row of the site (per group;
    one row for an ungrouped site) and, per row, the sums over the row's current population of the items'
    local-density gradients and Hessians at that centre."""

    center: jax.Array  # (R, d) flat centres
    grad_sum: jax.Array  # (R, d)
    hess_sum: jax.Array  # (R, d, d) (zeros for order 1)
    seen: jax.Array  # () int32: the member journal's move count these sums include
    pending: jax.Array  # () int32: items read at set-up, reported with the first step


def _inputs_read(fn, args) -> list:
    """For each leaf of ``args``: whether ``fn(args)``'s output depends on it (a forward taint pass over the
    jaxpr; conservative: an equation's outputs depend on all its inputs, nested jaxprs included)."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    closed = jax.make_jaxpr(lambda *ls: fn(jax.tree_util.tree_unflatten(tree, ls)))(*leaves)
    jaxpr = closed.jaxpr
    src = {v: {i} for i, v in enumerate(jaxpr.invars)}
    for eqn in jaxpr.eqns:
        got = set()
        for v in eqn.invars:
            if type(v).__name__ != "Literal":
                got |= src.get(v, set())
        for v in eqn.outvars:
            src[v] = got
    out = set()
    for v in jaxpr.outvars:
        if type(v).__name__ != "Literal":
            out |= src.get(v, set())
    return [i in out for i in range(len(leaves))], tree


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


def _check_cv(self, model, values, aux, data, n, program):  # (SubsampledMH's, out of the class)
    """One-line refusals of what the control variates cannot keep exact (see the class docstring)."""
    lab = self.label
    v = values[self.site]
    if not all(jnp.issubdtype(a.dtype, jnp.floating) for a in jax.tree_util.tree_leaves(v)):
        raise ConfigError(f"{lab}: control variates need a real-valued site; {self.site!r} is "
                          f"{getattr(v, 'dtype', type(v).__name__)}")
    has_local = getattr(model, "has_local_sections", None)
    if callable(has_local) and not has_local(self.site):
        raise ConfigError(f"{lab}: no item's density depends on {self.site!r}; control variates have nothing "
                          "to expand (use MH)")
    m = int(min(n, 2))
    probe_idx = jnp.arange(m, dtype=jnp.int32)
    rows = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((m,) + tuple(a.shape[1:]), a.dtype), data)
    others = {k: jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype) for k, x in values.items()
              if k != self.site}
    aux_s = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x), jnp.asarray(x).dtype), aux)
    site_s = jax.ShapeDtypeStruct(jnp.shape(v), v.dtype)
    row_v = v[0] if self.group_by is not None else v
    full = bool(getattr(model, "wants_full_site", False)) and self.group_by is not None

    def dens(args):
        o, a, rw, sv = args
        val = sv if (full or self.group_by is None) else sv[0]
        return model.local_log_density(self.site, val, {**o, self.site: sv}, a, rw, probe_idx)

    try:
        out = jax.eval_shape(dens, (others, aux_s, rows, site_s))
    except Exception as e:  # noqa: BLE001 - re-raised as a one-line refusal
        raise ConfigError(f"{lab}: the local density cannot be evaluated on a sub-batch: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    if tuple(out.shape) != (m,):
        raise ConfigError(f"{lab}: control variates need one local density per item; local_log_density gave "
                          f"shape {tuple(out.shape)} for {m} items")
    order = self.control_variates.order

    def terms(args):  # what the sums are made of: the items' gradients (and Hessians) in the site
        o, a, rw, sv = args

        def total(x):
            return jnp.sum(dens((o, a, rw, x)))

        g = jax.grad(total)(sv)
        return (g, jax.jacfwd(jax.grad(total))(sv)) if order == 2 else g

    try:
        read, tree = _inputs_read(terms, (others, aux_s, rows, site_s))
    except Exception as e:  # noqa: BLE001 - re-raised as a one-line refusal
        raise ConfigError(f"{lab}: control variates need a local density JAX can differentiate "
                          f"{'twice' if order == 2 else 'once'} in {self.site!r}: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
    read = jax.tree_util.tree_unflatten(tree, read)
    updated = program.updated_sites(exclude=self) if program is not None else set()
    stale = sorted(k for k in others if k != self.group_by and k in updated
                   and any(jax.tree_util.tree_leaves(read[0][k])))
    if stale:
        raise ConfigError(f"{lab}: control variates need the items' gradients in {self.site!r} to read no site "
                          f"another block updates, but they read {', '.join(map(repr, stale))}: their sums "
                          "would go stale at every step")
    from .mh import MH

    aux_movers = [b for b in (program.blocks if program is not None else ())
                  if not isinstance(getattr(b, "block", b), (SubsampledMH, MH))]  # (these leave aux as it is)
    if aux_movers and any(jax.tree_util.tree_leaves(read[1])):
        raise ConfigError(f"{lab}: control variates need the items' gradients not to read the model's aux, "
                          f"which {aux_movers[0].label} may change: their sums would go stale")
    flat = ravel_pytree(row_v)[0]
    f = self._item_fn(model, values, aux)
    row1 = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct((1,) + tuple(a.shape[1:]), a.dtype), data)
    lab0 = jnp.zeros((), jnp.int32)
    try:
        if self.control_variates.order == 2:
            jax.eval_shape(lambda r, rw: jax.jacfwd(jax.grad(f))(r, lab0, rw), flat, row1)
        else:
            jax.eval_shape(lambda r, rw: jax.grad(f)(r, lab0, rw), flat, row1)
    except Exception as e:  # noqa: BLE001 - re-raised as a one-line refusal
        raise ConfigError(f"{lab}: control variates need a local density JAX can differentiate "
                          f"{'twice' if self.control_variates.order == 2 else 'once'} in {self.site!r}: "
                          f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e


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

    **Control variates** (``control_variates=tm.ControlVariates(order=2)``; Bardenet, Doucet & Holmes, JMLR
    2017, Sec. 7, as :mod:`tallmh.control_variates`): each item's local density ``ell_i`` is replaced in the
    test by its remainder after the Taylor expansion at its row's centre ``c_k``, and the exact sum of the
    expansions over the row's population moves into ``log_base`` -- the kernel's own control variates, given
    the row's :class:`~tallmh.control_variates.CVState` ``(c_k, G_k, H_k)`` with ``G_k = sum_{i: z_i = k}
    grad ell_i(c_k)`` and ``H_k`` the Hessians' sum. Decisions target the same conditional as without them
    (a test that reads the whole population decides exactly as exact MH, up to float error); only the
    variance of the per-item terms changes. The sums are kept equal to the current population's:

    - *moves*: every member-list move of the group site (a Gibbs block on z) is written to a journal in the
      program state (:class:`~tallmh.blocks.state.Journal`); at its next step the block reads the moves made
      since (O(moves) items: one read per move, its gradient and Hessian at the old and the new group's
      centres) and moves those terms between the two rows' sums. Cost per step: the moves of one cycle
      (``items_per_step`` of the Gibbs blocks on z), never N. A fixed assignment costs nothing.
    - *full passes* (O(N) each, every item read once, its group's centre used): at set-up (reported with
      the first step), and when the centres move -- with ``center=None`` (start at the rows' initial values)
      or ``recenter=True``, each row's centre moves to the chain's current row at warmup steps 8, 16, 32,
      64, ... (log2(warmup) passes), never during sampling.

    Both costs are in ``n_data`` and, separately, in ``refresh_items`` (``block{i}_refresh_items`` in
    ``result.stats``; the set-up pass and the recentrings fall in ``result.warmup_stats``). The journal holds
    the moves of one cycle (its capacity is what the program's blocks declare they move, ``Gibbs.moves``).
    ``Exact()`` decides from the full sums and ignores the expansion, as in the kernel. Refused with a
    ConfigError: a site that is not floating point or whose local density JAX cannot differentiate (twice
    for order 2), a local density that is not one value per item, a site no item depends on, and items'
    gradients in the site (found from the jaxpr) that also read a site another block of the program updates
    (other than ``group_by``) or the model's ``aux`` when a block may change it -- their sums would go stale
    at every step. Items of a group must depend on the site through their own row only (the premise of
    ``group_by``). Every refresh runs under a branch whose condition is the same for every chain (the step
    index), so the chains can be vectorised without a per-step copy of the data.
    """

    site: str
    test: Any = None
    scale: float = 0.1
    proposal: Any = None
    group_by: Optional[str] = None
    groups: str = "all"
    control_variates: Any = None

    def __post_init__(self):
        if self.groups not in ("all", "one"):
            raise ConfigError(f"SubsampledMH groups must be 'all' or 'one', not {self.groups!r}")
        cv = self.control_variates
        if cv is not None:
            from ..control_variates import ControlVariates

            if not isinstance(cv, ControlVariates):
                raise ConfigError(f"SubsampledMH control_variates must be a tm.ControlVariates, not {type(cv).__name__}")
        if self.test is None:
            from ..acceptance import Exact

            object.__setattr__(self, "test", Exact())
        if self.proposal is None:
            from ..proposals import RandomWalk

            object.__setattr__(self, "proposal", RandomWalk(self.scale))

    @property
    def label(self):
        cv = ", cv" if self.control_variates is not None else ""
        return f"subsampled_mh({self.site}, {getattr(self.test, 'name', type(self.test).__name__)}{cv})"

    wants_program = True  # init is given the program (the sites other blocks update, the journal)

    @property
    def uses_step(self):  # the step index and warmup flag (to move the centres during warmup)
        return self.control_variates is not None

    @property
    def refreshes(self):  # its statistics include refresh_items
        return self.control_variates is not None

    @property
    def journal_site(self):  # the grouped site whose moves it reads
        return self.group_by if self.control_variates is not None else None

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

    def init(self, model, values, aux, data, n, program=None):
        v = values[self.site]
        row = v[0] if self.group_by is not None else v
        flat, _ = ravel_pytree(row)
        pstate = self.proposal.init(flat, n)
        if self.control_variates is None:
            return pstate
        _check_cv(self, model, values, aux, data, n, program)
        centers = self._centers0(values, flat.dtype)
        g, h = self._full_sums(model, values, aux, data, n, centers)
        # (the journal starts empty: its move count is 0 when these sums are made)
        return pstate, SiteCV(centers, g, h, jnp.zeros((), jnp.int32), jnp.asarray(n, jnp.int32))

    # -- control variates: set-up checks, per-item terms, full passes, journal ------------------------------

    def _row_unravel(self, values):
        v = values[self.site]
        row = v[0] if self.group_by is not None else v
        return ravel_pytree(row)[1]

    def _centers0(self, values, dtype):
        cv = self.control_variates
        v = values[self.site] if cv.center is None else jnp.asarray(cv.center, dtype)
        if cv.center is not None and jnp.shape(v) != jnp.shape(values[self.site]):
            raise ConfigError(f"{self.label}: control_variates center has shape {jnp.shape(v)}; the site has "
                              f"{jnp.shape(values[self.site])}")
        if self.group_by is None:
            return ravel_pytree(v)[0].astype(dtype)[None]
        return jax.vmap(lambda r: ravel_pytree(r)[0])(v).astype(dtype)

    def _item_fn(self, model, values, aux):
        """``f(r, lab, row)``: the local log density of one item (``row``: its data, leading axis 1) in group
        ``lab`` with its group's row of the site at flat ``r``."""
        unravel = self._row_unravel(values)
        full = bool(getattr(model, "wants_full_site", False)) and self.group_by is not None
        one = jnp.zeros((1,), jnp.int32)

        def f(r, lab, row):
            v = unravel(r)
            vals = values
            if self.group_by is not None:
                vals = {**values, self.group_by: jnp.reshape(lab, (1,)).astype(values[self.group_by].dtype)}
                if full:
                    v = values[self.site].at[lab].set(v)
            return model.local_log_density(self.site, v, vals, aux, row, one)[0]

        return f

    def _item_terms(self, model, values, aux, data, items, labels, centers):
        """Per-item gradients (m, d) and Hessians (m, d, d) of the local densities of ``items`` in groups
        ``labels``, each at its group's centre."""
        f = self._item_fn(model, values, aux)
        order = self.control_variates.order
        rows = take(data, items)
        d = centers.shape[1]

        def one(lab, row):
            row1 = jax.tree_util.tree_map(lambda a: a[None], row)
            c = centers[lab]
            g = jax.grad(f)(c, lab, row1)
            h = jax.jacfwd(jax.grad(f))(c, lab, row1) if order == 2 else jnp.zeros((d, d), c.dtype)
            return g, h

        return jax.vmap(one)(labels, rows)

    def _full_sums(self, model, values, aux, data, n, centers):
        """Per-row sums of the items' gradients and Hessians at their rows' centres: one pass over all N
        items, in chunks, by a segment sum on the group labels."""
        r, d = centers.shape
        b = int(min(n, _CHUNK))
        chunks = -(-int(n) // b)
        labels_all = values[self.group_by].astype(jnp.int32) if self.group_by is not None else None

        def body(carry, c):
            g_sum, h_sum = carry
            idx = c * b + jnp.arange(b, dtype=jnp.int32)
            valid = idx < n
            idx = jnp.where(valid, idx, 0)
            lab = labels_all[idx] if labels_all is not None else jnp.zeros((b,), jnp.int32)
            g, h = self._item_terms(model, values, aux, data, idx, lab, centers)
            g_sum = g_sum + jax.ops.segment_sum(jnp.where(valid[:, None], g, 0.0), lab, r)
            h_sum = h_sum + jax.ops.segment_sum(jnp.where(valid[:, None, None], h, 0.0), lab, r)
            return (g_sum, h_sum), None

        zero = (jnp.zeros((r, d), centers.dtype), jnp.zeros((r, d, d), centers.dtype))
        (g_sum, h_sum), _ = jax.lax.scan(body, zero, jnp.arange(chunks, dtype=jnp.int32))
        return g_sum, 0.5 * (h_sum + jnp.swapaxes(h_sum, 1, 2))

    def _apply_moves(self, model, values, aux, data, cvs: SiteCV, mem):
        """The moves made since the sums were last current, from the member journal: each moved item's terms
        leave its old row's sums and join its new row's. Returns the state and the items read."""
        jr = mem.journal
        if jr is None:
            return cvs, jnp.zeros((), jnp.int32)
        cap = jr.items.shape[0]
        fresh = jr.total - cvs.seen
        j = jnp.arange(cap, dtype=jnp.int32)
        slot = jnp.remainder(cvs.seen + j, cap)
        valid = j < fresh
        items, old, new = jr.items[slot], jr.old[slot], jr.new[slot]
        both = jnp.concatenate([old, new])
        g, h = self._item_terms(model, values, aux, data, jnp.concatenate([items, items]), both, cvs.center)
        w = (valid & (old != new)).astype(g.dtype)
        sign = jnp.concatenate([-w, w])
        r = cvs.center.shape[0]
        g_sum = cvs.grad_sum + jax.ops.segment_sum(sign[:, None] * g, both, r)
        h_sum = cvs.hess_sum + jax.ops.segment_sum(sign[:, None, None] * h, both, r)
        occupied = (mem.counts > 0)
        g_sum = jnp.where(occupied[:, None], g_sum, 0.0)  # an empty row's sums are exactly zero (no drift)
        h_sum = jnp.where(occupied[:, None, None], h_sum, 0.0)
        return cvs._replace(grad_sum=g_sum, hess_sum=h_sum, seen=jr.total), jnp.minimum(fresh, cap)

    def _recenter(self, model, values, aux, data, n, cvs: SiteCV, mem, step_index, adapt):
        """During warmup, at steps 8, 16, 32, ...: the centres move to the chain's current rows and the sums are
        made again by a full pass (N items). The condition is the same for every chain (no per-chain branch)."""
        cv = self.control_variates
        if step_index is None or (isinstance(adapt, bool) and not adapt):
            return cvs, jnp.zeros((), jnp.int32)
        if cv.center is not None and not cv.recenter:
            return cvs, jnp.zeros((), jnp.int32)
        g1 = jnp.asarray(step_index, jnp.int32) + 1
        when = jnp.asarray(adapt, bool) & (g1 >= 8) & ((g1 & (g1 - 1)) == 0)

        def move():
            centers = self._rows_now(values, cvs.center.dtype)
            g, h = self._full_sums(model, values, aux, data, n, centers)
            seen = mem.journal.total if (mem is not None and mem.journal is not None) else cvs.seen
            return cvs._replace(center=centers, grad_sum=g, hess_sum=h, seen=seen), jnp.asarray(n, jnp.int32)

        def keep():
            return cvs, jnp.zeros((), jnp.int32)

        return jax.lax.cond(when, move, keep)

    def _rows_now(self, values, dtype):
        v = values[self.site]
        if self.group_by is None:
            return ravel_pytree(v)[0].astype(dtype)[None]
        return jax.vmap(lambda r: ravel_pytree(r)[0])(v).astype(dtype)

    audits = True  # its decisions can be audited against the exact test (``step(..., audit=True)``)

    def _one(self, key, model, value, values, aux, data, n, idx_map, pstate, embed=None, audit=False, cv=None):
        """One MH step on the site's conditional problem, by the kernel's own step
        (:func:`tallmh.kernel.build_kernel`): the same support handling, test call, control variates and
        counting as a model's chain. The kernel reads items through ``idx_map`` (positions -> item indices);
        ``cv`` is the row's :class:`~tallmh.control_variates.CVState` (centre and population sums) or None."""
        from ..kernel import KernelState, build_kernel

        flat, unravel = ravel_pytree(value)
        problem = _SiteProblem(model, self.site, embed if embed is not None else (lambda v: v), values, aux, data)
        order = self.control_variates.order if cv is not None else None
        kernel = build_kernel(problem, self.proposal, self.test, n, unravel, cv_order=order,
                              reader=lambda _, pos: idx_map(pos))
        lp = jnp.asarray(problem.log_prior(value), flat.dtype)
        state = KernelState(flat, lp, jnp.zeros((), flat.dtype), pstate, cv)
        new, info = kernel.step(key, state, None, jnp.int32(0), False, None, audit)
        wrong = info.audited & (info.accepted != info.audit_exact)
        return unravel(new.theta), BlockInfo(info.n_data, jnp.int32(1), info.accepted.astype(jnp.int32),
                                             info.audited.astype(jnp.int32), wrong.astype(jnp.int32),
                                             info.audit_items)

    def _refresh(self, model, values, aux, members, cvs, data, n, step_index, adapt):
        """Bring the sums up to the current population (moves since the last step, a warmup recentring);
        returns the state and the items read (set-up's pass included at the first step)."""
        mem = members.get(self.group_by) if self.group_by is not None else None
        items = cvs.pending
        cvs = cvs._replace(pending=jnp.zeros((), jnp.int32))
        if mem is not None:
            cvs, moved = self._apply_moves(model, values, aux, data, cvs, mem)
            items = items + moved
        cvs, passed = self._recenter(model, values, aux, data, n, cvs, mem, step_index, adapt)
        return cvs, items + passed

    def step(self, key, model, values, aux, members, bstate, data, n, audit=False, step_index=None, adapt=False):
        from ..control_variates import CVState

        v = values[self.site]
        cvs, refresh = None, jnp.zeros((), jnp.int32)
        if self.control_variates is not None:
            bstate, cvs = bstate
            cvs, refresh = self._refresh(model, values, aux, members, cvs, data, n, step_index, adapt)
        extra = BlockInfo.zero()._replace(n_data=refresh, refresh_items=refresh)

        def wrap(bs, info):
            return ((bs, cvs) if cvs is not None else bs), info + extra

        if self.group_by is None:
            cv = CVState(cvs.center[0], cvs.grad_sum[0], cvs.hess_sum[0]) if cvs is not None else None
            new, info = self._one(key, model, v, values, aux, data, n, lambda pos: pos, bstate, audit=audit, cv=cv)
            return ({**values, self.site: new}, aux, members, *wrap(bstate, info))
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

            cv = CVState(cvs.center[k], cvs.grad_sum[k], cvs.hess_sum[k]) if cvs is not None else None
            new, inf = self._one(key_k, model, row, vals, aux, data, mem.counts[k], idx_map, bstate, embed, audit,
                                 cv)
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
        return (values, aux, members, *wrap(bstate, info))
