#!/usr/bin/env python
"""Build the correction distribution ``X_corr`` of the minibatch Barker test.

Seita, Pan, Chen, Canny (2017), "An Efficient Minibatch Acceptance Test for Metropolis-Hastings",
Section 4 ("Correction distribution"), eq. 12-15 and Table 1
(``../shared/papers/minibatch-barker-test-seita-et-al-2017.md``).

The test of eq. 13 needs ``X_corr`` such that ``X_norm + X_corr`` with ``X_norm ~ N(0, sigma^2)`` is
(approximately) standard logistic, ``X_log`` with CDF ``S(x) = 1 / (1 + exp(-x))`` (eq. 12). Eq. 14 asks
for the correction density ``C_sigma`` minimising ``|Phi_sigma * C_sigma - S|``. Following Section 4 we
discretise: ``Y_j = j V/N`` for ``j = -N..N`` (support of ``X_corr``), ``X_i = i V/N`` for ``i = -2N..2N``
(fitting points), ``M_ij = Phi((X_i - Y_j) / sigma)``, ``v_i = S(X_i)``, so that ``(M u)_i`` is the CDF of
``X_norm + X_corr`` at ``X_i`` when ``X_corr`` puts mass ``u_j`` on ``Y_j``.

Two solvers of the same objective (eq. 15), ``min_u ||M u - v||_2^2 + lam ||u||_2^2``:

* ``ridge`` -- the paper's procedure: the unconstrained solution of the normal equations
  ``u* = (M^T M + lam I)^{-1} M^T v`` (float64, Cholesky), then negative weights clipped to 0 and the rest
  renormalised to sum 1 ("removal of those leads to small error", Sec. 4). This reproduces Table 1
  (sigma 0.9 -> ~1e-4, sigma 0.8 -> ~5e-6) but at sigma = 1 the clipped negative mass limits the error
  to about 5e-4.
* ``nnls`` -- the same objective with the constraint ``u >= 0`` that Sec. 4 states for the discretised
  problem imposed exactly (scipy's non-negative least squares on the augmented system
  ``[M; sqrt(lam) I] u ~ [v; 0]``), then renormalised. At sigma = 1, lam = 0 it gives a sparse table
  (about 50 atoms) with L_inf error about 7e-8, i.e. close to single precision.

For each candidate the error is measured AFTER clipping/renormalising, as
``max_x |sum_j p_j Phi((x - Y_j)/sigma) - S(x)|`` on a fine grid over [-40, 40] (step 0.005, i.e. also
between the fitting points). The script prints a (method, sigma, lam, V, N, L_inf) table for
sigma in {1.0, 0.9, 0.8} (plus ``--sigma``), keeps the best candidate for ``--sigma``, drops zero-weight
atoms and writes an ``.npz`` with ``values`` (support points, ascending), ``probs`` (weights summing to 1)
and the scalars ``sigma``, ``lam``, ``V``, ``ngrid``, ``linf_error``, ``method``.

Note that ``lam`` is grid dependent: for a fixed continuous density ``u_j ~ C(Y_j) V/N``, so the same
effective regularisation corresponds to ``lam (V/N)^2`` = const (the paper used N = 4000 with an
unstated V, so its lam values are not directly comparable with ours at N = 1000).

Usage::

    python scripts/make_barker_correction.py [--sigma 1.0] [--lam LAM] [--method auto|ridge|nnls] [--out PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from scipy.linalg import solve
from scipy.optimize import nnls
from scipy.special import expit, ndtr

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "tallmh" / "acceptance" / "barker_correction.npz"

# Grid settings (V, N) per method. The ridge solution is spread over many atoms and its error is set by the
# clipped negative mass, not by the grid; N = 1000 (spacing 0.02) is ample and keeps M^T M small.
# NNLS is insensitive to N (N = 200, 400, 800 give the same error) and fast at N = 200 (spacing 0.1).
RIDGE_GRID = (20.0, 1000)
NNLS_GRID = (20.0, 200)
RIDGE_LAMS = (1e-3, 1e-2, 0.1, 0.3, 0.5, 1.0, 3.0)
NNLS_LAMS = (0.0, 1e-8, 1e-6)
SWEEP_SIGMAS = (1.0, 0.9, 0.8)
EVAL_X = np.linspace(-40.0, 40.0, 16001)  # step 0.005


class Candidate(NamedTuple):
    method: str
    sigma: float
    lam: float
    V: float
    ngrid: int
    values: np.ndarray
    probs: np.ndarray
    raw_linf: float  # max_i |(M u)_i - v_i| on the fitting grid before clipping
    neg_mass: float  # total negative weight removed by clipping
    linf_error: float  # after clipping/renormalising, on EVAL_X


def grids(V: float, ngrid: int) -> tuple[np.ndarray, np.ndarray]:
    """Fitting points ``X_i = i V/N`` (i = -2N..2N) and support ``Y_j = j V/N`` (j = -N..N), Sec. 4."""
    h = V / ngrid
    x = np.arange(-2 * ngrid, 2 * ngrid + 1) * h
    y = np.arange(-ngrid, ngrid + 1) * h
    return x, y


def design_matrix(x: np.ndarray, y: np.ndarray, sigma: float) -> np.ndarray:
    """``M_ij = Phi((X_i - Y_j) / sigma)`` (Sec. 4, below eq. 14)."""
    return ndtr((x[:, None] - y[None, :]) / sigma)


def mixture_cdf(x: np.ndarray, values: np.ndarray, probs: np.ndarray, sigma: float, chunk: int = 4096) -> np.ndarray:
    """CDF of ``N(0, sigma^2) + X_corr`` with ``X_corr`` the point masses ``probs`` at ``values``."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for s in range(0, x.size, chunk):
        out[s : s + chunk] = ndtr((x[s : s + chunk, None] - values[None, :]) / sigma) @ probs
    return out


