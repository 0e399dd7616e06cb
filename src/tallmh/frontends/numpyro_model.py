"""NumPyro models as tallmh models: ``model, data = tm.from_numpyro(numpyro_model, *args, **kwargs)``.

The probabilistic-programs paper (Chen, Mansinghka & Ghahramani, Sec. 3.1-3.2, eqs. 5-6) applies the
austerity test to the *global* variables of any program whose *local sections* are conditionally
independent given them: the acceptance ratio factorises into a global part (prior, proposal) and one
factor ``l_i`` per local section, and the test reads a random subset of the ``l_i``. In NumPyro the local
sections are the entries of a ``numpyro.plate``: this module turns a NumPyro model into a
:class:`tallmh.Model` whose

- ``theta`` is the dict of latent sample sites *outside* the data plate, in unconstrained space
  (``biject_to(site.support)``, as NumPyro's ``potential_energy`` does), and ``log_prior(theta)`` is the
  log density of every site outside the data plate plus the log-Jacobians of those transforms;
- ``log_lik(theta, batch) -> (b,)`` is, for each item of ``batch`` (rows of the data arrays), the sum of
  the log densities of the sites inside the data plate for that item (``l_i`` of eq. 6 is then
  ``log_lik(theta', item) - log_lik(theta, item)``). It runs the model on the ``b`` rows with the plate's
  subsample indices *substituted* by ``arange(b)``: the plate never draws its own subsample (an O(N)
  shuffle per call), and the plate's ``N/b`` scale is removed, while the user's own ``handlers.scale``
  factors are kept;
- discrete latent sites inside the data plate with finite support (``Bernoulli``, ``Categorical``, ...)
  are summed out per item by enumeration: ``l_i = logsumexp_z [log p(z_i = z | theta) + log p(x_i | z,
  theta)]`` over the joint support of those sites (paper Sec. 4.2 collapses its mixture the same way).
  Where they also sit in further plates E inside the data plate (one ``z`` per (item, time)), each cell e
  of E is summed out on its own, ``l_i = sum_e logsumexp_z [...]_{i,e}`` (the plated variable elimination
  of Obermeyer et al. 2019, one level): the sites in the plates of E enter per cell, the other per-item
  sites must not depend on the enumerated values. Enumerated sites in different plates, per-item sites
  coupling the cells (``y_i ~ N(sum_t z_it, 1)``) and enumerated sites with batch axes that are not plates
  are refused with :class:`~tallmh.errors.ModelError`;

The data are the model's array arguments whose leading length is the data plate's size N; everything
else (shapes, hyperparameters, Python values) is kept as a constant. At construction a few checks run
on a handful of items and raise :class:`~tallmh.errors.ModelError` with the reason: exactly one data
plate; no other subsampled plate; no continuous latent inside the plate (keep such latents in a state
with :mod:`tallmh` blocks, or marginalise them); no site outside the plate whose density changes with
the items passed; additivity over items, ``ll(theta, A u B) = ll(theta, A) ++ ll(theta, B)``; no data
plate around a ``scan``; with enumerated sites, that ``log_lik`` of two items equals the brute-force sum
over every joint value of the items' enumerated cells (one model run per configuration; skipped above
4096 configurations per item); and, without them, (for N <= ``check_full_max``) that ``log_prior +
sum(log_lik)`` equals minus NumPyro's ``potential_energy`` on the full data.

Helper for other front ends (e.g. blocks that keep local latents in the chain's state):
:func:`describe` builds the same model without refusing continuous per-item latents
(``local="state"``); :meth:`NumPyroModel.item_log_lik` then takes those latents' values for the batch.
"""

from __future__ import annotations

import inspect
from typing import Any, Dict, NamedTuple, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, ModelError
from ..model import Model
from .numpyro_trace import get_trace as _get_trace, load_numpyro as _numpyro, plate_messenger as _plate_messenger
from .numpyro_trace import take_rows as _take
from .numpyro_checks import checks as _checks, prepare as _prepare

__all__ = ["from_numpyro", "describe", "NumPyroModel", "SiteInfo"]

class SiteInfo(NamedTuple):
    """Static description of one sample site (from a trace of the model)."""

    name: str
    kind: str  # "global", "global_observed", "local_observed", "local_enumerated", "local_latent"
    shape: Tuple[int, ...]  # value shape (for local sites: with a plate of the probe's size)
    event_dim: int
    discrete: bool


