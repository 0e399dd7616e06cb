"""A Bambi model's intercepts reported on the data's scale, as Bambi's own ``fit`` reports them.

With ``center_predictors=True`` (Bambi's default) a distributional component that has an intercept and common terms
is built on the centred design ``X - mean(X)``: the PyMC model's ``Intercept`` is the intercept of the centred
predictors, ``b_c``. Bambi's ``fit`` then reports ``b_c - mean(X) @ beta`` under the same name (in its results'
clean-up, for every such component, ``X`` the component's common-term design without the intercept, ``beta`` the
common terms' coefficients in the design's column order). tallmh samples ``b_c`` (the better-conditioned
coordinate) and applies that map to each draw in the model's output map: ``Intercept`` (or a component's
``<param>_Intercept``) is Bambi's, and the sampled one is kept beside it as ``Intercept_centred``. Components
without an intercept or without common terms, and models built with ``center_predictors=False``, are left as they
are, as Bambi leaves them. Group-level terms read the data uncentred in Bambi's model and do not enter the map.
"""

from __future__ import annotations

from typing import List, Tuple

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["CENTRED_SUFFIX", "intercept_shifts", "with_data_scale_intercepts", "shift_draws"]

CENTRED_SUFFIX = "_centred"  # the sampled intercept's output name: "Intercept_centred"


def _aliased(term):
    """Bambi's name of a term's parameter: its alias where it has one (``bambi.utils.get_aliased_name``)."""
    return term.alias if getattr(term, "alias", None) else term.name


def intercept_shifts(bmb_model) -> List[Tuple[str, List[Tuple[str, int]], np.ndarray]]:
    """``[(intercept name, [(common term name, its columns)], column means)]``, one entry for each distributional
    component of the built ``bmb_model`` whose intercept Bambi's ``fit`` moves back to the data's scale: the
    component has an intercept and common terms, and the model centres its predictors. The column means are those
    of the component's common-term design (Bambi's ``design_matrix_without_intercept``), in its column order."""
    if not getattr(bmb_model, "center_predictors", False):
        return []
    out = []
    for pymc_component in bmb_model.backend.distributional_components.values():
        comp = pymc_component.component
        if comp.intercept_term is None or not comp.common_terms:
            continue
        X = pymc_component.design_matrix_without_intercept
        if X is None:  # (Bambi stores it whenever it centres; nothing to undo otherwise)
            continue
        X = np.asarray(X)
        X = X.reshape(X.shape[0], -1)
        terms = []
        for term in comp.common_terms.values():
            d = np.asarray(term.data)
            terms.append((_aliased(term), 1 if d.ndim < 2 else int(np.prod(d.shape[1:]))))
        if sum(k for _, k in terms) != X.shape[1]:
            raise ValueError(f"Bambi's common terms {[t for t, _ in terms]} have {sum(k for _, k in terms)} columns but "
                             f"the centred design has {X.shape[1]}: the intercept cannot be put on the data's scale")
        out.append((_aliased(comp.intercept_term), terms, X.mean(axis=0, dtype=np.float64)))
    return out


def _shift(outs, name, terms, means):
    """``sum_j mean(X_j) * beta_j`` over the common terms' columns, in the intercept's shape (one value, or one per
    level of a response with levels: a term's coefficient then has its columns first, the response's levels after)."""
    b0 = jnp.asarray(outs[name])
    total = jnp.zeros(jnp.shape(b0), jnp.result_type(b0))
    j = 0
    for term, k in terms:
        beta = jnp.reshape(jnp.asarray(outs[term]), (k,) + jnp.shape(b0))
        m = jnp.asarray(means[j:j + k], jnp.result_type(b0)).reshape((k,) + (1,) * jnp.ndim(b0))
        total = total + jnp.sum(m * beta, axis=0)
        j += k
    return total


def with_data_scale_intercepts(model, shifts):
    """``model`` (a :class:`~tallmh.frontends.pymc_model.PyMCModel` converted from a Bambi model), changed in place so
    that its output map reports each intercept of ``shifts`` (:func:`intercept_shifts`) on the data's scale, with the
    sampled (centred) one beside it as ``<name>_centred``; ``theta``, the prior and the likelihood are unchanged. The
    model's ``notes`` say so. Returns the model."""
    shifts = [s for s in shifts if s[0] in model.output_names]
    if not shifts:
        return model
    missing = [t for _, terms, _ in shifts for t, _ in terms if t not in model.output_names]
    if missing:
        raise ValueError(f"the common terms {missing} are not among the model's outputs: the intercept cannot be put "
                         "on the data's scale")
    names = list(model.output_names)
    by_name = {s[0]: s for s in shifts}
    new_names = []
    for k in names:
        new_names.append(k)
        if k in by_name:
            centred = k + CENTRED_SUFFIX
            if centred in names:
                raise ValueError(f"the model already has an output {centred!r}: the sampled intercept cannot be kept "
                                 "under that name")
            new_names.append(centred)
    inner = model._out_fn

    def out_fn(*values):
        outs = dict(zip(names, inner(*values)))
        for name, terms, means in shifts:
            outs[name + CENTRED_SUFFIX] = outs[name]
            outs[name] = outs[name] - _shift(outs, name, terms, means)
        return [outs[k] for k in new_names]

    model._out_fn = out_fn
    model.output_names = new_names
    for name, _, _ in shifts:
        if name in model.coords:
            model.coords[name + CENTRED_SUFFIX] = model.coords[name]
    model.constrain = jax.jit(model._constrain)
    txt = ", ".join(f"{name} = {name}{CENTRED_SUFFIX} - sum_j mean(X_j) * beta_j over {[t for t, _ in terms]}"
                    for name, terms, _ in shifts)
    model.notes = list(getattr(model, "notes", None) or []) + [
        "Bambi's intercepts on the data's scale, as its fit reports them: " + txt + f" ({'; '.join(n + CENTRED_SUFFIX for n, _, _ in shifts)}: "
        "the intercept of the centred predictors, the parameter sampled)"]
    return model


def shift_draws(draws, shifts, sample_axes: int = 2):
    """``draws`` (``{name: array (chain, draw, *shape)}``, the first ``sample_axes`` axes the draws', e.g. another
    sampler's draws of Bambi's PyMC model, such as NUTS's) with each intercept of ``shifts`` put on the data's scale
    and the sampled one kept as ``<name>_centred``: the map of :func:`with_data_scale_intercepts`, on the host."""
    out = dict(draws)
    for name, terms, means in shifts:
        b0 = np.asarray(draws[name], np.float64)
        lead, event = b0.shape[:sample_axes], b0.shape[sample_axes:]
        total = np.zeros_like(b0)
        j = 0
        for term, k in terms:
            beta = np.asarray(draws[term], np.float64).reshape(lead + (k,) + event)
            m = np.asarray(means[j:j + k], np.float64).reshape((k,) + (1,) * len(event))
            total = total + np.sum(m * beta, axis=sample_axes)
            j += k
        out[name + CENTRED_SUFFIX] = draws[name]
        out[name] = b0 - total
    return out
