"""The exact effects block of a hierarchical GLM: fixed and group effects by exact subsampled MH.

Written below for the logistic family; the Poisson-log and known-sd Gaussian families (their recognition, remainders
and bounds: a trust region for the Poisson, none needed for the Gaussian, whose remainder is zero) are in
:mod:`tallmh.glm_families`.

Given the hyperparameters, the fixed effects ``beta`` and the group effects ``u`` of a hierarchical logistic
regression reach the likelihood only through ``eta_i = x_i . beta + c_i u_{g(i)} + o_i``: a logistic
regression on the design ``[X, c * onehot(g)]``, whose prior on ``u`` (``N(0, sigma^2)``) moves with the
hyperparameters. The exact subsampled test (Cornish, Vanetti, Bouchard-Cote, Deligiannidis & Doucet, *Scalable
Metropolis-Hastings for exact Bayesian inference with large datasets*, ICML 2019, "SMH", eq. 4 and Alg. 2; see
:mod:`tallmh.acceptance.thinning`) thins on the likelihood's Taylor remainders only; the prior is evaluated
exactly at every step, so one set-up serves every value of ``sigma``.

**Recognition** (:func:`recognise`): the model's per-row log-likelihood in the flat effects ``e`` must be
``log sigmoid(a_i . e + b_i)`` with ``a_i`` zero outside the fixed effects and one entry of the largest effect key
(the group key). With ``l_i = log sigmoid(v_i)``, ``v_i = -log(expm1(-l_i))`` and ``a_i = grad l_i / (1 -
exp(l_i))``: one pass of forward derivatives (:mod:`tallmh.glm_rows`) gives the design (the response's sign folded
into it), the group index ``g_i``, its coefficient ``c_i`` and the offset ``b_i = v_i - a_i . e``. It is then checked on every row at
the start and at a moved point (the model's value against the reconstruction); anything else (a probit link,
two group terms on one row, a family parameter) is not recognised and keeps the approximate block.

**The bound, per group** (SMH eq. 8 in a per-group product form). With ``delta_i = a_i . (e - c)`` at the centre
``c`` and ``|(log sigmoid)'''| <= M = sqrt(3)/18``, ``|R_i(e') - R_i(e)| <= (M/6) |delta_i'^3 - delta_i^3| <=
(M/6) |delta_i' - delta_i| (delta_i^2 + |delta_i delta_i'| + delta_i'^2)``. In the coordinates of the arrow
precision's block Cholesky factor at the centre (``L L^T = S``, the fixed effects' marginal precision; ``v_j =
B_j / D_j``, by which group ``j``'s conditional mean moves with ``beta``; ``s_j = D_j^-1/2``, its conditional sd),
``delta_i = (x_i - c_i v_j) . d_beta + c_i (d_u_j + v_j . d_beta)``, so with ``r_i = ||L^-1 (x_i - c_i v_j)||``
(the row's fixed part left after its group's share: zero for a group intercept's own column) ``|delta_i| <= r_i
||L^T d_beta|| + |c_i| s_j |d_u_j + v_j . d_beta| / s_j <= kappa_i t_j`` with ``kappa_i = lam r_i + |c_i|
s_{g(i)}``, ``lam = 2 sqrt(p)`` and ``t_j = max(||L^T d_beta|| / lam, |d_u_j + v_j . d_beta| / s_j)`` (likewise
``t_j'`` at ``e'`` and ``d_j`` for the step), so ``|Delta R_i| <= kappa_i^3 phi_j``, ``phi_j = (M/6) d_j (t_j^2 +
t_j t_j' + t_j'^2)``: symmetric in ``e, e'`` and data-free. (Without the ``v_j`` term an intercept confounded with
the group effects gives every row the intercept's marginal sd: measured, 1.4% of 10^6 rows a step.) A small, uncertain group has a large ``s_j`` but few rows; a large group
many rows of tiny ``kappa_i``: each costs in proportion to its own contribution. The Poisson process of rate
``phi_j rate_i`` (``rate_i >= kappa_i^3``) is drawn as in SMH Alg. 2: ``K ~ Poisson(Lambda)`` points, ``Lambda =
sum_j phi_j T_j``, each in group ``j`` with probability ``phi_j T_j / Lambda``, then a bucket of like weights within
the group by an integer threshold table and an item uniformly in it (the rate it gets is known exactly, as in
:func:`tallmh.factor_bounds.build_table`). The points are met, as in :mod:`tallmh.acceptance.thinning`, by their
arrival times on ``[0, Lambda)`` in a unit-rate process (exponential gaps, summed as a double-float pair), ``K``
never drawn in advance, until the next arrival is past ``Lambda`` or a point is kept; a chunk of points takes its
words (group, bucket, item, thinning, gap) from one hash. Where ``Lambda > N/4`` the
step takes the exact decision from all rows (a symmetric condition: still exact).

**The proposal**: preconditioned Crank-Nicolson on the Gaussian that the surrogate gives *at the current
hyperparameters*: precision ``P = -H + Lambda0`` (``H`` the likelihood's Hessian sum at the centre, arrow-shaped:
fixed x fixed dense, fixed x group, group diagonal; ``Lambda0`` the prior's curvature, ``-hess log p0 . 1``, exact
for a separable Gaussian prior) and mean ``mu = c + P^-1 (G + grad log p0(c))``; ``e' = mu + sqrt(1 - r^2) (e -
mu) + r P^-1/2 xi``. As ``sigma`` moves, ``mu`` and ``P`` move with it (``O(p^2 G)`` per step, no d x d array).
The proposal is reversible for that Gaussian, so ``log_base = log p0(e') - log p0(e) + Q(e') - Q(e) + (1/2)
[(e' - mu)^T P (e' - mu) - (e - mu)^T P (e - mu)]`` (zero for a Gaussian prior up to rounding): what is left to
decide is the remainders' factor.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from . import setup_reads
from .blocks.state import BlockInfo
from .factor_bounds import SAFETY
from .glm_families import POISSON_RADIUS, host_terms, item_rates, remainder_diff
from .glm_rows import logistic_rows, second_order_rows, tangents

__all__ = ["recognise", "GLMEffects", "glm_setup", "DATA_KEYS"]

DATA_KEYS = ("_glm_x", "_glm_g", "_glm_c", "_glm_b", "_glm_order")  # the design's arrays, beside the data
MAX_FIXED = 64  # fixed-effect columns the arrow structure keeps dense
_BUCKET_BITS = 20  # integer draw range per group
_CHUNK_BYTES = 1 << 25


class GLMView(NamedTuple):
    """A recognised GLM in the flat effects: ``l_i(e) = f(x_i . e[fixed] + c_i e[group][g_i] + b_i; y_i) + k_i``, ``f``
    the family's (:mod:`tallmh.glm_families`; ``log sigmoid`` for the logistic) (host arrays)."""

    x: np.ndarray  # (N, p) float32
    g: np.ndarray  # (N,) int32
    c: np.ndarray  # (N,) float32
    b: np.ndarray  # (N,) float32
    fixed: np.ndarray  # (p,) positions of the fixed effects in the flat effects
    group: np.ndarray  # (G,) positions of the group effects
    family: str = "logistic"  # tallmh.glm_families: "logistic", "poisson" or "gaussian"
    y: Optional[np.ndarray] = None  # (N,) float32: the response in the family's form (unused for "logistic")
    k: Optional[np.ndarray] = None  # (N,) float32: the rows' constants (checks only)