def _bind(model_fn, args, kwargs):
    """The model's arguments by name (a dict) and a function rebuilding (args, kwargs) from such a dict."""
    try:
        sig = inspect.signature(model_fn)
        bound = sig.bind(*args, **kwargs)
        named = dict(bound.arguments)

        def rebuild(named_new):
            b = sig.bind_partial()
            b.arguments.update(named_new)
            return b.args, b.kwargs

        return named, rebuild
    except (TypeError, ValueError):
        named = {f"arg{i}": a for i, a in enumerate(args)}
        named.update({f"kw_{k}": v for k, v in kwargs.items()})

        def rebuild(named_new):
            a = tuple(named_new[f"arg{i}"] for i in range(len(args)))
            k = {key: named_new[f"kw_{key}"] for key in kwargs}
            return a, k

        return named, rebuild


def _is_array(x):
    return isinstance(x, (np.ndarray, jax.Array)) or (hasattr(x, "shape") and hasattr(x, "dtype"))


def _path_name(path):
    s = jax.tree_util.keystr(path)
    for ch in "[]'\"":
        s = s.replace(ch, "" if ch != "]" else "/")
    return s.strip("/").replace("//", "/") or "data"


def _frames(site):
    return [(f.name, f.dim, f.size) for f in site.get("cond_indep_stack", [])]


def _is_discrete(fn):
    return bool(getattr(fn, "is_discrete", False) or getattr(getattr(fn, "support", None), "is_discrete", False))


def _structure(model_fn, args, kwargs):
    """An abstract trace (no arithmetic on the data): sites, plates and their sizes, as plain Python values."""
    _numpyro()
    from numpyro import handlers

    Sub = _plate_messenger()
    box = {}
    leaves, treedef = jax.tree_util.tree_flatten((args, kwargs))
    arr_pos = [i for i, v in enumerate(leaves) if _is_array(v)]

    def run(arrs):
        ls = list(leaves)
        for i, a in zip(arr_pos, arrs):
            ls[i] = a
        a, k = jax.tree_util.tree_unflatten(treedef, ls)
        try:
            tr = _get_trace(handlers.seed(Sub(model_fn), 0), *a, **k)
        except NotImplementedError as e:
            if "control flow" in str(e):
                raise ModelError(
                    "a plate encloses a scan (numpyro.contrib.control_flow.scan): put the data plate inside "
                    "the scan body, or write the per-item likelihood without scan") from e
            raise
        sites = []
        for name, s in tr.items():
            info = {"name": name, "type": s["type"], "frames": _frames(s)}
            if s["type"] == "plate":
                info["size"], info["subsample_size"] = s["args"]
            elif s["type"] == "sample":
                fn = s["fn"]
                info.update(observed=bool(s.get("is_observed")), discrete=_is_discrete(fn),
                            enumerable=bool(getattr(fn, "has_enumerate_support", False)),
                            shape=tuple(np.shape(s["value"])), event_dim=len(fn.event_shape),
                            scan=("_scan_current_index" in s.get("infer", {}) or "_control_flow_done" in s))
            elif s["type"] == "control_flow":
                info["scan"] = True
            sites.append(info)
        box["sites"] = sites
        return 0

    jax.eval_shape(run, [leaves[i] for i in arr_pos])
    return box["sites"]


