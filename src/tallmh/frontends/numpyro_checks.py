"""The NumPyro front end's probes and checks on a described model: the initial point, enumeration supports,
deterministic outputs, and the one-line refusals of a model whose likelihood tallmh cannot split into
per-item terms (:func:`checks`, also run by the PyMC front end)."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import ModelError
from ..model import count_conversion
from .numpyro_trace import MAX_ENUM, STACK_LOCK, get_trace, plate_messenger, take_rows


__all__ = ["prepare", "checks"]


def _outside_probe(model):
    """A jitted ``f(theta, batch) -> ({site: summed log density}, {deterministic site: value})`` over the
    sites outside the data plate (compiled once per batch shape)."""

    def f(theta, batch):
        tr, _ = model._run(theta, batch, model._fill_locals())
        lps, dets = {}, {}
        for name, site in tr.items():
            if model._in_plate(site):
                continue
            if site["type"] == "sample":
                lps[name] = model._site_log_prob(site)
            elif site["type"] == "deterministic":
                dets[name] = site["value"]
        return lps, dets

    return jax.jit(f)


def prepare(model, data, n):
    """Probe runs on 1-2 items: the initial point, enumeration supports, deterministic output sites."""
    from numpyro import handlers

    b0 = min(n, 2)
    rows = take_rows(data, list(range(b0)))
    model._init = _initial_point(model, rows, b0)
    model._supports = {}
    enum = model.enumerated_sites
    if enum:  # the joint support of the enumerated sites (Cartesian product), from a concrete run
        Sub = plate_messenger()
        args, kwargs = model._args_for(rows)
        tr = get_trace(handlers.seed(Sub(model.model_fn, model.data_plate, b0), 1), *args, **kwargs)
        model._supports = _enum_joint_supports(tr, enum)
        _check_enum_batch_axes(tr, enum)
        _check_enum_structure(model, data, n)
    _find_deterministic_outputs(model, data, n)


def _initial_point(model, rows, b0):
    """``{global site: unconstrained value}`` at NumPyro's ``init_to_median``, from a run on ``b0`` rows."""
    from numpyro import handlers
    from numpyro.distributions.transforms import biject_to
    from numpyro.infer.initialization import init_to_median

    Sub = plate_messenger()

    def init_fn(rows):
        args, kwargs = model._args_for(rows)
        m = handlers.substitute(handlers.seed(Sub(model.model_fn, model.data_plate, b0), 1),
                                substitute_fn=init_to_median(num_samples=15))
        tr = get_trace(m, *args, **kwargs)
        return {s: biject_to(tr[s]["fn"].support).inv(tr[s]["value"]) for s in model.global_sites}

    try:
        init = jax.jit(init_fn)(rows)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise ModelError(f"the model fails on {b0} data items: {type(e).__name__}: {e}") from e
    return {k: np.asarray(v) for k, v in init.items()}


def _enum_joint_supports(tr, enum):
    """``{subset of enumerated sites: {site: values}}``: the joint support (Cartesian product) of every
    subset of the enumerated sites, read from the trace ``tr`` of a concrete run."""
    supports = {}
    for r in range(1, len(enum) + 1):
        for subset in itertools.combinations(enum, r):
            sups = []
            for s in subset:
                fn = tr[s]["fn"]
                try:
                    sup = fn.enumerate_support(expand=False)
                except Exception as e:  # noqa: BLE001
                    raise ModelError(f"site {s!r} (discrete, inside the data plate) cannot be enumerated: "
                                     f"{type(e).__name__}: {e}") from e
                sups.append(np.asarray(sup).reshape((-1,) + tuple(fn.event_shape)))
            total = int(np.prod([len(x) for x in sups]))
            if total > MAX_ENUM:
                raise ModelError(f"the joint support of the per-item discrete latents {list(subset)} has "
                                 f"{total} values (more than {MAX_ENUM}): too many to sum out per item")
            grids = list(itertools.product(*[range(len(x)) for x in sups]))
            supports[subset] = {s: jnp.asarray(np.stack([sups[j][g[j]] for g in grids]))
                                for j, s in enumerate(subset)}
    return supports


