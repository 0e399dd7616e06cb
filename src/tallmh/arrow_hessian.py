"""The log-likelihood's Hessian of a group-level model from a few Hessian-vector products (its arrow shape).

In a model whose rows each read one level of every group term (``y ~ x + (1|g)``: row ``i`` reads the fixed
effects, the group scale where the term is written ``offset * sigma``, and the effect of its own level
``g_i``), the Hessian of ``sum_i log p(y_i | theta)`` is *arrow-shaped*: the "dense" coordinates (fixed effects,
scales) have entries with every coordinate, and among the group coordinates only those of the same level are
coupled (a diagonal block per term, and a level's entries across terms of the same grouping). Such a Hessian
is known exactly from ``p + K`` Hessian-vector products, where ``p`` is the number of dense coordinates and
``K`` the number of group terms (a product along the unit vector of each dense coordinate gives its column;
one along the sum of a term's unit vectors gives, on each level, that level's entries with the term), instead
of the ``d = p + sum_k G_k`` products of the dense Hessian (``jax.hessian``: at 1,004 parameters ~1 minute a
Newton pass on 65,536 rows; by this ~1 s).

Whether the structure holds is checked, not assumed: one more product along a random Gaussian direction
``r`` must equal the assembled Hessian times ``r`` to float rounding, entry by entry (a model whose rows read
two crossed groupings, or any other coupling between levels, fails it; the caller then computes the dense
Hessian). The Hessian-vector products are forward-over-reverse derivatives (Pearlmutter, "Fast exact
multiplication by the Hessian", Neural Computation 6, 1994), each a few evaluations of the chunk's rows.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from .cache_keys import shape_key, value_key

ARROW_RTOL = {4: 1e-3, 8: 1e-8}  # the check's relative tolerance per entry, by the float size in bytes


class ArrowSpec(NamedTuple):
    """Positions in the flat parameter: ``dense`` (fixed effects, scales) and ``groups`` (one int array per
    group term, its levels' positions in level order)."""
    dense: np.ndarray
    groups: tuple

    @classmethod
    def of(cls, d: int, groups: Sequence) -> "ArrowSpec":
        groups = tuple(np.asarray(b, np.int64).reshape(-1) for b in groups)
        is_g = np.zeros(d, bool)
        for b in groups:
            is_g[b] = True
        return cls(np.flatnonzero(~is_g), groups)

    def worth(self, d: int) -> bool:
        """Whether the products are fewer than a dense Hessian's (with a margin: the dense one is one program)."""
        return bool(self.groups) and 2 * (self.dense.size + len(self.groups) + 1) < d


def directions(d: int, spec: ArrowSpec, dtype, seed: int = 3) -> np.ndarray:
    """``(d, p + K + 1)``: the dense coordinates' unit vectors, each group term's sum of unit vectors, and the
    check's random direction."""
    v = np.zeros((d, spec.dense.size + len(spec.groups) + 1), np.float64)
    v[spec.dense, np.arange(spec.dense.size)] = 1.0
    for k, b in enumerate(spec.groups):
        v[b, spec.dense.size + k] = 1.0
    v[:, -1] = np.random.default_rng(seed).standard_normal(d)
    return v.astype(dtype)


def chunk_vghv(model, unravel):
    """``f(t0, dirs, batch, mask) -> (value, gradient, Hessian @ dirs)`` of the chunk's log-likelihood sum."""

    def f(t0, dirs, batch, mask):
        def total(t):
            return jnp.sum(jnp.where(mask, model.log_lik(unravel(t), batch), 0.0))

        v, g = jax.value_and_grad(total)(t0)
        hv = jax.vmap(lambda u: jax.jvp(jax.grad(total), (t0,), (u,))[1], in_axes=1, out_axes=1)(dirs)
        return v, g, hv

    return f


def chunk_hv(model, unravel):
    """``f(t0, dirs, batch, mask) -> Hessian @ dirs`` of the chunk's log-likelihood sum (no value, no gradient)."""

    def f(t0, dirs, batch, mask):
        def total(t):
            return jnp.sum(jnp.where(mask, model.log_lik(unravel(t), batch), 0.0))

        return jax.vmap(lambda u: jax.jvp(jax.grad(total), (t0,), (u,))[1], in_axes=1, out_axes=1)(dirs)

    return f


def assemble(hv: np.ndarray, spec: ArrowSpec) -> np.ndarray:
    """The dense ``(d, d)`` Hessian from the products ``hv = H @ directions(...)`` under the arrow structure."""
    hv = np.asarray(hv, np.float64)
    d = hv.shape[0]
    p = spec.dense.size
    h = np.zeros((d, d), np.float64)
    cols = hv[:, :p]
    h[:, spec.dense] = cols
    h[spec.dense, :] = cols.T
    h[np.ix_(spec.dense, spec.dense)] = 0.5 * (cols[spec.dense] + cols[spec.dense].T)
    for k, bk in enumerate(spec.groups):
        col = hv[:, p + k]
        for bm in spec.groups:
            if bm.size == bk.size:  # a level's entries with the same level of a term of the same grouping
                h[bm, bk] = col[bm]
    return h


def check(h: np.ndarray, hv: np.ndarray, dirs: np.ndarray) -> float:
    """The largest relative difference, entry by entry, between the product along the check direction and the
    assembled Hessian times it (relative to ``|H| |r|`` of that entry)."""
    r = np.asarray(dirs[:, -1], np.float64)
    got = np.asarray(hv[:, -1], np.float64)
    want = h @ r
    scale = np.abs(h) @ np.abs(r)
    tiny = 1e-30 + 1e-12 * float(np.max(scale, initial=0.0))
    return float(np.max(np.abs(got - want) / (scale + tiny), initial=0.0))


def holds(h, hv, dirs) -> bool:
    """Whether the arrow structure holds to the float rounding of the products' dtype."""
    return check(h, hv, dirs) <= ARROW_RTOL.get(np.dtype(dirs.dtype).itemsize, 1e-3)


def group_diagonal(full_pass, model, data, n, unravel, th, spec: ArrowSpec, desc="tallmh: information pass"):
    """The likelihood Hessian's diagonal at the group coordinates over all ``n`` rows (float64, length ``d``,
    zero elsewhere): one product a group term a row (the structure is the caller's to have checked);
    ``full_pass`` is :func:`tallmh.setup_passes.full_pass`."""
    d = int(th.shape[0])
    dirs = directions(d, spec, np.asarray(th).dtype)[:, spec.dense.size:spec.dense.size + len(spec.groups)]
    key = (value_key(model), shape_key(unravel(th)), "arrow-hv")
    fn = _FNS.get(key)
    if fn is None:
        fn = _cache(key, chunk_hv(model, unravel))
    total = np.zeros((d, dirs.shape[1]), np.float64)
    for part in full_pass(fn, data, n, (th, jnp.asarray(dirs)), desc):
        total += np.asarray(part, np.float64)
    out = np.zeros(d, np.float64)
    for k, b in enumerate(spec.groups):
        out[b] = total[b, k]
    return out


_FNS: dict = {}  # the compiled passes find their programs again through these functions' identity


def _cache(key, fn):
    if len(_FNS) >= 8:
        _FNS.pop(next(iter(_FNS)))
    _FNS[key] = fn
    return fn


class ArrowDerivs:
    """The value, gradient and arrow-assembled Hessian of the log-likelihood sum for :func:`tallmh.setup_passes._newton`,
    with the structure checked on every pass; ``ok`` turns False (and stays) where a check fails, and the
    caller computes the dense Hessian from then on. ``full_pass`` is :func:`tallmh.setup_passes.full_pass`."""

    def __init__(self, full_pass, model, unravel, th, spec: ArrowSpec):
        self.full_pass = full_pass
        self.spec = spec
        self.dirs = jnp.asarray(directions(int(th.shape[0]), spec, np.asarray(th).dtype))
        key = (value_key(model), shape_key(unravel(th)), "arrow")
        fn = _FNS.get(key)
        if fn is None:
            fn = _cache(key, chunk_vghv(model, unravel))
        self.fn = fn
        self.ok = True
        self.worst = 0.0

    def __call__(self, data, n, t0, desc):
        """``(value, gradient, Hessian)`` or None where the structure does not hold at ``t0``."""
        d = int(t0.shape[0])
        v, g, hv = 0.0, np.zeros(d, np.float64), np.zeros((d, self.dirs.shape[1]), np.float64)
        for cv, cg, ch in self.full_pass(self.fn, data, n, (t0, self.dirs), desc):
            v += float(cv)
            g = g + np.asarray(cg, np.float64)
            hv = hv + np.asarray(ch, np.float64)
        h = assemble(hv, self.spec)
        self.worst = max(self.worst, check(h, hv, np.asarray(self.dirs)))
        if not holds(h, hv, np.asarray(self.dirs)):
            self.ok = False
            return None
        return v, g, h