class NumPyroModel(Model):
    """A NumPyro model seen as a :class:`tallmh.Model` (build it with :func:`from_numpyro`).

    ``theta`` is a dict ``{site: unconstrained value}`` of the latent sites outside the data plate.
    ``constrain(theta)`` returns the constrained values of those sites (plus deterministic sites outside
    the plate) by name; :class:`tallmh.Result` uses it so that draws, summaries and ``to_arviz()`` are on
    the constrained scale.

    Attributes: ``data_plate`` (name), ``n`` (its size), ``sites`` (``{name: SiteInfo}``), ``global_sites``,
    ``enumerated_sites``, ``local_latent_sites`` (latents inside the plate kept in a state: only with
    :func:`describe` ``local="state"``), ``data_names`` (the data pytree's keys).
    """

    name = "numpyro"
    _collapse_plates = False  # the old, wrong enumeration (one value per item for all its plates): tests only

    def __init__(self, model_fn, named, rebuild, data_keys, data_plate, n, sites, probe_rows, plate_dim,
                 local="enumerate"):
        self.model_fn = model_fn
        self._named = named
        self._rebuild = rebuild
        self._data_keys = data_keys  # {data name: (arg name, path-in-arg as treedef-index)}
        self.data_plate = data_plate
        self.n = int(n)
        self.sites = sites
        self._probe = probe_rows  # a pytree of 1 row of data, constant
        self._plate_dim = plate_dim
        self.local = local
        self.global_sites = [s for s, i in sites.items() if i.kind == "global"]
        self.enumerated_sites = [s for s, i in sites.items() if i.kind == "local_enumerated"]
        self.local_latent_sites = [s for s, i in sites.items() if i.kind == "local_latent"]
        self._supports = None
        self._enum_plates = ()  # the enumerated sites' plates other than the data plate (outermost first)
        self._plate_sizes = {}
        self._deterministic = []
        self.name = getattr(model_fn, "__name__", "numpyro")
        # compiled once per shape: the runner's set-up (Newton, Laplace) calls these outside jit too
        self.log_prior = jax.jit(self._log_prior)
        self.item_log_lik = jax.jit(self._item_log_lik)
        self.constrain = jax.jit(self._constrain)

    # -- running the model ------------------------------------------------------------------------

    def _args_for(self, batch):
        """The model's (args, kwargs) with the data arrays replaced by ``batch`` (dict of rows)."""
        named = dict(self._named)
        for key, (arg, leaf_i) in self._data_keys.items():
            val = named[arg]
            leaves, tdef = jax.tree_util.tree_flatten(val)
            leaves = list(leaves)
            leaves[leaf_i] = batch[key]
            named[arg] = jax.tree_util.tree_unflatten(tdef, leaves)
        # several data keys may live in one argument: re-flatten each time from the updated value
        return self._rebuild(named)

    def _run(self, theta, batch, fixed=None, with_logdet=False, rng_key=None):
        """Run the model on ``batch`` with the globals from unconstrained ``theta`` and ``fixed`` values.

        Returns ``(trace, log_det)``; ``log_det`` sums the log-Jacobians of the globals' transforms.
        """
        _numpyro()
        from numpyro import handlers
        from numpyro.distributions import constraints
        from numpyro.distributions.transforms import biject_to
        from numpyro.distributions.util import sum_rightmost

        Sub = _plate_messenger()
        b = int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0])
        logdets = []
        fixed = fixed or {}

        def subst(msg):
            name = msg["name"]
            if msg["type"] != "sample":
                return None
            if name in fixed:
                v = fixed[name]
                return v(msg) if callable(v) else v
            if theta is not None and name in theta:
                u = theta[name]
                support = msg["fn"].support
                t = biject_to(support)
                if support is constraints.real or (isinstance(support, constraints.independent)
                                                   and support.base_constraint is constraints.real):
                    return u
                value = t(u)
                if with_logdet:
                    ld = t.log_abs_det_jacobian(u, value)
                    ld = sum_rightmost(ld, jnp.ndim(ld) - jnp.ndim(value) + len(msg["fn"].event_shape))
                    logdets.append(jnp.sum(ld))
                return value
            return None

        args, kwargs = self._args_for(batch)
        m = handlers.seed(handlers.substitute(Sub(self.model_fn, self.data_plate, b), substitute_fn=subst),
                          0 if rng_key is None else rng_key)
        tr = _get_trace(m, *args, **kwargs)
        ld = sum(logdets) if logdets else jnp.zeros(())
        return tr, ld

    def _in_plate(self, site):
        return any(f.name == self.data_plate for f in site.get("cond_indep_stack", []))

    def _plate_factor(self, tr, b):
        s = tr.get(self.data_plate)
        size = s["args"][0] if s is not None else b
        return float(size) / float(b) if size != b else 1.0

    def _scaled_log_prob(self, site, factor=1.0):
        """A site's log density with the user's scale (the data plate's own N/b ``factor`` removed)."""
        lp = site["fn"].log_prob(site["value"])
        scale = site["scale"]
        if scale is not None:
            if isinstance(scale, (int, float)):
                scale = float(scale) / factor
                if abs(scale - 1.0) > 1e-12:
                    lp = lp * scale
            else:
                lp = lp * (scale / factor)
        return lp

    def _site_log_prob(self, site, per_item=False, factor=1.0):
        lp = self._scaled_log_prob(site, factor)
        if not per_item:
            return jnp.sum(lp)
        return self._keep_plates(site, lp, ())

    def _keep_plates(self, site, lp, keep):
        """``lp`` (a site's log density, its batch shape) summed over every axis except the data plate's
        (first) and those of the plates named in ``keep`` (then in that order): ``(b, *sizes of keep)``."""
        fn = site["fn"]
        bshape = tuple(fn.batch_shape)
        lp = jnp.broadcast_to(lp, bshape) if jnp.shape(lp) != bshape else lp
        dims = {f.name: f.dim for f in site["cond_indep_stack"]}
        axes = [len(bshape) + dims[self.data_plate]] + [len(bshape) + dims[p] for p in keep]
        lp = jnp.moveaxis(lp, axes, list(range(len(axes))))
        return lp.reshape(lp.shape[: len(axes)] + (-1,)).sum(axis=-1)

    def _per_item(self, tr, b):
        factor = self._plate_factor(tr, b)
        total = jnp.zeros((b,))
        for name, site in tr.items():
            if site["type"] == "sample" and self._in_plate(site):
                total = total + self._site_log_prob(site, per_item=True, factor=factor)
        return total

    # -- the Model interface ----------------------------------------------------------------------

    def _log_prior(self, theta):
        """Log density of every site outside the data plate at constrained(theta), plus log-Jacobians."""
        tr, ld = self._run(theta, self._probe, self._fill_locals(), with_logdet=True)
        lp = ld
        for name, site in tr.items():
            if site["type"] == "sample" and not self._in_plate(site):
                lp = lp + self._site_log_prob(site)
        return lp

    def log_lik(self, theta, batch):
        """Per-item log-likelihood ``(b,)``: the data plate's sites summed per item, discrete latents summed out."""
        if self.local_latent_sites:
            raise ModelError(f"sites {self.local_latent_sites} are latents inside the data plate kept in a state: "
                             "use item_log_lik(theta, batch, local=...)")
        return self.item_log_lik(theta, batch)

    def _item_log_lik(self, theta, batch, local: Optional[Dict[str, Any]] = None):
        """Per-item log-likelihood of ``batch`` given the globals ``theta`` (unconstrained) and, for latents
        inside the data plate kept in a state, their values ``local`` (``{site: value}`` shaped as the site
        is with a plate of ``b`` items). Discrete latents not in ``local`` are summed out by enumeration.

        This is the helper for inference programs that keep local latents in the state (paper Sec. 4.2,
        4.3): ``l_i`` of eq. 6 for such a program is ``item_log_lik(theta', x_i, z_i) - item_log_lik(theta,
        x_i, z_i)``.
        """
        local = dict(local or {})
        b = int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0])
        enum = [s for s in self.enumerated_sites if s not in local]
        missing = [s for s in self.local_latent_sites if s not in local]
        if missing:
            raise ModelError(f"item_log_lik needs the values of the per-item latents {missing}")
        if not enum:
            tr, _ = self._run(theta, batch, local)
            return self._per_item(tr, b)
        inner, outer = self._enum_terms(theta, batch, local, enum)  # (C, b, *plates), (C, b)
        if self._collapse_plates:  # negative control for the tests: one value per item for all its plates
            inner = inner.reshape(inner.shape[:2] + (-1,)).sum(axis=-1)
        ll = jax.scipy.special.logsumexp(inner, axis=0)
        return ll.reshape(b, -1).sum(axis=1) + outer[0]

    def _enum_terms(self, theta, batch, local, enum):
        """Per configuration c of the enumerated sites ``enum`` (each at the same value in every cell of its
        plates), the log densities of the data plate's sites split in two: ``inner`` ``(C, b, *E)``, the
        sites whose plates include the enumerated sites' own further plates E (summed over their other
        axes), and ``outer`` ``(C, b)``, the rest, which do not depend on the enumerated values (checked at
        construction). Given the globals, the cells of E are independent, so the marginal of item i is
        ``sum_e logsumexp_c inner[c, i, e] + outer[0, i]`` (tensor variable elimination over plates,
        Obermeyer et al. 2019, for a single level of enumeration)."""
        b = int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0])
        sup = self._enum_supports(enum)
        keep = self._enum_plates

        def one(vals):
            fixed = dict(local)
            for s in enum:
                fixed[s] = (lambda v: (lambda msg: jnp.broadcast_to(v, msg["fn"].shape()).astype(
                    jnp.result_type(v))))(vals[s])
            tr, _ = self._run(theta, batch, fixed)
            factor = self._plate_factor(tr, b)
            inner, outer = 0.0, 0.0
            for name, site in tr.items():
                if site["type"] != "sample" or not self._in_plate(site):
                    continue
                plates = {f.name for f in site["cond_indep_stack"]}
                if all(p in plates for p in keep):
                    inner = inner + self._keep_plates(site, self._scaled_log_prob(site, factor), keep)
                else:
                    outer = outer + self._site_log_prob(site, per_item=True, factor=factor)
            shape = (b,) + tuple(self._plate_sizes[p] for p in keep)
            inner = jnp.broadcast_to(jnp.asarray(inner), shape)
            return inner, jnp.broadcast_to(jnp.asarray(outer, inner.dtype), (b,))

        return jax.vmap(one)(sup)

    def item_log_probs(self, theta, batch, local: Optional[Dict[str, Any]] = None):
        """``{site: log density}`` of every sample site inside the data plate for ``batch``, the plate's axis
        first and the site's other batch axes kept (e.g. ``(b, T)`` for a site inside a time plate too);
        per-item latents in ``local`` are fixed, the rest (globals) from unconstrained ``theta``. No
        enumeration: every discrete per-item latent must be in ``local``. Used by the blocks' particle
        Gibbs on NumPyro models (per-time weights; paper Sec. 4.3)."""
        local = dict(local or {})
        missing = [s for s in self.local_latent_sites + self.enumerated_sites if s not in local]
        if missing:
            raise ModelError(f"item_log_probs needs the values of the per-item latents {missing}")
        b = int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0])
        tr, _ = self._run(theta, batch, local)
        factor = self._plate_factor(tr, b)
        out = {}
        for name, site in tr.items():
            if site["type"] != "sample" or not self._in_plate(site):
                continue
            fn = site["fn"]
            lp = fn.log_prob(site["value"])
            scale = site["scale"]
            if scale is not None:
                lp = lp * (scale / factor)
            bshape = tuple(fn.batch_shape)
            lp = jnp.broadcast_to(lp, bshape) if jnp.shape(lp) != bshape else lp
            dim = [f.dim for f in site["cond_indep_stack"] if f.name == self.data_plate][0]
            out[name] = jnp.moveaxis(lp, len(bshape) + dim, 0)
        return out

    def init(self, data=None):
        """The starting point found at construction: the prior median of each global site (unconstrained)."""
        return jax.tree_util.tree_map(jnp.asarray, self._init)

    def _constrain(self, theta):
        """``{site: constrained value}`` for the global latent sites, plus deterministic sites outside the plate."""
        tr, _ = self._run(theta, self._probe, self._fill_locals())
        out = {s: tr[s]["value"] for s in self.global_sites}
        for s in self._deterministic:
            out[s] = tr[s]["value"]
        return out

    def unconstrain(self, values):
        """The inverse of :meth:`constrain` on the global latent sites (a dict of constrained values)."""
        from numpyro.distributions.transforms import biject_to

        theta = {}
        tr, _ = self._run(None, self._probe, {**self._fill_locals(), **{s: values[s] for s in self.global_sites}})
        for s in self.global_sites:
            theta[s] = biject_to(tr[s]["fn"].support).inv(jnp.asarray(values[s]))
        return theta

    # -- internals --------------------------------------------------------------------------------

    def _fill_locals(self):
        """Values for per-item latents in the 1-row probe run (they do not enter the log prior)."""
        from numpyro.distributions.transforms import biject_to

        def fill(msg):
            fn = msg["fn"]
            if _is_discrete(fn):
                return jnp.zeros(fn.shape(), jnp.int32)
            return biject_to(fn.support)(jnp.zeros(fn.shape()))

        return {s: fill for s in self.local_latent_sites + self.enumerated_sites}

    def _enum_supports(self, enum):
        key = tuple(enum)
        if self._supports is not None and key in self._supports:
            return self._supports[key]
        raise ModelError(f"no enumeration support prepared for {enum}")

    def __repr__(self):
        return (f"NumPyroModel({self.name!r}, data plate {self.data_plate!r} of N = {self.n}, globals "
                f"{self.global_sites}" + (f", enumerated {self.enumerated_sites}" if self.enumerated_sites else "")
                + ")")


