"""PyMC (and Bambi) models as tallmh models: ``model, data = tm.from_pymc(pm_model)``.

The probabilistic-programs paper (Chen, Mansinghka & Ghahramani, Sec. 3.1-3.2, eqs. 5-6) subsamples the
*local sections* of a program: factors ``l_i`` that are conditionally independent given the global
variables. In a PyMC model these are the rows of the observed variables along their leading (data)
axis. This module turns a ``pm.Model`` into a :class:`tallmh.Model` whose

- ``theta`` is ``{value variable: unconstrained value}`` for every free random variable, on the scale of
  PyMC's own value transforms (``sigma_log__`` for a ``HalfNormal("sigma")``), and ``log_prior(theta)``
  is their joint log density with the log-Jacobians of those transforms (PyMC's ``logp(jacobian=True)``)
  plus any potential that does not read the data;
- ``log_lik(theta, batch) -> (b,)`` is, for each of the ``b`` rows in ``batch``, the sum over observed
  variables of their log density at that row (a 2-d observed variable's row is summed over its other
  axes). The observed values, the ``pm.Data`` containers and the constant arrays whose leading length is
  the number of rows N become *inputs* of one graph that PyTensor's JAX backend compiles
  (:func:`pymc.sampling.jax.get_jaxified_graph`): the compiled program serves any batch of rows;
- ``constrain(theta)`` gives ``{PyMC variable: constrained value}`` for the free variables and the
  deterministics that do not read the data, so draws, summaries and ``to_arviz()`` use PyMC's names on
  the constrained scale.

Refused with a :class:`~tallmh.errors.ModelError` that says why: a free variable indexed by the data rows
(a per-item latent, including PyMC's imputed missing values); an observed variable without a data axis
(a scalar) or with a leading length different from the others; discrete free variables (MH here moves
continuous globals); a prior or potential that reads the data arrays; a model whose per-row terms are
not additive over rows (e.g. it standardises the data inside the graph); a length fixed to N inside an
observed variable's parameters (the batch fails, and the message says so); and operations PyTensor's JAX
backend cannot compile (the op is named). For N <= ``check_full_max`` the construction also checks that
``log_prior + sum(log_lik)`` equals PyMC's own log density on the full data.

Group-level terms in Bambi's non-centred form (``T = T_offset * T_sigma``) are then moved partially
centred (:class:`RecentredPyMCModel`, :func:`recentre`): with many rows per level the non-centred form's
joint mode, where tallmh builds its start and preconditioner, lies at a scale far above the posterior's.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Dict

import jax
import jax.numpy as jnp
import numpy as np

from .._memory import release
from ..errors import ConfigError, ModelError
from ..model import Model, count_conversion
from ..arrow_hessian import ArrowDerivs, ArrowSpec, group_diagonal

__all__ = ["from_pymc", "from_bambi", "PyMCModel", "RecentredPyMCModel", "recentre"]


def _pymc():
    try:
        import pymc  # noqa: F401
        import pytensor  # noqa: F401
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("tm.from_pymc needs PyMC: pip install pymc (or pip install 'tallmh[pymc]')") from e
    import pymc

    return pymc


def _quiet(fn):
    """Call a JAX-funcified PyTensor graph without its float64-under-float32 dtype warnings."""

    def call(*args):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*dtype.*is not available.*")
            warnings.filterwarnings("ignore", message=".*Explicitly requested dtype.*")
            return fn(*args)

    return call


class PyMCModel(Model):
    """A PyMC model seen as a :class:`tallmh.Model` (build it with :func:`from_pymc`).

    ``theta`` is a dict ``{value variable name: unconstrained value}``. Attributes: ``pm_model``, ``n``
    (the number of rows), ``value_names`` (the keys of ``theta``), ``free_names`` (their PyMC names),
    ``observed_names``, ``data_names`` (the keys of the data dict), ``output_names`` (the keys of
    ``constrain(theta)``).
    """

    name = "pymc"

    def __init__(self, pm_model, n, value_names, free_names, observed_names, data_names, output_names,
                 prior_fn, lik_fn, out_fn, init_point, dtypes):
        self.pm_model = pm_model
        self.n = int(n)
        self.value_names = list(value_names)
        self.free_names = list(free_names)
        self.observed_names = list(observed_names)
        self.data_names = list(data_names)
        self.output_names = list(output_names)
        self._prior_fn = _quiet(prior_fn)
        self._lik_fn = _quiet(lik_fn)
        self._out_fn = _quiet(out_fn)
        self._init = init_point
        self._dtypes = dtypes
        self.name = getattr(pm_model, "name", "") or "pymc"
        self.coords = _output_coords(pm_model, self.output_names)
        self.log_prior = jax.jit(self._log_prior)
        self.log_lik = jax.jit(self._log_lik)
        self.constrain = jax.jit(self._constrain)

    def _log_prior(self, theta):
        """Joint log density of the free variables at ``theta`` (unconstrained), Jacobians included."""
        return jnp.asarray(self._prior_fn(*[theta[k] for k in self.value_names])[0]).reshape(())

    def _log_lik(self, theta, batch):
        """Per-row log-likelihood ``(b,)``: each observed variable's log density at the row, summed."""
        args = [theta[k] for k in self.value_names] + [batch[k] for k in self.data_names]
        return jnp.asarray(self._lik_fn(*args)[0])

    def _constrain(self, theta):
        """``{PyMC variable: constrained value}`` for the free variables and data-free deterministics."""
        outs = self._out_fn(*[theta[k] for k in self.value_names])
        return {k: v for k, v in zip(self.output_names, outs)}

    def init(self, data=None):
        """PyMC's initial point of the model (``model.initial_point()``), unconstrained."""
        return {k: jnp.asarray(v) for k, v in self._init.items()}

    def __repr__(self):
        return (f"PyMCModel({self.name!r}, N = {self.n} rows of {self.observed_names}, globals "
                f"{self.free_names}, data {self.data_names})")


