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

On the CPU, where the bound has a NumPy form of its weights (``weights_block``: the logistic bounds) and the data
is read on the host, the weights are made in NumPy beside the compiled pass (in a thread of its own,
:func:`tallmh.setup_passes.full_pass`'s ``host``), which then computes the derivatives alone: the CPU
backend runs one compiled call at a time, on one core, and NumPy's arithmetic releases the GIL, so the two halves
run on two cores. The weights are the same numbers to the last bits of the working precision (both inflated by
``_INFLATE`` for its rounding); the derivatives, hence the centre, are bit for bit those of the compiled form.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import jax.numpy as jnp
import numpy as np

from . import fused_request
from .errors import ConfigError

RATIO_MAX = 1.25  # the previous Hessian within this factor of the final one in every direction, or a separate pass
_INFLATE = 1 + 1e-3  # the working-precision weights' rounding, as factor_bounds.prepare inflates them
_BLOCK = 1 << 20  # rows per TableBuilder.add (full_pass yields chunks; a block's keys are made in a thread)

_FUSED_FNS: dict = {}

# the weights made in NumPy beside the compiled pass (:func:`_host_weights`) where the bound and the data allow it;
# False: in the compiled call, fused with the derivatives (the form before; kept for comparisons and other bounds)
HOST_WEIGHTS = True


class FusedTable:
    """A request, registered for the data while the set-up runs (:func:`requesting`), that the mode search's
    compiled Newton passes make the table's weights in the pass (:func:`tallmh.setup_passes._newton` asks
    :func:`tallmh.fused_request.request_of`). ``result``: ``(centre, A^T, whitening Hessian, TableBuilder)`` of the last fused pass."""

    def __init__(self, data, bound, plan=None):
        self.data, self.bound = data, bound
        self.neg_h = None  # -H of the log posterior at the last iterate (whitens the next pass)
        self.result = None
        self.fused_passes = 0
        self.plan = plan  # a tallmh.one_pass.OnePassPlan: the first full pass may be the only one
        self.prediction = None  # the one-pass rule's tallmh.one_pass.Prediction, once asked
        self.mean = None  # (centre, the surrogate's mode) where the set-up stopped after one pass
        self.widened = False
        self.attempt = True  # (the prescreen's verdict: the first pass makes the one-pass table)
        self.probed: list = []  # rows the prescreen read to price a read (counted in the set-up's items)

    def prescreen(self, model, unravel, rows, m, n, center, h_lik):
        """Whether the first full pass makes the one-pass table (:func:`tallmh.one_pass.prescreen`)."""
        from . import one_pass

        if self.plan is not None:
            self.attempt = one_pass.prescreen(self.plan, self.bound, model, unravel, rows, m, n, center, h_lik,
                                              self.probed)

    def one_pass_scale(self, d, n, m):
        """The whitening's scale for a first pass, at the mode of a sub-sample of ``m`` rows, that may be the only
        one (:mod:`tallmh.one_pass`), or None (no plan, or forced off)."""
        from . import one_pass

        if self.plan is None or one_pass.MODE == "never" or not self.attempt:
            return None
        return one_pass.whitening_scale(self.bound, d, one_pass.reach_of(n, d, m))

    def decide(self, n, center, step, neg_h, pass_s) -> bool:
        """Whether the search stops after the one-pass table's pass (:func:`tallmh.one_pass.keep_one_pass`)."""
        from . import one_pass

        if self.result is None or not self.widened:
            return False
        c, at, _, tb = self.result
        self.prediction = p = one_pass.keep_one_pass(self.plan, self.bound, tb, at, c, step, neg_h, n, pass_s)
        if p.one_pass:
            self.mean = (np.asarray(center), np.asarray(center, np.float64) + np.asarray(step, np.float64))
        else:
            self.result = None
        return p.one_pass

    def mean_for(self, center):
        """The chains' centre (the surrogate's mode) where the set-up stopped at ``center`` after one pass."""
        if self.mean is None or not np.array_equal(self.mean[0], np.asarray(center)):
            return None
        return self.mean[1]

    def saw(self, h) -> None:
        """The log posterior's Hessian at the iterate just passed (or estimated there)."""
        neg = -0.5 * (np.asarray(h, np.float64) + np.asarray(h, np.float64).T)
        self.neg_h = neg if np.all(np.isfinite(neg)) else None

    def ready(self, pending) -> bool:
        """Whether the next exact pass makes the weights: Newton has just taken an unchecked full step (its
        quadratic regime) and the Hessian before it is positive definite."""
        return pending is not None and self.neg_h is not None and _chol(self.neg_h) is not None

    def run(self, full_pass, chunk_vgh, data, n, t0, desc, neg_h=None, scale=None):
        """One exact Newton pass at ``t0`` with the weights fused: ``(value, gradient, Hessian)`` sums, as the
        plain pass's, and ``self.result`` set for this point. ``neg_h``, ``scale``: the whitening ``A A^T = neg_h``
        (default: the last iterate's) scaled by ``scale`` (a pass that may be the only one, :mod:`tallmh.one_pass`)."""
        from .factor_bounds import builder

        self.result = None  # (an earlier pass's table belongs to another point)
        neg_h = self.neg_h if neg_h is None else neg_h
        a = _chol(neg_h) * (1.0 if scale is None else scale)
        ainv = np.linalg.inv(a)
        dt = np.asarray(t0).dtype
        tb = builder(n)  # (from factor_bounds.BULK_MIN_N items the large-N sampler's)
        d = int(np.shape(t0)[0])
        v, g, h = 0.0, np.zeros(d), np.zeros((d, d))
        buf, filled, jobs = [], 0, []
        with ThreadPoolExecutor(1, thread_name_prefix="tallmh-table") as ex:  # (keys in order, beside the pass)
            part = _host_weights(self.bound, data, t0, ainv)
            if part is not None:  # the weights in NumPy on the other core, the derivatives compiled
                def sink(a, b, w):
                    jobs.append(ex.submit(tb.add, a, w))

                blocks = full_pass(chunk_vgh, data, n, (t0,), desc, host=(part, sink))
            else:
                blocks = full_pass(_fused_fn(chunk_vgh, self.bound), data, n, (t0, jnp.asarray(ainv, dt)), desc)
            for out in blocks:
                cv, cg, ch = out[:3]
                v += float(cv)
                g = g + np.asarray(cg, np.float64)
                h = h + np.asarray(ch, np.float64)
                if part is None:  # (the compiled call's weights, out[3])
                    buf.append(out[3])
                    if sum(b.size for b in buf) >= _BLOCK or filled + sum(b.size for b in buf) >= n:
                        w = np.concatenate(buf)[:n - filled]
                        jobs.append(ex.submit(tb.add, filled, w.astype(np.float64) * _INFLATE))
                        filled += w.size
                        buf = []
            try:
                for j in jobs:
                    j.result()  # (a weight that is not finite raises here, as in the separate pass)
            except ConfigError:
                if scale is None:
                    raise
                return v, g, h  # (the widened region's weights overflow: no table from this pass, a second one)
        self.result = (np.asarray(t0), a.T, neg_h, tb)
        self.widened = scale is not None  # (whitened for a centre that may stay off the mode: its own check)
        self.fused_passes += 1
        return v, g, h

    def table(self, model, unravel, cv):
        """``(FactorTable, 0)`` from the fused pass where it belongs to ``cv``'s centre and its whitening is
        within ``RATIO_MAX`` of the final Hessian; else None (the caller makes the table in a pass)."""
        from .factor_bounds import laplace_factors

        if self.result is None:
            return None
        c, at, neg_prev, tb = self.result
        one = self.widened
        center = np.asarray(cv.center)
        if c.shape != center.shape or not np.array_equal(c, center):
            return None
        rt_final, chol_cov, _ = laplace_factors(model, unravel, cv)
        if not one and not within(neg_prev, rt_final.T, RATIO_MAX):  # (a one-pass table: its own, or none)
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


def _host_weights(bound, data, t0, ainv):
    """``part(rows, a, b)``: the weights of a block of host rows, in NumPy in the working precision of ``t0``
    (float64, inflated by ``_INFLATE`` for that precision's rounding, as the compiled ones), made beside the
    compiled pass (:func:`tallmh.setup_passes.full_pass`'s ``host``); or None where the bound has no NumPy form
    (``weights_block``), the data is not read on the host, or the backend is not the CPU (an accelerator makes
    them in its own compiled call)."""
    import jax

    from ._blas import one_thread
    from .storage import datasource as ds

    wb = getattr(bound, "weights_block", None)
    if not HOST_WEIGHTS or wb is None or jax.default_backend() != "cpu" or ds.host_reader(data) is None:
        return None
    dt = np.asarray(t0).dtype
    c, ainv = np.asarray(t0, dt), np.asarray(ainv, dt)

    def part(rows, a, b):
        # (one BLAS thread: the same bits in any thread, on any number of cores, tallmh._blas; a weight that
        # overflows is not finite, which the table's builder reports as the compiled pass's would be)
        with one_thread(), np.errstate(over="ignore", invalid="ignore"):
            w = np.array(wb(c, ainv, rows), np.float64)
        w *= _INFLATE  # (in place: the same numbers as w.astype(np.float64) * _INFLATE)
        return w

    return part


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


def requesting(data, bound, plan=None):
    """``with requesting(data, bound, plan) as req:`` registers a :class:`FusedTable` for ``data`` while the set-up
    runs (``bound`` None: nothing registered, ``req`` None); ``plan``: a :class:`tallmh.one_pass.OnePassPlan`."""
    return fused_request.registered(data, FusedTable(data, bound, plan) if bound is not None else None)
