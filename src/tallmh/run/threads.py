"""JAX settings carried into tallmh's own threads, waits that keep Ctrl-C responsive, and stop signals.

In: a function to run or an array to wait for. Out: the function run in a thread with the caller's JAX
settings and full float32 matrix products (:func:`in_thread`, :func:`as_caller`); SIGTERM and SIGHUP turned
into :class:`~tallmh.errors.Stopped` while a run goes (:func:`stop_signals`).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time

import jax

from .._blas import one_thread as one_blas_thread
from ..errors import Stopped


def wait(x):
    """Block until ``x`` is computed, sleeping in short steps so Ctrl-C is seen at once."""
    leaves = jax.tree_util.tree_leaves(x)
    for leaf in leaves:
        is_ready = getattr(leaf, "is_ready", None)
        if is_ready is None:
            continue
        delay = 1e-4
        while not is_ready():
            time.sleep(delay)
            delay = min(delay * 2, 0.02)
    return x


def full_float32(fn):
    """``fn`` traced with full float32 matrix products: on GPUs JAX's default lets float32 products run in
    TF32 (a 10-bit mantissa), which would leave the control variates' remainders and the exact sums with
    errors of ~1e-3 of each item's log-likelihood; the CPU computes float32 either way. (A config context
    does not follow a thread: each thread that traces for tallmh enters it, see :func:`in_thread` and
    :func:`tallmh.run._exec_cache.compile_and_store`.)"""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with jax.default_matmul_precision("float32"):
            return fn(*args, **kwargs)

    return wrapper


# JAX settings that a ``with`` block may set for the calling thread only (``with jax.enable_x64(True):``), and
# that change what a traced program computes: carried into tallmh's own threads by :func:`as_caller`
CARRIED = ("enable_x64", "default_device", "threefry_partitionable", "default_prng_impl")


def as_caller(fn):
    """``fn`` to run in another thread with the calling thread's JAX settings (64-bit mode, default device,
    random-bits settings: ``_CARRIED``) and full float32 matrix products (:func:`full_float32`): JAX's
    configuration contexts hold in the thread that entered them only, and tallmh traces in threads of its own
    (the set-up, the chain's compile, the audits); without this a run inside ``with jax.enable_x64(True):``
    made its start points and its chain in float32. NumPy's products in the new thread run on one BLAS thread
    (:func:`tallmh._blas.one_thread`). Call it in the calling thread; the wrapper runs in the new one."""
    settings = [(state, getattr(jax.config, "jax_" + name)) for name in CARRIED
                if (state := getattr(jax, name, None)) is not None]  # (States: callable as contexts, not truthy)
    fn32 = full_float32(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with contextlib.ExitStack() as stack:
            for state, value in settings:
                stack.enter_context(state(value))
            stack.enter_context(one_blas_thread())  # (the set-up's host passes: see tallmh._blas)
            return fn32(*args, **kwargs)

    return wrapper


class Started:
    """``fn()`` running in a daemon thread (:func:`started`); :meth:`result` waits for it in short sleeps (Ctrl-C
    stays responsive) and returns its value or raises its error in the caller's thread."""

    def __init__(self, fn):
        self._box = {}
        run = as_caller(fn)

        def target():
            try:
                self._box["value"] = run()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
                self._box["error"] = e

        self._thread = threading.Thread(target=target, daemon=True)
        self._thread.start()

    def result(self):
        while self._thread.is_alive():
            self._thread.join(0.05)
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]


def started(fn) -> Started:
    """``fn()`` started in a daemon thread with the caller's JAX settings (:func:`as_caller`); its value later by
    ``.result()``."""
    return Started(fn)


def in_thread(fn):
    """Run ``fn()`` in a daemon thread and wait in short sleeps (Ctrl-C stays responsive), traced with the
    caller's JAX settings and full float32 matrix products as :func:`.sampling.sample` is (:func:`as_caller`)."""
    return started(fn).result()


STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextlib.contextmanager
def stop_signals():
    """SIGTERM and SIGHUP (what schedulers, ``timeout`` and a closed terminal send) stop the run like Ctrl-C.

    Only in the main thread, and only for a signal whose handler is the default (which would kill the
    process with the draws in memory); a handler the caller installed is left alone. The previous handlers
    are restored afterwards.
    """
    previous = {}
    if threading.current_thread() is threading.main_thread():
        def handler(signum, frame):
            raise Stopped(signum)

        for sig in STOP_SIGNALS:
            try:
                if signal.getsignal(sig) == signal.SIG_DFL:
                    previous[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):  # pragma: no cover - not settable here
                pass
    try:
        yield
    finally:
        for sig, h in previous.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):  # pragma: no cover
                pass
