"""Helpers shared by the papers' experiment scripts (machine description, JSON output, paths).

Not a benchmark itself. Each script in this folder imports it as ``_common`` (the folder of the script is
on ``sys.path`` when a script is run as ``python benchmarks/papers/NAME.py``).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
DEFAULT_OUT = os.path.join(HERE, "results")


def load_average():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:  # pragma: no cover - not on every platform
        return None


def machine_info(argv):
    """Platform, CPU count, versions, date, git commit and the command line, for the JSON files."""
    import jax

    import tallmh

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=False, cwd=HERE, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # pragma: no cover - git missing
        commit = ""
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
        "git_commit": commit,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), os.path.relpath(os.path.abspath(argv[0]), REPO_ROOT)]
                            + list(argv[1:])),
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


def write_json(out_dir, filename, obj):
    os.makedirs(out_dir, exist_ok=True)
    obj.setdefault("meta", {})["load_average_at_end"] = load_average()
    path = os.path.join(out_dir, filename)
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, default=_default, allow_nan=True)
    print(f"wrote {path}", flush=True)
    return path


def save_fig(fig, out_dir, filename):
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, filename)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", flush=True)
    return path


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def slope(x, y):
    """Least-squares slope of log10(y) on log10(x)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log10(x[ok]), np.log10(y[ok]), 1)[0])
