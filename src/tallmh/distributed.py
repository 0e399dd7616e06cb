"""Many devices and many hosts, on JAX's own engine (``jax.sharding``, ``jax.shard_map``, ``jax.distributed``).

A run is spread over a :class:`jax.sharding.Mesh` with two named axes:

- ``"chains"``: the vmapped chain axis is split across these devices. Each device runs ``num_chains /
  size`` chains with its own (vmapped) while loops, so chains on different devices never wait for each
  other inside a step and no collective is needed for this axis.
- ``"rows"``: the data's item axis N is split across these devices (each holds about ``N / size`` rows).
  The test still reads the items in the order of the *same* global keyed permutation as on one device
  (:mod:`tallmh.storage.data`), so it makes the same decisions on the same keys. Each device evaluates the
  model on the items of the chunk that it owns (the other lanes are masked to zero) and one ``psum``
  over ``"rows"`` per chunk gives every device the chunk's per-item log-likelihood ratios; the
  test's running sums (:class:`tallmh.acceptance.base.Moments`) are then updated identically on every
  device. A sum of one owned value and zeros is exact, so the draws are those of the single-device run,
  bit for bit. What travels per round is ``m`` numbers (the chunk size), whatever the data's width.

The compiled chain is ``jit(shard_map(vmap(chain), mesh))``: the same program runs unchanged on one
machine with several devices, on several processes of one machine (CPU collectives, gloo), or on a GPU
cluster or TPU pod once every process has called :func:`initialize` (``jax.distributed.initialize``).
Each process then runs the same script with the same data and seed; the set-up passes (posterior mode,
control-variate sums, the exact test's first pass) run on each process's own devices, after which the
chain states and the data are laid out over the global mesh (:func:`put`) and the results gathered back
to every process (:func:`to_host`).

Layout of the compiled program: an outer ``shard_map`` is manual over ``"chains"`` (``check_vma=False``:
the tests' loops start their running sums as unvarying constants that become chain-varying, and nothing
is summed across chains, so the compiled program has no collective at all when ``rows == 1``); with
``rows > 1`` an inner ``shard_map`` over ``"rows"`` (``check_vma=True``) runs the chains' loops, so the
gradient of a psum of local terms is the psum of the local gradients and the Langevin proposal's
minibatch gradient is right (its draws then match the single-device ones to float rounding: the
gradient's sum is split across devices in another order). The compiled program's collectives are one
``all-reduce`` of ``f32[chains per device, m]`` per chunk size of the test's reader, over the row
groups (:func:`collectives` counts them).

What is *not* done here: per-shard keyed permutations with stratified draws weighted
by shard sizes (which would let each device evaluate only its own ``m / rows`` items instead of masking
``m``); with ``rows > 1`` every device still evaluates the model on the whole chunk (its own rows
un-masked), so row sharding saves memory per device, not likelihood evaluations. The set-up passes
(posterior mode, control-variate sums, the exact test's first pass) read the whole data on every
process, and a test that brings its own kernel (informed sub-sampling) cannot be row-sharded.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from .storage.data import take
from .errors import ConfigError

__all__ = ["CHAINS", "ROWS", "make_mesh", "default_mesh", "initialize", "Plan", "plan_for", "put", "to_host",
           "agree", "collectives", "RowView"]

CHAINS = "chains"
ROWS = "rows"


def make_mesh(chains: Optional[int] = None, rows: int = 1, devices=None) -> Mesh:
    """A ``(chains, rows)`` mesh over ``devices`` (default: all devices of all processes, ``jax.devices()``).

    ``chains * rows`` devices are used (the first ones); ``chains`` defaults to ``len(devices) // rows``.
    Pass it to :func:`tallmh.sample` as ``mesh=``.
    """
    devices = list(jax.devices() if devices is None else devices)
    rows = int(rows)
    if rows < 1:
        raise ConfigError(f"rows must be a positive integer; got {rows}")
    if chains is None:
        chains = max(1, len(devices) // rows)
    chains = int(chains)
    if chains < 1:
        raise ConfigError(f"chains must be a positive integer; got {chains}")
    if chains * rows > len(devices):
        raise ConfigError(f"a mesh of {chains} x {rows} devices needs {chains * rows}; {len(devices)} available")
    arr = np.array(devices[: chains * rows], dtype=object).reshape(chains, rows)
    return Mesh(arr, (CHAINS, ROWS))


def default_mesh(num_chains: int) -> Optional[Mesh]:
    """The mesh :func:`tallmh.sample` uses when ``mesh`` is not given: ``None`` (one device) when only one
    device is visible, else the chains split over as many devices as evenly divide ``num_chains``."""
    n_dev = jax.device_count()
    if n_dev <= 1:
        return None
    c = max(k for k in range(1, n_dev + 1) if num_chains % k == 0 and n_dev % k == 0)
    if c <= 1:
        return None
    return make_mesh(chains=c, rows=1)


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, local_device_count: Optional[int] = None, **kwargs):
    """Join a multi-process run: ``jax.distributed.initialize`` with CPU collectives on (gloo).

    Call it first thing in every process, before any JAX computation, then run the same program
    everywhere. On a GPU cluster or a TPU pod the arguments can usually be left out (JAX reads them from
    the cluster environment: SLURM, Open MPI, Cloud TPU). ``local_device_count``: host (CPU) devices per
    process, set through ``XLA_FLAGS`` (it only takes effect if JAX's CPU backend has not started yet).
    """
    if local_device_count is not None:
        flags = os.environ.get("XLA_FLAGS", "")
        flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", flags)
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={int(local_device_count)}".strip()
    if "jax_cpu_collectives_implementation" in jax.config.values:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, **kwargs)


@dataclass(frozen=True)
class Plan:
    """How a run is laid out: the mesh, and the sizes of its chain and row axes."""

    mesh: Mesh
    chains: int
    rows: int
    n: int  # items
    n_pad: int  # items after padding to a multiple of ``rows``

    @property
    def chain_spec(self):
        return P(CHAINS) if CHAINS in self.mesh.axis_names else P()

    @property
    def row_spec(self):
        return P(ROWS) if self.rows > 1 else P()

    def sharding(self, spec) -> NamedSharding:
        return NamedSharding(self.mesh, spec)

    def key(self):
        return (tuple(self.mesh.axis_names), tuple(self.mesh.devices.shape),
                tuple(d.id for d in self.mesh.devices.flat), self.n_pad)


def plan_for(mesh, num_chains: int, n: int) -> Optional[Plan]:
    """Check ``mesh`` against the run and return its :class:`Plan` (None: run on one device as before)."""
    if mesh is None or mesh is False:
        return None
    if not isinstance(mesh, Mesh):
        raise ConfigError(f"mesh must be a jax.sharding.Mesh (see tallmh.distributed.make_mesh), None or False; "
                          f"got {type(mesh).__name__}")
    names = tuple(mesh.axis_names)
    bad = [a for a in names if a not in (CHAINS, ROWS)]
    if bad:
        raise ConfigError(f"mesh axes must be named {CHAINS!r} and/or {ROWS!r}; got {names}")
    shape = dict(mesh.shape)
    c, r = int(shape.get(CHAINS, 1)), int(shape.get(ROWS, 1))
    if num_chains % c:
        raise ConfigError(f"num_chains = {num_chains} does not split evenly over the mesh's {c} chain devices")
    if r > n:
        raise ConfigError(f"N = {n} items cannot be split over {r} row devices")
    n_pad = -(-n // r) * r
    return Plan(mesh, c, r, n, n_pad)


def put(x, sharding: NamedSharding):
    """``x`` (array-like) as a global array laid out by ``sharding``; works across processes too.

    Every process must pass the same value. Arrays already laid out so are returned as they are.
    """
    if isinstance(x, jax.Array) and x.sharding.is_equivalent_to(sharding, x.ndim):
        return x
    if sharding.is_fully_addressable:
        return jax.device_put(x, sharding)
    shape = np.shape(x)
    return jax.make_array_from_callback(shape, sharding, lambda idx: np.asarray(x[idx]))


def put_rows(leaf, plan: Plan):
    """A data leaf laid out by rows (``plan.row_spec``), padded to ``plan.n_pad`` rows with copies of row 0
    (padding rows are never read: every index the tests make is below N). Each device's block is sliced
    from ``leaf`` (a memmap is read only where needed)."""
    sharding = plan.sharding(plan.row_spec)
    if plan.n_pad == plan.n:
        return put(leaf, sharding)
    shape = (plan.n_pad,) + tuple(np.shape(leaf)[1:])
    n = plan.n

    def block(idx):
        rs = idx[0]
        start, stop = rs.start or 0, plan.n_pad if rs.stop is None else rs.stop
        rest = tuple(idx[1:])
        part = np.asarray(leaf[(slice(start, min(stop, n)),) + rest]) if start < n else None
        missing = stop - max(start, min(stop, n))
        if missing > 0:
            pad = np.repeat(np.asarray(leaf[(slice(0, 1),) + rest]), missing, axis=0)
            part = pad if part is None else np.concatenate([part, pad])
        return part

    return jax.make_array_from_callback(shape, sharding, block)


def to_host(x):
    """A (possibly multi-process) global array as a NumPy array, the same on every process."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        from jax.experimental import multihost_utils

        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)


