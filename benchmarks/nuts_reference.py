"""NUTS references on the full data for the hierarchical benchmarks: NumPyro's NUTS on the same posterior as the
tallmh run, cached as a summary (means and sds per site, R-hat and bulk ESS, the command, the times, the load).

Two cases, each with the priors of the model tallmh samples:

- ``flights``: ``late ~ log_dist + C(dep_time) + (1|origin)`` (``--group day``: ``(1|day)``), Bernoulli, on the
  3,000,000 flights of ``bambi_flights3m.py`` (the same table and columns), with the common terms' columns centred
  as Bambi's PyMC model centres them (``center_predictors``), so the reference's ``Intercept`` is the model's parameter, the intercept of
  the centred predictors: tallmh samples it and reports it as ``Intercept_centred``, beside ``Intercept`` on the
  data's scale (``Intercept_centred - mean(X) @ beta``, what Bambi's own ``fit`` reports), and :func:`compare`
  compares the reference's with ``Intercept_centred``. Bambi's priors for that formula: ``Intercept ~ Normal(0, 1.5)``,
  ``log_dist ~ Normal(0, 1)``, ``C(dep_time) ~ Normal(0, 1)`` (4 levels beside 06-09), ``1|origin_sigma ~
  HalfNormal(2.5353)`` (Bambi's auto-scaled value, read from the model it builds), the 229 airports in formulae's
  (sorted) order.
- ``simulated``: ``y ~ x1 + x2 + (1|g)`` on ``hierarchical_scale.py``'s simulated rows (same ``simulate(rows,
  groups, seed)``), with the priors of its PyMC model: ``Normal(0, 1.5)`` intercept, ``Normal(0, 1)`` slopes,
  ``HalfNormal(2.5)`` group sd. Its design is not centred: the reference's ``Intercept`` is on the data's scale, as
  tallmh's ``Intercept`` is on every route (a Bambi model's prior is on the centred intercept instead; the simulated
  slopes' columns have means within ``4 / sqrt(N)`` of 0, so the two priors differ by a shift of that order).

The likelihood is exact on every row. The flights are held as binomial counts per distinct row of the design
(log distance, departure band, airport: 13,378 patterns), which is the Bernoulli likelihood of the 3,000,000 rows
up to a constant (the same posterior, with an exact gradient at 1/200 of the cost). The simulated rows have
continuous covariates and are read one by one (float32 terms, their sum in float64: a float32 sum of 10^7 terms is
off by O(1), noise in NUTS's energy that drove the step size down and the trees to their largest in a first try).
**Memory grows with every chunk** (not found why; NumPyro compiles each chunk's sampling program anew): a 10^7-row
run grew to 24 GB and was killed by the kernel after 170 draws per chain with the data closed over, another to
21.5 GB by 150 draws with the data as the model's argument; with ``jit_model_args=True`` (now) a 2 * 10^6-row run
still grew by about 50 MB a chunk. Use large chunks (``--chunk``) for long runs; the flights (1,000 draws in 4
chunks) were not affected.

The group term: Bambi's model writes it ``1|g = 1|g_offset * 1|g_sigma`` with ``1|g_offset ~ Normal(0, 1)``, which is
the same joint distribution as ``1|g ~ Normal(0, 1|g_sigma)``. Here NUTS samples the group-level intercepts
``c_j = Intercept + 1|g[j] ~ Normal(Intercept, sigma)`` (a linear change of variables with unit Jacobian, so the
posterior of ``Intercept, slopes, sigma, 1|g`` is the same), since with thousands of rows per group the
non-centred form is a narrow ridge for NUTS and the centred one is close to Gaussian. The start is the mode of
the effects at a fixed sigma (Newton's method, the data's Hessian computed exactly in one pass), sigma updated from
the effects, three rounds (the joint mode with the scale is degenerate, sigma -> 0); the initial inverse mass matrix
is the diagonal of the Laplace covariance there, each chain starting at the mode plus twice those sds times normal
noise.

Chains run one after the other, in chunks, alternating (so a run stopped by ``--deadline`` has as many draws in
each chain); the summary is rewritten after every chunk, with ``complete: false`` until the asked draws are in.
``--shared-adaptation``: chain 2 reuses chain 1's adapted step size and mass matrix (its own burn-in of
``--burn-in`` iterations from its own over-dispersed start) instead of a warm-up of its own.

Usage::

    python benchmarks/nuts_reference.py flights --table flights-3m.parquet
    python benchmarks/nuts_reference.py simulated --rows 10000000 --groups 1000 --warmup 100 --fixed-mass \\
        --max-tree-depth 8 --draws 1000 --chunk 10 --shared-adaptation --burn-in 30 --deadline 08:36
    python benchmarks/nuts_reference.py compare REFERENCE.json RUN.json   # a saved hierarchical_scale.py run

``hierarchical_scale.py --nuts-reference REFERENCE.json`` and ``bambi_flights3m.py --nuts-reference REFERENCE.json``
print the same comparison after their run (:func:`compare`).
"""

