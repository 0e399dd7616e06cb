"""Probabilistic-programs paper Sec. 4.3, Fig. 9: stochastic volatility, particle Gibbs + subsampled MH.

Chen, Mansinghka & Ghahramani, Sec. 4.3: ``x_t = exp(h_t/2) eps_t``, ``h_t ~ N(phi h_{t-1}, sigma^2)``,
``h_0 = 0``, phi ~ Beta(5, 1), sigma^2 ~ InvGamma(5, 0.05); 200 synthetic series of length 5 with
phi = 0.95, sigma = 0.1; particle Gibbs on windows of h, (subsampled) MH on phi and sigma (epsilon = 1e-3 in
Fig. 9), 10x more computation given to h. Fig. 9b/c: histograms of phi and sigma (ground truth, exact MH,
subsampled MH); Fig. 9d: autocorrelation against running time, with ESS per second in the legend. The
paper: "subsampled MH still obtains about twice the efficiency of exact MH without introducing
significant bias".

Here the model is a **NumPyro model** (:func:`tallmh.blocks.numpyro_models.stochastic_volatility`) run
through the front end, ``model, data = tm.blocks.from_numpyro(stochastic_volatility, x)``, with the program::

    tm.Cycle([tm.blocks.ParticleGibbs("eps", particles=P, window=L, series_per_step=M),
              tm.blocks.Repeat(tm.blocks.SubsampledMH("phi", test=TEST, scale=...), R),
              tm.blocks.Repeat(tm.blocks.SubsampledMH("sigma2", test=TEST, scale=...), R)])

TEST = ``Exact()`` or ``Austerity(eps, batch)``; the items of the subsampled tests are the series (the
plate). The NumPyro model is written in the **non-centred** form (``eps_t ~ N(0, 1)``, ``h = AR(eps)``):
the earlier centred program (hand-written :class:`~tallmh.blocks.models.StochasticVolatility`, MH on phi
and sigma given h) did not mix (ESS 5 in 4 x 4000 steps), because h pins phi and sigma (given 10^4 values
of h, sigma^2 can move ~1.4% per step while its posterior sd is ~17%) and particle Gibbs refreshes only a
fraction of h per step. Given eps instead, (phi, sigma) are only weakly pinned, because x says little
about h (Papaspiliopoulos, Roberts & Skold 2007). ``--hand-written`` also runs the centred program with
the same settings, as a cross-check of the posterior and of the mixing difference.

phi and sigma^2 are sampled on the logit / log scale (random walk; scales tuned for 25-45% acceptance).
The "ground truth" is a long run of the exact program (``--ref-chunks`` chunks from other starts after
``--warmup-chunks``). ESS is ArviZ's bulk ESS over chains; ESS/s uses sampling time (compile excluded,
reported apart).

Scaled for a loaded 2-core CPU: 2000 series (not 200: with 200 series an austerity test with a batch of
100 reads most of the plate anyway), ``T = 5``.

Usage::

    python benchmarks/papers/pp_sv.py --steps 2500 --hand-written   # the committed results, ~15 min at load ~13
    python benchmarks/papers/pp_sv.py --nuts                           # NUTS ground truth, ~1 min
    python benchmarks/papers/pp_sv.py --smoke --out /tmp/x
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C


def run(program, model, x, steps, chains, seed, thin=1, warmup_chunks=1, ref_seed=None, ref_chunks=0):
    """Warm up (``warmup_chunks`` chunks of ``steps``), then time one chunk of ``steps``; the first chunk
    compiles the program (reported apart). With ``ref_seed``, then run ``ref_chunks`` more chunks of the
    same compiled program from other starts (the long reference run)."""
    import jax

    import tallmh as tm

    runner = tm.blocks.Runner(program, model)
    t0 = time.perf_counter()
    states, data = runner.init(x, chains, seed)
    key = jax.random.PRNGKey(seed + 7)
    for c in range(warmup_chunks):
        states, _, _ = runner.run(states, data, steps, jax.random.fold_in(key, 1000 + c), thin)
    jax.block_until_ready(states)
    t1 = time.perf_counter()
    print(f"   compiled and warmed up in {t1 - t0:.1f}s", flush=True)
    states, rec, infos = runner.run(states, data, steps, key, thin)
    jax.block_until_ready(rec)
    t2 = time.perf_counter()
    out = {k: np.asarray(v) for k, v in rec.items()}
    items = {lab: float(np.mean(np.asarray(inf.n_data)) / thin) for lab, inf in zip(runner.program.labels, infos)}
    acc = {lab: float(np.sum(np.asarray(inf.accepted)) / max(np.sum(np.asarray(inf.proposals)), 1))
           for lab, inf in zip(runner.program.labels, infos)}
    timing = {"setup_compile_and_warmup_s": t1 - t0, "sampling_s": t2 - t1, "items_per_step": items,
              "acceptance": acc}
    ref = None
    if ref_seed is not None:
        rs, _ = runner.init(x, chains, ref_seed)
        recs = []
        for c in range(warmup_chunks + ref_chunks):
            rs, r, _ = runner.run(rs, data, steps, jax.random.fold_in(key, 5000 + c), thin)
            print(f"   reference chunk {c + 1}/{warmup_chunks + ref_chunks}", flush=True)
            if c >= warmup_chunks:
                recs.append({k: np.asarray(v) for k, v in r.items()})
        ref = {k: np.concatenate([r[k] for r in recs], axis=1) for k in recs[0]}
    return out, timing, ref


def nuts_reference(x, args, meta, num_warmup=500, num_samples=1000):
    """NumPyro NUTS on the whole model (phi, sigma^2 and the 5 * S innovations), one chain."""
    import arviz as az
    import jax
    from numpyro.infer import MCMC, NUTS

    from tallmh.blocks.numpyro_models import stochastic_volatility

    t0 = time.perf_counter()
    mc = MCMC(NUTS(stochastic_volatility), num_warmup=num_warmup, num_samples=num_samples, num_chains=1,
              progress_bar=False)
    mc.run(jax.random.PRNGKey(args.seed), x)
    s = mc.get_samples()
    out = {"seconds": time.perf_counter() - t0, "num_warmup": num_warmup, "num_samples": num_samples}
    for p, v in (("phi", np.asarray(s["phi"])), ("sigma", np.sqrt(np.asarray(s["sigma2"])))):
        out[p] = {"mean": float(v.mean()), "sd": float(v.std()), "ess": float(az.ess(v[None]))}
        print(f"NUTS {p}: {v.mean():.4f} +- {v.std():.4f} (ESS {out[p]['ess']:.0f})", flush=True)
    print(f"NUTS took {out['seconds']:.0f}s", flush=True)
    C.write_json(args.out, "pp_sv_nuts.json", {"meta": meta, "args": vars(args), "nuts": out})


def main(argv=None):
    argv = sys.argv if argv is None else argv
    ap = C.parser(__doc__)
    C.add_options(ap, series=2000, length=5, particles=5, window=5, series_per_step=500)
    ap.add_argument("--repeats", type=int, default=3, help="MH updates of phi and of sigma per cycle")
    ap.add_argument("--scale-phi", type=float, default=1.5, help="random-walk sd on logit phi")
    ap.add_argument("--scale-sigma2", type=float, default=0.45, help="random-walk sd on log sigma^2")
    C.add_options(ap, epsilon=0.05, batch=100, steps=600, chains=2)
    ap.add_argument("--ref-chunks", type=int, default=4, help="reference run length, in chunks of --steps")
    ap.add_argument("--warmup-chunks", type=int, default=1)
    ap.add_argument("--thin", type=int, default=1)
    ap.add_argument("--hand-written", action="store_true",
                    help="also run the centred hand-written program (exact test) as a cross-check")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--nuts", action="store_true",
                    help="only run NumPyro's NUTS on the same NumPyro model and data (an independent ground truth "
                         "for the long exact run) and write pp_sv_nuts.json")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default=C.DEFAULT_OUT)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        args.series, args.steps, args.ref_chunks, args.series_per_step = 300, 40, 1, 100
        args.chains = 2

    import arviz as az

    import tallmh as tm
    from tallmh.blocks.models import StochasticVolatility
    from tallmh.blocks.numpyro_models import stochastic_volatility

    meta = C.machine_info(argv)
    C.header("probabilistic programs Sec. 4.3 / Fig. 9: stochastic volatility (NumPyro model, non-centred)", meta)
    x, h_true = StochasticVolatility.simulate(args.series, args.length, phi=0.95, sigma=0.1, seed=args.seed)
    if args.nuts:
        return nuts_reference(x, args, meta)
    model, data = tm.blocks.from_numpyro(stochastic_volatility, x)
    print(f"# {args.series} series of length {args.length} (phi = 0.95, sigma = 0.1); {model}; particles "
          f"{args.particles}, window {args.window}, {args.series_per_step} series per PG step, {args.repeats} MH "
          f"updates of phi and of sigma^2 per cycle", flush=True)

    def program(test, site="eps"):
        return tm.Cycle([
            tm.blocks.ParticleGibbs(site, particles=args.particles, window=args.window,
                                    series_per_step=args.series_per_step),
            tm.blocks.Repeat(tm.blocks.SubsampledMH("phi", test=test, scale=args.scale_phi), args.repeats),
            tm.blocks.Repeat(tm.blocks.SubsampledMH("sigma2", test=test, scale=args.scale_sigma2), args.repeats),
        ])

    exact_test = tm.acceptance.Exact(chunk=1024)
    sub_test = tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch)
    results = {}
    ref = None
    cases = [("exact", exact_test, "eps", model, data), (f"austerity eps={args.epsilon}", sub_test, "eps", model, data)]
    if args.hand_written:
        cases.append(("hand-written centred, exact", exact_test, "h", StochasticVolatility(), x))
    for name, test, site, mdl, dat in cases:
        draws, t, r = run(program(test, site), mdl, dat, args.steps, args.chains, args.seed, args.thin,
                          args.warmup_chunks, ref_seed=args.seed + 100 if ref is None else None,
                          ref_chunks=args.ref_chunks)
        if r is not None:
            ref = r
            print(f"reference (exact, {args.chains} chains x {args.ref_chunks * args.steps} steps from other "
                  f"starts): phi {ref['phi'].mean():.4f} +- {ref['phi'].std():.4f}, sigma "
                  f"{ref['sigma'].mean():.4f} +- {ref['sigma'].std():.4f}", flush=True)
        row = dict(t)
        for p in ("phi", "sigma"):
            ess = float(az.ess(draws[p]))
            row[p] = {"mean": float(draws[p].mean()), "sd": float(draws[p].std()), "ess": ess,
                      "ess_per_s": ess / t["sampling_s"],
                      "ref_mean": float(ref[p].mean()), "ref_sd": float(ref[p].std()),
                      "bias_in_ref_sd": float((draws[p].mean() - ref[p].mean()) / ref[p].std())}
        row["draws"] = {p: draws[p].tolist() for p in ("phi", "sigma")}
        results[name] = row
        items = ", ".join(f"{k}: {v:.0f}" for k, v in t["items_per_step"].items())
        print(f"{name:22s} sampling {t['sampling_s']:.1f}s (set-up, compile and warmup "
              f"{t['setup_compile_and_warmup_s']:.1f}s); items/step {items}", flush=True)
        for p in ("phi", "sigma"):
            r = row[p]
            print(f"   {p:5s} mean {r['mean']:.4f} (ref {r['ref_mean']:.4f}, bias {r['bias_in_ref_sd']:+.2f} ref sd), "
                  f"ESS {r['ess']:.0f}, ESS/s {r['ess_per_s']:.1f}", flush=True)
    names = list(results)[:2]
    ratio = {p: results[names[1]][p]["ess_per_s"] / results[names[0]][p]["ess_per_s"] for p in ("phi", "sigma")}
    print(f"ESS/s subsampled / exact: phi {ratio['phi']:.2f}x, sigma {ratio['sigma']:.2f}x (paper: about 2x)")

    fig, axes = C.figure(1, 3, figsize=(14, 4))
    for ax, p in zip(axes[:2], ("phi", "sigma")):
        bins = np.linspace(np.quantile(ref[p], 0.001), np.quantile(ref[p], 0.999), 40)
        ax.hist(ref[p].ravel(), bins=bins, density=True, alpha=0.4, color="g", label="long exact run")
        for name, col in zip(list(results), ("r", "b", "m")):
            ax.hist(np.asarray(results[name]["draws"][p]).ravel(), bins=bins, density=True, histtype="step",
                    color=col, lw=1.5, label=name)
        ax.axvline({"phi": 0.95, "sigma": 0.1}[p], color="k", ls=":", label="true value")
        ax.set_xlabel(p)
        ax.legend(fontsize=7)
    ax = axes[2]
    for name, col in zip(list(results), ("r", "b", "m")):
        for p, ls in (("phi", "-"), ("sigma", "--")):
            d = np.asarray(results[name]["draws"][p])
            dt = results[name]["sampling_s"] / d.shape[1]
            ac = [1.0] + [float(np.mean([np.corrcoef(c[:-k], c[k:])[0, 1] for c in d])) for k in range(1, min(200, d.shape[1] // 4))]
            ax.plot(np.arange(len(ac)) * dt, ac, ls, color=col,
                    label=f"{name} {p} (ESS/s {results[name][p]['ess_per_s']:.1f})")
    ax.set_xlabel("lag (seconds of sampling)")
    ax.set_ylabel("autocorrelation")
    ax.legend(fontsize=7)
    fig.suptitle(f"Stochastic volatility (NumPyro model, non-centred), {args.series} series x {args.length}: "
                 "particle Gibbs + (subsampled) MH")
    C.finish_figure(fig, args.out, "pp_sv.png" if not args.smoke else "pp_sv_smoke.png")
    for r in results.values():
        r["draws"] = {p: np.asarray(v)[:, ::max(1, np.asarray(v).shape[1] // 500)].round(5).tolist()
                      for p, v in r["draws"].items()}
    C.write_json(args.out, "pp_sv.json" if not args.smoke else "pp_sv_smoke.json", {
        "meta": meta, "args": vars(args),
        "reference": {"phi_mean": float(ref["phi"].mean()), "phi_sd": float(ref["phi"].std()),
                      "sigma_mean": float(ref["sigma"].mean()), "sigma_sd": float(ref["sigma"].std()),
                      "draws": int(ref["phi"].size)},
        "results": results, "ess_per_s_ratio": ratio,
        "paper": "Fig. 9: subsampled MH (eps = 1e-3) about 2x the ESS/s of exact MH, no significant bias "
                 "(200 series of length 5)",
        "model": "NumPyro model through tm.blocks.from_numpyro (non-centred: eps ~ N(0, 1), h = AR(eps))",
    })


if __name__ == "__main__":
    main()
