"""Helpers shared by the benchmark scripts in ``benchmarks/`` and the papers' scripts in ``benchmarks/papers/``.

Not a benchmark itself. A script in ``benchmarks/`` imports it as ``_common`` (the folder of a script is on
``sys.path`` when it runs as ``python benchmarks/NAME.py``); the papers' scripts reach it through
``benchmarks/papers/_common.py``, which adds their own results folder.

What lives here, once:

- arguments: :func:`parser` (the description is the first paragraph of the script's docstring),
  :func:`add_options` (plain options from their defaults), :func:`add_run_options` (``--seed``,
  ``--smoke``, ``--out``), :func:`numbers` (comma-separated lists);
- text tables: :func:`print_table` (or :func:`table_header` and :func:`table_row` for a table printed as
  its rows come);
- result files: :func:`machine_info` (platform, CPUs, versions, git commit, date, load average, command
  line), :func:`header` (the same as a comment line), :func:`write_json` (numpy-aware, records the load
  average at the end);
- plots: :func:`pyplot` (the non-interactive backend), :func:`figure`, :func:`finish_figure` (lay out,
  save the PNG, close), :func:`log_log` (the axes of a cost-versus-N panel);
- child processes: :func:`run_child` (a fresh process timed from outside, its result read from a tagged
  JSON line of its output);
- small analysis pieces the scripts share: :func:`slope` (log-log least squares), the logistic-regression
  MAP by Newton's method (:func:`logistic_newton`), the wrong-decision measurement of the austerity
  paper's Fig. 2 (:func:`tune_rw_sigma`, :func:`pair_decisions`, :func:`wrong_decisions`), and the
  epsilon runs of its Figs. 5-7 scored at wall-time points (:func:`epsilon_tests`, :func:`time_grid`,
  :func:`running_means_at`).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import re
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


# ---------------------------------------------------------------------------------------------------
# child processes


def run_child(cmd, env, tag, *, timeout=None):
    """Run ``cmd`` (a benchmark's own child) and return ``(result, wall seconds)``: ``result`` is the JSON
    object on the last line of its standard output that starts with ``tag`` and a space. A child that
    exits non-zero raises RuntimeError with the end of its standard error; ``timeout`` is
    :func:`subprocess.run`'s (``subprocess.TimeoutExpired`` is left to the caller)."""
    t = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"child {' '.join(map(str, cmd[1:]))} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    prefix = tag + " "
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith(prefix)][-1]
    return json.loads(line[len(prefix):]), wall


# ---------------------------------------------------------------------------------------------------
# arguments


def parser(doc, *, whole=False):
    """An ``ArgumentParser`` whose description is the first paragraph of ``doc`` (the script's docstring), or
    with ``whole=True`` all of it, as written."""
    if whole:
        return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    return argparse.ArgumentParser(description=doc.split("\n\n")[0])


def add_run_options(ap, out, *, out_help=None, smoke_help="tiny run (seconds) for the tests", seed=True):
    """Add the options every script has, in this order: ``--seed`` (default 0), ``--smoke``, ``--out``."""
    if seed:
        ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--smoke", action="store_true", help=smoke_help)
    ap.add_argument("--out", default=out, help=out_help)
    return ap


def add_options(ap, **defaults):
    """One option per keyword, in order: ``name_x=default`` adds ``--name-x`` whose type is that of its default
    (int, float or str; ``False`` makes a flag), so a script lists its plain options on one line."""
    for name, default in defaults.items():
        flag = "--" + name.replace("_", "-")
        if default is False:
            ap.add_argument(flag, action="store_true")
        elif isinstance(default, (int, float, str)) and not isinstance(default, bool):
            ap.add_argument(flag, type=type(default), default=default)
        else:
            raise TypeError(f"add_options: {flag} needs an int, float or str default, or False")
    return ap


def numbers(text, kind=float):
    """``"1e3,1e4"`` -> ``[1000.0, 10000.0]``; ``kind=int`` reads each as a float first (so ``1e3`` works)."""
    if kind is int:
        return [int(float(s)) for s in text.split(",")]
    return [kind(s) for s in text.split(",")]


# ---------------------------------------------------------------------------------------------------
# result files


def load_average():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=False, cwd=HERE, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # pragma: no cover - git missing
        return ""


def machine_info(argv, **extra):
    """Platform, CPU count, versions, date, git commit, load average and the command line, for the JSON files.

    Keyword arguments are added as they are (e.g. ``jax_devices=...``)."""
    import jax

    import tallmh

    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load_average(),
        "python": platform.python_version(),
        "jax_version": jax.__version__,
        "jax_backend": jax.default_backend(),
        "numpy_version": np.__version__,
        "tallmh_version": tallmh.__version__,
        "git_commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), os.path.relpath(os.path.abspath(argv[0]), REPO_ROOT)]
                            + list(argv[1:])),
        **extra,
    }