def describe(model_fn, *args, data_plate: Optional[str] = None, local: str = "enumerate",
             check: bool = True, check_full_max: int = 20_000, state_sites=(), **kwargs):
    """Analyse a NumPyro model and return ``(NumPyroModel, data)`` (see the module docstring).

    ``local``: ``"enumerate"`` (sum out discrete per-item latents; refuse continuous ones) or ``"state"``
    (discrete finite latents still summed out; continuous per-item latents allowed and left to the caller,
    who passes their values to :meth:`NumPyroModel.item_log_lik`). ``check``: run the construction checks.
    ``state_sites``: with ``local="state"``, discrete per-item latents that are *kept in the state* (e.g. a
    mixture's assignments ``z`` updated by a Gibbs block) instead of being summed out.
    """
    _numpyro()
    if local not in ("enumerate", "state"):
        raise ConfigError(f"local must be 'enumerate' or 'state'; got {local!r}")
    state_sites = tuple(state_sites or ())
    if state_sites and local != "state":
        raise ConfigError("state_sites needs local='state'")
    if not callable(model_fn):
        raise ConfigError("from_numpyro needs a NumPyro model (a Python callable)")
    named, rebuild = _bind(model_fn, args, kwargs)
    sites = _structure(model_fn, args, kwargs)
    plates = [s for s in sites if s["type"] == "plate"]
    samples = [s for s in sites if s["type"] == "sample"]
    if any(s.get("scan") for s in sites):
        scanned_in_plate = [s["name"] for s in samples if s.get("scan") and s["frames"]]
        if data_plate is None or scanned_in_plate:
            raise ModelError("models with scan (numpyro.contrib.control_flow) are not supported by from_numpyro: "
                             "write the per-item likelihood without scan inside the data plate")

    leaves = _array_leaves(named)
    plate = _data_plate(plates, samples, data_plate, {int(np.shape(l)[0]) for _, _, _, l in leaves})
    pname, n = plate["name"], int(plate["size"])
    data, data_keys = _plate_data(plates, pname, n, leaves)
    dims = {f[0]: f[1] for s in samples for f in s["frames"]}
    info = _site_kinds(samples, pname, local, state_sites)
    enum_plates = _enum_plates(samples, info, pname)
    probe = _take(data, [0])
    model = NumPyroModel(model_fn, named, rebuild, data_keys, pname, n, info, probe, dims.get(pname, -1), local)
    model._enum_plates = next(iter(enum_plates.values())) if enum_plates else ()
    model._plate_sizes = {p["name"]: int(p["size"]) for p in plates}
    _prepare(model, data, n)
    if check:
        _checks(model, data, n, named, rebuild, check_full_max)
    return model, data


