"""The persistent compilation cache: on by default in the user's cache folder, read by a second process,
off with ``TALLMH_COMPILATION_CACHE=0`` or ``tm.set_compilation_cache(None)``, and a user's own JAX cache
folder left alone.

Each check runs fresh Python processes (the cache matters only across processes) and counts JAX's own
monitoring events (``/jax/compilation_cache/cache_hits`` and ``cache_misses``) and the files written: no
timings are asserted.
"""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 300  # a hang guard

CHILD = r'''
import json, sys
from collections import Counter
import jax
events = Counter()
jax.monitoring.register_event_listener(lambda e, **k: events.update([e]))
import tallmh as tm
mode = sys.argv[1]
if mode == "off-by-call":
    tm.set_compilation_cache(None)
if mode in ("sample", "off-by-call"):
    data, _ = tm.models.LogisticRegression.simulate(400, d=3, seed=1)
    data = jax.tree_util.tree_map(jax.numpy.asarray, data)  # device arrays (NumPy data: "numpy-at-K" below)
    tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Austerity(error=0.05, batch_size=100),
              control_variates=tm.ControlVariates(order=2), num_samples=30, num_warmup=30, num_chains=2,
              seed=0, progress=False, audit=0.0)
elif mode.startswith("numpy-at-"):
    # NumPy data at a given offset within 64 bytes (a view into a larger buffer), as malloc may place a small
    # array differently in each process: the compiled programs must not depend on it
    import numpy as np
    k = int(mode.rsplit("-", 1)[1])
    data, _ = tm.models.LogisticRegression.simulate(400, d=3, seed=1)
    placed = {}
    for name, a in data.items():
        a = np.asarray(a)
        buf = np.empty(a.size + 16, a.dtype)
        shift = (k - buf.ctypes.data % 64) % 64 // a.dtype.itemsize
        view = buf[shift:shift + a.size].reshape(a.shape)
        view[...] = a
        assert view.ctypes.data % 64 == k
        placed[name] = view
    tm.sample(tm.models.LogisticRegression(), placed, test=tm.acceptance.Austerity(error=0.05, batch_size=100),
              control_variates=tm.ControlVariates(order=2), num_samples=30, num_warmup=30, num_chains=2,
              seed=0, progress=False, audit=0.0)
else:
    f = jax.jit(lambda x: jax.numpy.sin(x) * 3.0 + x.sum())
    jax.block_until_ready(f(jax.numpy.arange(7.0)))
from tallmh.run import _exec_cache
print("CACHE-JSON " + json.dumps({"dir": tm.compilation_cache_dir(), "loaded": _exec_cache.LOADED,
                                  "hits": events["/jax/compilation_cache/cache_hits"],
                                  "misses": events["/jax/compilation_cache/cache_misses"]}))
'''


def _run(tmp_path, mode, **env_extra):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = {k: v for k, v in os.environ.items()
           if k not in ("TALLMH_COMPILATION_CACHE", "JAX_COMPILATION_CACHE_DIR", "XDG_CACHE_HOME")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    env["PYTHONPATH"] = os.path.join(ROOT, "src") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(env_extra)
    proc = subprocess.run([sys.executable, str(script), mode], env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("CACHE-JSON ")][-1]
    return json.loads(line[len("CACHE-JSON "):])


def _files(path):
    return sum(len(fs) for _, _, fs in os.walk(path)) if os.path.isdir(path) else 0


def test_default_cache_is_read_by_a_second_process(tmp_path):
    first = _run(tmp_path, "jit")
    xdg = str(tmp_path / "xdg")
    assert first["dir"] is not None and first["dir"].startswith(os.path.join(xdg, "tallmh", "jax"))
    import jax

    assert f"jax{jax.__version__}" in os.path.basename(first["dir"])  # a folder per version
    assert first["hits"] == 0 and first["misses"] >= 1
    assert _files(first["dir"]) >= 1
    second = _run(tmp_path, "jit")
    assert second["dir"] == first["dir"]
    assert second["hits"] >= 1 and second["misses"] == 0


def test_opt_out_by_environment(tmp_path):
    out = _run(tmp_path, "jit", TALLMH_COMPILATION_CACHE="0")
    assert out["dir"] is None and out["hits"] == 0 and out["misses"] == 0
    assert _files(str(tmp_path / "xdg")) == 0


def test_environment_path_and_users_own_folder(tmp_path):
    mine = tmp_path / "mine"
    out = _run(tmp_path, "jit", TALLMH_COMPILATION_CACHE=str(mine))
    assert out["dir"] == str(mine) and _files(str(mine)) >= 1
    # a folder the user gave JAX is kept (and tallmh's default folder is not created)
    users = tmp_path / "users"
    out = _run(tmp_path, "jit", JAX_COMPILATION_CACHE_DIR=str(users))
    assert out["dir"] == str(users)
    assert not os.path.exists(tmp_path / "xdg" / "tallmh")


def test_set_compilation_cache_in_process(tmp_path):
    import jax

    import tallmh as tm

    before = jax.config.jax_compilation_cache_dir
    before_min = jax.config.jax_persistent_cache_min_compile_time_secs
    try:
        path = tm.set_compilation_cache(str(tmp_path / "c"))
        assert path == str(tmp_path / "c") and tm.compilation_cache_dir() == path and os.path.isdir(path)
        assert tm.set_compilation_cache(None) is None and tm.compilation_cache_dir() is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before_min)


@pytest.mark.slow
def test_sampler_programs_cached_across_processes(tmp_path):
    """The default path (mode search, control variates, kernel init, the chain) compiles nothing in a second
    process: every program is read from the cache; and ``set_compilation_cache(None)`` writes nothing.
    (Data as device arrays; NumPy data: test_numpy_data_at_another_offset_hits_the_cache.)"""
    off = _run(tmp_path, "off-by-call")
    assert off["dir"] is None and off["hits"] == 0 and off["misses"] == 0
    assert _files(str(tmp_path / "xdg" / "tallmh" / "jax")) == 0
    first = _run(tmp_path, "sample")
    assert first["misses"] >= 5 and _files(first["dir"]) >= first["misses"]
    second = _run(tmp_path, "sample")
    # (the chain itself is loaded from tallmh's own store of compiled chains, without a JAX cache lookup)
    assert first["loaded"] == 0 and second["loaded"] >= 1
    assert second["misses"] == 0 and second["hits"] + second["loaded"] >= first["misses"]


@pytest.mark.slow
def test_numpy_data_at_another_offset_hits_the_cache(tmp_path):
    """Small NumPy arrays land at malloc-dependent offsets within 64 bytes: a second process whose arrays sit
    elsewhere compiles nothing (they are copied into aligned buffers, not read in place at their offset)."""
    first = _run(tmp_path, "numpy-at-4")
    assert first["misses"] >= 4  # (the set-up's programs; the chain goes to tallmh's own store, not JAX's cache)
    assert first["loaded"] == 0
    second = _run(tmp_path, "numpy-at-36")
    assert second["misses"] == 0 and second["hits"] + second["loaded"] >= first["misses"], (first, second)
    assert second["loaded"] >= 1, second  # (the chain, from tallmh's own store)