def _positions(bm):
    e0 = bm.start["effects"]
    d = int(e0.shape[0])
    pos = bm._unravel_e(jnp.arange(d, dtype=e0.dtype))
    return {k: np.rint(np.asarray(v, np.float64)).astype(np.int64).reshape(-1) for k, v in pos.items()}


def recognise(bm, data, n) -> Optional[GLMView]:
    """The effects' GLM structure (see the module and :mod:`tallmh.glm_families`), or None where the likelihood is
    not a logistic, Poisson-log or known-sd Gaussian GLM with one group key (checked on every row at two points).
    Each form is first tried on up to ``PROBE_ROWS`` rows; the one that fits there is read from all rows (one pass
    of per-row derivatives) and checked (two passes of values), in chunks."""
    pos = _positions(bm)
    gkey = max(pos, key=lambda k: pos[k].size)
    group = pos[gkey]
    fixed = np.sort(np.concatenate([pos[k] for k in pos if k != gkey] or [np.zeros(0, np.int64)]))
    if group.size < 2 or fixed.size > MAX_FIXED:
        return None
    d = int(bm.start["effects"].shape[0])
    size = int(max(256, min(8192, _CHUNK_BYTES // (8 * max(d, 1)))))
    for form in ("logistic", "second-order"):
        probe = min(n, PROBE_ROWS)
        if _read(bm, data, probe, form, fixed, group, size, probe) is None:
            continue
        return _read(bm, data, n, form, fixed, group, size, n)
    return None


PROBE_ROWS = 2048


def _read(bm, data, n, form, fixed, group, size, rows) -> Optional[GLMView]:
    """The view read from the first ``rows`` rows by ``form`` (``"logistic"``, or ``"second-order"``: Poisson or
    Gaussian), checked on those rows at the start and at a moved point; None where it does not fit."""
    from .storage.data import take

    e0 = bm.start["effects"]
    d = int(e0.shape[0])
    fj, gj = jnp.asarray(fixed), jnp.asarray(group)
    w = jnp.asarray(np.random.default_rng(4).standard_normal(d), e0.dtype)

    h0 = bm.start["hyper"]
    tang = tangents(fixed, group, d, e0.dtype)

    @jax.jit
    def chunk(data, idx, at):  # (the data an argument: closed over, they would be copied into the program as constants)
        flat = take(data, idx)
        lik = lambda e: bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), flat)  # noqa: E731
        # forward derivatives along p + 3 directions (tallmh.glm_rows): O(p) a row whatever the number of groups
        if form != "logistic":
            return second_order_rows(lik, at, tang, w, int(fixed.size), fj, gj)
        xf, gi, ci, b, ok = logistic_rows(lik, at, tang, int(fixed.size), fj, gj)
        z = jnp.zeros_like(b)
        return jnp.int32(0), xf, gi, ci, b, z, z, ok

    parts, kinds = [], set()
    for s in range(0, rows, size):
        idx = jnp.asarray(np.minimum(np.arange(s, s + size), rows - 1).astype(np.int32))
        setup_reads.add(min(size, rows - s))
        kind, xf, gi, ci, b, y, k, ok = chunk(data, idx, e0)
        kinds.add(int(kind))
        if not bool(jnp.all(ok)) or len(kinds) > 1:
            return None
        m = min(size, rows - s)
        parts.append(tuple(np.asarray(t)[:m] for t in (xf, gi, ci, b, y, k)))
    cat = [np.concatenate([p[i] for p in parts]) for i in range(6)]
    if form == "logistic":
        zero = jnp.zeros_like(e0)
        _reread_flat(lambda idx: (lambda o: o[1:5] + (o[7],))(chunk(data, idx, zero)), cat, size)
    family = ("logistic", "poisson", "gaussian")[kinds.pop()]
    view = GLMView(cat[0].astype(np.float32), cat[1].astype(np.int32), cat[2].astype(np.float32),
                   cat[3].astype(np.float32), fixed, group, family, cat[4].astype(np.float32), cat[5].astype(np.float32))
    shift = 0.3 * np.random.default_rng(3).standard_normal(d)
    for e in (e0, e0 + jnp.asarray(shift, e0.dtype)):
        if not _matches(bm, data, rows, view, e, size):
            return None
    return view


def _reread_flat(read, cat, size):
    """The logistic rows' design ``cat = [x, g, c, b, ...]`` (host arrays, read at the start; changed in place), with
    the rows that read as constants there (every derivative zero) read again at another point (``read(idx) -> (x, g,
    c, b, ok)`` of rows ``idx``, ``size`` of them): a link saturated at the start (Bambi replaces a probability that
    rounds to 1 by ``1 - eps``, a flat function there) hides the row's design, and the start's constant would be a
    wrong, flat likelihood away from it. A row constant at both points stays constant (a zero design row: its
    remainder is zero); the caller's checks at two points still decide on every row. Reads only the flat rows."""
    flat = np.nonzero((cat[2] == 0) & np.all(cat[0] == 0, axis=1))[0].astype(np.int32)
    for s in range(0, flat.size, size):
        sel = flat[s:s + size]
        idx = np.concatenate([sel, np.full(size - sel.size, sel[-1], np.int32)])  # (one shape: one program)
        setup_reads.add(sel.size)
        x1, g1, c1, b1, ok1 = (np.asarray(t)[:sel.size] for t in read(jnp.asarray(idx)))
        new = ok1 & ~((c1 == 0) & np.all(x1 == 0, axis=1))
        for a, v in zip(cat[:4], (x1, g1, c1, b1)):
            a[sel[new]] = v[new]


def _matches(bm, data, n, view, e, size) -> bool:
    """Whether the model's per-row log-likelihood at ``e`` equals the reconstruction's on the first ``n`` rows (to
    1e-4, relative to the larger of the value, the family's terms and 1)."""
    from .glm_families import row_loglik
    from .storage.data import take

    h0 = bm.start["hyper"]
    fj, gj = jnp.asarray(view.fixed), jnp.asarray(view.group)
    arrays = {k: jnp.asarray(v) for k, v in zip(("x", "g", "c", "b", "y", "k"), view[:4] + view[-2:])}

    @jax.jit
    def differs(data, arrays, e, idx):
        a = bm.model.log_lik(bm.theta({"hyper": h0, "effects": e}), take(data, idx))
        eta = arrays["x"][idx] @ e[fj] + arrays["c"][idx] * e[gj][arrays["g"][idx]] + arrays["b"][idx]
        r, scale = row_loglik(view.family, eta, arrays["y"][idx], arrays["k"][idx])
        return jnp.any(~jnp.isfinite(a) | (jnp.abs(r - a) > 1e-4 * jnp.maximum(1.0, scale)))

    size = max(size, 1 << 14)
    for s in range(0, n, size):
        idx = jnp.asarray(np.minimum(np.arange(s, s + size), n - 1).astype(np.int32))
        setup_reads.add(min(size, n - s))
        if bool(differs(data, arrays, e, idx)):
            return False
    return True


# --- the set-up (host, float64) -------------------------------------------------------------------------------

class Arrow(NamedTuple):
    """A symmetric matrix over (fixed, group) effects: ``[[A, B], [B^T, diag(D)]]``."""

    A: Any  # (p, p)
    B: Any  # (p, G)
    D: Any  # (G,)


def arrow_solve(P: Arrow, rf, rg, xp=np):
    """``P^-1 [rf; rg]`` by the Schur complement of the diagonal block."""
    Bd = P.B / P.D
    S = P.A - Bd @ P.B.T
    yf = xp.linalg.solve(S, rf - Bd @ rg) if rf.shape[0] else rf
    return yf, (rg - P.B.T @ yf) / P.D


def arrow_quad(P: Arrow, xf, xg, yf, yg):
    """``x^T P y``."""
    return xf @ P.A @ yf + xf @ P.B @ yg + yf @ P.B @ xg + (xg * P.D) @ yg


_HOST_BLOCK = 1 << 20  # rows per block of the host sums (float64 temporaries of a block, not of all N rows)


def _glm_sums(view, ef, eg):
    """``(sum l_i, gradient (fixed, group), likelihood precision Arrow)`` at ``(ef, eg)`` over all rows (float64,
    accumulated over blocks of ``_HOST_BLOCK`` rows)."""
    G, p = view.group.size, view.x.shape[1]
    val, gf, gg = 0.0, np.zeros(p), np.zeros(G)
    A, B, D = np.zeros((p, p)), np.zeros((p, G)), np.zeros(G)
    setup_reads.add(view.x.shape[0])
    for s in range(0, view.x.shape[0], _HOST_BLOCK):
        sl = slice(s, s + _HOST_BLOCK)
        x = view.x[sl].astype(np.float64)
        c = view.c[sl].astype(np.float64)
        g = view.g[sl]
        m = x @ ef + c * eg[g] + view.b[sl]
        y = None if view.y is None else view.y[sl].astype(np.float64)
        v, d1, w = host_terms(view.family, m, y)  # f, f' and -f'' at the margins
        val += float(v)
        gf += x.T @ d1
        gg += np.bincount(g, weights=c * d1, minlength=G)
        A += (x * w[:, None]).T @ x
        for k in range(p):
            B[k] += np.bincount(g, weights=x[:, k] * c * w, minlength=G)
        D += np.bincount(g, weights=c * c * w, minlength=G)
    return val, gf, gg, Arrow(A, B, D)


def _glm_value(view, ef, eg):
    """``sum l_i`` at ``(ef, eg)`` over all rows (float64, in blocks of ``_HOST_BLOCK`` rows): the line search's
    value, without the gradient and precision sums of :func:`_glm_sums` (``p + 2`` weighted counts a block)."""
    val = 0.0
    setup_reads.add(view.x.shape[0])
    for s in range(0, view.x.shape[0], _HOST_BLOCK):
        sl = slice(s, s + _HOST_BLOCK)
        m = view.x[sl].astype(np.float64) @ ef + view.c[sl].astype(np.float64) * eg[view.g[sl]] + view.b[sl]
        val += float(host_terms(view.family, m, None if view.y is None else view.y[sl].astype(np.float64))[0])
    return val


def _prior_fns(bm):
    """``lp(h, e)``, and ``pieces(h, e) -> (grad_e log p0, -hess_e log p0 . 1)`` (the curvature, exact for a
    separable prior)."""

    def lp(h, e):
        return bm.model.log_prior(bm.theta({"hyper": h, "effects": e}))

    def pieces(h, e):
        g = jax.grad(lambda x: lp(h, x))
        return g(e), -jax.jvp(g, (e,), (jnp.ones_like(e),))[1]

    return lp, pieces


def _newton_centre(bm, view, e0, rounds=40):
    """The effects' conditional mode given the hyperparameters at their start (damped Newton with the prior's
    curvature as in :func:`_prior_fns`), float64 on the host."""
    lp, pieces = _prior_fns(bm)
    lpj, pj = jax.jit(lp), jax.jit(pieces)
    h0 = bm.start["hyper"]
    e = np.asarray(e0, np.float64)
    F, Gp = view.fixed, view.group

    def obj(e):
        return _glm_value(view, e[F], e[Gp]) + float(lpj(h0, jnp.asarray(e, e0.dtype)))

    cur = obj(e)
    for _ in range(rounds):
        _, gf, gg, P = _glm_sums(view, e[F], e[Gp])
        g0, l0 = (np.asarray(t, np.float64) for t in pj(h0, jnp.asarray(e, e0.dtype)))
        l0 = np.maximum(l0, 1e-10)
        P = Arrow(P.A + np.diag(l0[F]), P.B, P.D + l0[Gp])
        yf, yg = arrow_solve(P, gf + g0[F], gg + g0[Gp])
        step = np.zeros_like(e)
        step[F], step[Gp] = yf, yg
        t = 1.0
        while t > 1e-4:
            new = obj(e + t * step)
            if np.isfinite(new) and new >= cur - 1e-9 * abs(cur):
                break
            t *= 0.5
        e, old, cur = e + t * step, cur, new
        if abs(cur - old) < 1e-10 * max(1.0, abs(cur)):
            break
    return e


class GLMSetup(NamedTuple):
    """What the block's steps need besides the rows (small: O(p^2 + p G + buckets))."""

    center: Any  # (d,)
    gl: Any  # (d,) likelihood gradient sum at the centre
    P: Arrow  # likelihood precision at the centre
    lstf: Any  # (p, p) L^T of the fixed effects' marginal precision (whitening)
    v: Any  # (p, G) B / D: a group effect's conditional mean moves by -v_j . d_beta (whitening)
    s: Any  # (G,) group effects' conditional sds (whitening)
    lam: float
    T: Any  # (G,) per-group total rate / phi_j
    bstart: Any  # (NB,) first position of each bucket in the order
    bcount: Any  # (NB,)
    cumk: Any  # (NB,) within-group cumulative integer range
    gfirst: Any  # (G + 1,) first bucket of each group
    K: Any  # (G,) integer range of each group
    search_steps: int


def glm_setup(bm, view, e0):
    """``(GLMSetup, order)``: the centre (the effects' conditional mode at the start), the likelihood's sums there,
    the whitening, the per-item weights ``kappa_i^3`` and the per-group bucket tables (``order``: the items with
    a positive weight, by group and bucket; it goes with the data). Several passes over N rows, float64."""
    c = _newton_centre(bm, view, e0)
    F, Gp = view.fixed, view.group
    _, gf, gg, P = _glm_sums(view, c[F], c[Gp])
    _, pieces = _prior_fns(bm)
    _, l0 = (np.asarray(t, np.float64) for t in jax.jit(pieces)(bm.start["hyper"], jnp.asarray(c, e0.dtype)))
    l0 = np.maximum(l0, 1e-10)
    Pw = Arrow(P.A + np.diag(l0[F]), P.B, P.D + l0[Gp])
    S = Pw.A - (Pw.B / Pw.D) @ Pw.B.T
    p = F.size
    L = np.linalg.cholesky(0.5 * (S + S.T)) if p else np.zeros((0, 0))
    s = 1.0 / np.sqrt(Pw.D)
    lam = 2.0 * math.sqrt(max(p, 1))
    v = Pw.B / Pw.D
    r = np.zeros(view.x.shape[0]) if p else 0.0
    setup_reads.add(view.x.shape[0])  # (the rows' bounds and their margins at the centre: one pass)
    for a in range(0, view.x.shape[0] if p else 0, _HOST_BLOCK):  # (in blocks: float64 temporaries of a block)
        sl = slice(a, a + _HOST_BLOCK)
        xr = view.x[sl].astype(np.float64) - view.c[sl].astype(np.float64)[:, None] * v.T[view.g[sl]]
        r[sl] = np.sqrt(np.sum(np.linalg.solve(L, xr.T) ** 2, axis=0))
    kappa = (lam * r + np.abs(view.c.astype(np.float64)) * s[view.g]) * (1 + 1e-5)
    mc = view.x.astype(np.float64) @ c[F] + view.c.astype(np.float64) * c[Gp][view.g] + view.b
    w = item_rates(view.family, mc, kappa)
    if view.family == "gaussian":
        w = kappa**3  # (tables for the record: a Gaussian's remainder is zero and its steps draw no point)
    # a zero weight only where kappa_i = 0 (x_i = 0 and c_i = 0: delta_i = 0 at every point, the remainder is zero);
    # a positive bound that underflows keeps the smallest weight, so that the row can still be drawn
    if not np.all(np.isfinite(kappa)):
        raise ValueError("glm_effects: a row's bound is not finite")
    w = np.where(kappa > 0, np.maximum(w, np.finfo(np.float64).tiny), 0.0)
    gl = np.zeros_like(c)
    gl[F], gl[Gp] = gf, gg
    return _tables(c, gl, P, L.T, v, s, lam, w, view.g, Gp.size)


def _tables(c, gl, P, lstf, v, s, lam, w, g, G):
    """The per-group bucket tables for weights ``w`` (see :class:`GLMSetup`), and the order: the rows of positive
    weight by group and bucket, then those of zero weight (rows whose remainder is zero: no bucket points at them, so
    the thinning never draws them; they are there so that the order, stored beside the data, has N rows)."""
    if not np.all(np.isfinite(w) & (w >= 0)):  # (an overflowed Poisson rate too: its bucket key would be meaningless)
        raise ValueError("glm_effects: a row's bound weight is negative or not finite")
    items = np.nonzero(w > 0)[0]
    wk = w[items]
    key = np.floor(8.0 * np.log2(wk)).astype(np.int64)
    o = np.lexsort((key, g[items]))
    gs, ks = g[items][o], key[o]
    brk = np.concatenate([[0], np.nonzero((np.diff(gs) != 0) | (np.diff(ks) != 0))[0] + 1]) if o.size else \
        np.zeros(0, np.int64)
    bcount = np.diff(np.concatenate([brk, [o.size]]))
    bmax = np.maximum.reduceat(wk[o], brk) if o.size else np.zeros(0)
    bgroup = gs[brk] if o.size else np.zeros(0, np.int64)
    mass = bmax * bcount
    msum = np.bincount(bgroup, weights=mass, minlength=G)
    k = np.maximum(np.ceil(mass / msum[bgroup] * 2**_BUCKET_BITS), 1).astype(np.int64)
    K = np.bincount(bgroup, weights=k, minlength=G).astype(np.int64)
    T = np.zeros(G)
    np.maximum.at(T, bgroup, mass * K[bgroup] / k)
    T *= 1 + 1e-5
    gfirst = np.searchsorted(bgroup, np.arange(G + 1))
    cumk = np.cumsum(k) - np.concatenate([[0], np.cumsum(K)])[bgroup]
    steps = int(math.ceil(math.log2(max(2, int(np.max(np.diff(gfirst))) + 1)))) + 1
    f32 = np.float32
    setup = GLMSetup(c.astype(f32), gl.astype(f32), Arrow(*(a.astype(f32) for a in P)), lstf.astype(f32),
                     v.astype(f32), s.astype(f32), float(lam), np.nextafter(T.astype(f32), np.inf), brk.astype(np.int32),
                     bcount.astype(np.int32), cumk.astype(np.int32), gfirst.astype(np.int32),
                     np.maximum(K, 1).astype(np.int32), steps)
    return setup, np.concatenate([items[o], np.nonzero(w == 0)[0]]).astype(np.int32)


# --- the block -----------------------------------------------------------------------------------------------

def _row_terms(data, idx, e, ep, c, F, Gp):
    """``(m_i, delta_i, delta_i')`` of rows ``idx``: the margin at the centre and the steps to ``e`` and ``e'``."""
    x, gi, ci, b = (data[k][idx] for k in DATA_KEYS[:4])
    cols = jnp.stack([c[F], e[F] - c[F], ep[F] - c[F]], axis=-1)
    u = jnp.stack([c[Gp][gi], e[Gp][gi] - c[Gp][gi], ep[Gp][gi] - c[Gp][gi]], axis=-1)
    md = x @ cols + ci[:, None] * u
    return md[:, 0] + b, md[:, 1], md[:, 2]


def _unit(hi, lo, dtype):
    """A uniform on ``[0, 1)`` from two uint32 words: 24 random bits of ``hi`` in float32, 53 of both in float64 (the
    resolutions of ``jax.random.uniform``), never 1 after rounding."""
    if jnp.dtype(dtype).itemsize <= 4:
        return (hi >> 8).astype(dtype) * (2.0**-24)
    return ((hi >> 5).astype(dtype) * 2.0**26 + (lo >> 6).astype(dtype)) * (2.0**-53)


@dataclass(frozen=True, eq=False)
class GLMEffects:
    """Exact MH on the ``"effects"`` site of a :class:`~tallmh.hierarchical.BlockedModel` whose likelihood is a
    logistic GLM (:func:`recognise`): the preconditioned Crank-Nicolson proposal and the per-group bound of the
    module, decided by Poisson thinning (``test="thinning"``) or from every row (``test="exact"``: plain MH on
    the reconstructed likelihood). ``shrink`` (< 1) scales the bound down: a wrong sampler, for tests' negative
    controls only. ``n_data`` counts every row read: one per lane of each chunk of points, N per full decision."""

    setup: GLMSetup
    fixed: Any
    group: Any
    test: str = "thinning"
    r: float = 0.5
    chunk: int = 8
    shrink: float = 1.0
    site: str = "effects"
    family: str = "logistic"
    radius: float = POISSON_RADIUS

    def __post_init__(self):
        st = self.setup
        conv = {k: (v if isinstance(v, (int, float)) else
                    Arrow(*(jnp.asarray(a) for a in v)) if isinstance(v, Arrow) else jnp.asarray(v))
                for k, v in st._asdict().items()}
        object.__setattr__(self, "setup", GLMSetup(**conv))
        object.__setattr__(self, "fixed", np.asarray(self.fixed))
        object.__setattr__(self, "group", np.asarray(self.group))

    def _st(self):
        """The set-up with JAX arrays (a program read back from a saved result, to resume, has NumPy arrays: a
        checkpoint rebuilds the block without running ``__post_init__``)."""
        st = self.setup
        if isinstance(st.center, np.ndarray):
            self.__post_init__()
        return self.setup

    @property
    def label(self):
        fam = "" if self.family == "logistic" else f"{self.family}, "
        return f"glm_effects({self.site}, {fam}{'exact-subsampled' if self.test == 'thinning' else 'exact'}, pcn)"

    def validate(self, model, values, n):
        from .errors import ConfigError

        missing = [k for k in DATA_KEYS if k not in getattr(model, "extra_data", {})]
        if self.site not in values or missing:
            raise ConfigError(f"{self.label}: needs a BlockedModel with its GLM arrays ({missing})")

    def init(self, model, values, aux, data, n):
        return ()

    def _gaussian(self, model, h):
        """``(P, mu)``: the surrogate's Gaussian at the hyperparameters ``h`` (the module's proposal)."""
        st = self._st()
        F, Gp = self.fixed, self.group
        _, pieces = _prior_fns(model)
        g0, l0 = pieces(h, st.center)
        l0 = jnp.maximum(l0, 1e-10)
        P = Arrow(st.P.A + jnp.diag(l0[F]), st.P.B, st.P.D + l0[Gp])
        r = st.gl + g0
        yf, yg = arrow_solve(P, r[F], r[Gp], jnp)
        mu = st.center.at[F].add(yf).at[Gp].add(yg)
        return P, mu

    def _propose(self, key, P, mu, e):
        F, Gp = self.fixed, self.group
        kf, kg = jax.random.split(key)
        xf = jax.random.normal(kf, (F.shape[0],), e.dtype)
        xg = jax.random.normal(kg, (Gp.shape[0],), e.dtype)
        # P^-1/2 xi by the block Cholesky factor of P (group block first): fixed part L_S^-T xi_f, then the group's
        Bd = P.B / P.D
        S = P.A - Bd @ P.B.T
        zf = jax.scipy.linalg.solve_triangular(jnp.linalg.cholesky(S), xf, lower=True, trans=1) if F.shape[0] else xf
        zg = (xg - (P.B / jnp.sqrt(P.D)).T @ zf) / jnp.sqrt(P.D)
        z = jnp.zeros_like(e).at[F].set(zf).at[Gp].set(zg)
        a = math.sqrt(1.0 - self.r**2)
        return mu + a * (e - mu) + self.r * z

    def _phi(self, e, ep):
        """Per-group ``phi_j`` (the module's bound) at ``(e, e')``."""
        st = self._st()
        F, Gp = self.fixed, self.group
        c = st.center
        nf = lambda v: jnp.linalg.norm(st.lstf @ v) / st.lam if F.shape[0] else jnp.zeros((), e.dtype)  # noqa: E731
        tau = lambda a: jnp.abs(a[Gp] + a[F] @ st.v) / st.s  # noqa: E731 - the conditional coordinate
        t = jnp.maximum(nf(e[F] - c[F]), tau(e - c))
        tp = jnp.maximum(nf(ep[F] - c[F]), tau(ep - c))
        dd = jnp.maximum(nf(ep[F] - e[F]), tau(ep - e))
        m3 = 0.0 if self.family == "gaussian" else 1.0  # (the family's M_i is in the rows' rates: glm_families)
        return (SAFETY * m3 / 6.0 * self.shrink) * dd * (t * t + t * tp + tp * tp), jnp.maximum(jnp.max(t), jnp.max(tp))

    def _draw(self, w, cum_mass, lam_total, m, data):
        """``m`` points from the random words ``w`` (6, m): (items, their per-point rate divided by phi of their
        group, their groups). The group by a uniform (:func:`_unit`), the bucket and the item by multiply-high of 64
        bits (:func:`tallmh.factor_bounds.below`): one hash for all, no ``randint``'s own."""
        from .factor_bounds import below

        st = self._st()
        G = st.T.shape[0]
        j = jnp.minimum(jnp.searchsorted(cum_mass, _unit(w[0], w[1], lam_total.dtype) * lam_total,
                                         side="right"), G - 1)
        r = below(w[2], w[3], st.K[j])
        lo, hi = st.gfirst[j], st.gfirst[j + 1] - 1

        def bisect(_, lh):  # the first bucket of the group whose cumulative range exceeds r
            lo, hi = lh
            mid = (lo + hi) // 2
            right = st.cumk[mid] <= r
            return jnp.where(right, mid + 1, lo), jnp.where(right, hi, mid)

        b, _ = jax.lax.fori_loop(0, st.search_steps, bisect, (lo, hi))
        k_b = st.cumk[b] - jnp.where(b > st.gfirst[j], st.cumk[jnp.maximum(b - 1, 0)], 0)
        item = data["_glm_order"][st.bstart[b] + below(w[4], w[5], st.bcount[b])]
        rate = st.T[j] * k_b.astype(st.T.dtype) / (st.K[j].astype(st.T.dtype) * st.bcount[b].astype(st.T.dtype))
        return item, rate, j

    def _rem(self, data, e, ep, valid):
        """``idx -> R_i(e') - R_i(e)`` of rows ``idx``, computed in a ``lax.cond`` branch of its own on ``valid`` (a
        true predicate the compiler cannot fold, not batched over chains), so that its result is stored once and
        read by each use: XLA otherwise re-emits the family's series into every consumer fusion."""
        c = self._st().center

        def rem(idx):
            m, d, dp = _row_terms(data, idx, e, ep, c, self.fixed, self.group)
            return remainder_diff(self.family, m, d, dp)

        return lambda idx: jax.lax.cond(valid, rem, lambda i: jnp.full(i.shape, jnp.nan, e.dtype), idx)

    def _full(self, data, n, e, ep, go, valid):
        """The compensated sum of every row's remainder difference (a while loop with target 0 unless ``go``), in
        chunks of one size (one loop)."""
        from .acceptance.base import CompSum, StreamReader

        reader = StreamReader(n, 4096, self._rem(data, e, ep, valid), permuted=False, ladder_base=None,
                              stop_on_nonfinite=True)
        return reader.advance(None, CompSum.zero(e.dtype), jnp.where(go, n, 0))

    def step(self, key, model, values, aux, members, bstate, data, n):
        from .acceptance.base import draw_u
        from .acceptance.exact import exact_accept

        st = self._st()
        F, Gp = self.fixed, self.group
        h, e = values["hyper"], values[self.site]
        k_prop, k_dec = jax.random.split(key)
        P, mu = self._gaussian(model, h)
        ep = self._propose(k_prop, P, mu, e)
        lp, _ = _prior_fns(model)
        a, ap = e - st.center, ep - st.center
        dq = st.gl @ (ap - a) - 0.5 * arrow_quad(st.P, ap[F] + a[F], ap[Gp] + a[Gp], ap[F] - a[F], ap[Gp] - a[Gp])
        dg = 0.5 * arrow_quad(P, ep[F] + e[F] - 2 * mu[F], ep[Gp] + e[Gp] - 2 * mu[Gp], ep[F] - e[F], ep[Gp] - e[Gp])
        log_base = lp(h, ep) - lp(h, e) + dq + dg
        log_base = jnp.where(jnp.isnan(log_base), -jnp.inf, log_base)
        u, k_first, k_points = draw_u(k_dec)
        valid = data[DATA_KEYS[1]][0] >= 0  # (true: a predicate on the data, shared by the chains, see _once)
        if self.test == "exact":
            fallback, lam_go, mass = jnp.bool_(True), jnp.zeros((), e.dtype), None
        else:
            phi, tmax = self._phi(e, ep)
            mass = phi * st.T
            lam_total = jnp.sum(mass)
            fallback = ~(lam_total <= max(64.0, n / 4.0))
            if self.family == "poisson":  # outside the trust region the rates do not bound: every row decides
                fallback = fallback | ~(tmax <= self.radius)
            go = (jnp.log(u) < log_base) & ~fallback
            lam_go = jnp.where(go, lam_total, jnp.zeros((), e.dtype))  # (no point unless the thinning decides)
        thin_ok, touched, rounds = self._thin(k_first, k_points, lam_go, mass, phi if mass is not None else None,
                                              data, e, ep, valid)
        full = fallback & jnp.isfinite(log_base)
        acc = self._full(data, n, e, ep, full, valid)
        full_ok = full & (acc.nonfinite == 0) & exact_accept("metropolis", u, log_base, (acc.hi, acc.lo))
        accept = jnp.where(fallback, full_ok, (jnp.log(u) < log_base) & thin_ok)
        new = jnp.where(accept, ep, e)
        info = BlockInfo(touched + acc.read, jnp.int32(1), accept.astype(jnp.int32))
        return {**values, self.site: new}, aux, members, bstate, info

    def _thin(self, k_first, key, lam_go, mass, phi, data, e, ep, valid):
        """SMH Alg. 2 on the per-group process of total rate ``lam_go`` (0: no point), its points met by their
        arrival times (see the module): ``(no point kept, rows read, rounds)``."""
        from .acceptance.base import df_add

        z = jnp.zeros((), jnp.int32)
        if mass is None:
            return jnp.bool_(True), z, z
        m = int(self.chunk)
        cum = jnp.cumsum(mass)
        lam_total = cum[-1]
        rem = self._rem(data, e, ep, valid)
        dtype = e.dtype

        def cond(s):
            hi, lo, rejected, _, _, _ = s
            return ((hi - lam_go) + lo < 0) & ~rejected

        def body(s):
            hi, lo, rejected, k, touched, rounds = s
            k, k1 = jax.random.split(k)
            w = jax.random.bits(k1, (10, m), jnp.uint32)  # (one hash: the points' words, the thinning's, the gaps')
            idx, rate, j = self._draw(w[:6], cum, lam_total, m, data)
            u2 = jnp.stack([_unit(w[6], w[7], dtype), _unit(w[8], w[9], dtype)])
            gaps = -jnp.log1p(-u2[1])
            ahead = jnp.cumsum(gaps) - gaps  # lane j's arrival: T + gaps[0] + ... + gaps[j-1]
            live = (hi - lam_go) + (lo + ahead) < 0
            dr = rem(idx)
            bad = live & ~jnp.isfinite(dr)
            lam_i = phi[j] * rate  # (positive for a drawn point; a rounding edge that lands on a zero rate: no point)
            p = jnp.where(live & ~bad & (lam_i > 0), jnp.maximum(-dr, 0.0) / jnp.where(lam_i > 0, lam_i, 1.0), 0.0)
            kept = (u2[0] < p) | bad
            hi, lo = df_add((hi, lo), (jnp.sum(gaps), jnp.zeros((), dtype)))
            return hi, lo, rejected | jnp.any(kept), k, touched + m, rounds + 1

        t1 = jax.random.exponential(k_first, (), dtype)
        _, _, rejected, _, touched, rounds = jax.lax.while_loop(
            cond, body, (t1, jnp.zeros((), dtype), jnp.bool_(False), key, z, z))
        return ~rejected, touched, rounds