def _array_leaves(named):
    """``[(name, argument, leaf index, array)]``: the arrays of at least one axis among the arguments."""
    leaves = []
    for arg, val in named.items():
        flat, _ = jax.tree_util.tree_flatten_with_path(val)
        for i, (path, leaf) in enumerate(flat):
            if _is_array(leaf) and np.ndim(leaf) >= 1:
                nm = arg if not path else f"{arg}/{_path_name(path)}"
                leaves.append((nm, arg, i, leaf))
    return leaves


def _data_plate(plates, samples, data_plate, lengths):
    """The data plate: the one named, or the only plate holding observed sites whose size is the leading
    length of some argument array (``lengths``)."""
    names = [p["name"] for p in plates]
    if data_plate is not None:
        if data_plate not in names:
            raise ModelError(f"the model has no plate named {data_plate!r}"
                             + (f" (its plates: {names})" if names else " (it has no plate)"))
        return [p for p in plates if p["name"] == data_plate][0]
    with_obs = {f[0] for s in samples if s["observed"] for f in s["frames"]}
    cands = [p for p in plates if p["name"] in with_obs and p["size"] in lengths]
    if not cands:
        raise ModelError(
            "no data plate found: put the observed sites inside numpyro.plate(name, N), where N is the "
            "leading length of the data arrays passed to the model" +
            (f" (plates {names} have sizes {[p['size'] for p in plates]}; array lengths {sorted(lengths)})"
             if plates else ""))
    if len(cands) > 1:
        raise ModelError(f"several plates could be the data plate ({[p['name'] for p in cands]}): pass "
                         "data_plate=NAME")
    return cands[0]