import time

T0 = time.perf_counter()

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# the key of a reference's info that says its Intercept is that of the centred predictors (and gives the column means)
CENTRED_INFO = "column means (centred, as Bambi does; Intercept is the centred one)"
BAMBI_FRONTENDS = ("bambi", "bambi-formula")


def intercept_pairs(ref, means):
    """``{reference key: (run key, what is compared)}`` for the intercept, like with like: a reference whose
    ``Intercept`` is that of the centred predictors (the flights reference, ``CENTRED_INFO``; or a Bambi run's result
    saved before tallmh reported Bambi's data-scale ``Intercept``, which has no ``Intercept_centred``) is compared with
    the run's ``Intercept_centred`` where the run has it; otherwise ``Intercept`` with ``Intercept`` (the data's scale
    in both, or, for a run that has no centred one, both as the model samples it)."""
    centred = CENTRED_INFO in (ref.get("info") or {}) or (
        ref.get("frontend") in BAMBI_FRONTENDS and "Intercept_centred" not in ref.get("means", {}))
    if "Intercept" not in ref.get("means", {}):
        return {}
    if centred and "Intercept_centred" in means:
        return {"Intercept": ("Intercept_centred", "the intercept of the centred predictors in both (the run's "
                                                   "Intercept_centred; its Intercept is on the data's scale)")}
    if centred:
        return {"Intercept": ("Intercept", "the reference's Intercept is that of the centred predictors; the run has "
                                           "no Intercept_centred: compared as the model samples it")}
    if "Intercept_centred" in means:
        return {"Intercept": ("Intercept", "on the data's scale in both (as Bambi's fit reports it)")}
    return {"Intercept": ("Intercept", "as the model samples it in both (no centred predictors)")}


