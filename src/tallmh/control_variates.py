"""Taylor control variates for the approximate tests (Bardenet, Doucet & Holmes, JMLR 2017, Sec. 7).

Each per-item log-likelihood ratio ``l_i = ell_i(theta') - ell_i(theta)`` is replaced by the remainder

    l~_i = l_i - (p_i(theta') - p_i(theta)),   p_i(theta) = g_i . a + (1/2) a^T H_i a,   a = theta - theta_hat,

where ``g_i`` and ``H_i`` are the gradient and Hessian of ``ell_i`` at a reference point ``theta_hat``
(first order: ``H_i`` dropped). The exact sum ``S = sum_i (p_i(theta') - p_i(theta)) = G . (a' - a) +
(1/2)(a'^T H a' - a^T H a)`` with ``G = sum_i g_i`` and ``H = sum_i H_i`` costs O(d^2) per step from sums
computed once, and is moved into the data-free part of the test (``log_base += S``). So each test now
decides ``mean_i l~_i > mu0 - S/N``: the same decision as before on the full data (batch = N gives the
exact decision), but the ``l~_i`` are of order ``||theta - theta_hat||^3`` instead of
``||theta' - theta||``, so near the posterior the tests need far fewer items (NumPyro's HMCECS uses the
same Taylor proxies).

Per item, ``g_i . a`` and ``a^T H_i a`` are directional derivatives, computed by nested forward-mode
``jax.jvp`` at the cost of a few likelihood evaluations; no per-item d x d Hessian is formed. The sums
``G, H`` and the optimiser that finds ``theta_hat`` read the full data (:mod:`tallmh.setup_passes`); every
such pass is counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .cache_keys import shape_key, value_key
from .errors import ConfigError
from .storage.data import to_device
from .setup_passes import HostPasses, centre_tol, closed_form_vgh, full_pass, mode_search


__all__ = ["ControlVariates", "CVState", "proxy_sums", "proxy_terms", "proxy_sum_diff", "state_at_mode"]


class CVState(NamedTuple):
    center: jax.Array  # flat theta_hat
    grad_sum: jax.Array  # G = sum_i grad ell_i(theta_hat)
    hess_sum: jax.Array  # H = sum_i hess ell_i(theta_hat)  (zeros for order 1)
    exact_rows: Any = None  # int32 (k,): the stratum the austerity test sums exactly (tallmh.strata), or None


@dataclass(frozen=True)
class ControlVariates:
    """Options of the Taylor control variates.

    ``order``: 1 or 2. ``center``: a parameter pytree for ``theta_hat``, or None to find the posterior
    mode by damped Newton on the full data (one counted pass per iteration). ``recenter``: after warmup,
    move ``theta_hat`` to the mean of the warmup draws of all chains and recompute the sums (one more
    counted pass). ``exact_rows``: the items the austerity test sums exactly at every step, those of largest
    Taylor-remainder weight (:mod:`tallmh.strata`; one more counted pass chooses them), while it subsamples the
    rest (:func:`tallmh.acceptance.austerity.stratified_decide`). An integer k: the k items of largest weight
    (0: none); ``"auto"``: every item whose weight is at least ``AUTO_RATIO`` times the mean weight, at most
    ``EXACT_ROWS_AUTO`` (none where no item's is: the test is then the unstratified one). Only the austerity test reads
    a stratum.
    """

    order: int = 2
    center: Any = None
    recenter: bool = False
    max_newton: int = 30
    exact_rows: Any = 0

    def __post_init__(self):
        if self.order not in (1, 2):
            raise ConfigError(f"ControlVariates order must be 1 or 2; got {self.order}")
        k = self.exact_rows
        if not (k == "auto" or (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0)):
            raise ConfigError(f"ControlVariates exact_rows must be a non-negative integer or 'auto'; got {k!r}")

    def exact_row_count(self, n: int) -> int:
        """The stratum's size at N = n items as far as it is known before the data are read: k for an integer,
        0 for ``"auto"`` (the compile started beside the set-up assumes no stratum; a stratum found is
        compiled for after it)."""
        if self.exact_rows == "auto":
            return 0
        return int(min(int(self.exact_rows), n))

    def exact_row_cap(self, n: int) -> int:
        """The most items the stratum may hold at N = n."""
        if self.exact_rows == "auto":
            return int(min(EXACT_ROWS_AUTO, n // 20))
        return self.exact_row_count(n)


# ControlVariates(exact_rows="auto"): at most a few hundred items (a default step reads ~300-900), each of weight
# at least AUTO_RATIO times the mean: the 30 rows of a one-hot feature in 50,000 had 1,400 times the mean (the
# next 1.5 times); with Gaussian features the largest had 5-15 times the mean (d = 3-11, N = 5e3-1e6) and 28
# at d = 2, N = 1e4
EXACT_ROWS_AUTO = 256
AUTO_RATIO = 100.0


_PROXY_FNS: dict = {}  # per-chunk functions of proxy_sums (see _proxy_chunk_fn)


def _proxy_chunk_fn(model, unravel, order, center):
    """The per-chunk sums of :func:`proxy_sums`, one per model, parameter structure and order (cached like
    the mode search's, so that repeated calls reuse the compiled pass)."""

    d = center.shape[0]
    key = ("proxy", order, value_key(model), shape_key(unravel(center)))
    fn = _PROXY_FNS.get(key)
    if fn is not None:
        return fn

    closed_form = closed_form_vgh(model, unravel, center)

    def chunk_sums(center, batch, mask):
        if closed_form is not None:
            _, g, h = closed_form(unravel(center), batch, mask)
            return g, (h if order == 2 else jnp.zeros((d, d), center.dtype))

        def total(th):
            return jnp.sum(jnp.where(mask, model.log_lik(unravel(th), batch), 0.0))

        g = jax.grad(total)(center)
        h = jax.hessian(total)(center) if order == 2 else jnp.zeros((d, d), center.dtype)
        return g, h

    if len(_PROXY_FNS) >= 16:
        _PROXY_FNS.pop(next(iter(_PROXY_FNS)))
    _PROXY_FNS[key] = chunk_sums
    return chunk_sums


def proxy_sums(model, data, n, unravel, center, order=2):
    """``G = sum_i grad ell_i(center)`` and ``H = sum_i hess ell_i(center)``: one full pass over the data.

    Each chunk's sums (8192 items) are made on the device in the working precision; the chunks are
    accumulated in float64 on the host, so the result has the precision of a float32 sum of 8192 items,
    not of N items (``G`` is a sum of N terms that nearly cancel at the mode). The pass reads the rows in
    blocks of 2**20 (:func:`full_pass`), so on-disk data is streamed, never loaded whole. A model with
    NumPy closed forms (the built-in logistic regression) on data in host memory or in a file is summed in
    float64 on the host instead (:class:`~tallmh.setup_passes.HostPasses`).
    """
    d = center.shape[0]
    host = HostPasses.of(model, data, n, unravel, center)
    if host is not None:  # the built-in logistic regression on host data: NumPy, float64 (HostPasses)
        _, G, H = host.sums(center, "tallmh: control-variate sums")
        if order == 1:
            H = np.zeros((d, d))
    else:
        chunk_sums = _proxy_chunk_fn(model, unravel, order, center)
        G = np.zeros(d, np.float64)
        H = np.zeros((d, d), np.float64)
        for g, h in full_pass(chunk_sums, data, n, (center,), "tallmh: control-variate sums"):
            G += np.asarray(g, np.float64)
            H += np.asarray(h, np.float64)
    H = 0.5 * (H + H.T)
    dt = np.dtype(center.dtype)
    return CVState(center, to_device(G, dt), to_device(H, dt))



def proxy_terms(model, unravel, cv: CVState, batch, direction, order=2):
    """Per-item ``g_i . a + (1/2) a^T H_i a`` at the centre along ``a = direction`` (nested jvp)."""

    def f(th):
        return model.log_lik(unravel(th), batch)

    if order == 1:
        _, first = jax.jvp(f, (cv.center,), (direction,))
        return first

    def df(th):
        return jax.jvp(f, (th,), (direction,))[1]

    first, second = jax.jvp(df, (cv.center,), (direction,))
    return first + 0.5 * second


def proxy_sum_diff(cv: CVState, theta, theta_p, order=2):
    """``S = sum_i (p_i(theta') - p_i(theta))`` from the stored sums: O(d^2)."""
    a = theta - cv.center
    ap = theta_p - cv.center
    s = cv.grad_sum @ (ap - a)
    if order == 2:  # a'^T H a' - a^T H a = (a' - a)^T H (a' + a) for symmetric H: no cancellation
        s = s + 0.5 * ((ap - a) @ (cv.hess_sum @ (ap + a)))
    return s


def state_at_mode(found) -> Optional[CVState]:
    """The control-variate state at the mode a :class:`~tallmh.setup_passes.ModeSearch` found, from the
    gradient and Hessian sums of its last pass, or None when it made none there (then :func:`proxy_sums`)."""
    if found.grad_sum is None:
        return None
    return CVState(found.center, found.grad_sum, found.hess_sum)


def zero_state(d, dtype) -> CVState:
    return CVState(jnp.zeros(d, dtype), jnp.zeros(d, dtype), jnp.zeros((d, d), dtype))


def prepare(cvopt: Optional[ControlVariates], model, data, n, unravel, flat0):
    """Build the initial :class:`CVState` (finding the centre if needed); returns ``(state, full passes,
    other items read)`` (the mode search's warm start)."""
    from jax.flatten_util import ravel_pytree

    if cvopt.center is not None:
        center, _ = ravel_pytree(jax.tree_util.tree_map(lambda a: jnp.asarray(a, flat0.dtype), cvopt.center))
        if center.shape != flat0.shape:
            raise ConfigError(f"ControlVariates center has {center.shape[0]} coordinates; the parameter has {flat0.shape[0]}")
        passes, extra = 0, 0
    else:
        found = mode_search(model, data, n, unravel, flat0, cvopt.max_newton, tol=centre_tol(flat0.shape[0]))
        center, passes, extra = found.center, found.passes, found.warm_items
        state = state_at_mode(found)
        if state is not None:  # the search's last pass made these sums at the mode already
            if cvopt.order == 1:
                state = state._replace(hess_sum=jnp.zeros_like(state.hess_sum))
            return state, passes, extra
    state = proxy_sums(model, data, n, unravel, center, cvopt.order)
    return state, passes + 1, extra