def _output_coords(pm_model, output_names):
    """``{output: [labels of axis 0, ...]}`` for the outputs whose dims have coordinates in the model
    (``pm.Model(coords=...)``; a Bambi group term's levels, ``g000, ...``); an axis without is ``None``."""
    dims = getattr(pm_model, "named_vars_to_dims", None) or {}
    coords = getattr(pm_model, "coords", None) or {}
    out = {}
    for name in output_names:
        axes = [None if d is None or coords.get(d) is None else [str(v) for v in coords[d]]
                for d in (dims.get(name) or ())]
        if any(a is not None for a in axes):
            out[name] = axes
    return out


# ---------------------------------------------------------------------------------------------------
# graph analysis


def _value_of(var):
    """The numpy value of a constant or shared variable, or None for anything else."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant

    if isinstance(var, Constant):
        return np.asarray(var.data)
    if isinstance(var, SharedVariable):
        try:
            return np.asarray(var.get_value(borrow=True))
        except Exception:  # noqa: BLE001 - e.g. a random generator
            return None
    return None


def _is_tensor(var):
    from pytensor.tensor.type import TensorType

    return isinstance(getattr(var, "type", None), TensorType)


def _roots(graphs):
    from pytensor.graph.traversal import ancestors

    return [v for v in ancestors(graphs) if v.owner is None]


def _discrete(rv):
    return str(rv.type.dtype).startswith(("int", "uint", "bool"))


def from_pymc(pm_model, *, check: bool = True, check_full_max: int = 20_000, centre_groups: bool = True):
    """``model, data = tm.from_pymc(pm_model)``: a PyMC model as a tallmh model, and its data by name.

    The free variables become the globals (unconstrained by PyMC's value transforms, Jacobians in the
    prior); each observed variable contributes one log-likelihood term per row of its leading axis; the
    observed values, ``pm.Data`` containers and constant arrays with that leading length N are returned in
    ``data`` (``{name: array}``) and read a batch of rows at a time. Then ``tm.sample(model, data,
    test=...)`` works with every test and draws come back by PyMC variable name, constrained. See
    :mod:`tallmh.frontends.pymc_model` for what is refused and why.

    ``centre_groups`` (default True): group-level terms written ``T = T_offset * T_sigma`` (Bambi's
    non-centred form, recognised by those names and checked numerically) are moved partially centred,
    with weights from a pilot fit on up to 65,536 rows (:func:`recentre`; the model's ``notes`` say what was
    done and ``tm.sample`` copies them into ``result.notes``). False converts the model as written.

    Example::

        import numpy as np, pymc as pm, tallmh as tm
        rng = np.random.default_rng(0)
        X = rng.normal(size=(20_000, 2))
        y = (rng.random(20_000) < 1 / (1 + np.exp(-(0.5 + X @ np.array([1.0, -0.5]))))).astype(int)
        with pm.Model() as m:
            a = pm.Normal("a", 0, 5)
            b = pm.Normal("b", 0, 5, shape=2)
            pm.Bernoulli("y", logit_p=a + pm.math.dot(X, b), observed=y)
        model, data = tm.from_pymc(m)
        result = tm.sample(model, data, test=tm.acceptance.Austerity(error=0.05, batch_size=400),
                           control_variates=tm.ControlVariates(), seed=0)
        print(result.summary())    # rows a, b[0], b[1]: by PyMC name
    """
    model, data_arrays = _convert(pm_model, check, check_full_max)
    if centre_groups:
        model = recentre(model, data_arrays)
    release()  # (the conversion's and the pilot fit's temporaries: see tallmh._memory)
    return model, data_arrays


def _convert(pm_model, check, check_full_max):
    """``(PyMCModel, data)``: :func:`from_pymc` without the recentring of group-level terms."""
    x64 = bool(jax.config.jax_enable_x64)
    pm = _pymc()
    from pymc.logprob.utils import replace_rvs_by_values
    _load_pytensor_jax()

    # PyTensor's JAX backend sets JAX's 64-bit mode from its floatX when first imported; keep the caller's
    jax.config.update("jax_enable_x64", x64)
    if not isinstance(pm_model, pm.Model):
        raise ConfigError(f"from_pymc needs a pymc.Model; got {type(pm_model).__name__}")
    m = pm_model
    free = list(m.free_RVs)
    observed = list(m.observed_RVs)
    if not observed:
        raise ModelError("the model has no observed variable: nothing for a subsample to read")
    if not free:
        raise ModelError("the model has no free random variable: nothing for MH to sample")
    obs_values, n = _observed_rows(m, observed)
    ip = _check_globals(m, free, observed, n)

    # the observed variables' graphs in terms of the value variables
    rv_to_val = {rv: m.rvs_to_values[rv] for rv in free}
    transforms = {rv: t for rv, t in m.rvs_to_transforms.items() if rv in rv_to_val}
    value_vars = [rv_to_val[rv] for rv in free]
    obs_graphs = replace_rvs_by_values(observed, rvs_to_values=rv_to_val, rvs_to_transforms=transforms)

    data_vars, data_arrays = _data_inputs(observed, obs_values, obs_graphs, n)
    data_names = list(data_vars)
    placeholders, repl = _batch_inputs(data_vars, data_arrays, obs_graphs, n, x64)
    b_sym = placeholders[data_names[0]].shape[0]
    obs_graphs = [_resized_to_batch(rv, g, obs_values[rv][1], b_sym) for rv, g in zip(observed, obs_graphs)]
    per_item = _per_row_log_lik(observed, obs_values, obs_graphs, repl)
    prior = _log_prior_graph(m, free, data_vars)
    out_vars, out_names = _output_graphs(m, free, rv_to_val, transforms, value_vars, set(data_vars.values()))

    ph_list = [placeholders[k] for k in data_names]
    lik_fn = _jaxify(value_vars + ph_list, [per_item], "log-likelihood")
    prior_fn = _jaxify(value_vars, [prior], "prior")
    out_fn = _jaxify(value_vars, out_vars, "output map")
    value_names = [v.name for v in value_vars]
    fdt = np.float64 if x64 else np.float32
    init = {k: np.asarray(ip[k], fdt) for k in value_names}
    model = PyMCModel(m, n, value_names, [rv.name for rv in free], [rv.name for rv in observed], data_names,
                      out_names, prior_fn, lik_fn, out_fn, init, {k: a.dtype for k, a in data_arrays.items()})
    if check:
        _checks(model, data_arrays, n, check_full_max)
    from .pymc_glm import attach_bound  # a bound for the exact subsampled test, where the likelihood is a GLM

    attach_bound(model, observed, obs_graphs, repl, value_vars, ph_list, data_arrays,
                 lambda ins, outs: _quiet(_jaxify(ins, outs, "linear predictor")))
    return model, data_arrays


def _observed_rows(m, observed):
    """``({observed rv: (value variable, array)}, N)``: the observed values, all with the same N rows."""
    obs_values, lengths = {}, {}
    for rv in observed:
        val = m.rvs_to_values[rv]
        arr = _value_of(val)
        if arr is None:
            raise ModelError(f"observed variable {rv.name!r}: its observed value is a computed graph, not data "
                             "(pass an array or a pm.Data container as observed=)")
        if arr.ndim == 0:
            raise ModelError(f"observed variable {rv.name!r} is a scalar: it has no data axis to subsample "
                             "(give it a leading axis of rows, or fold it into the prior as a pm.Potential)")
        obs_values[rv] = (val, arr)
        lengths[rv.name] = int(arr.shape[0])
    if len(set(lengths.values())) > 1:
        raise ModelError(f"observed variables have different leading lengths {lengths}: tallmh reads rows of one "
                         "data axis; give every observed variable the same rows (N along axis 0)")
    return obs_values, next(iter(lengths.values()))


def _check_globals(m, free, observed, n):
    """Refuse free variables that are not continuous globals; return PyMC's initial point."""
    dims = getattr(m, "named_vars_to_dims", {}) or {}
    obs_dims = {dims[rv.name][0] for rv in observed if dims.get(rv.name)}
    for rv in free:
        if _discrete(rv):
            raise ModelError(f"free variable {rv.name!r} is discrete: tallmh's MH moves continuous global "
                             "parameters; marginalise it in the model (e.g. a pm.Mixture likelihood)")
        rv_dims = dims.get(rv.name) or ()
        if obs_dims & set(d for d in rv_dims if d is not None):
            raise ModelError(f"free variable {rv.name!r} is indexed by the data rows (its dims {rv_dims} include "
                             f"the observed data's dim): per-item latents cannot be subsampled; marginalise it or "
                             "keep only global parameters")
    ip = m.initial_point()
    for rv in free:
        vname = m.rvs_to_values[rv].name
        shp = np.shape(ip[vname])
        if n > 1 and len(shp) >= 1 and shp[0] == n:
            hint = (" (PyMC imputes missing observed values as such a variable: drop the rows with NaN)"
                    if rv.name.endswith("_unobserved") else "")
            raise ModelError(f"free variable {rv.name!r} has leading length {n}, the number of data rows: it "
                             f"looks like a per-item latent, which cannot be subsampled{hint}")
    return ip


