"""A hierarchical Poisson regression, written centred as users write it, by ``tm.sample`` with defaults and by
NumPyro's NUTS.

The model (NumPyro)::

    mu ~ N(0, 1);  tau ~ HalfNormal(1);  alpha_g ~ N(mu, tau), g = 1..G (a plate);  beta ~ N(0, 1)^p
    y_i ~ Poisson(exp(alpha[g_i] + x_i . beta)),  i = 1..N

``mu`` and ``tau`` are read by no item: they enter the likelihood only through the group intercepts. The data
are generated with a fixed seed (G = 20 groups of equal expected size, p = 3 standard-normal covariates,
mu = 0.5, tau = 0.2, beta = (0.3, -0.2, 0.1)).

Both samplers run the same NumPyro model: tallmh through ``tm.from_numpyro`` and ``tm.sample(model, data)``
with no options (the recommended default test, control variates and proposal, the default chains and draws);
NUTS (4 chains x (``--nuts-warmup`` + ``--nuts-samples``), chains vectorised) as the reference. Printed per
site: the means' difference and the sds' ratio in units of NUTS's sd, R-hat and minimum bulk ESS of each,
tallmh's verdict and notes, and the wall time of each (compile included). ``--out`` writes the numbers as JSON.

Usage::

    python benchmarks/hierarchical.py                      # N = 2e5; a few minutes on 2 shared cores
    python benchmarks/hierarchical.py --n 20000 --smoke    # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def simulate(n, groups=20, p=3, seed=0, mu=0.5, tau=0.2):
    """``(data, truth)``: group index ``g``, covariates ``X`` (n x p) and counts ``y``."""
    rng = np.random.default_rng(seed)
    alpha = mu + tau * rng.standard_normal(groups)
    beta = np.array([0.3, -0.2, 0.1])[:p] if p <= 3 else rng.normal(0, 0.2, p)
    g = rng.integers(0, groups, n).astype(np.int32)
    X = rng.standard_normal((n, p)).astype(np.float32)
    y = rng.poisson(np.exp(alpha[g] + X @ beta)).astype(np.float32)
    return {"g": g, "X": X, "y": y}, {"mu": mu, "tau": tau, "alpha": alpha, "beta": beta}


def hierarchical_poisson(g, X, y=None, groups=20):
    """The centred hierarchical Poisson regression (NumPyro)."""
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", groups):
        alpha = numpyro.sample("alpha", dist.Normal(mu, tau))
    beta = numpyro.sample("beta", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Poisson(jnp.exp(alpha[g] + X @ beta)), obs=y)


def run_nuts(data, groups, warmup, samples, chains, seed=0):
    import jax
    from numpyro.infer import MCMC, NUTS

    t0 = time.perf_counter()
    mcmc = MCMC(NUTS(hierarchical_poisson), num_warmup=warmup, num_samples=samples, num_chains=chains,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), data["g"], data["X"], data["y"], groups=groups)
    draws = {k: np.asarray(v) for k, v in mcmc.get_samples(group_by_chain=True).items()}
    return draws, time.perf_counter() - t0


def run_tallmh(data, groups, seed=0):
    import tallmh as tm

    t0 = time.perf_counter()
    model, tdata = tm.from_numpyro(hierarchical_poisson, data["g"], data["X"], data["y"], groups=groups)
    res = tm.sample(model, tdata, seed=seed, progress=False)
    wall = time.perf_counter() - t0
    draws = {k: np.asarray(v) for k, v in res.samples.items()}
    return res, draws, wall


def flat_sites(draws):
    """``{site[i]: (chains, draws)}`` for every scalar component."""
    out = {}
    for k, v in draws.items():
        v = v.reshape(v.shape[0], v.shape[1], -1)
        for j in range(v.shape[2]):
            out[k if v.shape[2] == 1 else f"{k}[{j}]"] = v[:, :, j]
    return out


def diagnostics(x):
    from tallmh.reporting.diagnostics import ess, rhat

    return float(rhat(x)), float(ess(x))


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mu", type=float, default=0.5, help="true mean of the group intercepts")
    ap.add_argument("--tau", type=float, default=0.2, help="true sd of the group intercepts")
    ap.add_argument("--nuts-warmup", type=int, default=500)
    ap.add_argument("--nuts-samples", type=int, default=500)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--no-nuts", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="NUTS 2 chains x (200 + 200)")
    ap.add_argument("--out", default=None, help="write the numbers as JSON here")
    ap.add_argument("--save-draws", default=None, help="write tallmh's draws (constrained, by site) to this .npz")
    ap.add_argument("--nuts-cache", default=None, help="NUTS's draws: read from this .npz if it exists, else "
                                                        "run NUTS and write them there")
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.nuts_warmup, args.nuts_samples, args.chains = 200, 200, 2

    import jax

    data, truth = simulate(args.n, args.groups, seed=args.seed, mu=args.mu, tau=args.tau)
    res, tdraws, t_tm = run_tallmh(data, args.groups, seed=args.seed)
    print(f"tallmh: {t_tm:.1f} s ({', '.join(f'{k} {v:.1f}' for k, v in res.timings.items())}); {res.verdict}")
    for note in res.notes:
        print("  note:", note)
    out = {"n": args.n, "groups": args.groups, "tallmh_s": t_tm, "verdict": res.verdict,
           "notes": list(res.notes), "device": jax.devices()[0].device_kind, "sites": {}}
    T = flat_sites(tdraws)
    if args.save_draws:
        np.savez(args.save_draws, **tdraws)
    if not args.no_nuts:
        if args.nuts_cache and os.path.exists(args.nuts_cache):
            with np.load(args.nuts_cache) as z:
                ndraws = {k: z[k] for k in z.files if k != "wall_s"}
                t_nuts = float(z["wall_s"])
        else:
            ndraws, t_nuts = run_nuts(data, args.groups, args.nuts_warmup, args.nuts_samples, args.chains,
                                      args.seed)
            if args.nuts_cache:
                np.savez(args.nuts_cache, wall_s=t_nuts, **ndraws)
        out["nuts_s"] = t_nuts
        print(f"NUTS {args.chains} x ({args.nuts_warmup} + {args.nuts_samples}): {t_nuts:.1f} s")
        R = flat_sites(ndraws)
        print(f"{'site':10s} {'dmean/sd':>9s} {'sd ratio':>9s} {'R-hat':>7s} {'ESS':>7s} {'NUTS R-hat':>10s} "
              f"{'NUTS ESS':>9s}")
        worst = 0.0
        for k in R:
            r, t = R[k], T[k]
            sd = r.std()
            dm = (t.mean() - r.mean()) / sd
            ratio = t.std() / sd
            rh, es = diagnostics(t)
            nrh, nes = diagnostics(r)
            worst = max(worst, abs(dm))
            out["sites"][k] = {"dmean_sd": float(dm), "sd_ratio": float(ratio), "rhat": rh, "ess": es,
                               "nuts_rhat": nrh, "nuts_ess": nes}
            print(f"{k:10s} {dm:9.3f} {ratio:9.3f} {rh:7.3f} {es:7.0f} {nrh:10.3f} {nes:9.0f}")
        out["worst_dmean_sd"] = worst
        print(f"worst |mean difference| / NUTS sd: {worst:.3f}; tallmh {t_tm:.1f} s vs NUTS {t_nuts:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f, indent=1, default=float)
    return out


if __name__ == "__main__":
    main()
