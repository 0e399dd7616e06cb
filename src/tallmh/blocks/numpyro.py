"""NumPyro models in inference programs: ``model, data = tm.blocks.from_numpyro(fn, *args, state=("z",))``.

The probabilistic-programs paper (Chen, Mansinghka & Ghahramani, Sec. 3-4, Fig. 7) writes the model once
and the inference program as a ``cycle`` of transitions that address the model's random choices by name.
This module makes a NumPyro model usable by the blocks of :mod:`tallmh.blocks` the same way:

- the **global** sites (latent sample sites outside the data plate) are the program state's values by site
  name, on the unconstrained scale of ``biject_to(site.support)`` (Jacobians in the prior, as
  :func:`tallmh.from_numpyro`);
- the **per-item latents kept in the state** (continuous latents inside the data plate, and the discrete ones
  named in ``state=``) are the state's values by site name, item axis first: ``values["z"]`` is (N,),
  ``values["eps"]`` is (N, T) for a site inside a time plate. Other discrete per-item latents are summed out
  per item by enumeration, as in :func:`tallmh.from_numpyro`.

Every block reads the model through :class:`~tallmh.frontends.numpyro_model.NumPyroModel` with the data plate's
indices substituted, so its cost is that of the items it touches:

- ``SubsampledMH("w", ...)``: the local section ``l_i`` of item i (paper eq. 5-6) is the sum of the log
  densities of the plate's sites for item i, with the item's state latents fixed (``item_log_lik(theta,
  x_i, z_i)``); the test reads the items it asks for, O(batch) per look. ``group_by="z"``: row k of a site
  inside a cluster plate is tested over cluster k's current members (the full site with row k replaced is
  passed to the model, so any indexing ``w[z]`` in the model works);
- ``MH("alpha")``: a site none of whose descendants is inside the data plate (checked on the model's jaxpr:
  the per-item log density does not depend on it) is updated against the log prior alone, reading no data;
  otherwise the prior plus all N local sections (O(N), counted);
- ``Gibbs("z", items_per_step=m)``: z_i's full conditional given the globals is proportional to the item's
  joint density at each value of z_i (items are conditionally independent given the globals), so one
  batched model run on m * K rows gives the m items' K log weights: O(m K), never a full potential;
- ``ParticleGibbs("eps", particles=P, window=L)``: conditional SMC over a per-item latent with a time axis
  (site shape (T,) per item). Proposals are draws of each step from the site's own distribution (so its
  density cancels in the weights when the steps are independent, see below), and the incremental weight at
  time t is the log density of the plate's other sites at time t (sites with the same time axis); at the
  window's last step, every later time and the item-level sites are added. This needs the site's time
  steps to be conditionally independent given the globals (a time plate, or ``to_event`` of a univariate
  law) and the model to be *causal* in time (a site at time t does not depend on the latent after t),
  both checked on two items at set-up. A Gaussian path with dependent steps (``GaussianRandomWalk``,
  ``MultivariateNormal``: ``h = loc + L z``, L lower triangular) is run on its innovations ``z``, which
  are independent N(0, 1) with ``h_t`` depending on ``z_<=t`` only (O(T^2) per series to map them); other
  dependent paths are refused with the non-centred rewrite suggested. A state-space model written in the
  non-centred form ``eps_t ~ N(0, 1)``, ``h = AR(eps)`` fits; each weight evaluation runs the model on the
  window's series (O(m P T) per time step).

Example (the paper's stochastic volatility, non-centred)::

    def sv(x):
        phi = numpyro.sample("phi", dist.Beta(5.0, 1.0))
        sigma2 = numpyro.sample("sigma2", dist.InverseGamma(5.0, 0.05))
        with numpyro.plate("series", x.shape[0], dim=-2):
            with numpyro.plate("time", x.shape[1], dim=-1):
                eps = numpyro.sample("eps", dist.Normal(0.0, 1.0))
            h = ar1(eps, phi, jnp.sqrt(sigma2))
            with numpyro.plate("time", x.shape[1], dim=-1):
                numpyro.sample("x", dist.Normal(0.0, jnp.exp(h / 2)), obs=x)

    model, data = tm.blocks.from_numpyro(sv, x)
    program = tm.Cycle([tm.blocks.ParticleGibbs("eps", particles=10, window=3, series_per_step=500),
                        tm.blocks.SubsampledMH("phi", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100)),
                        tm.blocks.SubsampledMH("sigma2", test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100))])
    result = tm.sample_program(program, model, data, num_samples=1000, num_chains=4)

Draws come back by site name on the constrained scale (plus deterministic sites outside the plate and the
state sites named in ``record=``).
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ConfigError, ModelError

__all__ = ["NumPyroProgramModel", "from_numpyro"]


def _depends_on_input(fn, x) -> bool:
    """Whether ``fn(x)``'s outputs depend on ``x``, by a forward taint pass over the jaxpr (conservative: an
    equation with a tainted input taints all its outputs, nested jaxprs included)."""
    closed = jax.make_jaxpr(fn)(x)
    jaxpr = closed.jaxpr
    tainted = set(jaxpr.invars)
    for eqn in jaxpr.eqns:
        if any(type(v).__name__ != "Literal" and v in tainted for v in eqn.invars):
            tainted.update(eqn.outvars)
    return any(type(v).__name__ != "Literal" and v in tainted for v in jaxpr.outvars)


def _dependent_components(fn):
    """None when the components of a sample site's value are conditionally independent given the
    distribution's parameters (its event shape is () once ``Independent``, ``expand`` and ``mask`` wrappers are
    removed), otherwise the name of the distribution whose components are dependent (e.g.
    ``GaussianRandomWalk``, ``MultivariateNormal``). Conservative: an unknown multivariate law counts as
    dependent."""
    from numpyro.distributions import ExpandedDistribution, Independent, MaskedDistribution

    d = fn
    while tuple(d.event_shape) != ():
        if isinstance(d, (Independent, ExpandedDistribution, MaskedDistribution)):
            d = d.base_dist
            continue
        return type(d).__name__
    return None


def _gaussian_path(fn):
    """``(loc, scale_tril)`` of a Gaussian path law (``GaussianRandomWalk``, ``MultivariateNormal``, possibly
    expanded over plates), broadcast to ``fn.batch_shape + (T,)`` and ``+ (T, T)``; None for other laws."""
    from numpyro.distributions import ExpandedDistribution, GaussianRandomWalk, MultivariateNormal

    if len(fn.event_shape) != 1:
        return None
    d = fn
    while isinstance(d, ExpandedDistribution):
        d = d.base_dist
    batch, t_len = tuple(fn.batch_shape), int(fn.event_shape[0])
    if type(d) is GaussianRandomWalk:
        scale = jnp.asarray(d.scale)
        tril = jnp.tril(jnp.ones((t_len, t_len), scale.dtype))
        lower = scale[..., None, None] * tril
        loc = jnp.zeros((t_len,), scale.dtype)
    elif type(d) is MultivariateNormal:
        loc, lower = jnp.asarray(d.loc), jnp.asarray(d.scale_tril)
    else:
        return None
    return jnp.broadcast_to(loc, batch + (t_len,)), jnp.broadcast_to(lower, batch + (t_len, t_len))


class NumPyroProgramModel:
    """A :class:`~tallmh.frontends.numpyro_model.NumPyroModel` in the blocks' model protocol (see the module docstring).

    Build it with :func:`from_numpyro`. Attributes: ``np_model`` (the NumPyroModel), ``global_sites``,
    ``state_sites`` (per-item latents kept in the state), ``n``.
    """

    wants_full_site = True  # grouped SubsampledMH passes the whole site with row k replaced
    _gibbs_prior_only = False  # a deliberately wrong Gibbs conditional (tests' negative control)

    def __init__(self, np_model, data, record: Sequence[str] = (), init_globals: str = "prior"):
        if init_globals not in ("prior", "median"):
            raise ConfigError(f"init_globals must be 'prior' or 'median'; got {init_globals!r}")
        self.np_model = np_model
        self.n = np_model.n
        self.global_sites = list(np_model.global_sites)
        self.state_sites = list(np_model.local_latent_sites)
        self.record_sites = tuple(record)
        bad = [s for s in self.record_sites if s not in self.state_sites]
        if bad:
            raise ConfigError(f"record={bad}: only per-item latents kept in the state can be recorded "
                              f"(state sites: {self.state_sites}); globals are always recorded")
        self.init_globals = init_globals
        self._deps: Dict[str, bool] = {}
        self._pg_gaussian = set()  # Gaussian path sites that particle Gibbs runs on their innovations
        self._axis, self._support, self._item_shape = {}, {}, {}
        self._probe_layout(data)
        self._check_rows = {k: jnp.asarray(np.asarray(v)[: min(2, self.n)]) for k, v in data.items()}

    # -- layout of the per-item latents ---------------------------------------------------------------

    def _probe_layout(self, data):
        """For each state site: the axis of the data plate in NumPyro's layout, the per-item shape, and
        (discrete sites) the enumerated support. Found from abstract runs on 2 and 3 items."""
        m = self.np_model
        theta0 = m.init()
        fills = m._fill_locals()

        def shapes(b):
            batch = {k: jnp.asarray(np.asarray(v)[:b]) for k, v in data.items()}

            def f(batch):
                tr, _ = m._run(theta0, batch, fills)
                return {s: tr[s]["value"] for s in self.state_sites}

            return jax.eval_shape(f, batch)

        b2, b3 = shapes(2), shapes(3)
        for s in self.state_sites:
            sh2, sh3 = tuple(b2[s].shape), tuple(b3[s].shape)
            diff = [i for i, (u, v) in enumerate(zip(sh2, sh3)) if u != v]
            if len(sh2) != len(sh3) or len(diff) != 1:
                raise ModelError(f"cannot find the data plate's axis in site {s!r} (shapes {sh2} and {sh3} for 2 "
                                 "and 3 items)")
            ax = diff[0]
            self._axis[s] = ax
            self._item_shape[s] = sh2[:ax] + sh2[ax + 1:]
            if m.sites[s].discrete:
                rows = {k: jnp.asarray(np.asarray(v)[:1]) for k, v in data.items()}
                tr, _ = m._run(theta0, rows, fills)
                fn = tr[s]["fn"]
                try:
                    sup = np.asarray(fn.enumerate_support(expand=False))
                except Exception as e:  # noqa: BLE001 - re-raised with context
                    raise ModelError(f"site {s!r} (discrete, kept in the state) has no enumerable support: "
                                     f"{type(e).__name__}: {e}") from e
                self._support[s] = sup.reshape(-1)

    def _to_numpyro(self, site, v):
        """Item-first values of a state site for b items -> NumPyro's layout."""
        return jnp.moveaxis(v, 0, self._axis[site])

    def _from_numpyro(self, site, v):
        return jnp.moveaxis(v, self._axis[site], 0)

    def support_size(self, site):
        if site not in self._support:
            raise ModelError(f"site {site!r} is not a discrete per-item latent kept in the state")
        return int(self._support[site].shape[0])

    # -- helpers ---------------------------------------------------------------------------------------

    def _theta(self, values, site=None, value=None):
        th = {g: values[g] for g in self.global_sites}
        if site is not None:
            th[site] = value
        return th

    def _local(self, values, idx, override=None):
        override = override or {}
        out = {}
        for s in self.state_sites:
            v = override[s] if s in override else values[s][idx]
            out[s] = self._to_numpyro(s, v)
        return out

    @staticmethod
    def _rows(data, idx):
        return {k: v[idx] for k, v in data.items()}

    # -- set-up ----------------------------------------------------------------------------------------

    def init(self, key, data):
        """A draw from the prior (one model run on all N items, at set-up only): globals unconstrained, state
        latents item first. With ``init_globals="median"`` the globals start at their prior medians."""
        from numpyro.distributions.transforms import biject_to

        m = self.np_model
        theta = m.init() if self.init_globals == "median" else None
        tr, _ = m._run(theta, data, {}, rng_key=key)
        values = {}
        for g in self.global_sites:
            if theta is not None:
                values[g] = jnp.asarray(theta[g])
            else:
                values[g] = biject_to(tr[g]["fn"].support).inv(tr[g]["value"])
        for s in self.state_sites:
            v = self._from_numpyro(s, tr[s]["value"])
            if s in self._support:
                v = v.astype(jnp.int32)
            values[s] = v
        return values, ()

    # -- SubsampledMH / MH -------------------------------------------------------------------------------

    def site_log_prior(self, site, value, values, aux):
        """Log density of the sites outside the data plate (Jacobians included) with ``site`` = ``value``: the
        global part of the paper's eq. 5 (O(1) in N)."""
        return self.np_model.log_prior(self._theta(values, site, value))

    def local_log_density(self, site, value, values, aux, data, idx):
        """Per-item log densities ``(b,)`` of the items ``idx`` with ``site`` = ``value`` and the items' state
        latents fixed (their sum over the plate's sites; other discrete per-item latents summed out)."""
        idx = jnp.asarray(idx, jnp.int32)
        return self.np_model._item_log_lik(self._theta(values, site, value), self._rows(data, idx),
                                           self._local(values, idx))

    def has_local_sections(self, site):
        """Whether the per-item log density depends on the global ``site`` (jaxpr dependency, cached)."""
        if site not in self._deps:
            m = self.np_model
            theta0 = m.init()
            fills = {s: f for s, f in m._fill_locals().items() if s in self.state_sites}

            def f(u):
                return m._item_log_lik({**theta0, site: u}, m._probe, fills)

            self._deps[site] = _depends_on_input(f, jnp.asarray(theta0[site]))
        return self._deps[site]

    # -- Gibbs on a discrete state latent ----------------------------------------------------------------

    def gibbs_check(self, site):
        """Gibbs on a NumPyro site needs a discrete per-item latent with one value per item, kept in the state."""
        if site not in self._support:
            raise ModelError(f"Gibbs({site!r}): not a discrete per-item latent kept in the state (pass "
                             f"state=({site!r},) to from_numpyro); state sites: {self.state_sites}")
        if self._item_shape[site] != ():
            raise ModelError(f"Gibbs({site!r}): one value per item is needed; per-item shape {self._item_shape[site]}")

    def gibbs_logits_batch(self, site, values, data, items):
        """``(m, K)`` log full conditionals of ``site`` for the items ``items`` (one batched model run on
        ``m * K`` rows; z_i is conditionally independent of the other items' latents given the globals)."""
        sup = jnp.asarray(self._support[site])
        k = sup.shape[0]
        m = items.shape[0]
        rows = jnp.repeat(items, k)
        zvals = jnp.tile(sup, m).astype(values[site].dtype)
        zvals = jnp.broadcast_to(zvals.reshape((m * k,) + (1,) * len(self._item_shape[site])),
                                 (m * k,) + self._item_shape[site])
        if self._gibbs_prior_only:  # negative control for the tests: the likelihood ignored
            lps = self.np_model.item_log_probs(self._theta(values), self._rows(data, rows),
                                               self._local(values, rows, {site: zvals}))
            return lps[site].reshape(m * k, -1).sum(axis=1).reshape(m, k)
        ll = self.np_model._item_log_lik(self._theta(values), self._rows(data, rows),
                                         self._local(values, rows, {site: zvals}))
        return ll.reshape(m, k)

    def gibbs_value(self, site, k):
        """The support value of index ``k``."""
        return jnp.asarray(self._support[site])[k]

    # -- particle Gibbs on a state latent with a time axis -------------------------------------------------

    def pg_check(self, site):
        """Set-up checks for ParticleGibbs on ``site``: per-item shape (T,); time steps conditionally
        independent given the globals (the site is inside a time plate, or ``to_event`` of a univariate law),
        since the bootstrap proposals draw each step from the site's own law and its density is left out of
        the weights; a ``GaussianRandomWalk`` or ``MultivariateNormal`` path is run on its innovations
        instead, other dependent paths are refused; every other plate site either per item or per (item,
        time); and causality (the log density at time t does not change when the latent changes after t),
        on two items. Returns T."""
        if site not in self.state_sites:
            raise ModelError(f"ParticleGibbs({site!r}): not a per-item latent kept in the state "
                             f"(state sites: {self.state_sites})")
        if len(self._item_shape[site]) != 1:
            raise ModelError(f"ParticleGibbs({site!r}): the latent must have one time axis per item; its per-item "
                             f"shape is {self._item_shape[site]}")
        t_len = self._item_shape[site][0]
        rng = np.random.default_rng(0)
        data = self._check_rows
        idx = jnp.arange(min(2, self.n), dtype=jnp.int32)
        vals = self._probe_values(data, idx.shape[0])
        m = self.np_model
        tr, _ = m._run(self._theta(vals), data, self._local(vals, idx))
        fn = tr[site]["fn"]
        dep = _dependent_components(fn)
        self._pg_gaussian.discard(site)
        if dep is not None and _gaussian_path(fn) is not None:
            self._pg_gaussian.add(site)  # run on the innovations z = L^-1 (h - loc), independent N(0, 1)
        elif dep is not None:
            raise ModelError(
                f"ParticleGibbs({site!r}): site {site!r} is a {dep} path whose time steps are dependent given "
                "the globals; particle Gibbs on a NumPyro site draws each step from the site's own law "
                "independently of the others and leaves its density out of the weights, which is right only "
                "when the steps are conditionally independent (a time plate, or to_event of a univariate "
                "law; GaussianRandomWalk and MultivariateNormal paths are run on their innovations). Write "
                "the path in the non-centred form: innovations eps ~ Normal(0, 1) inside a time plate and "
                "the path a deterministic function of them (h = scale * cumsum(eps), or an AR recursion as in "
                "tallmh.blocks.numpyro_models.linear_gaussian_ssm), and run ParticleGibbs on eps; or write "
                "the model by hand with ssm_transition_sample/ssm_transition_logpdf")
        path = self.pg_innovations(site, vals, data, idx, vals[site][idx])
        per_time = jax.jit(lambda p: self._pg_weights_any(site, vals, data, idx, p)[0])
        lt = per_time(path)
        for t0 in range(1, t_len):
            p2 = path.at[:, t0:].add(jnp.asarray(rng.standard_normal((idx.shape[0], t_len - t0)), path.dtype))
            lt2 = per_time(p2)
            if not np.allclose(np.asarray(lt)[:, :t0], np.asarray(lt2)[:, :t0], rtol=1e-5, atol=1e-5):
                raise ModelError(f"ParticleGibbs({site!r}): the model is not causal in time: the log density at "
                                 f"times before {t0} changes when {site!r} changes from time {t0} on")
        return t_len

    def _probe_values(self, rows, b):
        """Globals at their prior medians and state latents drawn from the prior, for ``b`` probe rows."""
        m = self.np_model
        theta = m.init()
        tr, _ = m._run(theta, rows, {}, rng_key=jax.random.PRNGKey(1))
        vals = {g: jnp.asarray(theta[g]) for g in self.global_sites}
        for s in self.state_sites:
            vals[s] = self._from_numpyro(s, tr[s]["value"])
        return vals

    def _pg_weights_raw(self, site, values, data, rows, paths):
        """For b rows with path values ``paths`` (b, T): the summed log densities of the plate's sites other
        than ``site``, per (item, time) ``(b, T)`` and per item ``(b,)``."""
        lps = self.np_model.item_log_probs(self._theta(values), self._rows(data, rows),
                                           self._local(values, rows, {site: paths}))
        b, t_len = paths.shape
        per_time = jnp.zeros((b, t_len), paths.dtype)
        per_item = jnp.zeros((b,), paths.dtype)
        for name, lp in lps.items():
            if name == site:
                continue
            if lp.shape == (b, t_len):
                per_time = per_time + lp
            else:
                per_item = per_item + lp.reshape(b, -1).sum(axis=1)
        return per_time, per_item

    def pg_weights(self, site, values, data, series, paths):
        """``paths`` (m, P, T) for the series ``series`` (m,) -> per-time ``(m, P, T)`` and per-item ``(m, P)``
        log densities of the other plate sites (one model run on m * P rows)."""
        m, p, t_len = paths.shape
        rows = jnp.repeat(series, p)
        lt, li = self._pg_weights_any(site, values, data, rows, paths.reshape(m * p, t_len))
        return lt.reshape(m, p, t_len), li.reshape(m, p)

    # Gaussian paths (GaussianRandomWalk, MultivariateNormal): h = loc + L z with L lower triangular and
    # z ~ N(0, I) given the globals, so conditional SMC runs on the innovations z, whose steps are independent
    # (the site's density is N(z; 0, I) / |det L|, and |det L| does not depend on z), and h_t depends on
    # z_{<=t} only (causality is kept). The non-centred parametrisation of Papaspiliopoulos, Roberts & Skold
    # (2007), applied inside the block: the state keeps h.

    def _gaussian_params(self, site, values, data, rows):
        tr, _ = self.np_model._run(self._theta(values), self._rows(data, rows), self._local(values, rows))
        loc, lower = _gaussian_path(tr[site]["fn"])
        return self._from_numpyro(site, loc), lower  # item first

    def pg_innovations(self, site, values, data, rows, h):
        """``h`` (b, T) of the items ``rows`` -> the variables conditional SMC runs on: ``h`` itself, or for a
        Gaussian path its innovations ``z = L^-1 (h - loc)``."""
        if site not in self._pg_gaussian:
            return h
        loc, lower = self._gaussian_params(site, values, data, rows)
        z = jax.scipy.linalg.solve_triangular(lower, (h - loc)[..., None], lower=True)[..., 0]
        return z.astype(h.dtype)

    def pg_path(self, site, values, data, rows, z):
        """The inverse of :meth:`pg_innovations`: ``h = loc + L z`` for a Gaussian path (else ``z``)."""
        if site not in self._pg_gaussian:
            return z
        loc, lower = self._gaussian_params(site, values, data, rows)
        return (loc + jnp.einsum("bij,bj->bi", lower, z)).astype(z.dtype)

    def _pg_weights_any(self, site, values, data, rows, paths):
        if site in self._pg_gaussian:
            paths = self.pg_path(site, values, data, rows, paths)
        return self._pg_weights_raw(site, values, data, rows, paths)

    def pg_propose(self, site, key, values, data, series, paths):
        """Fresh draws ``(m, P, T)`` of ``site`` from its own distribution (given the globals), for the
        bootstrap proposals of conditional SMC."""
        m, p, t_len = paths.shape
        if site in self._pg_gaussian:  # innovations: independent N(0, 1) steps
            return jax.random.normal(key, (m, p, t_len), paths.dtype)
        rows = jnp.repeat(series, p)
        m_ = self.np_model
        tr, _ = m_._run(self._theta(values), self._rows(data, rows),
                        {s: self._to_numpyro(s, values[s][rows]) for s in self.state_sites if s != site},
                        rng_key=key)
        return self._from_numpyro(site, tr[site]["value"]).reshape(m, p, t_len).astype(paths.dtype)

    # -- output ----------------------------------------------------------------------------------------

    def record(self, values, aux):
        out = dict(self.np_model.constrain(self._theta(values)))
        for s in self.record_sites:
            out[s] = values[s]
        return out

    def __repr__(self):
        return (f"NumPyroProgramModel({self.np_model.name!r}, N = {self.n}, globals {self.global_sites}, "
                f"state {self.state_sites})")


def from_numpyro(numpyro_model, *args, state: Sequence[str] = (), record: Sequence[str] = (),
                 data_plate: Optional[str] = None, init_globals: str = "prior", check: bool = True, **kwargs):
    """``model, data = tm.blocks.from_numpyro(numpyro_model, *args, state=("z",), **kwargs)``.

    A NumPyro model for :func:`tallmh.sample_program`: its continuous per-item latents, and the discrete ones
    named in ``state``, are kept in the program's state by site name and updated by their own blocks; the
    other discrete per-item latents are summed out per item. ``record``: per-item state sites to record with
    each draw (the globals, constrained, always are). ``init_globals``: chains start from a prior draw
    (``"prior"``, one per chain) or from the prior medians (``"median"``); the state latents start from a
    prior draw given them. See :mod:`tallmh.blocks.numpyro`.
    """
    from ..frontends.numpyro_model import describe

    np_model, data = describe(numpyro_model, *args, data_plate=data_plate, local="state", check=check,
                              state_sites=tuple(state), **kwargs)
    return NumPyroProgramModel(np_model, data, record=record, init_globals=init_globals), data
