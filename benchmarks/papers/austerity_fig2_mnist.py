"""Austerity paper Fig. 2 on MNIST 7 vs 9: data used and wrong decisions of the sequential t-test versus epsilon.

Korattikara, Chen & Welling (2014), Sec. 5.1, Fig. 2: logistic regression on the MNIST digits 7 and 9
(N = 12214 training images), dimension reduced from 784 to 50 by PCA, Gaussian prior, random-walk
proposal ``N(theta, sigma_RW^2)``; "average percentage of data used per test" and "percentage of wrong
accept-reject decisions" as functions of epsilon (epsilon = 0 is exact MH).

Data: the MNIST training files (``--mnist DIR``; by default ``<repo>/../shared/data/mnist``, or the
``TALLMH_MNIST`` environment variable), the images labelled 7 (y = 0) and 9 (y = 1): 6265 + 5949 = 12214,
the paper's N. Features: pixels / 255, centred, projected on the top 50 principal components (numpy
eigendecomposition of the 784 x 784 scatter matrix, i.e. the SVD of the centred data), each component
scaled to unit variance ("normalization", as the probabilistic-programs paper describes the same data),
plus an intercept column: d = 51. Prior: ``N(0, 0.1 I)`` (the probabilistic-programs paper, eq. 7, which
says it uses "the same parameter and data settings as in Korattikara et al."; the austerity paper only
says "Gaussian prior"): ``LogisticRegression(prior_scale=sqrt(0.1))``.

Pairs as a chain sees them: an exact-MH chain (``tm.sample`` with ``Exact()``, random walk with
covariance 2.38^2/d times the Laplace covariance, started at the MAP, 500 burn-in steps) gives the
current states theta (every ``--thin``-th draw, ``--pairs`` of them); the proposal is the paper's
isotropic random walk ``theta' = theta + sigma_RW z``. The paper does not give sigma_RW; we tune it
(bisection on log sigma) so that the mean exact acceptance probability ``min(1, e^Delta)`` over the pairs
is ``--target-accept`` (0.234). For each pair, ``--keys`` keys; for each key, ``Austerity(epsilon,
batch_size)`` and ``Exact()`` decide with the same u (the library's key contract: both draw u from the
same key), so a decision is wrong when they differ. The paper does not give its minibatch size either;
we use 500 (the probabilistic-programs paper: "We use a smaller mini-batch size of 100" than the
austerity paper's).

Reported per epsilon: data fraction (items read / N), wrong-decision rate with a binomial standard error
and a pair-clustered one (sd of the per-pair rates / sqrt(pairs); wrong decisions concentrate on pairs
near the decision boundary, so this is the honest one), wrong accepts and wrong rejects.

Usage::

    python benchmarks/papers/austerity_fig2_mnist.py [--mnist DIR]      # ~4 min on 2 cores
    python benchmarks/papers/austerity_fig2_mnist.py --smoke --out /tmp/x
"""

from __future__ import annotations

import gzip
import math
import os
import sys
import time

import numpy as np

import _common as C

FILES = {
    "images": ("train-images.idx3-ubyte.gz", "train-images-idx3-ubyte.gz", "train-images.idx3-ubyte",
               "train-images-idx3-ubyte"),
    "labels": ("train-labels.idx1-ubyte.gz", "train-labels-idx1-ubyte.gz", "train-labels.idx1-ubyte",
               "train-labels-idx1-ubyte"),
}
WHERE = """MNIST training files not found in {where}.
Put train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz (the '.idx3-ubyte.gz' spelling and
uncompressed files work too) in that folder, or pass --mnist DIR (or set TALLMH_MNIST=DIR). They are the
original files of LeCun, Cortes & Burges: http://yann.lecun.com/exdb/mnist/ , mirrored for example at
https://ossci-datasets.s3.amazonaws.com/mnist/ and https://storage.googleapis.com/cvdf-datasets/mnist/ ."""


def default_mnist_dir():
    env = os.environ.get("TALLMH_MNIST")
    if env:
        return env
    return os.path.normpath(os.path.join(C.REPO_ROOT, "..", "shared", "data", "mnist"))


def find_files(folder):
    found = {}
    for kind, names in FILES.items():
        for nm in names:
            p = os.path.join(folder, nm)
            if os.path.isfile(p):
                found[kind] = p
                break
    return found if len(found) == len(FILES) else None


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim).reshape(dims)


