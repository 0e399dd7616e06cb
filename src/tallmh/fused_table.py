"""The exact subsampled test's item table made inside the set-up's last Newton pass, not in a pass of its own.

The table (:mod:`tallmh.factor_bounds`) needs each item's weight ``w_i`` of the remainder bound

    |R_i(theta') - R_i(theta)| <= w_i phi(z, z'),   z = A^T (theta - c)

(SMH, Cornish et al., ICML 2019, eq. 8 and Sec. 3.2). The built-in bounds write ``x_i . (theta - c) =
(A^-1 x_i) . z`` and take ``w_i = ||A^-1 x_i||^3 K_i`` (``K_i`` from the margin at ``c`` and the trust region in
``z``): the argument holds for **any** invertible ``A``, not only the factor of the Hessian at ``c``; ``A``
decides how sharp the bound is (items read per step), never whether it holds, provided the test whitens with
the same ``A`` and expands about the same centre ``c`` as the weights. The Newton pass at the iterate ``c``
computes the value, gradient and Hessian sums at ``c`` (the control variates' sums where Newton stops there)
and, fused into the same compiled call over the same rows, the weights at ``c`` whitened by ``A A^T = -H_prev``,
the log posterior's Hessian known before the pass (the previous iterate's, or the warm start's estimate). The
table then stores ``c`` and ``A^T`` for the test's ``z``, and the Laplace factor of the final Hessian for the
proposals only.

A pass is fused only where Newton has just taken a full step in its quadratic regime (the pass that checks it
is usually the last one). The table is used only where the search stopped at that pass's point (the centre
the chains' control variates carry) and ``-H_prev`` is within a factor ``RATIO_MAX`` of the final Hessian in
every direction (generalised eigenvalues); otherwise the set-up makes the table in a pass of its own, as before
(:func:`tallmh.factor_bounds.prepare`). Either way the test is exact; the check keeps the fused table as sharp
as the separate one's to within ``RATIO_MAX^(3/2)`` per item, and the trust region's exits as rare.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import jax.numpy as jnp
import numpy as np

from . import fused_request

RATIO_MAX = 1.25  # the previous Hessian within this factor of the final one in every direction, or a separate pass
_INFLATE = 1 + 1e-3  # the working-precision weights' rounding, as factor_bounds.prepare inflates them
_BLOCK = 1 << 20  # rows per TableBuilder.add (full_pass yields chunks; a block's keys are made in a thread)

_FUSED_FNS: dict = {}


class FusedTable:
    """A request, registered for the data while the set-up runs (:func:`requesting`), that the mode search's
    compiled Newton passes make the table's weights in the pass (:func:`tallmh.setup_passes._newton` asks
    :func:`tallmh.fused_request.request_of`). ``result``: ``(centre, A^T, whitening Hessian, TableBuilder)`` of the last fused pass."""

    def __init__(self, data, bound):
        self.data, self.bound = data, bound
        self.neg_h = None  # -H of the log posterior at the last iterate (whitens the next pass)
        self.result = None
        self.fused_passes = 0

    def saw(self, h) -> None:
        """The log posterior's Hessian at the iterate just passed (or estimated there)."""
        neg = -0.5 * (np.asarray(h, np.float64) + np.asarray(h, np.float64).T)
        self.neg_h = neg if np.all(np.isfinite(neg)) else None

    def ready(self, pending) -> bool:
        """Whether the next exact pass makes the weights: Newton has just taken an unchecked full step (its
        quadratic regime) and the Hessian before it is positive definite."""
        return pending is not None and self.neg_h is not None and _chol(self.neg_h) is not None

    def run(self, full_pass, chunk_vgh, data, n, t0, desc):
        """One exact Newton pass at ``t0`` with the weights fused: ``(value, gradient, Hessian)`` sums, as the
        plain pass's, and ``self.result`` set for this point."""
        from .factor_bounds import builder

        self.result = None  # (an earlier pass's table belongs to another point)
        a = _chol(self.neg_h)
        ainv = np.linalg.inv(a)
        dt = np.asarray(t0).dtype
        fn = _fused_fn(chunk_vgh, self.bound)
        tb = builder(n)  # (from factor_bounds.BULK_MIN_N items the large-N sampler's)
        d = int(np.shape(t0)[0])
        v, g, h = 0.0, np.zeros(d), np.zeros((d, d))
        buf, filled, jobs = [], 0, []
        with ThreadPoolExecutor(1, thread_name_prefix="tallmh-table") as ex:  # (keys in order, beside the pass)
            for cv, cg, ch, cw in full_pass(fn, data, n, (t0, jnp.asarray(ainv, dt)), desc):
                v += float(cv)
                g = g + np.asarray(cg, np.float64)
                h = h + np.asarray(ch, np.float64)
                buf.append(cw)
                if sum(b.size for b in buf) >= _BLOCK or filled + sum(b.size for b in buf) >= n:
                    w = np.concatenate(buf)[:n - filled]
                    jobs.append(ex.submit(tb.add, filled, w.astype(np.float64) * _INFLATE))
                    filled += w.size
                    buf = []
            for j in jobs:
                j.result()  # (a weight that is not finite raises here, as in the separate pass)
        self.result = (np.asarray(t0), a.T, self.neg_h, tb)
        self.fused_passes += 1
        return v, g, h

    def table(self, model, unravel, cv):
        """``(FactorTable, 0)`` from the fused pass where it belongs to ``cv``'s centre and its whitening is
        within ``RATIO_MAX`` of the final Hessian; else None (the caller makes the table in a pass)."""
        from .factor_bounds import laplace_factors

        if self.result is None:
            return None
        c, at, neg_prev, tb = self.result
        center = np.asarray(cv.center)
        if c.shape != center.shape or not np.array_equal(c, center):
            return None
        rt_final, chol_cov, _ = laplace_factors(model, unravel, cv)
        if not within(neg_prev, rt_final.T, RATIO_MAX):
            return None
        self.result = None
        return tb.table(cv.center, at, chol_cov, np.dtype(np.asarray(cv.center).dtype)), 0