def _plate_data(plates, pname, n, leaves):
    """``(data, data_keys)``: the arrays of leading length N by name, and where each sits in the arguments.
    Refuses other plates that subsample themselves."""
    others = [p["name"] for p in plates if p["name"] != pname and p["subsample_size"] is not None
              and p["subsample_size"] != p["size"]]
    if others:
        raise ModelError(f"plates {others} draw their own subsample (subsample_size): only the data plate "
                         f"{pname!r} may be subsampled, and tallmh chooses its items")
    data_leaves = [(nm, arg, i, l) for nm, arg, i, l in leaves if int(np.shape(l)[0]) == n]
    if not data_leaves:
        raise ModelError(f"the data plate {pname!r} has size N = {n} but no argument of the model has leading "
                         f"length {n}: pass the data arrays as arguments of the model")
    data = {nm: l for nm, _, _, l in data_leaves}
    data_keys = {nm: (arg, i) for nm, arg, i, _ in data_leaves}
    return data, data_keys


def _site_kinds(samples, pname, local, state_sites):
    """``{site name: SiteInfo}``: each sample site classified (global, global_observed, local_observed,
    local_enumerated, local_latent); refuses the sites tallmh cannot handle."""
    info = {}
    for s in samples:
        inside = any(f[0] == pname for f in s["frames"])
        if not inside:
            kind = "global_observed" if s["observed"] else "global"
            if kind == "global" and s["discrete"]:
                raise ModelError(f"site {s['name']!r} is a discrete latent outside the data plate: tallmh's "
                                 "subsampled MH moves continuous global parameters; marginalise it in the model")
        elif s["observed"]:
            kind = "local_observed"
        elif s["discrete"] and s["enumerable"] and s["name"] not in state_sites:
            kind = "local_enumerated"
        elif local == "state":
            kind = "local_latent"
        else:
            what = "a discrete latent without finite support" if s["discrete"] else "a continuous latent"
            raise ModelError(
                f"site {s['name']!r} is {what} inside the data plate {pname!r}: per-item latents are either "
                "summed out (discrete, finite support) or kept in the chain's state and updated by their own "
                "block (tm.Cycle); marginalise it in the model, or use describe(..., local='state')")
        info[s["name"]] = SiteInfo(s["name"], kind, tuple(s["shape"]), int(s["event_dim"]), bool(s["discrete"]))
    bad = [s for s in state_sites if s not in info or info[s].kind != "local_latent"]
    if bad:
        raise ModelError(f"state_sites {bad} are not latent sample sites inside the data plate {pname!r}")
    if not any(i.kind == "global" for i in info.values()):
        raise ModelError("the model has no latent site outside the data plate: nothing for MH to sample")
    return info