def _check_enum_batch_axes(tr, enum):
    """Every batch axis of an enumerated site must be a plate (its cells independent)."""
    for s in enum:
        site = tr[s]
        bshape = tuple(site["fn"].batch_shape)
        pdims = {f.dim for f in site["cond_indep_stack"]}
        free = [bshape[a] for a in range(len(bshape)) if a - len(bshape) not in pdims and bshape[a] > 1]
        if free:
            raise ModelError(
                f"site {s!r} (discrete, summed out per item) has batch axes of sizes {free} that are not "
                "plates: its components would have to be summed out jointly, which tallmh does not do; "
                "declare such an axis with numpyro.plate if its components are conditionally independent, "
                "or write one site per component")


def _find_deterministic_outputs(model, data, n):
    """Deterministic sites outside the plate that do not depend on the items are reported with the draws."""
    probe = _outside_probe(model)
    model._probe_fn = probe
    _, d1 = probe(model._init, take_rows(data, [0]))
    if d1:
        _, d2 = probe(model._init, take_rows(data, [n - 1] * min(n, 3)))
        for d in d1:
            v1, v2 = np.asarray(d1[d]), np.asarray(d2[d])
            if v1.shape == v2.shape and np.allclose(v1, v2, equal_nan=True):
                model._deterministic.append(d)


def _check_enum_structure(model, data, n):
    """Refuse a data-plate site outside the enumerated sites' further plates that depends on them.

    With the enumerated sites in further plates E (e.g. one z per (item, time)), a site that is per item but
    not per cell of E (say ``y_i ~ N(sum_t z_it, 1)``) couples all the cells' values: the marginal is then no
    longer a product over the cells of E of per-cell sums, and tallmh does not compute it. Checked on two
    items at two random points: such a site's log density changes with the enumerated values."""
    if not model._enum_plates:
        return
    enum = model.enumerated_sites
    sup = model._enum_supports(enum)
    keep = set(model._enum_plates)
    fills = {s: f for s, f in model._fill_locals().items() if s in model.local_latent_sites}
    rows = take_rows(data, list(range(min(n, 2))))
    b = int(np.shape(jax.tree_util.tree_leaves(rows)[0])[0])
    rng = np.random.default_rng(1)

    def per_site(theta, vals):
        fixed = dict(fills)
        for s in enum:
            fixed[s] = (lambda v: (lambda msg: jnp.broadcast_to(v, msg["fn"].shape()).astype(
                jnp.result_type(v))))(vals[s])
        tr, _ = model._run(theta, rows, fixed)
        factor = model._plate_factor(tr, b)
        return {name: model._site_log_prob(site, per_item=True, factor=factor) for name, site in tr.items()
                if site["type"] == "sample" and model._in_plate(site)
                and not keep <= {f.name for f in site["cond_indep_stack"]}}

    lps_at = jax.jit(lambda theta: jax.vmap(lambda v: per_site(theta, v))(sup))
    for _ in range(2):
        theta = jax.tree_util.tree_map(
            lambda a: a + 0.5 * jnp.asarray(rng.standard_normal(np.shape(a)), jnp.result_type(a)), model.init())
        lps = lps_at(theta)
        for name, lp in lps.items():
            lp = np.asarray(lp)
            if not np.allclose(lp, lp[:1], rtol=1e-5, atol=1e-5):
                raise ModelError(
                    f"site {name!r} is in the data plate {model.data_plate!r} but not in the plates "
                    f"{list(model._enum_plates)} of the enumerated sites {enum}, and depends on them: summing "
                    f"those out couples all their values per item (one sum over every combination), which "
                    "tallmh does not compute; put the site inside those plates too, marginalise the discrete "
                    "latents in the model, or keep them in the state (tm.blocks.from_numpyro(..., state=(...)))")