def flights_data(path, group="origin"):
    """(X, names, g, levels, k, n, sigma prior scale): binomial counts per distinct design row of the flights, the
    group-level intercept's group ``origin`` (229 airports) or ``day`` (182 calendar days)."""
    sys.path.insert(0, HERE)
    from bambi_flights3m import table

    df = table(path)
    bands = ["06-09", "09-13", "13-17", "17-21", "21-06"]
    levels = sorted(df[group].unique().tolist())
    code = np.asarray(__import__("pandas").Categorical(df[group], categories=levels).codes)
    band = np.asarray(__import__("pandas").Categorical(df["dep_time"].astype(str), categories=bands).codes)
    assert code.min() >= 0 and band.min() >= 0
    keys = np.stack([df["log_dist"].to_numpy(), band.astype(float), code.astype(float)], 1)
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    y = df["late"].to_numpy()
    k = np.bincount(inv, weights=y, minlength=len(uniq))
    n = np.bincount(inv, minlength=len(uniq)).astype(float)
    X = np.column_stack([uniq[:, 0]] + [(uniq[:, 1] == b).astype(float) for b in range(1, 5)])
    names = ["log_dist"] + [f"C(dep_time)[{i}]" for i in range(4)]
    # Bambi centres the common terms' columns when the model has an intercept (center_predictors=True): the PyMC
    # model's Intercept, the one tallmh samples and reports, is that of the centred columns, and its prior is on it
    x_mean = (X * n[:, None]).sum(0) / n.sum()
    X = X - x_mean
    # Bambi's auto prior of the group sd for this formula (indexed_bambi_model reads it off the model it builds)
    sys.path.insert(0, os.path.join(REPO, "src"))
    from bambi_flights3m import FORMULA
    from tallmh.frontends.bambi_index import indexed_bambi_model

    bm = indexed_bambi_model(FORMULA.format(group=group), df, family="bernoulli")
    term = bm.components["p"].group_specific_terms[f"1|{group}"]
    s_scale = float(term.prior.args["sigma"].args["sigma"])
    assert list(bm.components["p"].common_terms["C(dep_time)"].levels) == bands[1:]
    info = {"rows": int(len(df)), "patterns": int(len(uniq)), "levels": levels, "late share": float(y.mean()),
            CENTRED_INFO: dict(zip(names, x_mean.tolist())),
            "priors": {"Intercept": "Normal(0, 1.5)", "log_dist": "Normal(0, 1)", "C(dep_time)": "Normal(0, 1)",
                       f"1|{group}_sigma": f"HalfNormal({s_scale:.4f})"}}
    return X, names, uniq[:, 2].astype(np.int32), k, n, s_scale, f"1|{group}", info


def simulated_data(rows, groups, seed):
    sys.path.insert(0, HERE)
    from hierarchical_scale import simulate

    g, x, y, a_true, truth, sizes = simulate(rows, groups, seed)
    levels = [f"g{j:0{len(str(groups - 1))}d}" for j in range(groups)]
    info = {"rows": rows, "groups": groups, "seed": seed, "levels": levels, "truth": truth,
            "group sizes": f"{sizes.min()}-{sizes.max()}",
            "priors": {"Intercept": "Normal(0, 1.5)", "x1": "Normal(0, 1)", "x2": "Normal(0, 1)",
                       "1|g_sigma": "HalfNormal(2.5)"}}
    return x.astype(np.float32), ["x1", "x2"], g.astype(np.int32), y.astype(np.float32), None, 2.5, "1|g", info