def mnist_7_vs_9(folder, n_components):
    files = find_files(folder)
    if files is None:
        return None
    images = read_idx(files["images"])
    labels = read_idx(files["labels"])
    keep = (labels == 7) | (labels == 9)
    X = images[keep].reshape(int(keep.sum()), -1).astype(np.float64) / 255.0
    y = (labels[keep] == 9).astype(np.float64)
    Xc = X - X.mean(axis=0)
    evals, evecs = np.linalg.eigh(Xc.T @ Xc)
    order = np.argsort(evals)[::-1][:n_components]
    Z = Xc @ evecs[:, order]
    Z /= Z.std(axis=0)
    explained = float(evals[order].sum() / evals.sum())
    return np.concatenate([np.ones((Z.shape[0], 1)), Z], axis=1), y, explained


def laplace(X, y, prior_var, iters=100):
    """MAP (Newton, float64) and the Hessian of the negative log posterior there (``pp_fig4`` uses it too)."""
    theta, H, _ = C.logistic_newton(X, y, prior_var, iters)
    return theta, H


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--mnist", default=None, help="folder with the MNIST training files (default: "
                    "$TALLMH_MNIST or <repo>/../shared/data/mnist)")
    ap.add_argument("--components", type=int, default=50)
    ap.add_argument("--epsilons", default="0,0.001,0.005,0.01,0.02,0.05,0.1,0.2")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--keys", type=int, default=120, help="keys (u and subsample order) per pair")
    ap.add_argument("--thin", type=int, default=25, help="chain steps between the pairs' current states")
    ap.add_argument("--target-accept", type=float, default=0.234)
    ap.add_argument("--prior-var", type=float, default=0.1)
    C.add_run_options(ap, C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    folder = os.path.abspath(args.mnist) if args.mnist else default_mnist_dir()
    if find_files(folder) is None:
        print(WHERE.format(where=folder), file=sys.stderr)
        return 2
    if args.smoke:
        args.components, args.pairs, args.keys, args.thin = 10, 3, 16, 5
        args.epsilons = "0,0.1"

    import jax.numpy as jnp

    import tallmh as tm

    t_start = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("austerity Fig. 2 on MNIST 7 vs 9: data used and wrong decisions vs epsilon", meta)
    X, y, explained = mnist_7_vs_9(folder, args.components)
    n, dim = X.shape
    if args.smoke:  # a subset keeps the smoke run to seconds
        X, y = X[:3000], y[:3000]
        n = X.shape[0]
    eps_list = [float(e) for e in args.epsilons.split(",")]
    model = tm.models.LogisticRegression(prior_scale=math.sqrt(args.prior_var))
    data = {"X": X.astype(np.float32), "y": y.astype(np.float32)}
    theta_map, H = laplace(X, y, args.prior_var)
    cov = np.linalg.inv(H)
    post_sd = np.sqrt(np.diag(cov))
    train_acc = float(np.mean((X @ theta_map > 0) == (y > 0.5)))
    print(f"# {folder}: N = {n} (7: {int((y < 0.5).sum())}, 9: {int((y > 0.5).sum())}), {args.components} PCs "
          f"({100 * explained:.1f}% of the pixel variance) + intercept; MAP training accuracy {100 * train_acc:.2f}%; "
          f"Laplace posterior sd mean {post_sd.mean():.3g} (min {post_sd.min():.3g}, max {post_sd.max():.3g})", flush=True)

    # current states from an exact-MH chain
    tc = time.perf_counter()
    chain = tm.sample(model, data, test=tm.acceptance.Exact(),
                      proposal=tm.proposals.RandomWalk((2.38**2 / dim) * cov), num_samples=args.pairs * args.thin,
                      num_warmup=500 if not args.smoke else 20, num_chains=1, seed=args.seed,
                      init=jnp.asarray(theta_map, jnp.float32), progress=False)
    thetas = np.asarray(chain.samples, np.float64)[0, args.thin - 1:: args.thin][: args.pairs]
    chain_s = time.perf_counter() - tc
    chain_acc = float(np.mean(chain.stats["accepted"]))
    rng = np.random.default_rng(args.seed + 1)
    zs = rng.standard_normal(thetas.shape)
    sigma, deltas = C.tune_rw_sigma(X, y, thetas, zs, args.prior_var, args.target_accept,
                                    1e-3 * post_sd.min(), 10 * post_sd.max())
    props = thetas + sigma * zs
    dlt = deltas(sigma)
    exact_prob = np.exp(np.minimum(0.0, dlt))
    print(f"# exact-MH reference chain: {args.pairs * args.thin} steps, acceptance {chain_acc:.3f}, {chain_s:.1f}s; "
          f"pairs: every {args.thin}th draw; sigma_RW = {sigma:.4g} ({sigma / post_sd.mean():.2f} x mean posterior sd) "
          f"for exact acceptance {exact_prob.mean():.3f}", flush=True)

    run = C.pair_decisions(tm, model, data, thetas, props, args.seed, args.keys)
    te = time.perf_counter()
    exact_acc, exact_nd = run(tm.acceptance.Exact())
    exact_s = time.perf_counter() - te
    rows = []
    for eps in eps_list:
        tr = time.perf_counter()
        if eps == 0.0:
            acc, nd, test_repr, secs = exact_acc, exact_nd, "Exact() (epsilon = 0 is exact MH)", exact_s
        else:
            test = tm.acceptance.Austerity(epsilon=eps, batch_size=args.batch_size)
            acc, nd = run(test)
            test_repr, secs = repr(test), time.perf_counter() - tr
        core, per_pair = C.wrong_decisions(acc, nd, exact_acc, n)
        p = core["wrong_rate"]
        row = {"epsilon": eps, "test": test_repr, **core, "pairs_with_any_wrong": float(np.mean(per_pair > 0)),
               "seconds": secs}
        rows.append(row)
        print(f"  eps {eps:<6g} data {100 * row['data_fraction']:7.2f}%  wrong {100 * p:6.3f}% (pair-clustered se "
              f"{100 * row['wrong_rate_pair_clustered_se']:.3f}%)  accept {row['acceptance_rate']:.3f}  {secs:.1f}s", flush=True)

    total = time.perf_counter() - t_start
    print()
    pc = C.percent
    C.print_table(rows, [("epsilon", "8g", "epsilon"), ("data %", "8.2f", pc("data_fraction")),
                         ("wrong %", "8.3f", pc("wrong_rate")), ("binom se", "8.3f", pc("wrong_rate_binomial_se")),
                         ("pair se", "8.3f", pc("wrong_rate_pair_clustered_se")),
                         ("wrong acc", "9.3f", pc("wrong_accept_rate")), ("wrong rej", "9.3f", pc("wrong_reject_rate")),
                         ("accept", "7.3f", "acceptance_rate")])
    print(f"(exact acceptance over the same keys {exact_acc.mean():.3f}; {args.pairs} pairs x {args.keys} keys; "
          f"batch {args.batch_size})")
    print(f"\ntotal runtime {total:.1f}s", flush=True)

    out = {
        "benchmark": "austerity_fig2_mnist",
        "meta": meta,
        "config": {"mnist_dir": folder, "N": n, "components": args.components, "explained_variance": explained,
                   "d": dim, "prior": f"N(0, {args.prior_var} I)", "epsilons": eps_list, "batch_size": args.batch_size,
                   "pairs": args.pairs, "keys_per_pair": args.keys, "thin": args.thin,
                   "pairs_from": "theta: exact-MH chain (RW, 2.38^2/d Laplace cov) every thin-th draw; theta' = theta + sigma z",
                   "rw_sigma": sigma, "target_accept": args.target_accept,
                   "tuned_exact_acceptance_probability": float(exact_prob.mean()),
                   "reference_chain_acceptance": chain_acc, "map_train_accuracy": train_acc,
                   "posterior_sd_mean": float(post_sd.mean()), "seed": args.seed, "smoke": args.smoke},
        "pairs_summary": {"delta_quantiles": {q: float(np.quantile(dlt, float(q))) for q in ("0.05", "0.25", "0.5", "0.75", "0.95")}},
        "rows": rows,
        "total_runtime_s": total,
    }
    C.write_json(args.out, "austerity_fig2_mnist.json", out)

    e = np.array([r["epsilon"] for r in rows])
    frac = np.array([100 * r["data_fraction"] for r in rows])
    wr = np.array([100 * r["wrong_rate"] for r in rows])
    wse = np.array([100 * r["wrong_rate_pair_clustered_se"] for r in rows])
    fig, ax1 = C.figure(figsize=(5.8, 4.2))
    ax1.plot(e, frac, "o-", color="tab:blue")
    ax1.set_xlabel(r"$\epsilon$")
    ax1.set_ylabel("percentage of data used", color="tab:blue")
    ax1.tick_params(axis="y", labelcolor="tab:blue")
    ax1.set_ylim(0, 105)
    ax2 = ax1.twinx()
    ax2.errorbar(e, wr, yerr=2 * np.nan_to_num(wse), fmt="s-", color="tab:red", capsize=3)
    ax2.set_ylabel("percentage of wrong decisions (±2 se, pair-clustered)", color="tab:red")
    ax2.tick_params(axis="y", labelcolor="tab:red")
    ax2.set_ylim(0, max(1.0, 1.15 * float(np.max(wr + 2 * np.nan_to_num(wse)))))
    ax1.set_title(f"Austerity Fig. 2, MNIST 7 vs 9: N = {n}, {args.components} PCs + intercept, batch {args.batch_size}\n"
                  f"{args.pairs} pairs x {args.keys} keys, sigma_RW tuned to exact acceptance {exact_prob.mean():.2f}",
                  fontsize=9)
    C.finish_figure(fig, args.out, "austerity_fig2_mnist.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
