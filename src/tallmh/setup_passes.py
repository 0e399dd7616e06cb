"""The runner's set-up stage: the passes over the full data made before the chains start.

- **Streamed full passes** (:func:`full_pass`): a per-chunk function applied to every chunk of 8192 rows,
  in compiled blocks of 2**20 rows, so on-disk data is streamed, never loaded whole (files are read by threads
  ahead of the compiled calls, and the model's set-up statistics made from the same blocks); chunk results
  are accumulated in float64 on the host. For the built-in logistic regression on host data up to 2**23 rows,
  the same passes in NumPy (:class:`HostPasses`): nothing to compile.
- **Mode search** (:func:`mode_search`, :func:`find_center`): damped Newton on the log posterior, each
  iteration one counted pass for the gradient and Hessian sums, with a sub-sample warm start at large N (whose
  Hessian serves the first full step, so that pass makes the value and gradient only).
- **Laplace approximation** (:func:`laplace_cov`): the inverse negative Hessian of the log posterior at the
  mode (Tierney & Kadane, JASA 1986), the adaptive proposal's starting covariance and the spread of the
  chains' start points.

The control variates' sums at the mode (:func:`tallmh.control_variates.proxy_sums`) are made by the same
streamed pass; the mode search hands back its last pass's sums so that the caller need not make another.
"""

from __future__ import annotations

import time
from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import fused_request
from ._blas import one_thread as one_blas_thread
from .cache_keys import shape_key, value_key
from .storage.data import take, to_device
from .errors import ModelError
from .model import own_method

__all__ = ["ModeSearch", "find_center", "full_pass", "pass_chunk", "laplace_cov", "mode_search", "positive_part", "start_cov",
           "warm_rows", "warm_sizes"]

_CHUNK = 8192


def pass_chunk(n: int) -> int:
    """The rows of each chunk :func:`full_pass` gives its function (chunk c holds rows ``[c size, (c + 1) size)``)."""
    return _CHUNK if n > _CHUNK else n


def _chunks(n, size=_CHUNK):
    for s in range(0, n, size):
        yield s, min(size, n - s)


def _chunk_batch(data, start, size, n):
    idx = jnp.arange(start, start + size)
    return take(data, jnp.minimum(idx, n - 1))


_DECREMENT_FLOOR = 1e-3  # Newton decrements below this are not verified by a line search (find_center)
_BLOCK_CHUNKS = 128  # chunks per compiled block: 2**20 rows read per call