def _data_inputs(observed, obs_values, obs_graphs, n):
    """``({name: variable}, {name: array})``: the observed values, then shared and constant arrays with
    leading length N that the observed graphs read."""
    from pytensor.compile.sharedvalue import SharedVariable

    data_vars: Dict[str, object] = {}  # name -> pytensor variable
    data_arrays: Dict[str, np.ndarray] = {}
    seen = set()
    for rv in observed:
        val, arr = obs_values[rv]
        name = val.name if isinstance(val, SharedVariable) and val.name else rv.name
        data_vars[name], data_arrays[name] = val, arr
        seen.add(val)
    k = 0
    for v in _roots(obs_graphs):
        if v in seen or not _is_tensor(v) or v.type.ndim == 0:
            continue
        arr = _value_of(v)
        if arr is None or arr.ndim == 0 or arr.shape[0] != n:
            continue
        if isinstance(v, SharedVariable) and v.name and v.name not in data_vars:
            name = v.name
        else:
            while f"data_{k}" in data_vars:
                k += 1
            name = f"data_{k}"
        data_vars[name], data_arrays[name] = v, arr
        seen.add(v)
    return data_vars, data_arrays


def _batch_inputs(data_vars, data_arrays, obs_graphs, n, x64):
    """Placeholders for a batch of rows (``{name: placeholder}``) and the replacements that put them, and
    the batch size wherever the graphs held N, in the observed graphs. ``data_arrays`` is cast in place to
    the placeholders' dtypes (32-bit ones unless JAX runs in 64-bit mode)."""
    from pytensor import tensor as pt
    from pytensor.compile.sharedvalue import SharedVariable

    placeholders, repl = {}, {}
    for name, v in data_vars.items():
        arr = data_arrays[name]
        dtype = str(arr.dtype)
        if not x64:
            dtype = {"float64": "float32", "int64": "int32", "uint64": "uint32"}.get(dtype, dtype)
        ph = pt.tensor(name=name, dtype=str(v.type.dtype) if x64 else dtype,
                       shape=(None,) + tuple(arr.shape[1:]))
        placeholders[name] = ph
        repl[v] = ph.astype(v.type.dtype) if ph.type.dtype != v.type.dtype else ph
        data_arrays[name] = arr.astype(dtype) if str(arr.dtype) != dtype else arr
    b_sym = placeholders[next(iter(data_vars))].shape[0]
    for var in _roots(obs_graphs):  # dim lengths (e.g. coords of the rows) equal to N, held in shared scalars
        if isinstance(var, SharedVariable) and _is_tensor(var) and var.type.ndim == 0 and var not in repl:
            val = _value_of(var)
            if val is not None and np.issubdtype(val.dtype, np.integer) and int(val) == n:
                repl[var] = b_sym.astype(var.type.dtype)
    for g in obs_graphs:  # constant sizes (N, ...) of the observed variables
        node = g.owner
        size = node.op.size_param(node) if hasattr(node.op, "size_param") else None
        sval = _value_of(size) if size is not None else None
        if sval is not None and sval.ndim == 1 and len(sval) >= 1 and int(sval[0]) == n and size not in repl:
            rest = pt.as_tensor(sval[1:].astype(sval.dtype))
            repl[size] = pt.concatenate([b_sym.astype(size.type.dtype)[None], rest])
    return placeholders, repl


