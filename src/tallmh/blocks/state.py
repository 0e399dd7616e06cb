"""The state of an inference program: member lists of grouped sites, the program state, block statistics."""

from __future__ import annotations

from typing import Any, Dict, NamedTuple

import jax
import jax.numpy as jnp

from ..errors import ConfigError, ModelError


class Journal(NamedTuple):
    """A ring buffer of the last ``cap`` moves ``(item, old group, new group)`` of a grouped site, with the
    number of moves ever made (``total``, int32, wrapping): a reader that remembers the ``total`` it last saw
    finds the moves made since in O(moves), never by scanning the N items (the control variates of
    :class:`~tallmh.blocks.SubsampledMH` keep their per-group sums current this way)."""

    items: jax.Array  # (cap,) int32
    old: jax.Array  # (cap,) int32
    new: jax.Array  # (cap,) int32
    total: jax.Array  # () int32

    @staticmethod
    def empty(cap: int) -> "Journal":
        z = jnp.zeros((int(cap),), jnp.int32)
        return Journal(z, z, z, jnp.zeros((), jnp.int32))


class Members(NamedTuple):
    """Per-group member lists of a discrete per-item site z with K values.

    ``lists[k, :counts[k]]`` are the items with ``z_i = k`` (in no particular order); ``pos[i]`` is item
    i's slot in its list. Moving an item costs O(1): swap-remove from the old list, append to the new one.
    Memory is K x N int32 (each list has room for all N items). ``journal`` (None unless a block asked for
    one): the recent moves, see :class:`Journal`.
    """

    lists: jax.Array  # (K, N) int32
    pos: jax.Array  # (N,) int32
    counts: jax.Array  # (K,) int32
    journal: Any = None

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
        jr = self.journal
        if jr is not None:
            slot = jnp.remainder(jr.total, jr.items.shape[0])
            jr = Journal(put(jr.items, i, slot), put(jr.old, old, slot), put(jr.new, new, slot), jr.total + 1)
        return Members(lists, pos, counts, jr)


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
    """What one block did in one step: items of data read, proposals made and accepted; for a block that
    can audit itself (:class:`~tallmh.blocks.SubsampledMH`), the decisions audited against the exact test
    with the same u, those that differed, and the items the audits read (not in ``n_data``)."""

    n_data: jax.Array  # int32
    proposals: jax.Array  # int32
    accepted: jax.Array  # int32
    audits: Any = 0  # int32
    audit_wrong: Any = 0  # int32
    audit_items: Any = 0  # int32
    refresh_items: Any = 0  # int32: of n_data, the items read to keep control-variate sums current

    @staticmethod
    def zero():
        z = jnp.zeros((), jnp.int32)
        return BlockInfo(z, z, z, z, z, z, z)

    def __add__(self, other):
        return BlockInfo(*(a + b for a, b in zip(self, other)))


def require(model, names, block):
    missing = [m for m in names if not callable(getattr(model, m, None))]
    if missing:
        raise ModelError(f"{block} needs the model to define {', '.join(missing)}")


def check_site(values, site, block):
    if site not in values:
        raise ConfigError(f"{block}: the model has no site {site!r} (sites: {', '.join(sorted(values))})")