def agree(*values):
    """The integers ``values`` as process 0 has them (a broadcast when several processes run).

    The runner sizes its chunks by wall time and stops on a time budget; every process must make the
    same compiled calls (each holds a part of the same global program), so they follow process 0.
    """
    if jax.process_count() == 1:
        return tuple(int(v) for v in values)
    from jax.experimental import multihost_utils

    got = multihost_utils.broadcast_one_to_all(np.asarray([int(v) for v in values], np.int32))
    return tuple(int(v) for v in np.asarray(got))


def collectives(compiled) -> dict:
    """Counts of the collective operations in a compiled program's HLO text (all-reduce, all-gather, ...)."""
    text = compiled.as_text() if hasattr(compiled, "as_text") else str(compiled)
    ops = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    out = {}
    for op in ops:
        k = len(re.findall(rf"\b{op}(?:-start)?\(", text))
        if k:
            out[op] = k
    return out


class RowView:
    """A model whose per-item log-likelihoods are computed from row-sharded data inside ``shard_map``.

    The kernel is given ``arange(N)`` as its data, so a "batch" is a vector of global item indices.
    ``log_lik`` (and ``log_lik_ratio``, when the model has one) evaluates the model on the rows this
    device owns, puts zero in the other lanes and sums over the ``"rows"`` axis (one ``psum`` of ``m``
    values per chunk): every device gets the same per-item values as the single-device kernel. A model's
    closed-form drift sums (``lik_grad_remainder``) are taken over the rows each device owns and summed
    over the axis. Every other attribute is the wrapped model's.
    """

    def __init__(self, model, local_data, n_local: int, axis: str = ROWS):
        self._model = model
        self._local = local_data
        self._n_local = int(n_local)
        self._axis = axis

    def _gather(self, idx, fn):
        """``fn(rows)`` (one value per item) on this device's rows of ``idx``, zero in the other lanes, summed
        over the devices."""

        def masked(rows, own):
            v = fn(rows)
            return jnp.where(own, v, jnp.zeros_like(v))

        return self._gather_sum(idx, masked)

    def log_lik(self, theta, batch):
        return self._gather(batch, lambda b: self._model.log_lik(theta, b))

    def viewed_model(self):
        """The wrapped model: its class's closed forms are this view's (:func:`tallmh.model.own_method`)."""
        return self._model

    def _gather_sum(self, idx, fn):
        """``fn(rows, own)`` (a sum over the rows where ``own``) on this device's rows of ``idx``, summed over
        the devices."""
        rows = idx - jax.lax.axis_index(self._axis) * self._n_local
        own = (rows >= 0) & (rows < self._n_local)
        return jax.lax.psum(fn(take(self._local, jnp.clip(rows, 0, self._n_local - 1)), own), self._axis)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._model, name)
        if name == "log_lik_ratio" and callable(value):
            return lambda theta, theta_prop, batch: self._gather(batch, lambda b: value(theta, theta_prop, b))
        if name == "factor_bound" and callable(value):  # the exact subsampled test's remainders, on their devices
            return lambda: _RowBound(value(), self)
        if name == "lik_grad_remainder" and callable(value):
            return lambda theta, center, batch, order: self._gather_sum(
                batch, lambda b, own: value(theta, center, b, order, mask=own))
        return value


