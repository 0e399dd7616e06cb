"""Composition of blocks: ``Repeat`` and ``Cycle`` (the paper's ``cycle``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax

from ..errors import ConfigError
from .state import BlockInfo, Journal, ProgramState, build_members
from .subsampled import SubsampledMH


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

    def init(self, model, values, aux, data, n, program=None):
        if getattr(self.block, "wants_program", False):
            return self.block.init(model, values, aux, data, n, program=program)
        return self.block.init(model, values, aux, data, n)

    def moves(self, site, n):
        own = getattr(self.block, "moves", None)
        return int(self.times) * own(site, n) if callable(own) else 0

    @property
    def audits(self):
        return bool(getattr(self.block, "audits", False))

    @property
    def wants_program(self):
        return bool(getattr(self.block, "wants_program", False))

    @property
    def uses_step(self):
        return bool(getattr(self.block, "uses_step", False))

    @property
    def refreshes(self):
        return bool(getattr(self.block, "refreshes", False))

    def step(self, key, model, values, aux, members, bstate, data, n, audit=False, step_index=None, adapt=False):
        kw = {"audit": audit} if self.audits else {}
        if self.uses_step:
            kw.update(step_index=step_index, adapt=adapt)

        def body(j, c):
            vals, ax, mem, bs, info = c
            vals, ax, mem, bs, inf = self.block.step(jax.random.fold_in(key, j), model, vals, ax, mem, bs, data, n,
                                                     **kw)
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

    def approximate_tests(self):
        """The tests of the blocks that can audit themselves and do not read everything (not ``Exact``)."""
        out = []
        for b in self.blocks:
            inner = b.block if isinstance(b, Repeat) else b
            if getattr(inner, "audits", False) and not getattr(inner.test, "tracks_log_lik", False):
                out.append(inner.test)
        return out

    def audit_passes(self):
        """Full-data passes an audited step of the program reads at most: one per approximate block, times its
        ``Repeat`` count (a grouped block's rows read their clusters' members: one pass in all)."""
        total = 0
        for b in self.blocks:
            inner = b.block if isinstance(b, Repeat) else b
            if getattr(inner, "audits", False) and not getattr(inner.test, "tracks_log_lik", False):
                total += b.times if isinstance(b, Repeat) else 1
        return total

    @property
    def error_target(self):
        """The per-step error the program's approximate tests promise, when they all promise the same."""
        targets = {getattr(t, "error_target", None) for t in self.approximate_tests()}
        return targets.pop() if len(targets) == 1 else None

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

    def moves(self, site, n) -> int:
        """The most member-list moves of the per-item ``site`` one pass of the blocks makes."""
        return sum(b.moves(site, n) for b in self.blocks if callable(getattr(b, "moves", None)))

    def updated_sites(self, exclude=None):
        """The sites the blocks other than ``exclude`` update."""
        out = set()
        for b in self.blocks:
            inner = b.block if isinstance(b, Repeat) else b
            if inner is not exclude and getattr(inner, "site", None) is not None:
                out.add(inner.site)
        return out

    def init(self, model, values, aux, data, n) -> ProgramState:
        members = {}
        journaled = {getattr(b.block if isinstance(b, Repeat) else b, "journal_site", None) for b in self.blocks}
        for zsite, gsite in self.grouped_sites().items():
            members[zsite] = build_members(values[zsite], values[gsite].shape[0])
            cap = self.moves(zsite, n)
            if zsite in journaled and cap > 0:
                members[zsite] = members[zsite]._replace(journal=Journal.empty(cap))
        bstates = tuple(b.init(model, values, aux, data, n, program=self) if getattr(b, "wants_program", False)
                        else b.init(model, values, aux, data, n) for b in self.blocks)
        return ProgramState(values, aux, members, bstates)

    def step(self, key, model, state: ProgramState, data, n, audit=False, step_index=None, adapt=False):
        """One pass of the blocks; ``audit`` (a bool, traced or not) also takes the exact decision beside each
        approximate one of the blocks that can audit themselves. ``step_index`` and ``adapt`` (the runner's
        step within the phase and whether it is warmup) go to the blocks that use them."""
        values, aux, members = state.values, state.aux, state.members
        keys = jax.random.split(key, len(self.blocks))
        new_b, infos = [], []
        for b, kb, bs in zip(self.blocks, keys, state.blocks):
            kw = {"audit": audit} if getattr(b, "audits", False) else {}
            if getattr(b, "uses_step", False):
                kw.update(step_index=step_index, adapt=adapt)
            values, aux, members, bs, info = b.step(kb, model, values, aux, members, bs, data, n, **kw)
            new_b.append(bs)
            infos.append(info)
        return ProgramState(values, aux, members, tuple(new_b)), tuple(infos)