def _check_enum_brute_force(model, data, n, thetas, rows, local=None, max_configs=4096):
    """The enumerated per-item log-likelihood against a brute-force sum over every joint value of the
    enumerated sites' cells (one model run per configuration, one item at a time), at each point of
    ``thetas`` and each item of ``rows``; raise :class:`ModelError` on a mismatch. Returns the largest
    relative difference, or None where an item has more than ``max_configs`` configurations (not checked)."""
    enum = model.enumerated_sites
    local = dict(local or {})
    batch0 = take_rows(data, [rows[0]])
    tr, _ = model._run(thetas[0], batch0, {**model._fill_locals(), **local})
    cells, sups = [], []
    for s in enum:
        fn = tr[s]["fn"]
        sups.append(np.asarray(model._supports[(s,)][s]))  # (K_s, *event)
        cells.append((s, tuple(fn.batch_shape), int(np.prod(fn.batch_shape, dtype=int))))
    total = int(np.prod([float(len(sup)) ** count for (_, _, count), sup in zip(cells, sups)]))
    if total > max_configs:
        return None
    grids = [list(itertools.product(range(len(sup)), repeat=count)) for (_, _, count), sup in zip(cells, sups)]
    values = {s: [] for s in enum}
    for combo in itertools.product(*grids):
        for (s, bshape, _), sup, idx in zip(cells, sups, combo):
            values[s].append(sup[list(idx)].reshape(bshape + sup.shape[1:]))
    values = {s: jnp.asarray(np.stack(v)) for s, v in values.items()}

    @jax.jit
    def brute(theta, batch):
        def one(vals):
            tr, _ = model._run(theta, batch, {**local, **vals})
            return model._per_item(tr, 1)[0]

        return jax.scipy.special.logsumexp(jax.vmap(one)(values))

    worst = 0.0
    for theta in thetas:
        for i in rows:
            batch = take_rows(data, [i])
            b = float(brute(theta, batch))
            ours = float(np.asarray(model._item_log_lik(theta, batch, local) if local
                                    else model.log_lik(theta, batch))[0])
            worst = max(worst, abs(b - ours) / max(1.0, abs(b)))
            if not np.isclose(ours, b, rtol=1e-4, atol=1e-3):
                raise ModelError(
                    f"the per-item log-likelihood with {enum} summed out ({ours:.6g} for item {i}) differs from "
                    f"the sum over all {total} joint values of their cells ({b:.6g}): the enumerated sites are "
                    "not conditionally independent across the cells of their plates (e.g. a site indexes z at "
                    "another time); marginalise them in the model or keep them in the state")
    return worst


def checks(model, data, n, named, rebuild, check_full_max):
    """Construction checks on a few items (see the module docstring); raise ModelError with the reason."""
    theta0 = model.init()
    rng = np.random.default_rng(0)
    theta1 = jax.tree_util.tree_map(lambda a: a + 0.1 * jnp.asarray(rng.standard_normal(np.shape(a)), a.dtype),
                                    theta0)
    _check_prior_ignores_items(model, data, n, (theta0, theta1))
    # additivity over items (per-item latents kept in a state get fixed probe values)
    fills = {s: f for s, f in model._fill_locals().items() if s in model.local_latent_sites}
    _check_additive(model, data, n, (theta0, theta1), fills)
    # enumeration: the summed-out per-item log-likelihood equals the brute-force sum over every joint value
    # of the enumerated cells, on two items (skipped where an item has more than 4096 configurations)
    if model.enumerated_sites:
        _check_enum_brute_force(model, data, n, (theta0, theta1), sorted({0, n - 1}), fills)
    if n <= check_full_max and not model.local_latent_sites:
        _check_full_density(model, data, n, named, rebuild, theta0)


