"""A remainder bound for NumPyro models whose likelihood is a Bernoulli-logit, Poisson-log or NB2-log GLM of an
affine linear predictor.

Read from the model's trace on a few rows (see :mod:`tallmh.linear_predictor` for why each condition is needed
for the exact subsampled test to stay exact): no discrete latent summed out and no latent inside the data plate;
exactly one sample site inside the data plate, observed, one value per row, without a scale or a mask; its
distribution ``Bernoulli(logits=eta)`` (NumPyro's ``BernoulliLogits``) or ``Poisson(rate)`` whose rate is, in the
program, ``exp`` of ``eta``; ``eta``, as a function of the flat unconstrained globals and the data, affine
(:func:`tallmh.linear_predictor.affine_in`); and, as a cross-check of the reading, the model's per-row
log-likelihood equal to the family's at two parameter values on up to 64 rows. (For a Poisson site ``eta`` is
computed as ``log(rate)``: exact to rounding where the rate neither overflows nor underflows.) An NB2 site,
``NegativeBinomial2(mean, concentration)``, needs ``mean = exp(eta)`` and ``concentration = exp(affine)`` of one
value that reads no data (:func:`_attach_nb2`, :mod:`tallmh.nb2_predictor`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["attach_bound"]


def _site(model, tr):
    """The one sample site inside the data plate, or ``(None, why)``."""
    sites = [(k, s) for k, s in tr.items() if s["type"] == "sample" and model._in_plate(s)]
    if len(sites) != 1:
        return None, "more than one site inside the data plate"
    name, s = sites[0]
    if not s.get("is_observed", False):
        return None, "a latent site inside the data plate"
    if type(s["fn"]).__name__ not in ("BernoulliLogits", "Poisson", "NegativeBinomial2"):
        return None, (f"a {type(s['fn']).__name__} likelihood (bounds exist here for Bernoulli(logits=...), "
                      "Poisson(exp(...)) and NegativeBinomial2(exp(...), exp(...)))")
    if type(s["fn"]).__name__ == "Poisson" and getattr(s["fn"], "is_sparse", False):
        return None, "a sparse Poisson likelihood"
    if s.get("scale") is not None or s.get("mask") is not None or tuple(s["fn"].event_shape) != ():
        return None, "a scaled, masked or multivariate likelihood site"
    return name, s


def attach_bound(model, data):
    """Give ``model`` a ``factor_bound`` where its likelihood is recognised (see the module and :func:`_attach`);
    otherwise, and on any failure of the reading itself, none (``model.factor_bound_reason`` says why): the model
    then runs as it did without."""
    try:
        return _attach(model, data)
    except Exception as e:  # noqa: BLE001 - a reading that fails gives no bound, never a failed conversion
        model.factor_bound_reason = f"the likelihood could not be read ({type(e).__name__}: {e})"
        return None


def _attach(model, data):
    """Give ``model`` (a :class:`~tallmh.frontends.numpyro_model.NumPyroModel`) a ``factor_bound`` where its
    likelihood is recognised (see the module); else set ``model.factor_bound_reason``."""
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree

    from ..linear_predictor import affine_in, attach_bound
    from .pymc_glm import family_loglik

    def refuse(why):
        model.factor_bound_reason = why
        return None

    if model.enumerated_sites or model.local_latent_sites:
        return refuse("discrete or continuous latents inside the data plate")
    n = model.n
    rows = np.unique(np.linspace(0, n - 1, min(n, 64)).astype(np.int64))
    few = {k: jnp.asarray(np.asarray(v)[rows]) for k, v in data.items()}
    flat0, unravel = ravel_pytree(model.init())
    try:
        tr, _ = model._run(unravel(flat0), few)
    except Exception as e:  # noqa: BLE001 - no bound, not an error
        return refuse(f"its trace failed ({type(e).__name__})")
    name, site = _site(model, tr)
    if name is None:
        return refuse(site)
    b = rows.size
    if tuple(site["fn"].batch_shape) != (b,) or np.shape(site["value"]) != (b,):
        return refuse("a likelihood site without one value per row")

    if type(site["fn"]).__name__ == "NegativeBinomial2":
        return _attach_nb2(model, name, unravel, flat0, data, few, refuse)
    family = "bernoulli_logit" if type(site["fn"]).__name__ == "BernoulliLogits" else "poisson_log"
    attr = "logits" if family == "bernoulli_logit" else "rate"

    def param(t, batch):
        tr, _ = model._run(unravel(t), batch)
        bb = int(np.shape(next(iter(batch.values())))[0])
        return jnp.broadcast_to(getattr(tr[name]["fn"], attr), (bb,))

    def eta_flat(t, batch):  # (Poisson: the log of a rate certified to be exp(affine), exact to rounding)
        return param(t, batch) if family == "bernoulli_logit" else jnp.log(param(t, batch))

    def y_of(batch):
        tr, _ = model._run(unravel(flat0), batch)
        return tr[name]["value"]

    ok, why = affine_in(param, flat0, {k: v[:2] for k, v in few.items()},
                        outer=None if family == "bernoulli_logit" else "exp")
    if not ok:
        return refuse(why)
    # (the responses need no check: the remainders of y eta - softplus(eta) and y eta - exp(eta) do not depend on y)
    rng = np.random.default_rng(1)
    for t in (flat0, flat0 + 0.3 * jnp.asarray(rng.standard_normal(flat0.shape), flat0.dtype)):
        ours = np.asarray(family_loglik(family, eta_flat(t, few), y_of(few).astype(t.dtype)), np.float64)
        theirs = np.asarray(model.log_lik(unravel(t), few), np.float64)
        if ours.shape != theirs.shape or not np.allclose(ours, theirs, rtol=1e-4, atol=1e-4):
            return refuse("its log-likelihood differs from the family's (the reading is not trusted)")
    return attach_bound(model, family, eta_flat, y_of, unravel, flat0, data, refuse)


def _attach_nb2(model, name, unravel, flat0, data, few, refuse):
    """The ``NegativeBinomial2(mean, concentration)`` case: NumPyro stores ``rate = concentration / mean``; the
    rate must be, in the program, ``c / exp(affine)`` and the concentration ``exp(affine)`` of one value that reads
    no data. Then ``eta = log(concentration) - log(rate)`` and ``tau = -log(concentration)`` (the NB2 dispersion
    is ``1 / concentration``), exact to rounding where neither overflows nor underflows."""
    import jax.numpy as jnp

    from ..linear_predictor import affine_in, reads_data
    from ..nb2_predictor import attach_nb2

    def fn_of(t, batch):
        tr, _ = model._run(unravel(t), batch)
        return tr[name]["fn"]

    def rate(t, batch):
        return fn_of(t, batch).rate

    def conc(t, batch):
        return fn_of(t, batch).concentration

    two = {k: v[:2] for k, v in few.items()}
    if np.size(conc(flat0, two)) != 1:
        return refuse("a concentration that differs between rows (one dispersion for all rows is needed)")
    ok, why = affine_in(rate, flat0, two, outer=(("div", 1), "exp"))
    if not ok:
        return refuse(f"its mean is not exp(linear predictor) ({why})")
    ok, why = affine_in(conc, flat0, two, outer="exp")
    if not ok:
        return refuse(f"its concentration is not exp(affine) of the parameters ({why})")
    if reads_data(conc, flat0, two):
        return refuse("a concentration that depends on the data (one dispersion for all rows is needed)")

    def pair(t, batch):
        f = fn_of(t, batch)
        bb = int(np.shape(next(iter(batch.values())))[0])
        log_c = jnp.log(jnp.reshape(f.concentration, ()))
        return jnp.broadcast_to(log_c - jnp.log(f.rate), (bb,)), -log_c

    def y_of(batch):
        tr, _ = model._run(unravel(flat0), batch)
        return tr[name]["value"]

    return attach_nb2(model, pair, y_of, unravel, flat0, data, few, refuse)
