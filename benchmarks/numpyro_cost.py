"""Cost of the NumPyro front end: the same model through ``tm.from_numpyro`` and written as a ``tm.Model``.

The target: a model through the front end should step within 2x the time of the same model
written by hand, and still read O(batch) items per step. The model is Bayesian logistic regression with
a ``N(0, prior_scale^2 I)`` prior (the probabilistic-programs paper's BayesLR, eq. 7):

- hand-written: ``tm.models.LogisticRegression(prior_scale)``;
- NumPyro: ``w ~ Normal(0, prior_scale).expand([d]).to_event(1)``; ``y ~ Bernoulli(logits=X @ w)`` in
  ``numpyro.plate("data", N)``, through ``tm.from_numpyro``.

Both run the same chains (same data, seed, proposal ``RandomWalk(--sd)`` from the same start, fixed
chunk size) with ``Exact()`` and ``Austerity(epsilon, batch)``. Reported per model and test: seconds
per step in the sampling phase (best of ``--repeats`` runs, the two models alternated on the same
machine), mean items read per step, acceptance, compile and set-up seconds, and whether the two chains
took the same decisions (they should, up to float rounding of the log-likelihoods). Also the time of one
jitted per-item log-likelihood call on a batch (``--batch`` rows).

Usage::

    python benchmarks/numpyro_cost.py                 # ~2-3 min on 2 shared cores
    python benchmarks/numpyro_cost.py --smoke
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    C.add_options(ap, n=100_000, d=10, prior_scale=1.0, sd=0.01, epsilon=0.05, batch=500, steps=2000, exact_steps=200,
                      chains=1, repeats=3)
    C.add_run_options(ap, C.RESULTS, seed=False)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.n, args.steps, args.exact_steps, args.repeats = 5000, 200, 50, 1

    import logging
    import warnings

    warnings.simplefilter("ignore")  # short fixed-chunk chains: trust warnings are expected and not the point
    logging.getLogger("arviz").setLevel(logging.ERROR)
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    import tallmh as tm

    t_start = time.perf_counter()
    data0, w_true = tm.models.LogisticRegression.simulate(args.n, d=args.d - 1, seed=0)
    X, y = np.asarray(data0["X"]), np.asarray(data0["y"])
    d = X.shape[1]

    def logreg(X, y):
        w = numpyro.sample("w", dist.Normal(0.0, args.prior_scale).expand([X.shape[1]]).to_event(1))
        with numpyro.plate("data", X.shape[0]):
            numpyro.sample("y", dist.Bernoulli(logits=X @ w), obs=y)

    tb = time.perf_counter()
    np_model, np_data = tm.from_numpyro(logreg, X, y)
    build_s = time.perf_counter() - tb
    hand = tm.models.LogisticRegression(prior_scale=args.prior_scale)
    hand_data = {"X": jnp.asarray(X), "y": jnp.asarray(y)}
    start = jnp.asarray(w_true, jnp.float32)
    meta = C.machine_info(argv, numpyro_version=numpyro.__version__)
    C.header(f"numpyro_cost: logistic regression N = {args.n}, d = {d}; from_numpyro took {build_s:.2f}s", meta)

    # per-item log-likelihood of one batch (jitted), both models
    rows = np.arange(args.batch)
    bh = {"X": hand_data["X"][rows], "y": hand_data["y"][rows]}
    bn = {"X": jnp.asarray(X[rows]), "y": jnp.asarray(y[rows])}
    fh = jax.jit(hand.log_lik)
    fn = jax.jit(np_model.log_lik)
    th_h, th_n = start, {"w": start}
    np.testing.assert_allclose(np.asarray(fh(th_h, bh)), np.asarray(fn(th_n, bn)), rtol=1e-4, atol=1e-5)

    def per_call(f, th, b, reps=2000):
        jax.block_until_ready(f(th, b))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                out = f(th, b)
            jax.block_until_ready(out)
            best = min(best, (time.perf_counter() - t0) / reps)
        return best

    ll_s = {"hand": per_call(fh, th_h, bh), "numpyro": per_call(fn, th_n, bn)}
    print(f"  log_lik on {args.batch} rows (jitted call): hand {1e6 * ll_s['hand']:.1f} us, numpyro "
          f"{1e6 * ll_s['numpyro']:.1f} us (ratio {ll_s['numpyro'] / ll_s['hand']:.2f})", flush=True)

    tests = {"exact": (tm.acceptance.Exact(), args.exact_steps),
             "austerity": (tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch), args.steps)}
    rows_out = []
    for tname, (test, steps) in tests.items():
        best = {}
        keep = {}
        for rep in range(args.repeats):
            for mname, (model, data, init) in (("hand", (hand, hand_data, start)),
                                               ("numpyro", (np_model, np_data, {"w": start}))):
                r = tm.sample(model, data, test=test, proposal=tm.proposals.RandomWalk(args.sd), num_samples=steps,
                              num_warmup=0, num_chains=args.chains, seed=1, init=init, init_jitter=0.0,
                              chunk_size=steps, audit=0.0, progress=False)
                s = r.timings["sampling_s"] / steps
                if mname not in best or s < best[mname]["s_per_step"]:
                    best[mname] = {"s_per_step": s, "compile_s": r.timings["compile_s"],
                                   "setup_s": r.timings["setup_s"]}
                keep[mname] = r
        for mname in ("hand", "numpyro"):
            r = keep[mname]
            best[mname].update(items_per_step=float(np.mean(r.stats["n_data"])),
                               acceptance=float(np.mean(r.stats["accepted"])))
        same = float(np.mean(keep["hand"].stats["accepted"] == keep["numpyro"].stats["accepted"]))
        drift = float(np.max(np.abs(keep["hand"].flat_samples - keep["numpyro"].flat_samples)))
        ratio = best["numpyro"]["s_per_step"] / best["hand"]["s_per_step"]
        row = {"test": tname, "steps": steps, "hand": best["hand"], "numpyro": best["numpyro"], "ratio": ratio,
               "same_decisions": same, "max_abs_draw_difference": drift}
        rows_out.append(row)
        print(f"  {tname:9s}: hand {1e6 * best['hand']['s_per_step']:9.1f} us/step, numpyro "
              f"{1e6 * best['numpyro']['s_per_step']:9.1f} us/step, ratio {ratio:.2f}; items/step "
              f"{best['hand']['items_per_step']:.0f} vs {best['numpyro']['items_per_step']:.0f}; same decisions "
              f"{100 * same:.1f}%; compile {best['hand']['compile_s']:.1f}s vs {best['numpyro']['compile_s']:.1f}s",
              flush=True)
    total = time.perf_counter() - t_start
    out = {"benchmark": "numpyro_cost", "config": vars(args), "from_numpyro_s": build_s,
           "log_lik_call_s": ll_s, "rows": rows_out, "total_runtime_s": total, "meta": meta}
    C.write_json(args.out, "numpyro_cost.json", out)
    print(f"total {total:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