def _check_prior_ignores_items(model, data, n, thetas):
    """The log prior must not depend on the items passed, and must be finite at ``thetas``."""
    probe = model._probe_fn
    rows2 = [n - 1, n // 2, 0][: max(1, min(n, 3))]
    for th in thetas:
        lp1, _ = probe(th, take_rows(data, [0]))
        lp2, _ = probe(th, take_rows(data, rows2))
        for name in lp1:
            v1, v2 = float(lp1[name]), float(lp2.get(name, np.nan))
            if not np.isclose(v1, v2, rtol=1e-5, atol=1e-5):
                raise ModelError(
                    f"site {name!r} is outside the data plate {model.data_plate!r} but depends on the "
                    f"items passed (log density {v1:.6g} with 1 item, {v2:.6g} with {len(rows2)}): put it "
                    "inside the plate if it is per-item, or do not compute it from the data arrays (e.g. pass "
                    "N or summaries as plain arguments)")
        val = float(model.log_prior(th))
        if not np.isfinite(val):
            raise ModelError(f"the log prior is not finite at the initial point ({val})")


def _check_additive(model, data, n, thetas, fills):
    """One finite log-likelihood per item, and ll(A u B) = ll(A) ++ ll(B) on a few items."""

    def ll(th, rows):
        if fills:
            return model._item_log_lik(th, take_rows(data, rows), fills)
        return model.log_lik(th, take_rows(data, rows))

    a = list(range(min(n, 3)))
    bset = sorted({n - 1, n // 2, max(0, n - 2)} - set(a))
    if not bset:
        return
    for th in thetas:
        ll_ab = np.asarray(ll(th, a + bset))
        ll_a = np.asarray(ll(th, a))
        ll_b = np.asarray(ll(th, bset))
        if ll_ab.shape != (len(a) + len(bset),) or ll_a.shape != (len(a),):
            raise ModelError(f"the data plate {model.data_plate!r} does not give one log-likelihood per item "
                             f"(shape {ll_ab.shape} for {len(a) + len(bset)} items)")
        both = np.concatenate([ll_a, ll_b])
        if not np.allclose(ll_ab, both, rtol=1e-4, atol=1e-4):
            raise ModelError(
                f"the per-item log-likelihoods are not additive over items: ll(A u B) = {ll_ab.round(4)} but "
                f"ll(A) ++ ll(B) = {both.round(4)} (A = {a}, B = {bset}). Items must be conditionally "
                "independent given the global sites, the plate's items must be the rows of the data "
                "arguments (index them with the plate's indices, or use the arrays whole), and the model "
                "must not use the number of rows passed except as the plate size")
        if not np.all(np.isfinite(ll_ab)):
            raise ModelError("log_lik is not finite at the initial point")


def _check_full_density(model, data, n, named, rebuild, theta0):
    """The decomposition reproduces NumPyro's own log density on the full data (small N); enumerated sites
    are fixed at one value in every cell on both sides (their sum is checked against brute force)."""
    from numpyro import handlers
    from numpyro.infer.util import potential_energy

    Sub = plate_messenger()
    args, kwargs = rebuild(named)
    fixed = {s: f for s, f in model._fill_locals().items() if s in model.enumerated_sites}
    full = Sub(model.model_fn, model.data_plate, n)
    if fixed:
        full = handlers.substitute(full, substitute_fn=lambda msg: fixed[msg["name"]](msg)
                                   if msg["type"] == "sample" and msg["name"] in fixed else None)
    try:
        def pe_of(th):
            with STACK_LOCK:
                return potential_energy(full, args, kwargs, th)

        pe = float(jax.jit(pe_of)(theta0))
    except Exception:  # noqa: BLE001 - NumPyro cannot evaluate it: skip this check
        return
    ll = model._item_log_lik(theta0, data, fixed) if fixed else model.log_lik(theta0, data)
    count_conversion(model, 2 * n)  # (NumPyro's density and ours, each over all rows)
    ours = float(model.log_prior(theta0) + jnp.sum(ll))
    if not np.isclose(ours, -pe, rtol=1e-4, atol=1e-3 * max(1.0, np.sqrt(n))):
        raise ModelError(
            f"log_prior + sum(log_lik) = {ours:.6g} differs from NumPyro's log density {-pe:.6g} on the "
            "full data: the model probably uses the number of rows passed outside the data plate")