def build(X, g, k, n, G, s_scale):
    """The potential (minus the log posterior, unconstrained: log sigma) of a flat vector
    ``[Intercept, beta (p), c (G), log sigma]``, its gradient, and the exact Hessian (prior part by autodiff, data
    part in one pass: diagonal in c, the c-beta cross terms and X'WX)."""
    import jax
    import jax.numpy as jnp

    p = X.shape[1]
    f32 = X.dtype == np.float32
    Xd, gd, kd = jnp.asarray(X), jnp.asarray(g), jnp.asarray(k)
    nd = None if n is None else jnp.asarray(n)

    def unpack(t):
        return t[0], t[1:1 + p], t[1 + p:1 + p + G], t[1 + p + G]

    def loglik(t, data=None):
        Xj, gj, kj, nj = data if data is not None else (Xd, gd, kd, nd)
        b0, beta, c, ls = unpack(t)
        dt_ = Xj.dtype
        eta = c.astype(dt_)[gj] + Xj @ beta.astype(dt_)
        r = kj * eta - (jax.nn.softplus(eta) if nj is None else nj * jax.nn.softplus(eta))
        # each row's term in the data's precision, their sum in float64: a float32 sum of 10^7 terms rounds the
        # potential by O(1), noise in NUTS's energy that no step size removes
        return jnp.sum(r.astype(jnp.float64))

    def logprior(t):
        b0, beta, c, ls = unpack(t)
        s = jnp.exp(ls)
        lp = -0.5 * (b0 / 1.5) ** 2 - 0.5 * jnp.sum(beta ** 2)
        lp += -0.5 * (s / s_scale) ** 2 + ls  # HalfNormal and the log transform's Jacobian
        lp += jnp.sum(-0.5 * ((c - b0) / s) ** 2) - G * ls
        return lp

    def potential(t, data=None):
        return -(loglik(t, data) + logprior(t))

    def nuts_model(data):
        """The same density as a NumPyro model of one unconstrained vector, the data passed as the model's
        argument: jit arguments, not constants compiled into each of NumPyro's sampling programs."""
        import numpyro
        import numpyro.distributions as dist

        t = numpyro.sample("t", dist.ImproperUniform(dist.constraints.real_vector, (), event_shape=(2 + p + G,)))
        numpyro.factor("log_density", -potential(t, data))

    def data_hessian(t):
        Xj, gj, nj = Xd, gd, nd
        b0, beta, c, ls = unpack(t)
        dt_ = Xj.dtype
        eta = c.astype(dt_)[gj] + Xj @ beta.astype(dt_)
        pr = jax.nn.sigmoid(eta)
        w = pr * (1 - pr) * (1 if nj is None else nj)
        wc = jax.ops.segment_sum(w.astype(jnp.float64), gj, num_segments=G)
        cross = jax.ops.segment_sum((w[:, None] * Xj).astype(jnp.float64), gj, num_segments=G)
        xtwx = (Xj * w[:, None]).T.astype(jnp.float64) @ Xj.astype(jnp.float64) if not f32 else \
            jnp.einsum("ni,nj->ij", Xj * w[:, None], Xj, preferred_element_type=jnp.float32).astype(jnp.float64)
        H = jnp.zeros((2 + p + G, 2 + p + G))
        ib, ic = slice(1, 1 + p), slice(1 + p, 1 + p + G)
        H = H.at[ib, ib].set(xtwx)
        H = H.at[ic, ic].set(jnp.diag(wc))
        H = H.at[ic, ib].set(cross)
        H = H.at[ib, ic].set(cross.T)
        return H + jax.hessian(lambda u: -logprior(u))(t)

    return nuts_model, (Xd, gd, kd, nd), jax.jit(jax.value_and_grad(potential)), jax.jit(data_hessian)


def newton_mode(vg, hess, t0, log, iters=30):
    """The mode of ``(Intercept, slopes, c)`` at a fixed sigma (the last coordinate of ``t0``; the joint mode with
    the scale is degenerate, sigma -> 0), by Newton's method with a backtracking line search, and the Hessian."""
    import jax.numpy as jnp

    t = jnp.asarray(t0)
    D = t.shape[0]
    fix = np.zeros(D)
    fix[-1] = 1.0
    u, gr = vg(t)
    for it in range(iters):
        H = np.asarray(hess(t)) * np.outer(1 - fix, 1 - fix) + np.diag(fix)
        step = jnp.asarray(np.linalg.solve(H, np.asarray(gr) * (1 - fix)))
        a = 1.0
        while True:
            u2, g2 = vg(t - a * step)
            if np.isfinite(float(u2)) and float(u2) <= float(u) + 1e-6 or a < 1e-4:
                break
            a /= 2
        t, du, u, gr = t - a * step, float(u) - float(u2), u2, g2
        log(f"  newton {it}: U {float(u):.3f} decrease {du:.3g} step {a:g} "
            f"|grad| {float(jnp.max(jnp.abs(gr * (1 - fix)))):.3g}")
        if du < 1e-3:  # at the precision of the float32 sums
            break
    return t, np.asarray(hess(t))


