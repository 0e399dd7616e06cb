"""Rows read by set-up work made before the runner's own set-up: the automatic program's analysis of a
group-level model (:mod:`tallmh.hierarchical`: the data-free check, the start's Newton passes, the GLM
recognition and its tables, :mod:`tallmh.glm_effects`). Each such read adds its rows to the ledger of the
call in progress (:func:`counting`), and :func:`tallmh.sample` adds the total to ``result.setup_items``, so that
every item a run touches is counted. Outside :func:`counting` the reads are not recorded."""

from __future__ import annotations

import contextlib
import contextvars

__all__ = ["add", "counting"]

_LEDGER: contextvars.ContextVar = contextvars.ContextVar("tallmh_setup_reads", default=None)


@contextlib.contextmanager
def counting():
    """A fresh ledger for the reads made inside the block: yields a one-element list whose item is the rows
    read so far (nested ledgers add to the outer one when they close)."""
    outer = _LEDGER.get()
    box = [0]
    token = _LEDGER.set(box)
    try:
        yield box
    finally:
        _LEDGER.reset(token)
        if outer is not None:
            outer[0] += box[0]


def add(rows) -> None:
    """Record ``rows`` items read (a full pass over N rows: ``add(N)``)."""
    box = _LEDGER.get()
    if box is not None:
        box[0] += int(rows)