def header(name, meta):
    print(f"# {name}")
    print(f"# {meta['platform']}, {meta['cpu_count']} CPUs, JAX {meta['jax_version']} ({meta['jax_backend']}), "
          f"{meta['date']}, load average {meta['load_average_at_start']} (shared machine: timings are noisy)",
          flush=True)


def _default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def write_json(out_dir, filename, obj, *, default=_default):
    """Write ``obj`` to ``out_dir/filename`` (numpy scalars and arrays allowed; ``default`` as ``json.dump``'s),
    with ``meta.load_average_at_end`` (now, unless the caller has set it)."""
    os.makedirs(out_dir, exist_ok=True)
    obj.setdefault("meta", {}).setdefault("load_average_at_end", load_average())
    path = os.path.join(out_dir, filename)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, default=default, allow_nan=True)
    print(f"wrote {path}", flush=True)
    return path


def print_json_line(obj, path=None):
    """Print ``obj`` as one JSON line and, where ``path`` is given, append the line to that file (JSON lines)."""
    line = json.dumps(obj)
    print(line, flush=True)
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


def _column_header(title, spec):
    m = re.match(r"([<>^=]?)[+\- ]?(\d*)", spec)
    align = m.group(1).replace("=", ">") or ("<" if spec.endswith("s") else ">")
    return f"{title:{align}{m.group(2)}s}"


def table_header(columns, sep=" "):
    """The header line of a text table; ``columns`` is a list of ``(title, format spec, value)``, the value a
    key of the row or a function of it. A title is aligned like its column (left for ``s`` specs)."""
    return sep.join(_column_header(title, spec) for title, spec, _ in columns)


def table_row(row, columns, sep=" "):
    """One line of the table of :func:`table_header`."""
    return sep.join(format(value(row) if callable(value) else row[value], spec) for _, spec, value in columns)


def percent(key):
    """A table value: 100 times ``row[key]``."""
    return lambda r: 100 * r[key]


def print_table(rows, columns, sep=" "):
    """Print the header and one line per row (see :func:`table_header`)."""
    print(table_header(columns, sep))
    for r in rows:
        print(table_row(r, columns, sep))


# ---------------------------------------------------------------------------------------------------
# plots


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def figure(nrows=1, ncols=1, **kwargs):
    """``(fig, axes)`` of ``plt.subplots`` on the non-interactive backend."""
    return pyplot().subplots(nrows, ncols, **kwargs)


def save_fig(fig, out_dir, filename, dpi=110):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, filename)
    fig.savefig(path, dpi=dpi)
    print(f"wrote {path}", flush=True)
    return path


def finish_figure(fig, out_dir, filename, *, suptitle=None, rect=None, dpi=110):
    """Optional suptitle (font size 10), ``tight_layout``, save as ``out_dir/filename``, close; returns the path."""
    if suptitle is not None:
        fig.suptitle(suptitle, fontsize=10)
    if rect is None:
        fig.tight_layout()
    else:
        fig.tight_layout(rect=rect)
    path = save_fig(fig, out_dir, filename, dpi=dpi)
    pyplot().close(fig)
    return path


def log_log(ax, xlabel, ylabel, title, *, legend=True):
    """Log scales on both axes, the labels, a small title and (by default) a small legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    if legend:
        ax.legend(fontsize=7)


# ---------------------------------------------------------------------------------------------------
# analysis pieces


def slope(x, y):
    """Least-squares slope of log10(y) on log10(x), over the finite positive points (nan with fewer than 2)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log10(x[ok]), np.log10(y[ok]), 1)[0])


def epsilon_tests(tm, epsilons, batch_size):
    """``[(epsilon, test)]`` for a comma-separated list: ``Exact()`` for 0 (exact MH, as the austerity paper
    puts it), ``Austerity(epsilon, batch_size)`` otherwise."""
    return [(eps, tm.acceptance.Exact() if eps == 0 else tm.acceptance.Austerity(epsilon=eps, batch_size=batch_size))
            for eps in numbers(epsilons)]


def time_grid(seconds, points=16):
    """Wall-time points at which a run of ``seconds`` is scored: geometric from ``max(0.05, seconds / 200)``."""
    return np.geomspace(max(0.05, seconds / 200), seconds, points)


def running_means_at(values, seconds, grid):
    """Running means of ``values`` (draws along axis 0, taken at an even rate over ``seconds`` of wall time)
    at each time of ``grid``; nan before the first draw."""
    m = values.shape[0]
    t_draw = (np.arange(m) + 1) * seconds / m
    cum = np.cumsum(values, axis=0) / np.arange(1, m + 1).reshape((-1,) + (1,) * (values.ndim - 1))
    out = np.full((len(grid),) + values.shape[1:], np.nan)
    for gi, tg in enumerate(grid):
        j = np.searchsorted(t_draw, tg, side="right")
        if j > 0:
            out[gi] = cum[j - 1]
    return out


def log_lik_logistic(X, y, theta):
    """Per-item log-likelihood of logistic regression, ``log sigmoid(+-x.theta)`` (numpy, float64)."""
    z = X @ theta
    return -np.logaddexp(0.0, np.where(y > 0.5, -z, z))


