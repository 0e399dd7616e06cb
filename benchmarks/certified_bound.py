"""How often a deterministic bound on the Taylor remainders would settle an exact MH decision unread.

The measurement behind ``tallmh.certify`` (which adds a second, Hoelder-type bound and the float rounding margins,
and uses it in the self-audit; ``benchmarks/certified_audit.py`` measures that): for logistic regression the
per-item log-likelihood ``l_i(theta) = y_i z_i - softplus(z_i)``, ``z_i = x_i . theta``, has ``|d^3 l_i / d z^3| <=
M3 = 1 / (6 sqrt 3)``, so the second-order Taylor expansion at the centre ``c`` (the control variates' proxy) leaves
a remainder with ``|R_i(theta)| <= M3 / 6 |x_i . (theta - c)|^3``. With ``A A^T`` the Laplace covariance, ``|x . v|
<= ||A^T x|| ||A^{-1} v||``, so the whole-data remainder of ``Lambda = sum_i l_i(theta') - l_i(theta)`` is at most
``B = M3 / 6 (||A^{-1}(theta' - c)||^3 + ||A^{-1}(theta - c)||^3) S3`` with ``S3 = sum_i ||A^T x_i||^3`` (one pass
at set-up). Where ``|log u - P| > B`` (``P`` the proxy's difference, exact from the sums), the exact decision is
known without reading an item; only the rest need the full pass (the self-audit's cost at large N).

For each N (``time_to_trusted.make_data``: d = 11, feature scales 0.1 to 10; c the float64 MAP) the script
draws pairs ``theta ~ N(c, A A^T)``, ``theta' = theta + 2.38 / sqrt(d) A z`` and prints: the actual remainder
``Lambda - P`` (exact, float64) against ``B`` on ``--exact-pairs`` pairs (every one must lie within it), and the
fraction of ``--pairs`` decisions with ``|log u - Lambda| > B`` (``Lambda`` by its Gaussian approximation).

    python benchmarks/certified_bound.py --sizes 1e5 1e6 1e7
"""

from __future__ import annotations

import sys

import numpy as np

import _common as C
from peers import newton_map
from time_to_trusted import PRIOR_SCALE, make_data

M3 = 1.0 / (6.0 * np.sqrt(3.0))  # sup |softplus'''| = sup |s (1 - s) (1 - 2 s)|, s the logistic function
BLOCK = 1 << 20


def main():
    ap = C.parser(__doc__, whole=True)
    ap.add_argument("--sizes", nargs="+", type=float, default=[1e5, 1e6, 1e7])
    ap.add_argument("--exact-pairs", type=int, default=40)
    ap.add_argument("--pairs", type=int, default=2000)
    C.add_run_options(ap, C.RESULTS, smoke_help="tiny run (seconds)")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.exact_pairs, args.pairs = [2e4], 5, 200
    meta = C.machine_info(sys.argv)
    C.header("certified Taylor bound: decisions settled without reading data", meta)
    rows = []
    for n in [int(s) for s in args.sizes]:
        X, y, _ = make_data(n)
        c, H, _ = newton_map(X, y, PRIOR_SCALE)
        A = np.linalg.cholesky(np.linalg.inv(H))
        Ai = np.linalg.inv(A)
        d = c.shape[0]
        y64 = y.astype(np.float64)
        s3, g, h = 0.0, np.zeros(d), np.zeros((d, d))
        for a in range(0, n, BLOCK):
            Xb = np.asarray(X[a:a + BLOCK], np.float64)
            s3 += float(np.sum(np.linalg.norm(Xb @ A, axis=1) ** 3))
            p = 1.0 / (1.0 + np.exp(-(Xb @ c)))
            g += Xb.T @ (y64[a:a + BLOCK] - p)
            h -= (Xb * (p * (1.0 - p))[:, None]).T @ Xb

        def log_lik(th):
            total = 0.0
            for a in range(0, n, BLOCK):
                z = np.asarray(X[a:a + BLOCK], np.float64) @ th
                total += float(np.sum(y64[a:a + BLOCK] * z - np.logaddexp(0.0, z)))
            return total

        rng = np.random.default_rng([args.seed, n])

        def pair():
            th = c + A @ rng.standard_normal(d)
            thp = th + (2.38 / np.sqrt(d)) * (A @ rng.standard_normal(d))
            ra, rb = np.linalg.norm(Ai @ (thp - c)), np.linalg.norm(Ai @ (th - c))
            return th, thp, M3 / 6.0 * (ra**3 + rb**3) * s3, -0.5 * (ra**2 - rb**2)

        rem, bnd = [], []
        for _ in range(args.exact_pairs):
            th, thp, b, _ = pair()
            va, vb = thp - c, th - c
            proxy = g @ (thp - th) + 0.5 * (va @ h @ va - vb @ h @ vb)
            rem.append(log_lik(thp) - log_lik(th) - proxy)
            bnd.append(b)
        rem, bnd = np.abs(np.array(rem)), np.array(bnd)
        settled = []
        for _ in range(args.pairs):
            _, _, b, lam = pair()
            settled.append(abs(np.log(rng.random()) - lam) > b)
        row = {"N": n, "S3": s3, "remainder_median": float(np.median(rem)), "remainder_max": float(rem.max()),
               "bound_median": float(np.median(bnd)), "all_within": bool(np.all(rem <= bnd)),
               "settled_fraction": float(np.mean(settled))}
        rows.append(row)
        print(f"N {n:.0e}: |Lambda - P| median {row['remainder_median']:.2e}, max {row['remainder_max']:.2e}; bound "
              f"median {row['bound_median']:.2e} (all within: {row['all_within']}); decisions settled unread: "
              f"{row['settled_fraction']:.3f}", flush=True)
    if args.out:
        C.write_json(args.out, "certified_bound" + ("_smoke" if args.smoke else "") + ".json",
                     {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
