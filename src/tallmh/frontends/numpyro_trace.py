"""NumPyro primitives the front end's modules share: its handler stack held by one lock, the model's trace, the
data plate's indices substituted, rows taken; nothing of tallmh's models here."""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np

__all__ = ["MAX_ENUM", "STACK_LOCK", "get_trace", "load_numpyro", "plate_messenger", "take_rows"]

MAX_ENUM = 4096  # largest joint support summed out per item


# NumPyro keeps its effect handlers on one module-level stack (``numpyro.primitives._PYRO_STACK``), shared by
# all threads. tallmh traces a model in more than one thread at once (the chain's program compiles beside the
# set-up's passes, the self-audit's program beside the chain's XLA compile): two runs of the model at the same
# time would push their handlers on the same stack, and each would see the other's substitutions (a wrong
# value traced silently, or NumPyro's own assertion on a site without a key). Every run of the model under
# handlers holds this lock; it is held only while a model is traced (never while a compiled program runs).
STACK_LOCK = threading.RLock()


def get_trace(m, *args, **kwargs):
    """``handlers.trace(m).get_trace(*args, **kwargs)`` with NumPyro's handler stack to this thread alone."""
    from numpyro import handlers

    with STACK_LOCK:
        return handlers.trace(m).get_trace(*args, **kwargs)


def load_numpyro():
    try:
        import numpyro  # noqa: F401
        from numpyro import handlers  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "tm.from_numpyro needs NumPyro: pip install numpyro (or pip install 'tallmh[bench]')") from e
    import numpyro

    return numpyro


def plate_messenger():
    numpyro = load_numpyro()
    from numpyro.primitives import Messenger

    class _SubstitutePlates(Messenger):
        """Give the data plate the indices ``arange(b)`` (b = rows passed) instead of drawing a subsample.

        With ``name=None`` every subsampled plate gets ``arange(subsample_size)`` (structure traces only).
        """

        def __init__(self, fn=None, name=None, b=None):
            self.name = name
            self.b = b
            super().__init__(fn)

        def process_message(self, msg):
            if msg["type"] != "plate":
                return
            size, sub = msg["args"]
            if self.name is None:
                if msg["value"] is None:
                    msg["value"] = jnp.arange(sub)
                return
            if msg["name"] == self.name:
                msg["value"] = jnp.arange(self.b)
                msg["args"] = (size, self.b)

    del numpyro
    return _SubstitutePlates


def take_rows(data, idx):
    idx = np.asarray(idx)
    return {k: jnp.asarray(np.asarray(v)[idx]) for k, v in data.items()}