def linf_error(values: np.ndarray, probs: np.ndarray, sigma: float, x: np.ndarray = EVAL_X) -> float:
    return float(np.max(np.abs(mixture_cdf(x, values, probs, sigma) - expit(x))))


def clip_renormalise(y: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Clip negative weights to 0, drop zero-weight atoms, renormalise to sum 1 (Sec. 4)."""
    neg = float(u[u < 0].sum())
    w = np.clip(u, 0.0, None)
    keep = w > 0
    values, probs = y[keep], w[keep]
    return values, probs / probs.sum(), neg


def _finish(method, sigma, lam, V, ngrid, y, u, raw) -> Candidate:
    values, probs, neg = clip_renormalise(y, u)
    return Candidate(method, sigma, lam, V, ngrid, values, probs, raw, neg, linf_error(values, probs, sigma))


def ridge_candidates(sigma: float, lams, V: float, ngrid: int) -> list[Candidate]:
    """Paper's eq. 15 via the normal equations ``(M^T M + lam I) u = M^T v``, then clip + renormalise."""
    x, y = grids(V, ngrid)
    m = design_matrix(x, y, sigma)
    v = expit(x)
    a, b = m.T @ m, m.T @ v
    eye = np.eye(y.size)
    out = []
    for lam in lams:
        u = solve(a + lam * eye, b, assume_a="pos")
        out.append(_finish("ridge", sigma, lam, V, ngrid, y, u, float(np.max(np.abs(m @ u - v)))))
    return out


def nnls_candidates(sigma: float, lams, V: float, ngrid: int) -> list[Candidate]:
    """Eq. 15 with the constraint ``u >= 0`` of Sec. 4 imposed exactly (NNLS on ``[M; sqrt(lam) I]``)."""
    x, y = grids(V, ngrid)
    m = design_matrix(x, y, sigma)
    v = expit(x)
    out = []
    for lam in lams:
        if lam > 0:
            a = np.vstack([m, np.sqrt(lam) * np.eye(y.size)])
            b = np.concatenate([v, np.zeros(y.size)])
        else:
            a, b = m, v
        u, _ = nnls(a, b, maxiter=50 * y.size)
        out.append(_finish("nnls", sigma, lam, V, ngrid, y, u, float(np.max(np.abs(m @ u - v)))))
    return out


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sigma", type=float, default=1.0, help="sd of X_norm the table is built for (default 1.0)")
    p.add_argument("--lam", type=float, default=None, help="only try this regularisation lam (default: sweep)")
    p.add_argument(
        "--method",
        choices=("auto", "ridge", "nnls"),
        default="auto",
        help="ridge: paper's normal equations + clipping; nnls: same objective with u >= 0; "
        "auto (default): try both and keep the smaller L_inf error",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output .npz (default {DEFAULT_OUT})")
    return p.parse_args(argv)


def main(argv=None) -> Candidate:
    args = parse_args(argv)
    t0 = time.perf_counter()
    methods = ("ridge", "nnls") if args.method == "auto" else (args.method,)
    sigmas = list(SWEEP_SIGMAS) + ([args.sigma] if args.sigma not in SWEEP_SIGMAS else [])

    cands: list[Candidate] = []
    for sigma in sigmas:
        if "ridge" in methods:
            lams = RIDGE_LAMS if args.lam is None else (args.lam,)
            cands += ridge_candidates(sigma, lams, *RIDGE_GRID)
        if "nnls" in methods:
            lams = NNLS_LAMS if args.lam is None else (args.lam,)
            cands += nnls_candidates(sigma, lams, *NNLS_GRID)

    print("L_inf = max over x in [-40, 40] (step 0.005) of |CDF(X_norm + X_corr) - S(x)|, after clipping")
    print(f"{'method':<6} {'sigma':>5} {'lambda':>8} {'V':>5} {'N':>5} {'raw fit':>9} {'neg mass':>9} {'atoms':>6} {'L_inf':>9}")
    for c in cands:
        print(
            f"{c.method:<6} {c.sigma:5.2f} {c.lam:8.1e} {c.V:5.1f} {c.ngrid:5d} {c.raw_linf:9.2e} "
            f"{c.neg_mass:9.1e} {c.values.size:6d} {c.linf_error:9.2e}"
        )
    for sigma in sigmas:
        for method in methods:
            sub = [c for c in cands if c.sigma == sigma and c.method == method]
            b = min(sub, key=lambda c: c.linf_error)
            print(f"best {method:<5} sigma={sigma:.2f}: lambda={b.lam:.1e} L_inf={b.linf_error:.2e}")

    best = min((c for c in cands if c.sigma == args.sigma), key=lambda c: c.linf_error)
    order = np.argsort(best.values, kind="stable")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out,
        values=best.values[order].astype(np.float64),
        probs=best.probs[order].astype(np.float64),
        sigma=np.float64(best.sigma),
        lam=np.float64(best.lam),
        V=np.float64(best.V),
        ngrid=np.int64(best.ngrid),
        linf_error=np.float64(best.linf_error),
        method=np.str_(best.method),
    )
    print(
        f"wrote {args.out} ({args.out.stat().st_size} bytes): method={best.method} sigma={best.sigma} "
        f"lambda={best.lam:g} V={best.V:g} N={best.ngrid} atoms={best.values.size} L_inf={best.linf_error:.2e} "
        f"[{time.perf_counter() - t0:.1f} s]"
    )
    return best


if __name__ == "__main__":
    main()
