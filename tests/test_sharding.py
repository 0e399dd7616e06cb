"""Many devices and many hosts: tallmh.distributed and sample(mesh=...).

The device count of JAX's CPU backend is fixed when JAX starts, so the multi-device runs happen in
subprocesses (tests/sharding_worker.py) with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``, or
as two processes joined by ``jax.distributed`` (slow). The sharded sampler keeps the single-device
sampler's keys and its global permutation, so the checks are exact: the same draws and decisions, bit for
bit (Langevin with rows split: its minibatch gradient is summed across devices in another order, so its
draws agree to float rounding and its decisions exactly). A run with another seed is the negative
control: it must differ, so the comparison has power.
"""

import json
import os
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import tallmh as tm
from tallmh import distributed as dist
from tallmh.errors import ConfigError

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "sharding_worker.py")
SRC = os.path.join(HERE, "..", "src")


def _env(devices=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    flags = " ".join(f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f)
    if devices is not None:
        flags += f" --xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = flags.strip()
    env.pop("JAX_PLATFORMS", None)
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _local(tmp_path, runs):
    out = str(tmp_path / "local.npz")
    p = subprocess.run([sys.executable, WORKER, "local", out, "--runs", ",".join(runs)], env=_env(4),
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    with open(out + ".json") as f:
        meta = json.load(f)
    return np.load(out), meta


def _same_run(z, a, b):
    return np.array_equal(z[a], z[b]) and np.array_equal(z[a + "/accepted"], z[b + "/accepted"]) \
        and np.array_equal(z[a + "/n_data"], z[b + "/n_data"])


# --- in-process (one device) ---------------------------------------------------------------------------


def test_mesh_argument_errors():
    data, _ = tm.models.LogisticRegression.simulate(200, d=2, seed=0)
    model = tm.models.LogisticRegression()
    kw = dict(num_samples=2, num_warmup=0, num_chains=2, init=jnp.zeros(3), progress=False)
    with pytest.raises(ConfigError, match="Mesh"):
        tm.sample(model, data, mesh="all", **kw)
    with pytest.raises(ConfigError, match="axes must be named"):
        tm.sample(model, data, mesh=Mesh(np.array(jax.devices()[:1]), ("batch",)), **kw)
    with pytest.raises(ConfigError, match="needs 2"):
        dist.make_mesh(chains=2, rows=1, devices=jax.devices()[:1])
    with pytest.raises(ConfigError, match="rows"):
        dist.make_mesh(rows=0)


def test_default_mesh_on_one_device_is_none():
    assert jax.device_count() == 1  # the test process itself has one device
    assert dist.default_mesh(4) is None
    m = dist.make_mesh()
    assert dict(m.shape) == {"chains": 1, "rows": 1}


def test_collectives_counts_hlo_ops():
    text = "%a = f32[2] all-reduce(%x), replica_groups={}\n%b = f32[4] all-gather(%y)\n%c = f32[2] all-reduce(%z)"
    assert dist.collectives(text) == {"all-reduce": 2, "all-gather": 1}
    assert dist.collectives("%a = f32[2] add(%x, %y)") == {}


@pytest.mark.slow
def test_one_device_mesh_takes_the_sharded_path_and_matches():
    """A 1 x 1 mesh runs the shard_map program; its draws are those of the plain program."""
    data, _ = tm.models.LogisticRegression.simulate(300, d=2, seed=0)
    model = tm.models.LogisticRegression()
    kw = dict(test=tm.acceptance.Austerity(epsilon=0.05, batch_size=50), num_samples=8, num_warmup=4, num_chains=2,
              seed=1, init=jnp.zeros(3), init_jitter=0.1, progress=False, chunk_size=12)
    plain = tm.sample(model, data, mesh=False, **kw)
    meshed = tm.sample(model, data, mesh=dist.make_mesh(chains=1, rows=1), **kw)
    assert any(n.startswith("layout") for n in meshed.notes)
    np.testing.assert_array_equal(plain.flat_samples, meshed.flat_samples)
    np.testing.assert_array_equal(plain.stats["accepted"], meshed.stats["accepted"])


# --- 4 host devices in a subprocess --------------------------------------------------------------------


@pytest.mark.slow
def test_four_devices_same_draws_as_one(tmp_path):
    """Chains split over 2 devices and N = 2001 rows over 2 (unequal shards, padded): the same draws,
    decisions and items read as on one device; another seed differs (negative control)."""
    z, meta = _local(tmp_path, ["single", "c2r2", "c2r2_seed4", "bad_chains"])
    assert meta["devices"] == 4
    assert z["single"].shape == (4, 20, 4)
    assert _same_run(z, "single", "c2r2")
    assert not np.array_equal(z["single"], z["c2r2_seed4"])  # the comparison can fail
    assert np.mean(z["single/accepted"]) > 0.02  # decisions were made both ways
    # rows split: one all-reduce per chunk size of the test's reader; no other collective
    coll = meta["runs"]["c2r2"]["collectives"]
    assert set(coll) == {"all-reduce"} and coll["all-reduce"] >= 1
    assert meta["runs"]["single"]["collectives"] == {}
    assert "does not split evenly" in meta["runs"]["bad_chains"]["error"]


@pytest.mark.slow
def test_four_devices_more_layouts_tests_and_proposals(tmp_path):
    """Default layout (chains over all 4 devices, no collective), all rows over 4 devices, the exact test,
    control variates (forward-mode derivatives through the psum) and Langevin (reverse mode)."""
    z, meta = _local(tmp_path, ["single", "default", "r4", "exact", "cv", "langevin", "program", "thinning",
                                "thinning_full", "thinning_default", "thinning_bulk"])
    assert _same_run(z, "single", "default")
    assert meta["runs"]["default"]["collectives"] == {}
    assert "'chains_axis': 4" in meta["runs"]["default"]["notes"][0]
    assert _same_run(z, "single", "r4")
    assert _same_run(z, "exact_single", "exact_c2r2")
    assert _same_run(z, "cv_single", "cv_c2r2")
    assert not np.array_equal(z["single"], z["cv_single"])
    # Langevin: the gradient's sum is split across devices: same decisions, draws equal to rounding
    np.testing.assert_array_equal(z["langevin_single/accepted"], z["langevin_c2r2/accepted"])
    np.testing.assert_allclose(z["langevin_single"], z["langevin_c2r2"], rtol=0, atol=1e-5)
    assert np.mean(z["langevin_single/accepted"]) > 0.02
    # the exact subsampled test with rows split (drawn rows read on their devices; the full-pass fallback too),
    # and tm.sample's default with rows split is that test
    for name in ("thinning", "thinning_full"):
        assert _same_run(z, f"{name}_single", f"{name}_c2r2"), name
        assert np.mean(z[f"{name}_single/accepted"]) > 0.02
    assert np.all(z["thinning_full_single/n_data"] >= 2001)  # (every step took the full pass)
    assert np.mean(z["thinning_single/n_data"]) < 50
    # the large-N item sampler (forced on these rows): the same draws with rows split, other draws than the table's
    assert _same_run(z, "thinning_bulk_single", "thinning_bulk_c2r2")
    assert not np.array_equal(z["thinning_bulk_single"], z["thinning_single"])
    assert "error" not in meta["runs"]["thinning_default"], meta["runs"]["thinning_default"]
    assert any("exact-subsampled" in n for n in meta["runs"]["thinning_default"]["method"])
    # an inference program: its chains over 4 devices (one after another on each), the same draws
    assert "error" not in meta["runs"]["program_c4"], meta["runs"]["program_c4"]
    assert _same_run(z, "program_single", "program_c4")
    assert np.mean(z["program_single/accepted"]) > 0.02 and z["program_single"].shape[0] == 4


# --- two processes (jax.distributed, CPU collectives) ---------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_same_draws_as_one(tmp_path):
    """Two processes with 2 host devices each, joined by tallmh.distributed.initialize (gloo): chains over
    the 4 devices, rows over the 4 devices (psum across processes) and a 2 x 2 layout all give, on both
    processes, the draws of the single-device run."""
    out = str(tmp_path / "multi.npz")
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, "multi", out, "--process-id", str(i), "--num-processes", "2",
                               "--port", str(port)], env=_env(None), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=900)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    z0, z1 = np.load(out + ".0.npz"), np.load(out + ".1.npz")
    with open(out + ".0.json") as f:
        meta = json.load(f)
    assert meta["processes"] == 2 and meta["devices"] == 4
    for name in ("single", "default", "r4", "c2r2"):
        assert _same_run(z0, "single", name), name
        for k in (name, name + "/accepted"):
            np.testing.assert_array_equal(z0[k], z1[k])
    assert "'processes': 2" in meta["runs"]["r4"]["notes"][0]
    assert meta["runs"]["r4"]["collectives"].get("all-reduce", 0) >= 1