def laplace_start(vg, hess, t0, G, p, log, rounds=3):
    """The conditional mode at sigma, then sigma^2 <- mean((c_j - Intercept)^2 + their Laplace variance) (an EM-like
    update of the scale), a few rounds; returns the point, the Laplace sds (Intercept, slopes, c at that sigma; log
    sigma: 1/sqrt(2 G)) for the initial inverse mass matrix."""
    t = np.asarray(t0, float)
    for r in range(rounds):
        mode, H = newton_mode(vg, hess, t, log)
        D = len(t)
        cov = np.linalg.inv(H[:D - 1, :D - 1])
        c = np.asarray(mode[1 + p:1 + p + G]) - float(mode[0])
        A = np.zeros((G, D - 1))
        A[:, 1 + p:1 + p + G] = np.eye(G)
        A[:, 0] = -1
        var = np.einsum("ij,jk,ik->i", A, cov, A)
        s2 = float(np.mean(c ** 2 + var))
        t = np.asarray(mode).copy()
        t[-1] = 0.5 * np.log(s2)
        log(f" round {r}: sigma {np.sqrt(s2):.4f}")
    sd = np.sqrt(np.r_[np.diag(cov), 1.0 / (2 * G)])
    return t, sd


def summarise(draws, names, G, diagnostics, gname):
    """Per-site means, sds, bulk ESS and R-hat of (chains, draws, dim) unconstrained draws."""
    b0, beta, c, ls = draws[..., 0], draws[..., 1:1 + len(names)], draws[..., 1 + len(names):-1], draws[..., -1]
    sites = {"Intercept": b0, f"{gname}_sigma": np.exp(ls)}
    for i, nm in enumerate(names):
        sites[nm] = beta[..., i]
    eff = c - b0[..., None]
    out = {"means": {}, "sds": {}, "bulk ESS": {}, "R-hat": {}}
    for k, v in sites.items():
        out["means"][k] = float(v.mean())
        out["sds"][k] = float(v.std(ddof=1))
        out["bulk ESS"][k] = float(diagnostics.ess(v))
        out["R-hat"][k] = float(diagnostics.rhat(v))
        h = v.shape[1] // 2  # each chain's halves: where a split R-hat above 1.01 comes from
        out.setdefault("chain halves' means", {})[k] = [[float(v[c_, :h].mean()), float(v[c_, h:].mean())]
                                                       for c_ in range(v.shape[0])]
    out["group means"] = eff.mean((0, 1)).tolist()
    out["group sds"] = eff.reshape(-1, G).std(0, ddof=1).tolist()
    ge, gr = diagnostics.ess_all(eff), diagnostics.rhat_all(eff)
    out["group effects: min bulk ESS"] = float(ge.min())
    out["group effects: max R-hat"] = float(gr.max())
    return out