def _resized_to_batch(rv, graph, arr, b_sym):
    """The observed variable's graph redrawn with ``b_sym`` rows: its batch shape ``(N, ...)`` becomes
    ``(b, ...)`` through PyMC's own ``change_dist_size``, which rebuilds composite distributions (a
    ``NormalMixture``'s components, a censored or truncated distribution) at the new size instead of
    leaving the N of their inner graphs in place. Distributions PyMC cannot resize keep their graph (the
    size constants of plain random variables are replaced in :func:`_batch_inputs`); the checks at
    construction catch a batch that still fails."""
    from pymc.distributions.shape_utils import change_dist_size

    op = getattr(graph.owner, "op", None)
    ndim_supp = getattr(op, "ndim_supp", None)
    if ndim_supp is None:
        return graph
    batch_ndim = graph.type.ndim - int(ndim_supp)
    if batch_ndim < 1 or arr.ndim < batch_ndim:
        return graph
    new_size = [b_sym] + [int(k) for k in arr.shape[1:batch_ndim]]
    try:
        return change_dist_size(graph, new_size, expand=False)
    except Exception:  # noqa: BLE001 - not resizable by PyMC: keep the graph; the checks test the batch
        return graph


def _per_row_log_lik(observed, obs_values, obs_graphs, repl):
    """The graph of the per-row log-likelihood ``(b,)`` of a batch: the observed variables' terms summed."""
    from pytensor.graph.replace import clone_replace
    from pymc.logprob.basic import transformed_conditional_logp

    try:
        batch_graphs = clone_replace(obs_graphs, replace=repl, rebuild_strict=False)
        lps = transformed_conditional_logp(
            batch_graphs, rvs_to_values={g: repl[obs_values[rv][0]] for rv, g in zip(observed, batch_graphs)},
            rvs_to_transforms={})
        terms = []
        for rv, lp in zip(observed, lps):
            if lp.type.ndim == 0:
                raise ModelError(f"observed variable {rv.name!r}: its log density has no row axis")
            if lp.type.ndim > 1:
                lp = lp.reshape((lp.shape[0], -1)).sum(axis=1)
            terms.append(lp)
        per_item = terms[0]
        for t in terms[1:]:
            per_item = per_item + t
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise ModelError(f"the observed variables cannot be rewritten for a batch of rows: {type(e).__name__}: {e}"
                         ) from e
    return per_item


def _log_prior_graph(m, free, data_vars):
    """The prior: free variables (with Jacobians) and potentials; neither may read the data."""
    data_set = set(data_vars.values())
    prior_terms = [m.logp(vars=free, jacobian=True, sum=True)]
    for pot in m.potentials:
        prior_terms.append(m.replace_rvs_by_values([pot])[0].sum())
    prior = prior_terms[0]
    for t in prior_terms[1:]:
        prior = prior + t
    reads = [v for v in _roots([prior]) if v in data_set]
    if reads:
        names = [k for k, v in data_vars.items() if v in reads]
        raise ModelError(f"the prior (free variables' densities or a pm.Potential) reads the data arrays {names}: "
                         "a subsample cannot evaluate it; write per-row terms as observed variables")
    return prior


def _output_graphs(m, free, rv_to_val, transforms, value_vars, data_set):
    """``(graphs, names)`` of the output: free variables on the constrained scale, and deterministics that
    do not read the data."""
    from pymc.logprob.utils import replace_rvs_by_values

    out_vars, out_names = [], []
    det_graphs = m.replace_rvs_by_values(list(m.deterministics)) if m.deterministics else []
    for rv, g in zip(free, replace_rvs_by_values(free, rvs_to_values=rv_to_val, rvs_to_transforms=transforms)):
        out_vars.append(g)
        out_names.append(rv.name)
    for det, g in zip(m.deterministics, det_graphs):
        roots = _roots([g])
        if any(v in data_set for v in roots) or any(r in m.rvs_to_values.values() and r not in value_vars
                                                    for r in roots):
            continue
        out_vars.append(g)
        out_names.append(det.name)
    return out_vars, out_names


def _load_pytensor_jax():
    """Import ``pymc.sampling.jax`` (PyTensor's JAX backend) without the process-wide device setting its first
    import makes: it sets ``XLA_FLAGS`` to ask for 100 host CPU devices (for PyMC's own parallel chains), and
    in a process whose JAX backend has not started yet tallmh would then lay its chains out over 100 devices
    (a sharded run: other programs, no deferred self-audit). ``XLA_FLAGS`` is put back as it was; a user who
    imported that module earlier keeps what it set."""
    first = "pymc.sampling.jax" not in sys.modules
    flags = os.environ.get("XLA_FLAGS")
    from pymc.sampling.jax import get_jaxified_graph  # noqa: F401 - loads PyTensor's JAX backend now

    if first and os.environ.get("XLA_FLAGS") != flags:
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags


def _jaxify(inputs, outputs, what):
    """PyTensor graph -> JAX function, or a ModelError naming ``what`` cannot be compiled."""
    from .pytensor_jax import jaxified_graph

    try:
        return jaxified_graph(inputs, outputs)
    except NotImplementedError as e:
        raise ModelError(f"the {what} uses an operation PyTensor's JAX backend cannot compile: {e}") from e
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"the {what} cannot be compiled to JAX: {type(e).__name__}: {e}") from e


def _take(data, idx):
    idx = np.asarray(idx)
    return {k: jnp.asarray(np.asarray(v)[idx]) for k, v in data.items()}


