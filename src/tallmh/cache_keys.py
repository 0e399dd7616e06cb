"""Hashable keys for caches of compiled programs: a model, proposal or test by value, a pytree by its shapes."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

__all__ = ["value_key", "shape_key"]


def value_key(obj):
    """A hashable key for a model/proposal/test: by value for tallmh's own classes, else by identity."""
    try:
        hash(obj)
        if dataclasses.is_dataclass(obj):
            return (type(obj), obj)
    except TypeError:
        pass
    if type(obj).__module__.startswith("tallmh.") and hasattr(obj, "__dict__"):
        try:
            items = tuple(sorted((k, v) for k, v in vars(obj).items()))
            hash(items)
            return (type(obj), items)
        except TypeError:
            pass
    return (type(obj), id(obj))


def shape_key(tree):
    leaves, treedef = jax.tree_util.tree_flatten(tree)
    return (treedef, tuple((tuple(np.shape(a)), str(np.asarray(a).dtype) if not hasattr(a, "dtype") else str(a.dtype))
                           for a in leaves))