def _enum_plates(samples, info, pname):
    """The enumerated sites' further plates (inside the data plate): one set, shared by all of them."""
    enum_plates = {}
    for s in samples:
        if s["name"] in info and info[s["name"]].kind == "local_enumerated":
            enum_plates[s["name"]] = tuple(f[0] for f in sorted(s["frames"], key=lambda f: f[1]) if f[0] != pname)
    if len(set(enum_plates.values())) > 1:
        raise ModelError(
            "the discrete per-item latents summed out by enumeration sit in different plates ("
            + ", ".join(f"{k!r}: {list(v) or 'data plate only'}" for k, v in enum_plates.items())
            + "): tallmh sums out one level of plates only; put them in the same plates, marginalise some "
            "in the model, or keep them in the state (tm.blocks.from_numpyro(..., state=(...)))")
    return enum_plates


def from_numpyro(numpyro_model, *args, data_plate: Optional[str] = None, check: bool = True, **kwargs):
    """``model, data = tm.from_numpyro(numpyro_model, *args, **kwargs)``: a NumPyro model as a tallmh model.

    ``args``/``kwargs`` are the model's own arguments, the full data included (as for NumPyro's MCMC).
    The data plate is ``data_plate`` or, by default, the one plate holding observed sites whose size is
    the leading length of some argument array; the returned ``data`` is ``{name: array}`` of the arguments
    with that leading length N. Then ``tm.sample(model, data, test=..., control_variates=...)`` works with
    every test; draws come back by site name on the constrained scale. See :mod:`tallmh.frontends.numpyro_model`.

    (A model keyword argument called ``data_plate`` or ``check`` cannot be passed through this function.)
    """
    model, data = describe(numpyro_model, *args, data_plate=data_plate, check=check, local="enumerate", **kwargs)
    from .numpyro_glm import attach_bound  # a bound for the exact subsampled test, where the likelihood is a GLM

    attach_bound(model, data)
    return model, data