def logistic_newton(X, y, prior_var, iters, *, tol=1e-12, chunk=1_000_000):
    """MAP of logistic regression with a ``N(0, prior_var I)`` prior by Newton's method (float64, in chunks of
    ``chunk`` rows), the Hessian of the negative log posterior at the last iterate before the final step
    (its inverse is the Laplace covariance), and the number of Newton steps taken.

    Stops when the largest step is below ``tol * (1 + max |theta|)`` or after ``iters`` steps."""
    n, d = X.shape
    theta = np.zeros(d)
    steps = 0
    H = None
    for _ in range(iters):
        g = -theta / prior_var
        H = np.eye(d) / prior_var
        for a in range(0, n, chunk):
            Xc = np.asarray(X[a:a + chunk], np.float64)
            p = 1.0 / (1.0 + np.exp(-(Xc @ theta)))
            g += Xc.T @ (np.asarray(y[a:a + chunk], np.float64) - p)
            H += (Xc * (p * (1.0 - p))[:, None]).T @ Xc
        steps += 1
        step = np.linalg.solve(H, g)
        theta = theta + step
        if np.max(np.abs(step)) < tol * (1 + np.max(np.abs(theta))):
            break
    return theta, H, steps


def tune_rw_sigma(X, y, thetas, zs, prior_var, target_accept, lo_sd, hi_sd):
    """Random-walk sd for the pairs ``(theta, theta + sigma z)`` whose mean exact acceptance probability
    ``min(1, e^Delta)`` is ``target_accept``: 40 bisection steps on log sigma between ``lo_sd`` and ``hi_sd``
    (acceptance falls with sigma). Returns ``(sigma, deltas)``, ``deltas(s)`` the
    log MH ratios of the pairs at sd ``s`` (Gaussian ``N(0, prior_var I)`` prior)."""

    def log_prior(t):
        return -0.5 * np.sum(t**2, axis=-1) / prior_var

    ll_cur = np.array([log_lik_logistic(X, y, t).sum() for t in thetas])

    def deltas(sigma):
        props = thetas + sigma * zs
        ll_p = np.array([log_lik_logistic(X, y, t).sum() for t in props])
        return ll_p - ll_cur + log_prior(props) - log_prior(thetas)

    def acc_rate(sigma):
        return float(np.mean(np.exp(np.minimum(0.0, deltas(sigma)))))

    lo, hi = math.log(lo_sd), math.log(hi_sd)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        if acc_rate(math.exp(mid)) > target_accept:
            lo = mid
        else:
            hi = mid
    return math.exp(0.5 * (lo + hi)), deltas


def pair_decisions(tm, model, data, thetas, props, seed, keys):
    """``run(test) -> (accepted, items)``, both ``(pairs, keys)``: the test's decision for every pair
    ``(thetas[i], props[i])`` under ``keys`` keys per pair (the same keys for every test, so tests that draw
    u from the key, as the library's tests do, decide with the same u)."""
    import jax
    import jax.numpy as jnp

    pairs = len(thetas)
    th32 = jnp.asarray(thetas, jnp.float32)
    pr32 = jnp.asarray(props, jnp.float32)
    base_key = jax.random.PRNGKey(seed)
    pair_keys = [jax.random.split(jax.random.fold_in(base_key, i), keys) for i in range(pairs)]

    def run(test):
        f = jax.jit(jax.vmap(tm.decision_fn(test, model, data), in_axes=(None, None, 0)))
        acc = np.zeros((pairs, keys), bool)
        nd = np.zeros((pairs, keys), np.int64)
        for i in range(pairs):
            a, m = f(th32[i], pr32[i], pair_keys[i])
            acc[i] = np.asarray(a)
            nd[i] = np.asarray(m)
        return acc, nd

    return run


def wrong_decisions(acc, nd, exact_acc, n):
    """Data fraction and wrong-decision rates of a test against the exact decisions on the same keys:
    binomial standard error over all decisions and the pair-clustered one (sd of the per-pair rates /
    sqrt(pairs); nan with one pair), wrong accepts, wrong rejects, acceptance, worst pair; and the per-pair
    wrong rates. Returns ``(row, per_pair)``."""
    wrong = acc != exact_acc
    pairs = wrong.shape[0]
    p = float(wrong.mean())
    per_pair = wrong.mean(axis=1)
    return {
        "decisions": int(wrong.size),
        "data_fraction": float(nd.mean() / n),
        "wrong_rate": p,
        "wrong_rate_binomial_se": math.sqrt(p * (1 - p) / wrong.size),
        "wrong_rate_pair_clustered_se": float(per_pair.std(ddof=1) / math.sqrt(pairs)) if pairs > 1 else float("nan"),
        "wrong_accept_rate": float(np.mean(acc & ~exact_acc)),
        "wrong_reject_rate": float(np.mean(~acc & exact_acc)),
        "acceptance_rate": float(acc.mean()),
        "max_pair_wrong_rate": float(per_pair.max()),
    }, per_pair