def within(neg_prev, r_final, ratio) -> bool:
    """Whether the generalised eigenvalues of ``-H_prev`` against ``H = R R^T`` lie in ``[1/ratio, ratio]``."""
    rinv = np.linalg.inv(r_final)
    lam = np.linalg.eigvalsh(0.5 * (rinv @ neg_prev @ rinv.T + (rinv @ neg_prev @ rinv.T).T))
    return bool(np.all(np.isfinite(lam)) and lam.min() >= 1.0 / ratio and lam.max() <= ratio)


def _chol(neg_h) -> Optional[np.ndarray]:
    try:
        return np.linalg.cholesky(neg_h)
    except np.linalg.LinAlgError:
        return None


def _fused_fn(chunk_vgh, bound):
    """``chunk(t0, A^-1, batch, mask) -> (value, gradient, Hessian, weights)``, cached per chunk function and
    bound (so that :func:`tallmh.setup_passes.full_pass` finds its compiled pass again)."""
    key = (chunk_vgh, type(bound), tuple(sorted((k, repr(v)) for k, v in vars(bound).items())))
    fn = _FUSED_FNS.get(key)
    if fn is None:
        def fn(t0, ainv, batch, mask):
            v, g, h = chunk_vgh(t0, batch, mask)
            return v, g, h, jnp.where(mask, bound.weights(t0, ainv, batch), 0.0)

        if len(_FUSED_FNS) >= 16:
            _FUSED_FNS.pop(next(iter(_FUSED_FNS)))
        _FUSED_FNS[key] = fn
    return fn


def requesting(data, bound):
    """``with requesting(data, bound) as req:`` registers a :class:`FusedTable` for ``data`` while the set-up runs
    (``bound`` None: nothing registered, ``req`` None)."""
    return fused_request.registered(data, FusedTable(data, bound) if bound is not None else None)