class _RowBound:
    """A remainder bound (:mod:`tallmh.factor_bounds`) seen through a :class:`RowView`: its per-item remainders
    are computed on the device that owns each row and summed over the rows axis (a batch is a vector of global
    item indices); its data-free parts and the set-up's weights are the wrapped bound's."""

    def __init__(self, bound, view: "RowView"):
        self._bound, self._view = bound, view

    def remainder(self, theta, theta_p, center, batch):
        return self._view._gather(batch, lambda b: self._bound.remainder(theta, theta_p, center, b))

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._bound, name)


def sharded_runner(chain_run_of, plan: Plan, model, n: int, map_chains: bool = False):
    """``jit(shard_map(vmap(chain_run)))`` over ``plan.mesh``.

    ``chain_run_of(model)`` returns the one-chain function ``chain_run(state, ckey, akey, start, count,
    phase, audit_rate, data, stats)`` built on ``model``. With row sharding, an inner ``shard_map`` over
    ``"rows"`` (the chains' loops run inside it) gives it a :class:`RowView` of the model and
    ``arange(N)`` as data. ``map_chains``: each device runs its chains one after another (``lax.map``,
    as an inference program's kernel asks) instead of side by side (``vmap``).
    """
    c_spec = plan.chain_spec
    n_local = plan.n_pad // plan.rows
    vm = (0, 0, None, None, None, None, None, None, None)

    def rows_body(state, ckey, akey, start, count, phase, rate, data, stats):
        run = chain_run_of(RowView(model, data, n_local))
        kdata = jnp.arange(n, dtype=jnp.int32)
        return jax.vmap(run, in_axes=vm)(state, ckey, akey, start, count, phase, rate, kdata, stats)

    def body(state, ckey, akey, start, count, phase, rate, data, stats):
        if plan.rows > 1:
            # the rows axis is type-checked (check_vma): psum's transpose is then right for gradient
            # proposals (the gradient of a psum over rows of local terms is the psum of local gradients)
            inner = jax.shard_map(rows_body, in_specs=(P(), P(), P(), P(), P(), P(), P(), P(ROWS), P()),
                                  out_specs=P(), axis_names=frozenset({ROWS}), check_vma=True)
            return inner(state, ckey, akey, start, count, phase, rate, data, stats)
        run = chain_run_of(model)
        if map_chains:
            return jax.lax.map(lambda sk: run(sk[0], sk[1], akey, start, count, phase, rate, data, stats),
                               (state, ckey))
        return jax.vmap(run, in_axes=vm)(state, ckey, akey, start, count, phase, rate, data, stats)

    # check_vma=False on the chains axis: see the module's docstring
    fn = jax.shard_map(body, mesh=plan.mesh,
                       in_specs=(c_spec, c_spec, P(), P(), P(), P(), P(), P(), P()),
                       out_specs=c_spec, check_vma=False, axis_names=frozenset(plan.mesh.axis_names) - {ROWS}
                       if plan.rows > 1 else frozenset(plan.mesh.axis_names))
    return jax.jit(fn)


def place_inputs(plan: Plan, states, chain_keys, akey, data, stats):
    """The runner's inputs laid out over the mesh: chains split, data by rows (or replicated), rest replicated."""
    cs = plan.sharding(plan.chain_spec)
    rep = plan.sharding(P())
    states = jax.tree_util.tree_map(lambda a: put(a, cs), states)
    chain_keys = put(chain_keys, cs)
    akey = put(akey, rep)
    if plan.rows > 1:
        data = jax.tree_util.tree_map(lambda a: put_rows(a, plan), data)
    else:
        data = jax.tree_util.tree_map(lambda a: put(a, rep), data)
    stats = jax.tree_util.tree_map(lambda a: put(a, rep), stats)
    return states, chain_keys, akey, data, stats


def scalar(plan: Plan, value, dtype):
    """A replicated scalar argument."""
    return put(np.asarray(value, dtype), plan.sharding(P()))


def describe(plan: Optional[Plan]) -> Any:
    """A short description of the layout, for the result's notes."""
    if plan is None:
        return None
    return {"devices": int(plan.chains * plan.rows), "chains_axis": plan.chains, "rows_axis": plan.rows,
            "processes": int(jax.process_count())}