def full_pass(chunk_fn, data, n, args, desc="tallmh: set-up pass", host=None):
    """Apply ``chunk_fn(*args, batch, mask)`` to every chunk of ``_CHUNK`` rows; yields its per-chunk
    results (NumPy, in row order) so that the caller accumulates them in float64 on the host.

    The rows go through one compiled call per block of up to ``_BLOCK_CHUNKS`` chunks (2**20 rows), which
    maps ``chunk_fn`` over the block's chunks one after the other (``lax.map``: memory of one chunk's
    derivatives, not of the block's). Data in memory is read inside that call (``take``: a gather for
    in-memory and zero-copy data, a host read for :class:`~tallmh.storage.datasource.HostArray` leaves). Data in
    files is read on the host (files larger than memory by direct I/O: :mod:`tallmh.storage.direct_read`) by
    ``FILE_READERS`` threads, up to ``2 FILE_READERS`` blocks ahead of the
    compiled calls (:func:`tallmh.storage.datasource.host_reader`): the disk then reads several blocks at once while
    the cores reduce the previous ones, and the model's set-up statistics, where a
    :class:`~tallmh.storage.datasource.StatsTap` is registered for the data, are made from the same blocks. Either
    way each block holds the same rows (the last padded with copies of row N - 1, masked), so the chunk
    boundaries and the order of accumulation do not depend on where the data lives. A pass over on-disk data
    of at least ``datasource.PROGRESS_MIN_ROWS`` rows shows a progress bar.

    ``host``: ``(part, sink)``, for data that :func:`tallmh.storage.datasource.host_reader` reads: ``part(rows, a,
    b)`` of each block's rows ``[a, b)`` (NumPy, unpadded) is made in a thread of its own while the compiled call
    of the same block runs (NumPy's arithmetic releases the GIL: it runs on the other core; for data in files,
    from the rows the reader threads have read, so that they stay on the disk's reads), and ``sink(a, b, part)``
    takes them in row order: for data in memory each before its block's chunks are yielded; for data in files
    up to ``HOST_LAG`` blocks later (the compiled calls do not wait for the NumPy side), all before the pass
    ends.
    """
    from .storage import datasource as ds
    from .storage import direct_read

    size = pass_chunk(n)
    nchunks = -(-n // size)
    k = min(nchunks, _BLOCK_CHUNKS)
    read = (direct_read.reader(data) or ds.host_reader(data)) if ds.in_files(data) else None
    key = (chunk_fn, n, size, k, read is not None)
    fn = _PASS_FNS.get(key)
    if fn is None:
        def over(args, batch, mask):
            batch = jax.tree_util.tree_map(lambda a: a.reshape((k, size) + a.shape[1:]), batch)
            return jax.lax.map(lambda bm: chunk_fn(*args, bm[0], bm[1]), (batch, mask.reshape(k, size)))

        if read is None:
            def block(args, data, start):
                idx = start + jnp.arange(k * size, dtype=jnp.int32)
                return over(args, take(data, jnp.minimum(idx, n - 1)), idx < n)
        else:
            def block(args, batch, rows):
                return over(args, batch, jnp.arange(k * size, dtype=jnp.int32) < rows)

        fn = jax.jit(block)
        if len(_PASS_FNS) >= 32:
            _PASS_FNS.pop(next(iter(_PASS_FNS)))
        _PASS_FNS[key] = fn
    bar = ds.progress_bar(n, desc, ds.is_out_of_core(data))
    ds.advise(data, "sequential")
    starts = range(0, n, k * size)
    tap = ds.tap_of(data) if read is not None else None
    try:
        if read is None:
            blocks = _memory_blocks(fn, args, data, n, k * size, starts, host)
        else:
            blocks = _file_blocks(fn, args, read, n, k * size, starts, tap, host)
        for start, out in blocks:
            res = jax.tree_util.tree_map(np.asarray, out)
            rows = min(k * size, n - start)
            for c in range(-(-rows // size)):
                yield jax.tree_util.tree_map(lambda a: a[c], res)
            if bar is not None:
                bar.update(rows)
    finally:
        ds.advise(data, "normal")
        if bar is not None:
            bar.close()


# threads reading a pass's blocks from files: one thread read ~0.7-1.5 GB/s from this machine's disk, two to
# eight 1.5-2.4 GB/s (a 44 GB file, page cache dropped)
FILE_READERS = 3
# blocks whose host parts (full_pass's ``host``) may still be in the making while the compiled calls go on: the
# compiled call of the next block does not wait for the NumPy side of this one (each side keeps its own core busy)
HOST_LAG = 3


def _memory_blocks(fn, args, data, n, rows_per_block, starts, host):
    """``(start, fn(args, data, start))`` for each block of a pass over data in memory, with ``host``'s parts (see
    :func:`full_pass`) made one block ahead in a thread of their own."""
    from concurrent.futures import ThreadPoolExecutor

    from .storage import datasource as ds

    if host is None:
        yield from ((s, fn(args, data, jnp.int32(s))) for s in starts)
        return
    part, sink = host
    read = ds.host_reader(data)

    def make(s):
        e = min(n, s + rows_per_block)
        return part(read(s, e), s, e)

    with ThreadPoolExecutor(1, thread_name_prefix="tallmh-host") as ex:
        ahead = None
        for i, s in enumerate(starts):
            got = ahead if ahead is not None else ex.submit(make, s)
            out = fn(args, data, jnp.int32(s))  # (dispatched: runs while the thread makes the parts)
            ahead = ex.submit(make, starts[i + 1]) if i + 1 < len(starts) else None
            try:
                sink(s, min(n, s + rows_per_block), got.result())
            except BaseException:
                if ahead is not None:
                    ahead.cancel()
                raise
            yield s, out


def _file_blocks(fn, args, read, n, rows_per_block, starts, tap, host=None):
    """``(start, fn(args, rows, valid))`` for each block of a pass over data in files, in row order. The
    ``FILE_READERS`` threads take the blocks' rows (at most ``2 FILE_READERS`` in flight: memory of a few blocks,
    not of N) and make their part of ``tap``'s statistics and finiteness check (if any), which read the
    blocks' pages, so that the thread that calls ``fn`` does nothing else; on the CPU a memory map's rows go to
    the compiled call in place, without a copy (where no tap reads them first, the call's own page faults read
    them, with the read-ahead the pass asks for). ``host``'s parts (:func:`full_pass`) are made in one more thread
    while the block's compiled call runs, and taken up to ``HOST_LAG`` blocks later. Measured per block of 2**20 rows
    of the logistic model with d = 11, CPU ms on a 2-core machine (``benchmarks/table_pass_breakdown.py --threads``):
    the compiled value, gradient and Hessian ~33, the NumPy weights ~18, the model's statistics and finiteness check
    ~11-15, the reading ~5 by direct reads and 23-40 through page faults from the disk."""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    def load(s):
        e = min(n, s + rows_per_block)
        rows = read(s, e)
        part = tap.part(rows, s, e) if tap is not None else None
        if host is not None:
            part = (part, rows)  # (the host part is made in a thread of its own, from rows the tap has read)
        if e - s < rows_per_block:
            pad = rows_per_block - (e - s)
            rows = jax.tree_util.tree_map(lambda a: np.concatenate([a, np.repeat(a[-1:], pad, axis=0)]), rows)
        return jax.device_put(rows), part

    with ThreadPoolExecutor(FILE_READERS, thread_name_prefix="tallmh-read") as ex, \
            ThreadPoolExecutor(1, thread_name_prefix="tallmh-host") as hx:
        queue, parts = collections.deque(), collections.deque()
        it = iter(starts)
        try:
            for s in it:
                queue.append((s, ex.submit(load, s)))
                if len(queue) >= 2 * FILE_READERS:
                    break
            while queue:
                s, f = queue.popleft()
                nxt = next(it, None)
                if nxt is not None:
                    queue.append((nxt, ex.submit(load, nxt)))
                rows, part = f.result()
                e = min(n, s + rows_per_block)
                if host is not None:
                    part, hp = part
                    parts.append((s, e, hx.submit(host[0], hp, s, e)))  # (NumPy on the other core)
                out = fn(args, rows, np.int32(e - s))  # (dispatched: runs meanwhile)
                while parts and (parts[0][2].done() or len(parts) > HOST_LAG):
                    a, b, hp = parts.popleft()
                    host[1](a, b, hp.result())
                if tap is not None:
                    tap.add(s, e, part)
                yield s, out
            while parts:
                a, b, hp = parts.popleft()
                host[1](a, b, hp.result())
        finally:
            for _, f in queue:
                f.cancel()
            for _, _, f in parts:
                f.cancel()


_PASS_FNS: dict = {}
_NEWTON_FNS: dict = {}  # per-chunk functions of the set-up passes (see _newton_chunk_fns)


def closed_form_vgh(model, unravel, th):
    """The model's closed-form ``lik_value_grad_hess(theta, batch, mask)`` (value, gradient and Hessian
    sums of the log-likelihood over a chunk, e.g. :class:`tallmh.models.LogisticRegression`), or None
    (then autodiff). Used only when the class that defines it also defines ``log_lik`` (a subclass with
    its own likelihood does not inherit derivatives of another) and the parameter is a flat vector."""
    return closed_form(model, "lik_value_grad_hess", "log_lik", unravel, th)


def closed_form(model, name, partner, unravel, th):
    """``model.name`` where the model owns it as a closed form of ``partner`` (:func:`tallmh.model.own_method`: a
    subclass with its own likelihood or prior does not inherit another's closed forms) and the parameter is a
    flat vector (shapes by ``eval_shape``: no program for the unravelling); else None."""
    fn = own_method(model, name, partner)
    if fn is None:
        return None
    flat = jax.eval_shape(unravel, th)
    if not (hasattr(flat, "shape") and tuple(flat.shape) == tuple(np.shape(th))):
        return None
    return fn




HOST_BLOCK = 2**16  # rows per block of a host pass (fixed: the same blocks wherever the data lives)
# blocks of a host pass in flight at once: one for data in memory (measured at N = 10^7 on 2 cores: a second
# thread gained nothing on the gradient-and-Hessian pass, and beside BLAS's own threads it lost up to 50%; on
# a 16-core machine four threads made a 3-pass set-up take 8 s), two for data in files (one block read while
# the other is reduced)
HOST_THREADS = 1
HOST_THREADS_FILES = 2
# host passes up to this many rows; above, the compiled passes (float32, both cores): measured per pass of the
# logistic model with d = 11 on 2 cores, NumPy 0.05 s at 10^6, 0.55 s at 10^7, 7.8 s at 10^8, compiled about
# 0.35 s at 10^7 and 4-5 s at 10^8 once compiled (~1.2 CPU s for its programs in a fresh process, which the
# host passes save where N is small)
HOST_MAX_ROWS = 2**23


class HostPasses:
    """The set-up passes in NumPy, in float64, for a model with closed forms on the host
    (``lik_value_grad_hess_host``, ``log_lik_host``; the built-in logistic regression), data in host memory or
    in a file, and N up to ``HOST_MAX_ROWS`` (the warm start's sub-sample included): no program to compile
    (in a fresh process the set-up's compiled passes cost more than the passes themselves, and they compiled
    beside the chain on the same cores), and float64 sums.

    Blocks of ``HOST_BLOCK`` rows are read (:func:`tallmh.storage.datasource.host_reader`: slices of in-memory
    arrays, reads of files) and reduced one after the other (for data in files, by ``HOST_THREADS_FILES``
    threads, so that reads overlap the arithmetic); their results are summed in row order, so in-memory and
    on-disk data give the same sums, bit for bit (each block's products on one BLAS thread, :mod:`tallmh._blas`,
    in whatever thread makes them: OpenBLAS's threads would split a product's sum over rows). A pass over on-disk
    data of at
    least ``datasource.PROGRESS_MIN_ROWS`` rows shows a progress bar."""

    def __init__(self, model, data, n, read):
        self.model, self.data, self.n, self.read = model, data, n, read

    @staticmethod
    def of(model, data, n, unravel, th) -> Optional["HostPasses"]:
        """The host passes for this model and data, or None (then the compiled passes: :func:`full_pass`)."""
        from .storage.datasource import host_reader

        if n > HOST_MAX_ROWS or any(closed_form(model, a, "log_lik", unravel, th) is None
                                    for a in ("lik_value_grad_hess_host", "log_lik_host")):
            return None
        read = host_reader(data)
        return None if read is None else HostPasses(model, data, n, read)

    def _blocks(self, fn, desc):
        """``fn(rows)`` of each block, in row order."""
        import collections
        from concurrent.futures import ThreadPoolExecutor

        from .storage import datasource as ds

        n, read = self.n, self.read
        starts = list(range(0, n, HOST_BLOCK))
        bar = ds.progress_bar(n, desc, ds.is_out_of_core(self.data))
        ds.advise(self.data, "sequential")

        def work(s):
            with one_blas_thread():  # (the same sums in any thread, on any number of cores: tallmh._blas)
                return fn(read(s, min(n, s + HOST_BLOCK)))

        def done(s):
            if bar is not None:
                bar.update(min(n, s + HOST_BLOCK) - s)

        try:
            threads = min(HOST_THREADS_FILES if ds.in_files(self.data) else HOST_THREADS, len(starts))
            if threads <= 1:
                for s in starts:
                    yield work(s)
                    done(s)
                return
            with ThreadPoolExecutor(threads, thread_name_prefix="tallmh-pass") as ex:
                queue = collections.deque()
                for s in starts:  # at most 2 blocks per thread in flight: memory of a few blocks, not of N
                    queue.append((s, ex.submit(work, s)))
                    while len(queue) >= 2 * threads or (queue and s == starts[-1]):
                        s0, f = queue.popleft()
                        yield f.result()
                        done(s0)
        finally:
            ds.advise(self.data, "normal")
            if bar is not None:
                bar.close()

    def sums(self, th, desc="tallmh: set-up pass"):
        """``(sum_i l_i, sum_i grad l_i, sum_i hess l_i)`` at ``th``, float64."""
        t = np.asarray(th, np.float64)
        d = t.shape[0]
        v, g, h = 0.0, np.zeros(d), np.zeros((d, d))
        for bv, bg, bh in self._blocks(lambda rows: self.model.lik_value_grad_hess_host(t, rows), desc):
            v, g, h = v + bv, g + bg, h + bh
        return v, g, h

    def diff(self, th0, th1, desc="tallmh: set-up pass"):
        """``sum_i (l_i(th1) - l_i(th0))``, float64."""
        t0, t1 = np.asarray(th0, np.float64), np.asarray(th1, np.float64)
        ll = self.model.log_lik_host
        return float(sum(self._blocks(lambda rows: float(np.sum(ll(t1, rows) - ll(t0, rows))), desc)))


class ModeSearch(NamedTuple):
    """What :func:`mode_search` found: the mode, the full passes it made, the log-likelihood's gradient and
    Hessian sums at the mode when its last pass computed them (else None; the control variates' ``G, H``,
    see :func:`tallmh.control_variates.state_at_mode`), and the items its sub-sample warm start read."""

    center: jax.Array
    passes: int
    grad_sum: Optional[jax.Array]
    hess_sum: Optional[jax.Array]
    warm_items: int
    mean: Optional[np.ndarray] = None  # the last pass's Newton point where the search stopped short of it (one_pass)


WARM_ROWS = 2**16  # rows of the sub-sample whose scaled posterior mode starts Newton on the full data
WARM_BLOCKS = 64  # ... read as this many runs of contiguous rows spread evenly over the data
WARM_MIN_N = 4 * WARM_ROWS  # below this N the warm start saves nothing
# Larger sub-samples follow, each WARM_GROWTH times the last, while the last has fewer than
# WARM_TARGET * sqrt(d N) rows and the next is at most N / WARM_GROWTH. The full-data Newton step from a
# sub-sample's mode (Newton decrement about d N / m) lands within the centre's tolerance (0.01 d) when the
# decrement after it, about c (d N / m)^2 / N, is below 0.01 d, i.e. m >= 10 sqrt(c d N): c was 0.12 for the
# logistic model at N = 10^7 and 10^8 (d = 11; 0.55 after the step from 2.2e4 at N = 10^8, a third full pass)
# and 1 on data sorted by y (d = 4). Each larger sub-sample costs a few reads of its m <= N / 16 rows; each
# full pass it saves, N rows.
WARM_GROWTH = 16
WARM_TARGET = 16.0
WARM_RUN_ROWS = 1024  # rows per contiguous run of a larger sub-sample (at most WARM_MAX_RUNS runs)
WARM_MAX_RUNS = 1024
# Newton decrement at which tm.sample's mode search stops: the centre of the control variates and of the
# Laplace start is then within sqrt(0.01) = 0.1 posterior sd (Laplace metric) of the mode, which leaves the
# Taylor remainders as small as at the mode itself, and the search stops one gradient-and-Hessian pass and
# one line-search pass earlier (with the unchecked steps below, 2 full passes instead of 5 from the warm start
# at N = 10^6)
CENTRE_TOL = 1e-2


def centre_tol(d: int) -> float:
    """The Newton decrement at which tm.sample's mode search stops for a d-dimensional parameter:
    ``CENTRE_TOL * max(1, d)``. The control variates' Taylor remainders grow with the squared distance of the
    chain's points from the centre (in the Laplace metric: cubed for second order); posterior draws lie at a
    mean squared distance ``d`` from the mode, and a centre at squared distance ``delta`` (the decrement) from
    it raises that to ``d + delta``: by at most 1% with ``delta <= 0.01 d``, the remainders by at most 1.5%.
    (``CENTRE_TOL`` alone asked 0.1 posterior sd in every dimension; at N = 10^7 and d = 11 the search then made
    a third full pass to move the centre from 0.17 sd to 0.00005 sd of the mode.)"""
    return CENTRE_TOL * max(1, int(d))


# A Newton step at a concave point whose decrement is at most max(this, N / 1000) is taken without a line
# search when its predicted gain is well above the rounding of the log posterior's value (:func:`_value_margin`):
# the mode is then within sqrt(N / 1000) posterior sds, about 0.03 parameter units per unit of an item's
# Fisher information, where the quadratic model holds. The next gradient-and-Hessian pass, which computes the
# log posterior anyway, checks the step (a failed check falls back to the line search from the previous
# point). From the warm start this saves one pass per Newton step.
_UNCHECKED_MAX = 100.0


def _value_margin(v):
    """What rounding may change a log posterior of value ``v`` summed over chunks in float32 by: the
    check of an unchecked Newton step forgives a loss this small."""
    return 1e-6 * abs(v) + 1e-3


def warm_rows(n, rows=WARM_ROWS):
    """Row indices of a warm-start sub-sample of ``rows`` rows: runs of contiguous rows at evenly spaced
    offsets, ``WARM_BLOCKS`` runs for the first sub-sample, up to ``WARM_MAX_RUNS`` of ``WARM_RUN_ROWS`` or more
    rows for the larger ones (contiguous, so on-disk data is read in a few sequential reads; spread, so data
    sorted by some column is covered end to end). Deterministic: the same rows for the same N."""
    runs = WARM_BLOCKS if rows <= WARM_ROWS else min(WARM_MAX_RUNS, max(WARM_BLOCKS, rows // WARM_RUN_ROWS))
    per = rows // runs
    starts = (np.arange(runs, dtype=np.int64) * (n - per)) // max(1, runs - 1)
    return (starts[:, None] + np.arange(per, dtype=np.int64)[None, :]).reshape(-1).astype(np.int32)


def warm_sizes(n, d=1):
    """The warm start's sub-sample sizes for N = ``n`` rows and ``d`` parameters (empty below ``WARM_MIN_N``):
    ``WARM_ROWS``, then each ``WARM_GROWTH`` times the last while the last is below ``WARM_TARGET * sqrt(d n)``
    and the next is at most ``n / WARM_GROWTH`` (d = 11: 2^16 below N = 2^24 ~ 1.7e7; 2^16, 2^20 at 10^8; 2^16, 2^20,
    2^24 at 10^9)."""
    if n < WARM_MIN_N:
        return []
    sizes = [WARM_ROWS]
    while sizes[-1] < WARM_TARGET * np.sqrt(max(1, d) * n) and sizes[-1] * WARM_GROWTH * WARM_GROWTH <= n:
        sizes.append(sizes[-1] * WARM_GROWTH)
    return sizes


def find_center(model, data, n, unravel, flat0, max_iter=30, tol=1e-6):
    """Posterior mode by damped Newton with autodiff; returns ``(theta_hat, full passes made)``.

    See :func:`mode_search` (which this calls), which also returns the control-variate sums at the mode.
    """
    res = mode_search(model, data, n, unravel, flat0, max_iter, tol)
    return res.center, res.passes


def mode_search(model, data, n, unravel, flat0, max_iter=30, tol=1e-6, warm_start=True, fixed=None) -> ModeSearch:
    """Posterior mode by damped Newton with autodiff (:class:`ModeSearch`).

    Each iteration makes one pass computing the log posterior's gradient and Hessian over the data in
    chunks (chunk sums accumulated in float64 on the host). Where the negative Hessian is positive definite
    the step is Newton's; where it is not (a centred hierarchical model's funnel, where the first Newton step
    from the prior's centre often lands), the step is the eigenvalue-modified Newton step
    (:func:`positive_part`), which climbs out along the directions of negative curvature at their own scale
    (a large Levenberg shift there made gradient steps too short to leave the funnel in ``max_iter``
    iterations). A step that lowers the log posterior is halved
    (up to 30 times; each trial is a counted pass). The trial compares ``sum_i (ell_i(cand) - ell_i(theta))``
    made from per-item differences with a compensated sum (:func:`~tallmh.acceptance.base.df_sum`), not
    two full log-likelihoods near ``-N``, whose difference float32 cannot resolve. Stops when the Newton
    decrement is below ``tol``, or below ``_DECREMENT_FLOOR`` (1e-3, i.e. theta within 0.032 posterior sd
    of the mode) when the full step's computed gain is negative (float rounding of the difference, not a
    worse point), or when an accepted step no longer changes theta in its float precision, or after
    ``max_iter`` iterations. (At large N the float32 decrement stalls above ``tol``: without the last two
    stops every further iteration re-made the same line search, 230 passes instead of 10 at N = 10^6.)
    Every pass streams the rows in blocks of 2**20 (:func:`full_pass`), so on-disk data is never loaded
    whole.

    Two savings at large N (``N >= WARM_MIN_N``):

    - **Warm start**: Newton first runs, from ``flat0``, on a sub-sample of ``WARM_ROWS`` rows
      (:func:`warm_rows`) with its log-likelihood scaled by ``N / WARM_ROWS``; that mode is within a few
      ``sqrt(N / WARM_ROWS)`` posterior sds of the full one, where Newton on the full data converges in
      two or three iterations, so the full passes drop from about 10 to about 5. At large N, Newton then
      runs on sub-samples 16, 256, ... times larger in turn (:func:`warm_sizes`), each from the last one's
      mode, until the full data's first Newton step lands within the centre's tolerance: the search then
      ends after two full passes (measured with d = 11: three at N = 10^8 and 10^9 from the first sub-sample
      alone). The sub-samples' reads are returned in ``warm_items``. ``warm_start=False`` or a failed
      warm start (non-finite) starts the full-data Newton at the last finite sub-sample mode, or at ``flat0``.
    - **Sums reused**: when the search stops at a point where it has just made the gradient and Hessian
      pass, those sums (less the prior's) are the control-variate sums ``G, H`` at the mode
      (:func:`~tallmh.control_variates.proxy_sums` computes the same chunk sums the same way), returned in
      ``grad_sum`` and ``hess_sum``, so the caller need not make another pass.

    ``fixed`` (a boolean mask over the flat parameter, or None) holds those coordinates at ``flat0``: the
    search is then for the conditional mode of the others (a hierarchical model's scale, whose joint mode
    with its effects is degenerate, held at an estimate; see :func:`tallmh.frontends.pymc_model.recentre`).
    """
    th = to_device(flat0)
    warm_items = 0
    d = int(np.shape(flat0)[0])
    h_hint = None
    for rows in (warm_sizes(n, d) if warm_start else []):
        idx = warm_rows(n, rows)
        sub = _gather_rows(data, idx)
        m = int(idx.shape[0])
        h_hint = None
        try:
            th_w, p_w, last_w = _newton(model, sub, m, unravel, th, max_iter, tol, scale=n / m, label="warm start",
                                        fixed=fixed)
            warm_items += m * (p_w + 1)  # the gather, and each of its passes
            probe = _strided_host(sub, m, one_pass_rows(m)) if m * m >= WARM_TARGET**2 * d * n \
                and HostPasses.of(model, data, n, unravel, th) is None else None  # (rows for the one-pass prescreen)
        except ModelError:
            warm_items += m
            break
        finally:
            del sub
        if not bool(np.all(np.isfinite(np.asarray(th_w)))):
            break
        th = th_w
        # the sub-sample's Hessian at its mode, scaled to N, for the first full step where the sub-sample is
        # large enough that its relative error (about sqrt(d / m)) leaves a decrement below the centre's
        # tolerance: m at least WARM_TARGET sqrt(d N) (the last warm size at large N)
        if last_w is not None and np.array_equal(np.asarray(last_w[0]), np.asarray(th_w)) \
                and m * m >= WARM_TARGET**2 * d * n:
            h_hint = np.asarray(last_w[2], np.float64) * (n / m)
            if probe is not None:
                fused_request.request_of(data).prescreen(model, unravel, probe, m, n, th, h_hint)
    th, passes, last = _newton(model, data, n, unravel, th, max_iter, tol, fixed=fixed, h_hint=h_hint,
                               one_rows=m if h_hint is not None else None)
    g_sum = h_sum = None
    if last is not None and np.array_equal(np.asarray(last[0]), np.asarray(th)):
        _, g_lik, h_lik = last
        h_lik = 0.5 * (h_lik + h_lik.T)
        g_sum, h_sum = to_device(g_lik, th.dtype), to_device(h_lik, th.dtype)
    mean = fused_request.request_of(data).mean_for(th) if g_sum is not None else None
    return ModeSearch(th, passes, g_sum, h_sum, int(warm_items), mean)





def one_pass_rows(m):
    """Rows of a warm sub-sample of ``m`` kept for the one-pass prescreen (:func:`tallmh.one_pass.prescreen`)."""
    return min(m, 1 << 16)


def _strided_host(sub, m, k):
    """``k`` evenly strided rows of every leaf of ``sub`` as NumPy arrays, or None where a leaf is not an array."""
    step = max(1, m // max(1, k))
    try:
        return jax.tree_util.tree_map(lambda a: np.array(np.asarray(a)[::step][:k]), sub)
    except Exception:  # noqa: BLE001 - (rows the prescreen cannot read: it is skipped)
        return None


def _gather_rows(data, idx):
    """The rows ``idx`` of every leaf: by NumPy indexing where every leaf lies in host memory
    (:func:`tallmh.storage.datasource.host_view`; no program to compile), else by a compiled :func:`tallmh.storage.data.take`."""
    from .storage.datasource import HostArray, InPlaceArray, memmap_of, host_view
    from .storage.runs import gather  # (runs of rows read in threads: the same rows as host_view(a)[idx])

    special = lambda a: isinstance(a, (HostArray, InPlaceArray))  # noqa: E731 - (pytrees: leaves, not nodes)
    views = [host_view(a) for a in jax.tree_util.tree_leaves(data, is_leaf=special)]
    if views and all(v is not None for v in views):
        return jax.tree_util.tree_map(lambda a: to_device(gather(host_view(a), idx, memmap_of(a))), data,
                                      is_leaf=special)
    return jax.jit(take)(data, jnp.asarray(idx))


def _newton_chunk_fns(model, unravel, th):
    """The per-chunk functions of :func:`_newton` (value, gradient and Hessian; compensated log-likelihood
    difference), one pair per model (by value for tallmh's own models) and parameter structure, so that
    :func:`full_pass` finds its compiled passes again on the next call instead of compiling new ones."""

    key = (value_key(model), shape_key(unravel(th)))
    fns = _NEWTON_FNS.get(key)
    if fns is not None:
        return fns
    from .acceptance.base import df_sum

    closed_form = closed_form_vgh(model, unravel, th)

    def chunk_vgh(t0, batch, mask):
        if closed_form is not None:
            return closed_form(unravel(t0), batch, mask)

        def total(t):
            return jnp.sum(jnp.where(mask, model.log_lik(unravel(t), batch), 0.0))

        v, g = jax.value_and_grad(total)(t0)
        return v, g, jax.hessian(total)(t0)

    def chunk_dv(t0, cand, batch, mask):
        dl = model.log_lik(unravel(cand), batch) - model.log_lik(unravel(t0), batch)
        hi, lo = df_sum(jnp.where(mask, dl, 0.0))
        return hi, lo

    if len(_NEWTON_FNS) >= 16:
        _NEWTON_FNS.pop(next(iter(_NEWTON_FNS)))
    _NEWTON_FNS[key] = (chunk_vgh, chunk_dv)
    return chunk_vgh, chunk_dv


def _newton_vg_fn(model, unravel, th):
    """The per-chunk value and gradient of the log-likelihood (autodiff: a reverse pass costs about two
    products with the chunk's rows, where the Hessian costs ``d`` times that), for the Newton step that takes
    its Hessian from the warm start (:func:`_newton`'s ``h_hint``); cached as :func:`_newton_chunk_fns`."""
    key = (value_key(model), shape_key(unravel(th)), "vg")
    fn = _NEWTON_FNS.get(key)
    if fn is None:
        def fn(t0, batch, mask):
            return jax.value_and_grad(lambda t: jnp.sum(jnp.where(mask, model.log_lik(unravel(t), batch), 0.0)))(t0)

        if len(_NEWTON_FNS) >= 16:
            _NEWTON_FNS.pop(next(iter(_NEWTON_FNS)))
        _NEWTON_FNS[key] = fn
    return fn


_PRIOR_FNS: dict = {}  # compiled log-prior derivatives of the set-up passes (see _prior_fns)


def lik_hessian(model, data, n, unravel, th):
    """The log-likelihood's Hessian summed over all ``n`` rows at the flat point ``th`` (one pass, in float64
    on the host; closed form for the built-in GLMs, autodiff otherwise)."""
    host = HostPasses.of(model, data, n, unravel, th)
    if host is not None:
        return host.sums(th, "tallmh: Hessian pass")[2]
    chunk_vgh, _ = _newton_chunk_fns(model, unravel, th)
    d = th.shape[0]
    h = np.zeros((d, d), np.float64)
    for _, _, ch in full_pass(chunk_vgh, data, n, (th,), "tallmh: Hessian pass"):
        h = h + np.asarray(ch, np.float64)
    return h


def _prior_fns(model, unravel, th):
    """The log prior's ``(value, gradient, Hessian)`` at ``t`` and its values at two points ``(t0, t1)``, each
    one compiled program, cached per model (by value for tallmh's own models) and parameter structure:
    evaluated eagerly, every operation of the prior and of its derivatives would be compiled apart
    (dozens of small programs in a fresh process)."""

    key = (value_key(model), shape_key(unravel(th)), str(jnp.asarray(th).dtype))
    fns = _PRIOR_FNS.get(key)
    if fns is not None:
        return fns

    def lp(t):
        return model.log_prior(unravel(t))

    vgh = jax.jit(lambda t: (lp(t), jax.grad(lp)(t), jax.hessian(lp)(t)))
    pair = jax.jit(lambda t0, t1: (lp(t0), lp(t1)))
    if len(_PRIOR_FNS) >= 16:
        _PRIOR_FNS.pop(next(iter(_PRIOR_FNS)))
    _PRIOR_FNS[key] = (vgh, pair)
    return vgh, pair


EIG_FLOOR = 1e-6  # eigenvalues of the scaled negative Hessian are floored at this times the largest


def _prior_parts(model, unravel, th):
    """``(parts, diff)``: ``parts(t) = (log p0, gradient, Hessian)`` in float64 and ``diff(t0, t1) = log p0(t1) -
    log p0(t0)``, by the model's NumPy form (``log_prior_vgh_host``, defined with its ``log_prior``) where it
    has one, else by compiled programs (:func:`_prior_fns`)."""
    host = closed_form(model, "log_prior_vgh_host", "log_prior", unravel, th)
    if host is not None:
        def host_parts(t):
            v, g, h = host(np.asarray(t, np.float64))
            return float(v), np.asarray(g, np.float64), np.asarray(h, np.float64)

        return host_parts, lambda t0, t1: host_parts(t1)[0] - host_parts(t0)[0]
    vgh, pair = _prior_fns(model, unravel, th)

    def parts(t):
        lp, g, h = vgh(t)
        return float(lp), np.asarray(g, np.float64), np.asarray(h, np.float64)

    def diff(t0, t1):
        lp0, lp1 = pair(t0, t1)
        return float(lp1) - float(lp0)

    return parts, diff


def prior_hessian(model, unravel, th) -> np.ndarray:
    """The Hessian of the log prior at flat ``th`` in float64 (the model's NumPy form where it has one)."""
    return _prior_parts(model, unravel, th)[0](th)[2]


def positive_part(neg_h):
    """A positive-definite stand-in for a symmetric matrix ``A`` (the negative Hessian of the log posterior)
    that is not positive definite: with ``D = diag(sqrt|A_ii|)`` and the eigen-decomposition ``D^-1 A D^-1 =
    V L V^T``, returns ``D V |L|_+ V^T D``, where ``|L|_+`` are the eigenvalues' absolute values, floored at
    ``EIG_FLOOR`` times the largest. On a positive-definite ``A`` it returns ``A`` (up to rounding).

    The absolute values are the eigenvalue modification of Newton's method (Nocedal & Wright, Numerical
    Optimization, 2nd ed., Sec. 3.4; the saddle-free Newton step of Dauphin et al., NeurIPS 2014): the
    step ``(|A|)^-1 g`` is an ascent direction that moves *along* directions of negative curvature, at the
    scale of their curvature, instead of the vanishing gradient steps a large Levenberg shift gives. The
    diagonal scaling makes the floor act per coordinate's own scale (a hierarchical model's group effects
    have curvature 10^4 times its hyperparameters')."""
    a = 0.5 * (np.asarray(neg_h, np.float64) + np.asarray(neg_h, np.float64).T)
    dg = np.sqrt(np.maximum(np.abs(np.diag(a)), 1e-300))
    dg = np.where(np.isfinite(dg) & (dg > 0), dg, 1.0)
    w, v = np.linalg.eigh(a / dg[:, None] / dg[None, :])
    top = max(float(np.max(np.abs(w))), 1e-300)
    w = np.maximum(np.abs(w), EIG_FLOOR * top)
    m = (v * w) @ v.T
    return 0.5 * (m + m.T) * dg[:, None] * dg[None, :]


def modified_newton_step(neg_h, g):
    """The eigenvalue-modified Newton step ``positive_part(A)^-1 g`` (see :func:`positive_part`)."""
    return np.linalg.solve(positive_part(neg_h), np.asarray(g, np.float64))


def _arrow_step(neg_h, gn, spec):
    """``(step, concave)`` of the Newton step for an arrow-shaped ``neg_h`` (``spec``: an
    :class:`~tallmh.arrow_hessian.ArrowSpec` with one group term, whose block is diagonal), by eliminating the group
    coordinates: ``S = A - B D^-1 B^T`` over the ``p`` dense ones, O(G p^2) instead of a dense O(d^3) solve (and
    O(d^3) eigen-decomposition where not concave). Not concave (``S`` not positive definite; ``D`` must be): ``S``
    replaced by its positive part (:func:`positive_part`), the matrix then ``[[S_+ + B D^-1 B^T, B], [B^T, D]]``,
    positive definite, and equal to ``neg_h`` where ``S`` was. None where ``D`` is not positive."""
    f, gi = spec.dense, spec.groups[0]
    dd = np.diag(neg_h)[gi]
    if not np.all(np.isfinite(dd) & (dd > 0)):
        return None
    b = neg_h[np.ix_(f, gi)]
    s = neg_h[np.ix_(f, f)] - (b / dd) @ b.T
    try:
        np.linalg.cholesky(s)
        concave = True
    except np.linalg.LinAlgError:
        s, concave = positive_part(s), False
    step = np.zeros_like(gn)
    step[f] = np.linalg.solve(s, gn[f] - b @ (gn[gi] / dd))
    step[gi] = (gn[gi] - b.T @ step[f]) / dd
    return step, concave


def _newton_step(g, h, keep=None, arrow=None):
    """``(step, decrement, concave)`` of the Newton step for gradient ``g`` and Hessian ``h`` (float64); where the
    mask ``keep`` is given, only its coordinates move. Not concave: the modified step (:func:`modified_newton_step`).
    ``arrow``: the :class:`~tallmh.arrow_hessian.ArrowSpec` of an arrow-shaped ``h`` with one group term (the step
    by :func:`_arrow_step`)."""
    neg_h = -0.5 * (h + h.T)
    gn = g
    if keep is not None:  # the conditional mode of the free coordinates: zero gradient, identity rows
        gn = np.where(keep, g, 0.0)
        neg_h = np.where(keep[:, None] & keep[None, :], neg_h, 0.0) + np.diag((~keep).astype(float))
    got = _arrow_step(neg_h, gn, arrow) if arrow is not None and len(arrow.groups) == 1 else None
    if got is not None:
        return got[0], float(gn @ got[0]), got[1]
    try:
        np.linalg.cholesky(neg_h)
        step = np.linalg.solve(neg_h, gn)
        concave = True
    except np.linalg.LinAlgError:  # not concave here (e.g. a hierarchical prior's funnel)
        step = np.asarray(modified_newton_step(neg_h, gn), np.float64)
        concave = False
    return step, float(gn @ step), concave


def _line_search(full_diff, t0, step, decrement, t):
    """Halve ``t`` from the given value until ``t0 + t * step`` does not lower the log posterior (``full_diff(t0,
    cand)``: the log posterior's difference by full passes); ``(theta, passes, stop)``: ``stop`` when Newton can
    make no further progress."""
    used = 0
    for _ in range(30):
        # on the host: eager device arithmetic would compile a program per operation and shape
        th_h = np.asarray(t0)
        cand_h = th_h + (t * step).astype(th_h.dtype)
        cand = to_device(cand_h)
        dv = full_diff(t0, cand)
        used += 1
        # accept a step that does not lower the log posterior beyond float rounding of the difference
        if np.isfinite(dv) and dv >= -1e-6 * max(1.0, decrement):
            # a step below the float resolution of theta: Newton cannot move it any more
            return cand, used, bool(np.array_equal(cand_h, th_h))
        if t == 1.0 and decrement < _DECREMENT_FLOOR:
            # the full Newton step predicts a gain of decrement/2 < 5e-4, and the computed difference
            # says it loses: that is the float rounding of the difference, not a worse point. theta is
            # within sqrt(decrement) < 0.032 posterior sd (Laplace metric) of the mode: stop here.
            return t0, used, True
        t *= 0.5
    return t0, used, True


def _arrow_derivs(model, unravel, th, arrow):
    """The arrow-shaped Hessian's passes for :func:`_newton`, or None (no spec, or too few groups to gain)."""
    if arrow is None or not arrow.worth(int(th.shape[0])):
        return None
    from .arrow_hessian import ArrowDerivs

    return ArrowDerivs(full_pass, model, unravel, th, arrow)


def _dense_derivs(chunk_vgh, data, n, t0, what):
    """The log-likelihood sum's value, gradient and dense Hessian (``jax.hessian`` a chunk) over all ``n`` rows."""
    d = t0.shape[0]
    v, g, h = 0.0, np.zeros(d, np.float64), np.zeros((d, d), np.float64)
    for cv, cg, ch in full_pass(chunk_vgh, data, n, (t0,), what):
        v += float(cv)
        g = g + np.asarray(cg, np.float64)
        h = h + np.asarray(ch, np.float64)
    return v, g, h


def _vg_pass(fn, data, n, t0, what):
    """``(value, gradient)`` sums of the log-likelihood over all ``n`` rows by the per-chunk ``fn``."""
    v, g = 0.0, 0.0
    for cv, cg in full_pass(fn, data, n, (t0,), what):
        v += float(cv)
        g = g + np.asarray(cg, np.float64)
    return v, g


def _full_diff_fn(prior_diff, host, chunk_dv, data, n, scale, what):
    """``full_diff(t0, cand)``: the log posterior's difference by a full pass (:func:`_newton`'s line search)."""
    desc = what.replace("pass", "line search")

    def full_diff(t0, cand):
        dv = prior_diff(t0, cand)
        if host is not None:
            return dv + scale * host.diff(t0, cand, desc)
        lik = 0.0
        for hi, lo in full_pass(chunk_dv, data, n, (t0, cand), desc):
            lik += float(hi) + float(lo)
        return dv + scale * lik

    return full_diff


def _newton(model, data, n, unravel, th, max_iter, tol, scale=1.0, label=None, fixed=None, h_hint=None, arrow=None,
            one_rows=None):
    """The damped Newton loop of :func:`mode_search` on ``log p0 + scale * sum_i ell_i``; returns
    ``(theta, passes, (theta_d, g_lik, h_lik) of the last derivative pass or None)``, the likelihood's
    unscaled gradient and Hessian sums at ``theta_d``. Coordinates where the mask ``fixed`` is true do not
    move (their gradient and Hessian rows are dropped from the step).

    ``h_hint``: an estimate of the likelihood's Hessian sum at ``th`` (the warm start's, scaled to N). Where the
    passes are compiled (the host passes' Hessian costs little), the first pass then computes the value and
    gradient only and the first step is a quasi-Newton step with that Hessian; the passes after it compute
    the Hessian, so the stopping rule and the sums handed back are those of an exact pass. (With a Hessian
    off by a relative ``e``, the step leaves a decrement of about ``e^2`` times the one it started from.)

    ``arrow``: an :class:`~tallmh.arrow_hessian.ArrowSpec` of a group-level model's parameter; where the passes
    are compiled, its Hessian is assembled from ``p + K + 1`` Hessian-vector products a row instead of ``d``
    (:class:`~tallmh.arrow_hessian.ArrowDerivs`), and the dense Hessian is computed where its check fails.

    ``one_rows``: with ``h_hint`` (from a sub-sample of this many rows), where the data's fused-table request has
    a one-pass plan (:mod:`tallmh.one_pass`), the first pass is an exact one with the table's weights whitened by
    the hint's Hessian (its region widened to the offset expected from the sub-sample), and the search stops after it where the plan's rule says that a
    second pass costs more than the extra reads it saves."""
    keep = None if fixed is None else ~np.asarray(fixed, bool).reshape(-1)
    d = th.shape[0]
    what = f"tallmh: Newton {label} pass" if label else "tallmh: Newton pass"

    host = HostPasses.of(model, data, n, unravel, th)
    prior_parts, prior_diff = _prior_parts(model, unravel, th)
    if host is None:
        chunk_vgh, chunk_dv = _newton_chunk_fns(model, unravel, th)
    arrow_d = _arrow_derivs(model, unravel, th, arrow) if host is None else None
    fuse = fused_request.request_of(data if host is None and scale == 1.0 else None)  # (the table's weights)

    def lik_derivs(t0):
        if host is not None:
            return host.sums(t0, what)
        if one is not None and passes == 0:  # (the first pass may be the only one: the table's weights in it)
            neg = -(one[1] + prior_parts(t0)[2])
            return fuse.run(full_pass, chunk_vgh, data, n, t0, what, neg_h=0.5 * (neg + neg.T), scale=one[0])
        got = arrow_d(data, n, t0, what) if arrow_d is not None and arrow_d.ok and hint is None else None
        if got is not None:
            return got
        if hint is None and fuse.ready(pending):
            return fuse.run(full_pass, chunk_vgh, data, n, t0, what)
        if hint is not None:
            return _vg_pass(_newton_vg_fn(model, unravel, th), data, n, t0, what) + (hint,)
        return _dense_derivs(chunk_vgh, data, n, t0, what)

    full_diff = _full_diff_fn(prior_diff, host, None if host is not None else chunk_dv, data, n, scale, what)
    passes = 0
    last = None
    hint = None if (h_hint is None or host is not None) else np.asarray(h_hint, np.float64)
    # (theta, log posterior, step, decrement, check) before a step taken without a line search; check "value":
    # the next pass's log posterior must not be lower; "decrement": the gain predicted (decrement / 2) is below
    # the value's rounding, so the next pass's Newton decrement must be smaller instead (the step converged)
    pending = None
    one = fuse.one_pass_scale(d, n, one_rows) if hint is not None and one_rows is not None else None
    if one is not None:
        one, hint = (one, hint), None  # (an exact first pass, its weights whitened by the warm start's Hessian)
    for _ in range(max_iter):
        t_pass = time.perf_counter()
        lv, lg, lh = lik_derivs(th)
        pass_s = time.perf_counter() - t_pass
        passes += 1
        last = (th, lg, lh) if hint is None else None  # (an estimated Hessian: not the sums at th)
        hint = None
        pv, pg, ph = prior_parts(th)
        v, g, h = pv + scale * lv, pg + scale * lg, ph + scale * lh
        fuse.saw(h)
        finite = np.isfinite(v) and np.all(np.isfinite(g)) and np.all(np.isfinite(h))
        step, decrement, concave = _newton_step(g, h, keep, arrow_d.spec if arrow_d is not None and arrow_d.ok
                                                else None) if finite else (None, np.inf, False)
        if pending is not None:
            t0, v0, step0, dec0, check = pending
            pending = None
            kept = np.isfinite(v) and (v >= v0 - _value_margin(v0) if check == "value"
                                       else concave and decrement < dec0)
            if not kept:
                # the unchecked full step lost: search along it from where it started, as a checked step
                th, used, stop = _line_search(full_diff, t0, step0, dec0, 0.5)
                passes += used
                if stop:
                    break
                continue
        if not np.isfinite(v):
            raise ModelError("the log posterior is not finite at the control-variate starting point")
        if not finite:
            break  # derivatives overflow here (e.g. far down a funnel): no step can be computed
        if decrement < tol:
            break
        if one is not None and passes == 1 and concave and fuse.decide(n, th, step, -h, pass_s):
            break  # (one pass: the centre here, the chains at th + step; tallmh.one_pass)
        by_value = 16.0 * _value_margin(v) <= decrement
        small = decrement <= max(_UNCHECKED_MAX, 1e-3 * n * scale)
        if concave and small and (by_value or decrement >= _DECREMENT_FLOOR):
            # within a few posterior sds of a concave mode the quadratic model holds: take the full step and
            # let the next derivative pass, which computes the log posterior anyway, check it (by its value,
            # or, where the gain is below the value's rounding, by its Newton decrement: at N = 10^7 this
            # saved a line-search pass over the data)
            pending = (th, v, step, decrement, "value" if by_value else "decrement")
            th_h = np.asarray(th)
            th = to_device(th_h + step.astype(th_h.dtype))
            continue
        th, used, stop = _line_search(full_diff, th, step, decrement, 1.0)
        passes += used
        if stop:
            break
    if pending is not None:  # max_iter ended on an unchecked step: keep the last checked point
        th = pending[0]
    return th, passes, last




def start_cov(model, unravel, cv):
    """The covariance that disperses the chains' starts and preconditions the proposal: ``(cov, laplace)``.

    The Laplace covariance (:func:`laplace_cov`, ``laplace=True``) where the negative Hessian of the log
    posterior at ``cv.center`` is positive definite. Elsewhere (the search ended at a point that is not a
    mode, such as a saddle of a centred hierarchical model's funnel), the inverse of its positive part
    (:func:`positive_part`: eigenvalues' absolute values in the diagonally scaled metric), which is positive
    definite and has the local curvature's scale in every direction (``laplace=False``). ``(None, False)``
    when the Hessian is not finite."""
    cov = laplace_cov(model, unravel, cv)
    if cov is not None:
        return cov, True
    hp = _prior_parts(model, unravel, cv.center)[0](cv.center)[2]
    prec = -(np.asarray(cv.hess_sum, float) + np.asarray(hp, float))
    if not np.all(np.isfinite(prec)):
        return None, False
    try:
        cov = np.linalg.inv(positive_part(prec))
        np.linalg.cholesky(0.5 * (cov + cov.T))
    except np.linalg.LinAlgError:
        return None, False
    return to_device(0.5 * (cov + cov.T), cv.center.dtype), False


def laplace_cov(model, unravel, cv):
    """``(-(H + hess log prior(theta_hat)))^-1`` from the stored sums, or None if not positive definite."""
    hp = _prior_parts(model, unravel, cv.center)[0](cv.center)[2]
    prec = -(np.asarray(cv.hess_sum, float) + np.asarray(hp, float))
    try:
        np.linalg.cholesky(prec)
    except np.linalg.LinAlgError:
        return None
    cov = np.linalg.inv(prec)
    return to_device(0.5 * (cov + cov.T), cv.center.dtype)