def compare(ref_path, means, sds, group_means, group_sds, label="tallmh"):
    """Print and return the agreement of a run with a reference summary (this script's JSON, or an exact-MH run's
    JSON with the same keys): for every fixed effect and the group sd ``z = |mean - mean_ref| / sd_ref`` and
    ``sd / sd_ref``; for the group effects the largest ``z``, the share with ``z <= 0.1`` and ``<= 0.2``, and the
    range of the sd ratios."""
    with open(ref_path) as f:
        ref = json.load(f)["result"]
    ess, rh = ref.get("min bulk ESS (fixed effects and sigma)"), ref.get("max R-hat (fixed effects and sigma)")
    if ess is not None and not (ess >= 400 and rh <= 1.01):
        print(f"WARNING: the reference {ref_path} has min bulk ESS {ess:.0f} and max R-hat {rh:.4f} over the fixed "
              f"effects and sigma (draws per chain {ref.get('draws per chain')}): it is no converged reference")
    rows = {}
    pairs = intercept_pairs(ref, means)
    print(f"\n{label} against the reference {os.path.basename(ref_path)} (z = |mean - ref mean| / ref sd)")
    for k, (run_k, what) in pairs.items():
        print(f"{k}: the reference's {k} against the run's {run_k}: {what}")
    print(f"{'site':<22}{'mean':>11}{'ref mean':>11}{'ref sd':>11}{'z':>8}{'sd ratio':>10}{'ref ESS':>9}{'ref R-hat':>10}")
    for k in ref["means"]:
        run_k = pairs.get(k, (k,))[0]
        if run_k not in means:
            raise KeyError(f"{run_k} is in the reference (as {k}) but not in the run ({sorted(means)})")
        z = abs(means[run_k] - ref["means"][k]) / ref["sds"][k]
        rows[k] = {"z": z, "sd ratio": sds[run_k] / ref["sds"][k], "run's site": run_k}
        print(f"{k if run_k == k else run_k:<22}{means[run_k]:>11.4f}{ref['means'][k]:>11.4f}{ref['sds'][k]:>11.4f}{z:>8.3f}"
              f"{rows[k]['sd ratio']:>10.3f}{ref.get('bulk ESS', {}).get(k, np.nan):>9.0f}"
              f"{ref.get('R-hat', {}).get(k, np.nan):>10.4f}")
    gm, gs = np.asarray(ref["group means"]), np.asarray(ref["group sds"])
    if len(group_means) != len(gm):
        raise ValueError(f"{len(group_means)} group effects in the run, {len(gm)} in the reference")
    zg = np.abs(np.asarray(group_means) - gm) / gs
    ratio = np.asarray(group_sds) / gs
    out = {"fixed effects and sigma": rows, "max z (fixed effects and sigma)": max(r["z"] for r in rows.values()),
           "groups: max z": float(zg.max()), "groups: share z <= 0.1": float(np.mean(zg <= 0.1)),
           "groups: share z <= 0.2": float(np.mean(zg <= 0.2)), "groups: median z": float(np.median(zg)),
           "groups: sd ratio range": [float(ratio.min()), float(ratio.max())],
           "groups: median sd ratio": float(np.median(ratio)), "reference": os.path.basename(ref_path),
           "intercept compared": {k: f"reference {k} against run {v[0]}: {v[1]}" for k, v in pairs.items()},
           "reference min bulk ESS": ess, "reference max R-hat": rh,
           "reference draws per chain": ref.get("draws per chain")}
    print(f"group effects ({len(zg)}): max z {zg.max():.3f} (level {int(zg.argmax())}), median {np.median(zg):.3f}, "
          f"share z <= 0.1 {np.mean(zg <= 0.1):.3f}, <= 0.2 {np.mean(zg <= 0.2):.3f}; sd ratio "
          f"{ratio.min():.3f}-{ratio.max():.3f} (median {np.median(ratio):.3f})", flush=True)
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "compare":  # compare REF.json RUN.json: a saved hierarchical_scale.py run's result
        with open(argv[2]) as f:
            r = json.load(f)["result"]
        compare(argv[1], r["means"], r["sds"], r["group means"], r["group sds"], label=os.path.basename(argv[2]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("case", choices=("flights", "simulated"))
    ap.add_argument("--table", default="flights-3m.parquet", help="flights-3m.parquet (flights)")
    ap.add_argument("--group", default="origin", choices=("origin", "day"), help="the flights' group (flights)")
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--groups", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0, help="the simulation's seed (simulated)")
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=50, help="draws per chunk (chains alternate chunk by chunk)")
    ap.add_argument("--shared-adaptation", action="store_true")
    ap.add_argument("--burn-in", type=int, default=100, help="chain 2's burn-in with --shared-adaptation")
    ap.add_argument("--fixed-mass", action="store_true",
                    help="keep the Laplace inverse mass matrix (adapt the step size only)")
    ap.add_argument("--max-tree-depth", type=int, default=10)
    ap.add_argument("--deadline", default=None, help="HH:MM UTC: start no chunk after it (the summary says so)")
    ap.add_argument("--out", default=None, help="the summary's JSON (default benchmarks/results/...)")
    a = ap.parse_args(argv)

    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    from numpyro.infer import MCMC, NUTS

    sys.path.insert(0, os.path.join(REPO, "src"))
    from tallmh import diagnostics

    def log(msg):
        print(f"[{time.perf_counter() - T0:7.1f}s {dt.datetime.now(dt.timezone.utc):%H:%M:%S}] {msg}", flush=True)

    load0 = open("/proc/loadavg").read().split()[:3]
    if a.case == "flights":
        X, names, g, k, n, s_scale, gname, info = flights_data(a.table, a.group)
        stem = f"nuts_reference_flights3m_{a.group}"
    else:
        X, names, g, k, n, s_scale, gname, info = simulated_data(a.rows, a.groups, a.seed)
        stem = f"nuts_reference_{a.rows}x{a.groups}"
    G = len(info["levels"])
    out = a.out or os.path.join(HERE, "results", f"{stem}_2026-11-29.json")
    log(f"data: {X.shape[0]:,} likelihood rows, {G} groups, {X.shape[1]} slopes")
    nuts_model, data, vg, hess = build(X, g, k, n, G, s_scale)
    p = X.shape[1]
    t0 = np.zeros(2 + p + G)
    t0[-1] = np.log(0.5)
    t = time.perf_counter()
    jax.block_until_ready(vg(jnp.asarray(t0)))
    tc = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(3):
        jax.block_until_ready(vg(jnp.asarray(t0) + 1e-3))
    grad_s = (time.perf_counter() - t) / 3
    log(f"one potential + gradient on the full data: {grad_s:.3f}s (first call with compilation {tc:.1f}s); "
        f"load {open('/proc/loadavg').read().split()[:3]}")
    t = time.perf_counter()
    mode, sd_lap = laplace_start(vg, hess, t0, G, p, log)
    t_mode = time.perf_counter() - t
    log(f"mode in {t_mode:.1f}s: Intercept {float(mode[0]):.4f}, slopes {np.round(np.asarray(mode[1:1 + p]), 4)}, "
        f"sigma {float(np.exp(mode[-1])):.4f}; Laplace sds: Intercept {sd_lap[0]:.4g}, sigma (log) {sd_lap[-1]:.4g}")

    rng = np.random.default_rng(a.seed + 1)
    starts = [np.asarray(mode) + 2 * sd_lap * rng.standard_normal(len(sd_lap)) for _ in range(a.chains)]
    imm = jnp.asarray(sd_lap ** 2)
    deadline = None
    if a.deadline:
        hh, mm = map(int, a.deadline.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        deadline = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    mcmcs, times, counts = [], [0.0] * a.chains, [0] * a.chains
    chunks = [[] for _ in range(a.chains)]
    diverg = [0] * a.chains
    steps = [[] for _ in range(a.chains)]
    adapted = {}
    for ci in range(a.chains):
        shared = a.shared_adaptation and ci > 0
        kern = NUTS(nuts_model, inverse_mass_matrix=adapted["imm"] if shared else imm,
                    step_size=adapted["step"] if shared else 1.0,
                    adapt_step_size=not shared, adapt_mass_matrix=not (shared or a.fixed_mass),
                    max_tree_depth=a.max_tree_depth)
        m = MCMC(kern, num_warmup=a.burn_in if shared else a.warmup, num_samples=min(a.chunk, a.draws),
                 num_chains=1, progress_bar=False, jit_model_args=True)
        t = time.perf_counter()
        m.warmup(jax.random.PRNGKey(100 + ci), data, init_params={"t": jnp.asarray(starts[ci])}, collect_warmup=True,
                 extra_fields=("num_steps",))
        jax.block_until_ready(m.last_state)  # the call returns before the chain has run
        times[ci] += time.perf_counter() - t
        st = m.last_state
        if ci == 0:
            adapted = {"imm": st.adapt_state.inverse_mass_matrix, "step": float(st.adapt_state.step_size)}
        log(f"chain {ci + 1}: {'burn-in (shared adaptation)' if shared else 'warm-up'} "
            f"{a.burn_in if shared else a.warmup} iterations in {time.perf_counter() - t:.1f}s, "
            f"step size {float(st.adapt_state.step_size):.4g}, mean leapfrog steps "
            f"{float(np.mean(m.get_extra_fields()['num_steps'])):.1f}")
        mcmcs.append(m)

    def write(complete, stopped):
        d = np.stack([np.concatenate(c_, 0) for c_ in chunks], 0) if counts[0] else None
        res = {"case": a.case, "complete": complete, "stopped by deadline": stopped, "info": info,
               "draws per chain": counts, "chains": a.chains, "warmup": a.warmup,
               "shared adaptation": a.shared_adaptation, "fixed Laplace mass": a.fixed_mass,
               "max tree depth": a.max_tree_depth, "burn-in of later chains": a.burn_in if a.shared_adaptation else None,
               "seconds per chain (warm-up and draws)": times, "whole process s": time.perf_counter() - T0,
               "potential + gradient s": grad_s, "mode s": t_mode,
               "mean leapfrog steps per draw": [float(np.mean(s)) if s else None for s in steps],
               "divergences": diverg, "step size (chain 1)": adapted["step"],
               "load at start": load0, "load at end": open("/proc/loadavg").read().split()[:3],
               "command": "python " + " ".join(sys.argv), "date": dt.datetime.now(dt.timezone.utc).isoformat(),
               "sampler": "NumPyro NUTS (diagonal mass matrix, target accept 0.8), float64 parameters; "
                          "group-level intercepts c_j = Intercept + group effect sampled (same posterior)"}
        if d is not None:
            res.update(summarise(d, names, G, diagnostics, gname))
            keys = list(res["bulk ESS"])
            res["min bulk ESS (fixed effects and sigma)"] = min(res["bulk ESS"][k_] for k_ in keys)
            res["max R-hat (fixed effects and sigma)"] = max(res["R-hat"][k_] for k_ in keys)
        res["levels"] = info["levels"]
        with open(out, "w") as f:
            json.dump({"result": res}, f, indent=1)
        return res

    stopped = False
    while counts[0] < a.draws:
        if deadline and dt.datetime.now(dt.timezone.utc) >= deadline:
            stopped = True
            break
        for ci, m in enumerate(mcmcs):
            t = time.perf_counter()
            m.post_warmup_state = m.last_state
            m.run(m.post_warmup_state.rng_key, data, extra_fields=("num_steps", "diverging"))
            jax.block_until_ready(m.last_state)
            times[ci] += time.perf_counter() - t
            chunks[ci].append(np.asarray(m.get_samples()["t"]))
            ef = m.get_extra_fields()
            steps[ci].extend(np.asarray(ef["num_steps"]).tolist())
            diverg[ci] += int(np.sum(ef["diverging"]))
            counts[ci] += chunks[ci][-1].shape[0]
        res = write(counts[0] >= a.draws, False)
        log(f"draws per chain {counts}: min bulk ESS {res['min bulk ESS (fixed effects and sigma)']:.0f}, max R-hat "
            f"{res['max R-hat (fixed effects and sigma)']:.4f}, divergences {diverg}, chain times "
            f"{[round(x_) for x_ in times]}s; load {open('/proc/loadavg').read().split()[:3]}")
    res = write(counts[0] >= a.draws, stopped)
    print(json.dumps({k_: res[k_] for k_ in ("complete", "stopped by deadline", "draws per chain", "means", "sds",
                                             "bulk ESS", "R-hat", "group effects: min bulk ESS",
                                             "group effects: max R-hat", "divergences") if k_ in res}, indent=1))
    log(f"written {out}")


if __name__ == "__main__":
    main()
