"""The kernel a test runs on: informed sub-sampling's own (:mod:`tallmh.informed`) or the MH kernel.

Above both (:mod:`tallmh.kernel` knows nothing of informed sub-sampling, whose kernel is built on it), so that
the acceptance tests, the kernel and informed sub-sampling import one another in one direction only.
"""

from __future__ import annotations

from .acceptance.informed import Informed
from .informed import build_informed_kernel
from .kernel import build_kernel as build_mh_kernel

__all__ = ["build_kernel"]


def build_kernel(model, proposal, test, n: int, unravel, stats=None, cv_order=None, reader=None):
    """Compose ``model``, ``proposal`` and ``test`` into a kernel for N = ``n`` items: for
    :class:`~tallmh.acceptance.Informed`, informed sub-sampling's kernel; otherwise
    :func:`tallmh.kernel.build_kernel` (the MH kernel, or a test's own ``build_kernel``), with the same arguments."""
    if isinstance(test, Informed):
        if reader is not None:
            raise ValueError("the informed test brings its own kernel, which reads rows itself: it cannot be given "
                             "another reader")
        return build_informed_kernel(test, model, proposal, n, unravel, stats, cv_order)
    return build_mh_kernel(model, proposal, test, n, unravel, stats, cv_order, reader)
