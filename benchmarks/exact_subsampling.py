"""Exact subsampled MH (SMH's factorised test by Poisson thinning) against the approximate default and exact MH.

For logistic regression with unequal feature scales (``time_to_trusted.make_data``: d = 11, scales 0.1 to 10) at
each N of ``--sizes`` and on a rare-feature case (N = 5 10^4, a one-hot feature in 30 rows), the script prints,
per method: items read per step (mean, 99th percentile), acceptance rate, ESS per step (the smallest over the
coordinates, bulk ESS of ArviZ) and ESS per second of sampling (compiled program, compile time excluded).

Methods: the exact subsampled test (``PoissonThinning``) with the independence proposal from the Laplace
approximation (``CrankNicolson`` rho = 0), with Crank-Nicolson at rho = 0.5, and with MALA on the surrogate
(``SurrogateLangevin``); exact MH with the independence proposal (a full pass per step: fewer steps at large N,
``--exact-items``); and two calls of ``tm.sample``, up to ``--default-max-n`` (warmup included; their
sampling-stage time and their own step statistics): the default, ``tm.sample(model, data)`` (for this model the
exact subsampled test, the Crank-Nicolson proposal from the run's Laplace approximation with rho adapted in
warmup), and the approximate default of models without a bound (austerity with control variates and the
Langevin proposal, self-audit included). The set-up (mode search, control-variate sums, the bound's weights: counted items and
seconds) is printed once per data set.

``--unbalanced 1e5,1e6``: a case with about 1% positives (d = 11, ``unbalanced``), the exact subsampled test's
proposals with the global remainder bound and with the local one (``LogisticRegression(remainder_bound="local")``:
a trust region around the centre, the exact decision outside it); ``--only-unbalanced`` runs only that case
(results in ``exact_subsampling_unbalanced.json``).

    python benchmarks/exact_subsampling.py --sizes 1e5,1e6,1e7
    python benchmarks/exact_subsampling.py --only-unbalanced --unbalanced 1e5,1e6 --steps 2000
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import _common as C
from time_to_trusted import make_data

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "acceptance"))


def rare_feature(n=50_000, k=30, seed=0):
    rng = np.random.default_rng(seed)
    r = np.zeros(n)
    r[rng.choice(n, k, replace=False)] = 1
    X = np.column_stack([np.ones(n), rng.normal(size=(n, 4)), r])
    beta = np.array([-0.5, 0.8, -0.4, 0.3, 0.2, 4.0])
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X.astype(np.float32), "y": y}


def min_ess(draws):
    import arviz as az

    return min(float(np.ravel(az.ess(draws[..., j]))[0]) for j in range(draws.shape[-1]))


def timed_chains(tm, model, data, test, prop, unravel, cv, stats, steps, chains, seed, cv_order=2):
    """Chains on the kernel (as tests/acceptance/thinning_helpers.run_chains), compiled first, then timed."""
    import jax
    import jax.numpy as jnp

    from tallmh.kernel import build_kernel

    n = int(np.shape(data["y"])[0])
    kernel = build_kernel(model, prop, test, n, unravel, stats, cv_order)
    data = jax.tree_util.tree_map(jnp.asarray, data)
    th0 = jnp.broadcast_to(cv.center, (chains,) + cv.center.shape)
    states = jax.vmap(kernel.init, in_axes=(0, None, None))(th0, data, cv if cv_order else None)

    def one(key, state, data, stats):
        def body(st, k_i):
            st, info = kernel.step(k_i[0], st, data, k_i[1], False, stats)
            return st, (st.theta, info.accepted, info.n_data)

        _, out = jax.lax.scan(body, state, (jax.random.split(key, steps), jnp.arange(steps)))
        return out

    keys = jax.random.split(jax.random.PRNGKey(seed), chains)
    fn = jax.jit(jax.vmap(one, in_axes=(0, 0, None, None)))
    t0 = time.perf_counter()
    compiled = fn.lower(keys, states, data, stats).compile()
    t1 = time.perf_counter()
    out = compiled(keys, states, data, stats)
    jax.block_until_ready(out)
    t2 = time.perf_counter()
    draws, acc, nd = (np.asarray(a) for a in out)
    return draws.astype(np.float64), acc, nd, t1 - t0, t2 - t1


def row(name, n, nd, acc, draws, secs, steps, chains, extra=None):
    ess = min_ess(draws)
    r = {"case": name, "n": n, "items_mean": float(nd.mean()), "items_p99": float(np.quantile(nd, 0.99)),
         "full_pass_share": float(np.mean(nd >= n)), "accept": float(acc.mean()),
         "ess_per_step": ess / (steps * chains), "ess_per_s": ess / secs,
         "sampling_s": secs, "steps": steps, "chains": chains}
    r.update(extra or {})
    return r


COLUMNS = [("case", "<12", "case"), ("N", ">8.0e", "n"), ("method", "<34", "method"),
           ("items/step", ">10.3g", "items_mean"), ("p99", ">6.0f", "items_p99"), ("full", ">7.4f", "full_pass_share"),
           ("accept", ">7.3f", "accept"),
           ("ESS/step", ">9.3f", "ess_per_step"), ("ESS/s", ">9.3g", "ess_per_s")]


def show(r):
    print(C.table_row(r, COLUMNS), flush=True)


def unbalanced(n, seed=0, d=11, rate=0.01):
    """About ``rate`` positives: an intercept at logit(rate), d - 1 features on scales 0.3 to 3."""
    rng = np.random.default_rng(seed)
    sc = np.geomspace(0.3, 3, d - 1)
    X = np.concatenate([np.ones((n, 1)), rng.normal(size=(n, d - 1)) * sc], 1)
    beta = np.r_[np.log(rate / (1 - rate)), rng.normal(size=d - 1) * 0.3 / sc]
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": X.astype(np.float32), "y": y}


def one_case(tm, name, data, args, rows, model=None, full=True):
    """The methods on one data set; ``full=False``: the exact subsampled test's proposals only (no exact MH, no
    default)."""
    from thinning_helpers import setup

    from tallmh import factor_bounds as fbm

    n = int(data["y"].shape[0])
    model = model or tm.models.LogisticRegression()
    t0 = time.perf_counter()
    unravel, cv, stats, items = setup(model, data)
    setup_s = time.perf_counter() - t0
    T = stats[fbm.FACTOR_KEY]
    d = int(T.center.shape[0])
    print(f"## {name} N = {n:.0e}: set-up {setup_s:.1f} s, {items / n:.1f} N items read (mode search, sums, "
          f"the bound's weights); Lambda / phi = {float(T.total):.4g}, {int(np.sum(np.asarray(T.rate) > 0))} groups", flush=True)
    c, L = np.asarray(T.center), np.asarray(T.chol_cov)
    props = {"indep. (CN rho=0)": tm.proposals.CrankNicolson(c, L, rho=0.0),
             "CN rho=0.5": tm.proposals.CrankNicolson(c, L, rho=0.5),
             "surrogate MALA": tm.proposals.SurrogateLangevin(c, L, step=1.65 * d ** (-1 / 3))}
    for pname, prop in props.items():
        draws, acc, nd, comp, secs = timed_chains(tm, model, data, tm.acceptance.PoissonThinning(), prop, unravel, cv,
                                                  stats, args.steps, args.chains, args.seed)
        r = row(name, n, nd, acc, draws, secs, args.steps, args.chains,
                {"method": f"exact-subsampled, {pname}", "compile_s": comp, "setup_s": setup_s, "setup_items": items})
        rows.append(r)
        show(r)
    if not full:
        return
    # exact MH, independence proposal: a full pass per step
    steps = int(max(50, min(args.steps, args.exact_items / (n * args.chains))))
    draws, acc, nd, comp, secs = timed_chains(tm, model, data, tm.acceptance.Exact(), props["indep. (CN rho=0)"],
                                              unravel, cv, stats, steps, args.chains, args.seed + 1, cv_order=None)
    r = row(name, n, nd, acc, draws, secs, steps, args.chains, {"method": "exact MH, indep.", "compile_s": comp})
    rows.append(r)
    show(r)
    calls = {"default (tm.sample)": {},
             "austerity default (tm.sample)": dict(test=tm.acceptance.Austerity(error=0.05),
                                                   control_variates=tm.ControlVariates())}
    for label, kw in calls.items():
        if n > args.default_max_n:
            break
        t0 = time.perf_counter()
        res = tm.sample(model, data, seed=args.seed, progress=False, **kw)
        wall = time.perf_counter() - t0
        st = res.stats
        steps_d = res.flat_samples.shape[1]
        r = row(name, n, np.asarray(st["n_data"]), np.asarray(st["accepted"]), res.flat_samples,
                res.timings["sampling_s"], steps_d, res.flat_samples.shape[0],
                {"method": label, "wall_s": wall, "notes": list(res.notes)})
        rows.append(r)
        show(r)


def main(argv=None):
    ap = C.parser(__doc__)
    C.add_options(ap, sizes="1e5,1e6,1e7", steps=5000, chains=4, exact_items=2e9, default_max_n=1e6)
    ap.add_argument("--no-rare", action="store_true")
    ap.add_argument("--unbalanced", default="", help="sizes of a 1%%-positives case run with the global and the "
                    "local remainder bound (LogisticRegression(remainder_bound=...)), e.g. 1e5,1e6")
    ap.add_argument("--only-unbalanced", action="store_true", help="skip the other cases")
    C.add_run_options(ap, str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    if args.smoke:
        args.sizes, args.steps, args.exact_items, args.default_max_n = "2e4", 300, 2e7, 0
    import tallmh as tm

    meta = C.machine_info(sys.argv if argv is None else ["exact_subsampling.py"] + list(argv))
    C.header("exact subsampled MH", meta)
    print(C.table_header(COLUMNS))
    rows = []
    for n in ([] if args.only_unbalanced else C.numbers(args.sizes, int)):
        X, y, _ = make_data(n, args.seed)
        one_case(tm, "unequal", {"X": X, "y": y}, args, rows)
        del X, y
    for n in (C.numbers(args.unbalanced, int) if args.unbalanced else []):
        data = unbalanced(n, args.seed)
        for bound in ("global", "local"):
            one_case(tm, f"1%-pos {bound}", data, args, rows, tm.models.LogisticRegression(remainder_bound=bound),
                     full=False)
    if not args.no_rare and not args.smoke and not args.only_unbalanced:
        one_case(tm, "rare-feature", rare_feature(seed=args.seed), args, rows)
    meta["load_average_at_end"] = C.load_average()
    if not args.smoke:
        name = "exact_subsampling_unbalanced.json" if args.only_unbalanced else "exact_subsampling.json"
        C.write_json(args.out, name, {"meta": meta, "rows": rows})
    return rows


if __name__ == "__main__":
    main()