def _checks(model: PyMCModel, data, n, check_full_max):
    """Finite at the initial point; additive over rows; equal to PyMC's log density on the full data."""
    from .pytensor_jax import jaxified_graph

    theta0 = model.init()
    rng = np.random.default_rng(0)
    theta1 = {k: v + 0.1 * jnp.asarray(rng.standard_normal(np.shape(v)), v.dtype) for k, v in theta0.items()}
    try:
        lp0 = float(model.log_prior(theta0))
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"the log prior fails at the initial point: {type(e).__name__}: {e}") from e
    if not np.isfinite(lp0):
        raise ModelError(f"the log prior is not finite at PyMC's initial point ({lp0})")
    a = list(range(min(n, 3)))
    bset = sorted({n - 1, n // 2, max(0, n - 2)} - set(a))
    for th in (theta0, theta1):
        try:
            ll_ab = np.asarray(model.log_lik(th, _take(data, a + bset)))
        except Exception as e:  # noqa: BLE001
            raise ModelError(f"the log-likelihood of {model.observed_names} fails on a batch of {len(a) + len(bset)} "
                             f"rows: {type(e).__name__}: {e}. A length fixed to the N rows inside the model (e.g. "
                             "pt.ones(N) or shape=N in the observed variables' parameters) cannot follow a batch: "
                             "let such lengths come from the data arrays") from e
        if ll_ab.shape != (len(a) + len(bset),):
            raise ModelError(f"the log-likelihood does not give one value per row (shape {ll_ab.shape} for "
                             f"{len(a) + len(bset)} rows)")
        if not np.all(np.isfinite(ll_ab)):
            raise ModelError("the log-likelihood is not finite at PyMC's initial point")
        if bset:
            both = np.concatenate([np.asarray(model.log_lik(th, _take(data, a))),
                                   np.asarray(model.log_lik(th, _take(data, bset)))])
            if not np.allclose(ll_ab, both, rtol=1e-4, atol=1e-4):
                raise ModelError(
                    f"the per-row log-likelihoods are not additive over rows: ll(A u B) = {ll_ab.round(4)} but "
                    f"ll(A) ++ ll(B) = {both.round(4)} (A = {a}, B = {bset}). Rows must be conditionally "
                    "independent given the free variables, and the model must not compute from whole data "
                    "arrays (e.g. standardise them outside the model)")
    if n <= check_full_max:
        count_conversion(model, 2 * n)  # (the full data's log density, at two points)
        m = model.pm_model
        full = jax.jit(_quiet(jaxified_graph(m.value_vars, [m.logp()])))
        for th in (theta0, theta1):
            ref = float(full(*[th[v.name] for v in m.value_vars])[0])
            ours = float(model.log_prior(th) + jnp.sum(model.log_lik(th, _take(data, np.arange(n)))))
            if not np.isclose(ours, ref, rtol=1e-4, atol=1e-3 * max(1.0, np.sqrt(n))):
                raise ModelError(
                    f"log_prior + sum(log_lik) = {ours:.6g} differs from PyMC's log density {ref:.6g} on the full "
                    "data: the model probably uses the number of rows, or the data, outside its observed variables")


DENSE_GROUPS_WARN = 1 << 28  # bytes of Bambi's group indicator matrices above which from_bambi(bm) names the other route


def _warn_dense_groups(bmb_model):
    """A warning where Bambi's model holds group terms' rows x levels indicator matrices of more than 256 MB."""
    import warnings

    size = 0
    for comp in getattr(bmb_model, "components", {}).values():
        for term in getattr(comp, "group_specific_terms", {}).values():
            size += int(getattr(getattr(term, "grouper", None), "nbytes", 0))
    if size > DENSE_GROUPS_WARN:
        warnings.warn(f"Bambi's model holds its group terms' rows x levels indicator matrices ({size / 2**20:,.0f} MB); "
                      "tm.from_bambi(formula, df, family=..., ...) builds the same model with an index instead",
                      stacklevel=3)


def from_bambi(bmb_model, data=None, *, check: bool = True, check_full_max: int = 20_000, centre_groups: bool = True,
               **model_kwargs):
    """``model, data = tm.from_bambi(bmb_model)``: a Bambi model through :func:`from_pymc`.

    Builds the model (``bmb_model.build()``) and converts its PyMC model; common and group-level effects,
    and the family's auxiliary parameters, are all globals, named as Bambi names them. Group-level terms
    are moved partially centred unless ``centre_groups=False`` (see :func:`from_pymc`, :func:`recentre`). Where
    Bambi centres the common predictors (``center_predictors=True``, its default) the draws' ``Intercept`` is the one
    Bambi's ``fit`` reports, on the data's scale, and ``Intercept_centred`` the sampled intercept of the centred
    predictors (:mod:`tallmh.frontends.bambi_intercept`).

    ``tm.from_bambi(formula, df, family=..., priors=..., ...)`` (the formula and the data frame, and
    ``bambi.Model``'s other arguments as keywords) builds the same model without the rows x levels indicator
    matrix Bambi's formula library keeps for each group term (800 MB at 10^6 rows x 100 groups): the way to
    convert large tables with group terms (:mod:`tallmh.frontends.bambi_index`: grouping factors that are plain
    columns).

    Example::

        import bambi as bmb, tallmh as tm
        bm = bmb.Model("y ~ x + C(g) + (1|site)", df, family="bernoulli")
        model, data = tm.from_bambi(bm)
        # or, for a large table: tm.from_bambi("y ~ x + C(g) + (1|site)", df, family="bernoulli")
        result = tm.sample(model, data, seed=0)
    """
    if isinstance(bmb_model, str) or type(bmb_model).__name__ == "Formula":
        from .bambi_index import indexed_bambi_model

        if data is None:
            raise ConfigError("from_bambi(formula, data): the data frame is missing")
        bmb_model = indexed_bambi_model(bmb_model, data, **model_kwargs)
    elif data is not None or model_kwargs:
        raise ConfigError("from_bambi takes a data frame and bambi.Model's arguments only with a formula (a string); "
                          "a bambi.Model already has its data")
    else:
        _warn_dense_groups(bmb_model)
    if not hasattr(bmb_model, "build") or not hasattr(bmb_model, "backend"):
        raise ConfigError(f"from_bambi needs a bambi.Model; got {type(bmb_model).__name__}")
    if getattr(bmb_model, "backend", None) is None or getattr(bmb_model.backend, "model", None) is None:
        bmb_model.build()
    pm_model = bmb_model.backend.model
    from .bambi_intercept import intercept_shifts, with_data_scale_intercepts

    shifts = intercept_shifts(bmb_model)  # (the common terms' column means: Bambi's fit reports the intercept with them)
    n_design = len(shifts) * _bambi_rows(bmb_model) if shifts else 0
    del bmb_model  # (a model built here from the formula: its design and terms freed before the conversion)
    release()
    model, data = _convert(pm_model, check, check_full_max)
    notes = with_data_scale_intercepts(model, shifts).notes if shifts else []
    count_conversion(model, n_design)  # (the column means: one pass over each centred design)
    if centre_groups:
        model = recentre(model, data)
        kept = list(getattr(model, "notes", None) or [])
        model.notes = kept + [m for m in notes if m not in kept]
    release()  # (the conversion's and the pilot fit's temporaries: see tallmh._memory)
    return model, data


def _bambi_rows(bmb_model):
    """The number of rows of a built Bambi model's response."""
    return int(np.shape(bmb_model.response_component.term.data)[0])


# ---------------------------------------------------------------------------------------------------
# group-level offsets moved on partially centred coordinates


class RecentredPyMCModel(PyMCModel):
    """A :class:`PyMCModel` whose non-centred group-level terms (``effect = offset * sigma``, ``offset ~
    N(0, 1)``, the parameterisation Bambi builds by default) are moved on partially centred coordinates.

    For a term with offsets ``z_j`` and scale ``sigma`` the parameter holds ``u_j = z_j * sigma**w_j``
    (key ``<term>_centred__``) instead of ``z_j``: ``w_j = 1`` is the centred effect ``z_j * sigma``, ``w_j = 0``
    the offset itself. This is the partially non-centred parameterisation of Papaspiliopoulos, Roberts &
    Skold (Statistical Science 22, 2007, Sec. 4) in the scale form of Gorinova, Moore & Hoffman (ICML 2020,
    eq. 4). The prior gains the log-Jacobian ``-sum_j w_j log sigma`` of ``z = u * sigma**-w``; the
    likelihood and the output are the original model's at ``z``, so draws keep the PyMC (Bambi) names on
    the constrained scale. ``weights`` is ``{term: w}``; ``terms`` is ``[(offset key, sigma key, new key)]``.
    """

    def __init__(self, inner: PyMCModel, terms, weights, init_point, notes):
        self.inner = inner
        self.terms = [tuple(t) for t in terms]
        self.weights = {k: np.asarray(w, np.float64) for k, w in weights.items()}
        self.notes = list(notes)
        self.mode_fixed = [sig for _, sig, _ in self.terms]  # the mode search holds the scales (see recentre)
        swap = {off: new for off, _, new in self.terms}
        super().__init__(inner.pm_model, inner.n, [swap.get(k, k) for k in inner.value_names], inner.free_names,
                         inner.observed_names, inner.data_names, inner.output_names, inner._prior_fn,
                         inner._lik_fn, inner._out_fn, init_point, inner._dtypes)
        # (the inner model's coords: they include those given to outputs added after its conversion, such as a Bambi
        # intercept's ``Intercept_centred``, which PyMC's own coords do not name)
        self.coords = {**self.coords, **{k: v for k, v in inner.coords.items() if k in self.output_names}}

    def _inner_theta(self, theta):
        """``(theta of the original model, log |d z / d u|)``."""
        th = dict(theta)
        logdet = 0.0
        for off, sig, new in self.terms:
            w = jnp.asarray(self.weights[new], jnp.result_type(theta[new]))
            log_s = theta[sig]
            th[off] = theta[new] * jnp.exp(-w * log_s)
            logdet = logdet - jnp.sum(w) * log_s
            del th[new]
        return th, logdet

    def _log_prior(self, theta):
        th, logdet = self._inner_theta(theta)
        return self.inner._log_prior(th) + jnp.reshape(logdet, ())

    def _log_lik(self, theta, batch):
        return self.inner._log_lik(self._inner_theta(theta)[0], batch)

    def _constrain(self, theta):
        return self.inner._constrain(self._inner_theta(theta)[0])

    def __repr__(self):
        return f"RecentredPyMCModel({self.inner!r}, terms {[t[2] for t in self.terms]})"


def _offset_terms(model: PyMCModel):
    """``[(offset key, sigma key, term name)]`` for each group-level term written ``term = offset * sigma``
    with ``offset ~ N(0, 1)`` and ``sigma`` moved on the log scale, as Bambi names them (``1|g_offset``,
    ``1|g_sigma_log__``, deterministic ``1|g``). Each candidate is checked numerically at a random point:
    the deterministic equals ``offset * sigma`` and the prior's dependence on the offset is the standard
    normal's; a candidate that fails either check is left as it is."""
    found = []
    rng = np.random.default_rng(1)
    base = {k: np.asarray(v) + 0.3 * rng.standard_normal(np.shape(v)) for k, v in model.init().items()}
    for off in model.value_names:
        if not off.endswith("_offset"):
            continue
        term = off[: -len("_offset")]
        sig = term + "_sigma_log__"
        if sig not in model.value_names or term not in model.output_names:
            continue
        try:
            th = {k: jnp.asarray(v) for k, v in base.items()}
            out = model.constrain(th)
            want = np.asarray(th[off]) * np.exp(np.asarray(th[sig]))
            if np.shape(out[term]) != np.shape(want) or not np.allclose(np.asarray(out[term]), want, rtol=1e-5,
                                                                        atol=1e-6):
                continue
            z2 = np.asarray(th[off]) + 0.7 * rng.standard_normal(np.shape(th[off]))
            th2 = dict(th, **{off: jnp.asarray(z2, th[off].dtype)})
            dlp = float(model.log_prior(th2)) - float(model.log_prior(th))
            want_d = -0.5 * (np.sum(z2 ** 2) - np.sum(np.asarray(th[off]) ** 2))
            if not np.isclose(dlp, want_d, rtol=1e-4, atol=1e-4):
                continue
        except Exception:  # noqa: BLE001 - not the pattern
            continue
        found.append((off, sig, term))
    return found


PILOT_ROWS = 2**16  # rows of the pilot fit that sets the centring weights
FULL_HESSIAN_MAX = 400  # parameters: above, the full pass estimates each level's information by gradient squares


def gradient_square_sums(model, data, n, unravel, th):
    """``sum_i (d l_i / d theta)^2`` over all ``n`` rows at the flat point ``th``, coordinate by coordinate (float64 on
    the host): the outer-product (empirical Fisher) estimate of the likelihood information's diagonal, one streamed
    pass of per-row gradients (a row's gradient costs about two evaluations; the Hessian's diagonal by autodiff
    costs ``d`` Hessian-vector products a row, and its pass keeps a d x d array a chunk)."""
    from .. import setup_passes as setup

    fn = _GRAD_SQUARE_FNS.get((id(model), setup.shape_key(unravel(th))))
    if fn is None:
        def fn(t, batch, mask):
            one = lambda row: jax.grad(lambda x: model.log_lik(unravel(x), row)[0])(t)  # noqa: E731
            g = jax.vmap(one)(jax.tree_util.tree_map(lambda a: a[:, None], batch))
            return jnp.sum(jnp.where(mask[:, None], g * g, 0.0), axis=0)

        _GRAD_SQUARE_FNS.clear()  # (one model at a time: its compiled pass is found again by the next call)
        _GRAD_SQUARE_FNS[(id(model), setup.shape_key(unravel(th)))] = fn
    out = np.zeros(th.shape[0], np.float64)
    for part in setup.full_pass(fn, data, n, (th,), "tallmh: information pass"):
        out += np.asarray(part, np.float64)
    return out


_GRAD_SQUARE_FNS: dict = {}


def _full_information(model, data, n, unravel, th, sub, m, spec):
    """The likelihood information's diagonal over all ``n`` rows at ``th`` (only the group coordinates are read):
    where the arrow structure holds (checked on the pilot's rows at ``th``), exactly by one Hessian-vector
    product a group term a row (:func:`tallmh.arrow_hessian.group_diagonal`); else the dense Hessian's diagonal
    up to ``FULL_HESSIAN_MAX`` parameters, and the outer-product estimate above (gradient squares)."""
    from .. import setup_passes as setup

    full = {k: jnp.asarray(v) for k, v in data.items()}
    d = int(th.shape[0])
    if spec.worth(d) and ArrowDerivs(setup.full_pass, model, unravel, th, spec)(sub, m, th, "tallmh: arrow check") is not None:
        return -group_diagonal(setup.full_pass, model, full, n, unravel, th, spec)
    if d <= FULL_HESSIAN_MAX:
        return -np.diag(setup.lik_hessian(model, full, n, unravel, th))
    return gradient_square_sums(model, full, n, unravel, th)


def _eb_sigma(a, prec):
    """The scale for the weights and the start: the median of ``sigma``'s marginal posterior when the effects
    ``a_j``, measured with precisions ``prec_j``, are ``N(mu, sigma^2 + 1/prec_j)`` (``mu`` integrated out under
    a flat prior) and ``sigma`` has a flat prior
    (on a grid of log sigma). Unlike the maximum of that likelihood (empirical Bayes), which is 0 whenever
    the effects spread less than their noise (common with few groups), the median is positive."""
    v = 1.0 / np.maximum(prec, 1e-12)
    ls = np.linspace(-12.0, 4.0, 1601)
    s2 = np.exp(2 * ls)[:, None] + v[None, :]
    # the effects' common mean, integrated out under a flat prior: at the pilot's joint mode the intercept
    # and the effects trade a shift (effects around 3 and the intercept 3 lower, on the airports of the
    # 3-million-flight table), which must not be read as spread
    w = 1.0 / s2
    mu = np.sum(w * a[None, :], axis=1, keepdims=True) / np.sum(w, axis=1, keepdims=True)
    lp = -0.5 * np.sum(np.log(s2) + (a[None, :] - mu) ** 2 * w, axis=1) - 0.5 * np.log(np.sum(w, axis=1)) + ls
    p = np.exp(lp - lp.max())
    c = np.cumsum(p) / p.sum()
    return float(np.exp(np.interp(0.5, c, ls)))


def recentre(model: PyMCModel, data, *, pilot_rows: int = PILOT_ROWS):
    """``model`` with its non-centred group-level terms moved partially centred (:class:`RecentredPyMCModel`),
    or ``model`` itself when it has none (:func:`_offset_terms`).

    Why: with many rows per group each effect ``z_j * sigma`` is pinned by the data, so the offset ``z_j``
    is tied to ``1/sigma``; the joint mode of the non-centred density sits at a ``sigma`` far above the
    posterior's (the offsets' volume factor ``sigma^-J`` is absent from it), and the Laplace start and
    preconditioner made there are of the wrong scale along that ridge. The centred density has the
    volume factor, but also an unbounded spike at ``sigma -> 0``, effects 0, into which a mode search
    from the prior's centre runs. So:

    1. a pilot mode search of the non-centred model on ``pilot_rows`` rows (drawn at random, so that a
       table sorted by the group column gives every level its share; their log-likelihood scaled by
       ``N / rows``) gives each level's effect ``a_j = z_j sigma``, un-shrunk by the pilot's prior, and the
       pilot rows' precision of it ``p_j`` (the likelihood's curvature in ``z_j`` over ``sigma^2``); one pass
       over all rows at that point gives each level's data precision ``P_j`` (a level with few rows may
       have none among the pilot's);
    2. the scale is estimated from the ``a_j`` (:func:`_eb_sigma`: the median of its marginal posterior under
       that Gaussian approximation, with each ``a_j``'s noise that of the pilot's rows, ``1 / p_j``: the
       whole table's ``P_j`` there would read the pilot's noise as spread between the levels);
    3. each level's weight is the data's share of its precision, ``w_j = P_j sigma^2 / (1 + P_j sigma^2)``:
       a level with many rows is centred, one with few stays an offset (for a Gaussian level this makes
       its conditional sd, given ``sigma``, locally free of ``sigma``);
    4. the start (``init()``) is the shrunk effect ``w_j a_j`` at that scale, in the basin of the interior
       mode rather than the spike: there the rest of the parameters are moved to their conditional mode
       given the scales (on the pilot rows). ``tm.sample``'s mode search continues from that start on the
       full data with the scales held (the model's ``mode_fixed``): the joint mode of a scale and its
       effects is degenerate (the spike), and with many weakly informed levels the joint density has no
       interior mode in any such parameterisation; the scales then move freely in the chains.
    """
    from jax.flatten_util import ravel_pytree

    from .. import setup_passes as setup

    terms = _offset_terms(model)
    if not terms:
        return model
    n = model.n
    th0 = model.init()
    flat0, unravel = ravel_pytree(th0)
    if n > pilot_rows:
        # rows drawn at random (seeded): a table sorted by the group column gives every level its share
        idx = np.sort(np.random.default_rng(0).choice(n, pilot_rows, replace=False))
        sub = {k: np.asarray(v)[idx] for k, v in data.items()}
        m = len(idx)
    else:
        sub, m = data, n
    sub = {k: jnp.asarray(v) for k, v in sub.items()}
    pos = unravel(jnp.arange(flat0.shape[0]))
    # the likelihood's Hessian is arrow-shaped (fixed effects and scales with everything, each level with itself):
    # p + K + 1 Hessian-vector products a row instead of d (checked on every pass; dense where a check fails)
    spec = ArrowSpec.of(flat0.shape[0], [np.asarray(pos[off]).astype(int) for off, _, _ in terms])
    th, passes, last = setup._newton(model, sub, m, unravel, flat0, 30, 1e-6, scale=n / m, label="pilot",
                                     arrow=spec)
    if last is None or not np.all(np.isfinite(np.asarray(th))):
        return model
    _, _, h_lik = last
    h_pilot = -np.diag(np.asarray(h_lik, np.float64))  # the pilot rows' information (unscaled)
    full_passes = 0
    if m < n:  # each level's information from all its rows: one pass (a level may have no pilot rows)
        h_full = _full_information(model, data, n, unravel, th, sub, m, spec)
        full_passes = 1
    else:
        h_full = h_pilot
    at = unravel(th)
    init = {k: np.asarray(v) for k, v in at.items()}
    weights, notes_w = {}, []
    for off, sig, term in terms:
        z = np.asarray(at[off], np.float64)
        s_nc = float(np.exp(np.asarray(at[sig], np.float64)))
        where = np.asarray(pos[off]).astype(int)

        def info(h):  # likelihood information of the effects a_j = z_j sigma
            return np.maximum(h[where].reshape(z.shape), 0.0) / s_nc ** 2

        p_pilot, prec = info(h_pilot), info(h_full)
        # undo the shrinkage of the pilot's prior (the pilot's likelihood was scaled by n / m)
        a = z * s_nc * (1.0 + 1.0 / np.maximum(p_pilot * (n / m) * s_nc ** 2, 1e-12))
        a = np.where(p_pilot > 0, a, 0.0)
        # a_j is measured on the pilot's m rows: its noise is that of those rows, not of the n they stand for
        s = _eb_sigma(a.ravel(), p_pilot.ravel())
        w = prec * s ** 2 / (1.0 + prec * s ** 2)
        new = term + "_centred__"
        weights[new] = w
        z_start = w * a / s
        init[new] = np.asarray(z_start * s ** w, model._init[off].dtype)
        init[sig] = np.asarray(np.log(s), model._init[sig].dtype)
        del init[off]
        notes_w.append(f"{term!r}: weights w median {np.median(w):.2f}, range {w.min():.2f}-{w.max():.2f}")
    rm = RecentredPyMCModel(model, [(off, sig, term + "_centred__") for off, sig, term in terms], weights,
                            init, [])
    # the conditional mode given the scales, on the pilot rows (log-concave in the rest for a GLM)
    flat1, unravel1 = ravel_pytree(rm.init())
    pos1 = unravel1(jnp.arange(flat1.shape[0]))
    fixed = np.zeros(flat1.shape[0], bool)
    for k in rm.mode_fixed:
        fixed[np.asarray(pos1[k]).astype(int).reshape(-1)] = True
    spec1 = ArrowSpec.of(flat1.shape[0], [np.asarray(pos1[t[2]]).astype(int) for t in rm.terms])
    th1, passes1, _ = setup._newton(rm, sub, m, unravel1, flat1, 30, 1e-6, scale=n / m, label="pilot",
                                    fixed=fixed, arrow=spec1)
    # (the pilot's passes over its rows, and the one over all rows)
    count_conversion(rm, getattr(model, "conversion_items", 0) + (passes + passes1) * m + full_passes * n)
    if np.all(np.isfinite(np.asarray(th1))):
        rm._init = {k: np.asarray(v, rm._init[k].dtype) for k, v in unravel1(th1).items()}
    sig_txt = ", ".join(f"{t[2]}_sigma {float(np.exp(rm._init[t[1]])):.4g}" for t in terms)
    rm.notes = [
        "group-level offsets moved partially centred (u_j = offset_j * sigma^w_j, w_j = the data's share of "
        "level j's precision: 1 centred, 0 the offset): " + "; ".join(notes_w) + f"; set by a pilot fit on {m:,} "
        f"rows ({passes + passes1} passes; {full_passes} over all {n:,} rows), which estimated {sig_txt} for the start, where the "
        "mode search holds the scales (the joint mode of scale and effects is degenerate); draws keep the "
        "model's names"]
    return rm
