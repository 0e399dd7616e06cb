"""Which proposal should be the default for a differentiable model?

Bayesian logistic regression (``tm.models.LogisticRegression.simulate(N, d=10)``: 11 parameters), austerity
and Barker with control variates, the proposal either adaptive Metropolis (``AdaptiveMetropolis()``, the
default of ``tm.sample``) or preconditioned adaptive MALA (``Langevin()``: Laplace-covariance
preconditioner, step adapted in warmup to 57% acceptance, control-variate minibatch gradient), with 1 and 4
vectorised chains. Every run is a whole ``tm.sample`` call from a cold start (tallmh finds the mode,
the control variates and the Laplace covariance itself): the wall time is what a user waits for
(set-up, compile, warmup and sampling). Printed per run: min bulk ESS over the parameters, ESS per
second of the whole call and of sampling alone, items per step, acceptance, and the largest |mean -
Laplace mean| / Laplace sd (the posterior is close to Gaussian at these N, so that is a check that the
run is right, not a reference of its own).

Usage::

    python benchmarks/langevin_default.py                 # N = 1e5, 1e6 (a few minutes)
    python benchmarks/langevin_default.py --sizes 1e5,1e6,1e7
    python benchmarks/langevin_default.py --smoke
"""

from __future__ import annotations

import sys
import time
import warnings

import numpy as np

import _common as C


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    ap.add_argument("--sizes", default="1e5,1e6")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--chains", default="1,4")
    ap.add_argument("--batch", type=int, default=100)
    C.add_run_options(ap, C.RESULTS)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.sizes, args.warmup, args.samples, args.chains = "2000", 100, 200, "1,2"

    import arviz as az
    import jax
    import jax.numpy as jnp

    import tallmh as tm

    sizes = C.numbers(args.sizes, int)
    chain_counts = C.numbers(args.chains, int)
    rows = []
    t_all = time.perf_counter()
    meta = C.machine_info(argv)
    C.header("langevin_default: adaptive Metropolis or MALA, austerity or Barker, control variates", meta)
    print(f"{'N':>9s} {'proposal':>9s} {'test':>10s} {'ch':>3s} {'wall s':>7s} {'setup+compile':>13s} "
          f"{'min ESS':>8s} {'ESS/s tot':>9s} {'ESS/s smp':>9s} {'items/step':>10s} {'accept':>6s} {'max dm/sd':>9s}")
    for n in sizes:
        data, _ = tm.models.LogisticRegression.simulate(n, d=10, seed=args.seed)
        data = jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.float32), data)
        model = tm.models.LogisticRegression(prior_scale=10.0)
        # Laplace approximation at the mode, once per data set, for the sanity check of each run's means
        from jax.flatten_util import ravel_pytree

        from tallmh import control_variates as cvm
        from tallmh import setup_passes as setup

        flat0, unravel = ravel_pytree(jnp.zeros(11, jnp.float32))
        c, _ = setup.find_center(model, data, n, unravel, flat0)
        sums = cvm.proxy_sums(model, data, n, unravel, c, 2)
        mean_l = np.asarray(c, float)
        sd_l = np.sqrt(np.diag(np.asarray(setup.laplace_cov(model, unravel, sums), float)))
        for chains in chain_counts:
            for test_name in ("austerity", "barker"):
                for prop_name in ("am", "mala"):
                    test = (tm.acceptance.Austerity(batch_size=args.batch) if test_name == "austerity"
                            else tm.acceptance.Barker(batch_size=args.batch))
                    proposal = (tm.proposals.Langevin(batch_size=args.batch) if prop_name == "mala"
                                else tm.proposals.AdaptiveMetropolis())
                    tm.programs.RUNNERS.clear()  # every call compiles, as a user's first call does
                    t0 = time.perf_counter()
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        r = tm.sample(model, data, test=test, proposal=proposal, num_warmup=args.warmup,
                                      num_samples=args.samples, num_chains=chains, seed=args.seed + 1,
                                      control_variates=tm.ControlVariates(), progress=False)
                    wall = time.perf_counter() - t0
                    draws = np.asarray(r.flat_samples, float)  # (chain, draw, d)
                    ess = float(np.min(az.ess(az.convert_to_dataset(draws), method="bulk")["x"].values))
                    dm = float(np.max(np.abs(draws.reshape(-1, draws.shape[-1]).mean(0) - mean_l) / sd_l))
                    tim = r.timings
                    samp = float(tim["sampling_s"])
                    row = dict(N=n, proposal=prop_name, test=test_name, chains=chains, wall_s=wall,
                               setup_compile_s=wall - float(tim["warmup_s"]) - samp, sampling_s=samp,
                               min_ess=ess, ess_per_s_total=ess / wall, ess_per_s_sampling=ess / samp,
                               items_per_step=float(np.mean(r.stats["n_data"])),
                               acceptance=float(np.mean(r.stats["accepted"])), max_dmean_over_sd=dm,
                               trusted=bool(r.trusted), warnings=list(map(str, r.warnings)))
                    rows.append(row)
                    print(f"{n:9.0e} {prop_name:>9s} {test_name:>10s} {chains:3d} {wall:7.1f} "
                          f"{row['setup_compile_s']:13.1f} {ess:8.0f} {row['ess_per_s_total']:9.1f} "
                          f"{row['ess_per_s_sampling']:9.1f} {row['items_per_step']:10.1f} "
                          f"{row['acceptance']:6.3f} {dm:9.3f}", flush=True)
    total = time.perf_counter() - t_all
    print(f"# total {total:.0f}s, load average at end {C.load_average()}")
    C.write_json(args.out, "langevin_default.json" if not args.smoke else "langevin_default_smoke.json",
                 {"benchmark": "langevin_default", "meta": meta, "argv": argv[1:], "warmup": args.warmup,
                  "samples": args.samples, "rows": rows, "total_s": total})


if __name__ == "__main__":
    main()
