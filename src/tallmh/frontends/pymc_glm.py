"""A remainder bound for PyMC (and Bambi) models whose likelihood is a Bernoulli-logit, Poisson-log or NB2-log GLM.

:func:`attach_bound` reads the converted model's graph (see :mod:`tallmh.linear_predictor` for why each step is
needed for the exact subsampled test to stay exact):

1. exactly one observed variable, one value per row (a 1-d observed array);
2. its distribution is PyMC's ``Bernoulli`` with ``p = sigmoid(eta)`` (``logit_p=eta``, ``p=pm.math.invlogit(eta)``,
   or Bambi's logit link, which replaces a ``p`` that rounds to exactly 0 or 1 by 2.2e-16 or 1 - 2.2e-16),
   ``Poisson`` with ``mu = exp(eta)`` (Bambi's and PyMC's log link), or ``NegativeBinomial(mu=exp(eta), alpha)``
   with ``alpha`` one parameter sampled on its log scale (``exp`` of its value; the NB2 dispersion is ``1/alpha``),
   which PyMC stores as ``n = alpha``, ``p = n / (mu + n)`` (:mod:`tallmh.nb2_predictor`);
3. ``eta``, as a function of the flat unconstrained parameters and the data, is affine
   (:func:`tallmh.linear_predictor.affine_in`): a predictor with group-level terms (``offset * sigma``), a
   transformed parameter (``exp(log sigma)``) or any other non-linearity is refused;
4. the responses fit the family (0/1; whole non-negative counts), and, as a cross-check of the reading, the
   model's own per-row log-likelihood equals the family's at two parameter values on up to 64 rows.

When all hold the model gets ``factor_bound()`` (the built-in logistic, Poisson or NB2 bound on the design rows
that ``eta`` (and NB2's ``log alpha``, affine and reading no data) defines); otherwise it has none and ``reason`` says why. The exact test then targets the GLM's exact
likelihood: with Bambi's rounding guard that differs from the converted program only at rows whose ``p`` rounds
to 0 or 1 in the working precision.
"""

from __future__ import annotations

import numpy as np

__all__ = ["attach_bound"]

_CLIP = 1e-6  # Bambi's replacements of a rounded p lie within this of 0 or 1


def _unwrap(v):
    """Skip view and copy operations."""
    while v.owner is not None and type(v.owner.op).__name__ in ("ViewOp", "DeepCopyOp", "OutputGuard"):
        v = v.owner.inputs[0]
    return v


def _const(v):
    from pytensor.graph.basic import Constant

    v = _unwrap(v)
    while v.owner is not None and type(v.owner.op).__name__ in ("DimShuffle", "ExpandDims"):
        v = v.owner.inputs[0]
    if isinstance(v, Constant):
        arr = np.asarray(v.data)
        return float(arr) if arr.size == 1 else None
    return None


def _scalar_name(v):
    v = _unwrap(v)
    op = getattr(v.owner, "op", None)
    return type(getattr(op, "scalar_op", None)).__name__ if op is not None else None


def _strip_clip(v):
    """``switch(eq(p, c), r, p)`` with ``c`` in {0, 1} and ``r`` within 1e-6 of ``c`` (Bambi's guard) -> ``p``."""
    v = _unwrap(v)
    while _scalar_name(v) == "Switch":
        cond, r, p = v.owner.inputs
        if _scalar_name(cond) != "EQ":
            return v
        a, b = cond.owner.inputs
        c, rv = _const(b), _const(r)
        if c not in (0.0, 1.0) or rv is None or abs(rv - c) > _CLIP or _unwrap(a) is not _unwrap(p):
            return v
        v = _unwrap(p)
    return v


def _strip_dims(v):
    v = _unwrap(v)
    while v.owner is not None and type(v.owner.op).__name__ in ("DimShuffle", "ExpandDims"):
        v = _unwrap(v.owner.inputs[0])
    return v


def _nb2_parts(n, p):
    """``(eta, u)`` of PyMC's ``NegativeBinomial(mu=exp(eta), alpha=exp(u))``, whose inputs are ``n = alpha`` and
    ``p = n / (mu + n)`` (``pm.NegativeBinomial.get_n_p``), or ``(None, why)``."""
    n0 = _strip_dims(n)
    p = _unwrap(p)
    if _scalar_name(p) != "TrueDiv" or _strip_dims(p.owner.inputs[0]) is not n0:
        return None, "a negative binomial likelihood not given by its mean (mu) and alpha"
    den = _unwrap(p.owner.inputs[1])
    if _scalar_name(den) != "Add" or len(den.owner.inputs) != 2:
        return None, "a negative binomial likelihood not given by its mean (mu) and alpha"
    a, b = den.owner.inputs
    mu = a if _strip_dims(b) is n0 else b if _strip_dims(a) is n0 else None
    mu = None if mu is None else _unwrap(mu)
    if mu is None or _scalar_name(mu) != "Exp":
        return None, "a negative binomial likelihood whose mean is not exp(linear predictor) (log link)"
    if _scalar_name(n0) != "Exp" or n0.type.ndim != 0:
        return None, "a negative binomial likelihood whose alpha is not one positive parameter (exp of its value)"
    return mu.owner.inputs[0], n0.owner.inputs[0]


def _linear_predictor(graph):
    """``(family, eta graph)`` of an observed variable's graph (NB2: ``(eta, log alpha)`` graphs), or
    ``(None, why)``."""
    op = type(graph.owner.op).__name__ if graph.owner is not None else ""
    if op == "BernoulliRV":
        p = _strip_clip(graph.owner.inputs[-1])
        if _scalar_name(p) != "Sigmoid":
            return None, "a Bernoulli likelihood whose p is not sigmoid(linear predictor) (logit link)"
        return "bernoulli_logit", _unwrap(p).owner.inputs[0]
    if op == "PoissonRV":
        mu = _unwrap(graph.owner.inputs[-1])
        if _scalar_name(mu) != "Exp":
            return None, "a Poisson likelihood whose mean is not exp(linear predictor) (log link)"
        return "poisson_log", mu.owner.inputs[0]
    if op == "NegBinomialRV":
        parts = _nb2_parts(*graph.owner.inputs[-2:])
        return ("nb2_log", parts) if parts[0] is not None else parts
    return None, (f"a {op or 'computed'} likelihood (bounds exist for Bernoulli-logit, Poisson-log and NB2-log "
                  "GLMs)")


def family_loglik(family, eta, y):
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import gammaln

    if family == "bernoulli_logit":
        return y * eta - jax.nn.softplus(eta)
    return y * eta - jnp.exp(eta) - gammaln(y + 1.0)


def _response_fits(family, y) -> bool:
    y = np.asarray(y)
    if y.ndim != 1 or not np.all(np.isfinite(y)):
        return False
    if family == "bernoulli_logit":
        return bool(np.all((y == 0) | (y == 1)))
    return bool(np.all((y >= 0) & (y == np.round(y))))


def _cross_check(model, family, eta_flat, unravel, flat0, data, y_key) -> bool:
    """The model's per-row log-likelihood against the family's on up to 64 rows, at the start and near it."""
    import jax.numpy as jnp

    n = model.n
    rows = np.unique(np.linspace(0, n - 1, min(n, 64)).astype(np.int64))
    batch = {k: jnp.asarray(np.asarray(v)[rows]) for k, v in data.items()}
    rng = np.random.default_rng(1)
    for t in (flat0, flat0 + 0.3 * jnp.asarray(rng.standard_normal(flat0.shape), flat0.dtype)):
        ours = np.asarray(family_loglik(family, eta_flat(t, batch), batch[y_key].astype(t.dtype)), np.float64)
        theirs = np.asarray(model.log_lik(unravel(t), batch), np.float64)
        if ours.shape != theirs.shape or not np.allclose(ours, theirs, rtol=1e-4, atol=1e-4):
            return False
    return True


def attach_bound(model, observed, obs_graphs, repl, value_vars, placeholders, data, compile_fn):
    """Give ``model`` a ``factor_bound`` where its likelihood is recognised (see the module and :func:`_attach`);
    otherwise, and on any failure of the reading itself, none (``model.factor_bound_reason`` says why): the model
    then runs as it did without."""
    try:
        return _attach(model, observed, obs_graphs, repl, value_vars, placeholders, data, compile_fn)
    except Exception as e:  # noqa: BLE001 - a reading that fails gives no bound, never a failed conversion
        model.factor_bound_reason = f"the likelihood could not be read ({type(e).__name__}: {e})"
        return None


def _attach(model, observed, obs_graphs, repl, value_vars, placeholders, data, compile_fn):
    """Give ``model`` (a fresh :class:`~tallmh.frontends.pymc_model.PyMCModel`) a ``factor_bound`` when its
    likelihood is a GLM the built-in bounds cover (see the module); set ``model.factor_bound_reason`` to why
    not otherwise. ``placeholders`` are the batch inputs in ``model.data_names`` order; ``compile_fn(inputs,
    outputs)`` turns a PyTensor graph into a JAX function (the front end's)."""
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree
    from pytensor.graph.replace import clone_replace

    from ..linear_predictor import affine_in, attach_bound

    def refuse(why):
        model.factor_bound_reason = why
        return None

    if len(observed) != 1:
        return refuse("more than one observed variable")
    graph = obs_graphs[0]
    if graph.type.ndim != 1:
        return refuse("an observed variable of more than one value per row")
    family, eta = _linear_predictor(graph)
    if family is None:
        return refuse(eta)
    y_key = model.data_names[0]  # (the observed values come first among the data)
    if not _response_fits(family, data[y_key]):
        return refuse("responses that do not fit the family")
    if family == "nb2_log":
        return _attach_nb2(model, eta, repl, value_vars, placeholders, data, compile_fn, y_key, refuse)
    try:
        eta_b = clone_replace([eta], replace=repl, rebuild_strict=False)[0]
        fn = compile_fn(value_vars + list(placeholders), [eta_b])
    except Exception as e:  # noqa: BLE001 - no bound, not an error: the model runs as before
        return refuse(f"its linear predictor cannot be compiled ({type(e).__name__})")
    flat0, unravel = ravel_pytree(model.init())
    names, dnames = list(model.value_names), list(model.data_names)

    def eta_flat(t, batch):
        th = unravel(t)
        return jnp.reshape(fn(*[th[k] for k in names], *[batch[k] for k in dnames])[0], (-1,))

    two = {k: jnp.asarray(np.asarray(v)[:2]) for k, v in data.items()}
    ok, why = affine_in(eta_flat, flat0, two)
    if not ok:
        return refuse(why)
    try:
        if not _cross_check(model, family, eta_flat, unravel, flat0, data, y_key):
            return refuse("its log-likelihood differs from the family's (the reading is not trusted)")
    except Exception as e:  # noqa: BLE001
        return refuse(f"the cross-check failed ({type(e).__name__})")
    return attach_bound(model, family, eta_flat, y_key, unravel, flat0, data, refuse)


def _attach_nb2(model, parts, repl, value_vars, placeholders, data, compile_fn, y_key, refuse):
    """The NB2 case of :func:`_attach`: ``parts = (eta, u)`` with ``mu = exp(eta)``, ``alpha_pymc = r = exp(u)``
    (so the NB2 dispersion is ``e^tau``, ``tau = -u``); both affine, ``u`` reading no data
    (:mod:`tallmh.nb2_predictor`)."""
    import jax.numpy as jnp
    from jax.flatten_util import ravel_pytree
    from pytensor.graph.replace import clone_replace

    from ..linear_predictor import affine_in, reads_data
    from ..nb2_predictor import attach_nb2

    try:
        eta_b, u_b = clone_replace(list(parts), replace=repl, rebuild_strict=False)
        fn = compile_fn(value_vars + list(placeholders), [eta_b, u_b])
    except Exception as e:  # noqa: BLE001 - no bound, not an error: the model runs as before
        return refuse(f"its linear predictor cannot be compiled ({type(e).__name__})")
    flat0, unravel = ravel_pytree(model.init())
    names, dnames = list(model.value_names), list(model.data_names)

    def both(t, batch):
        th = unravel(t)
        return fn(*[th[k] for k in names], *[batch[k] for k in dnames])

    def pair(t, batch):
        eta, u = both(t, batch)
        return jnp.reshape(eta, (-1,)), -jnp.reshape(u, ())

    two = {k: jnp.asarray(np.asarray(v)[:2]) for k, v in data.items()}
    for k, what in ((0, "linear predictor"), (1, "log alpha")):
        ok, why = affine_in(lambda t, b: both(t, b)[k], flat0, two)
        if not ok:
            return refuse(why if k == 0 else f"its {what} is not affine in the parameters")
    if reads_data(lambda t, b: both(t, b)[1], flat0, two):
        return refuse("an alpha that depends on the data (one dispersion for all rows is needed)")
    n = model.n
    rows = np.unique(np.linspace(0, n - 1, min(n, 64)).astype(np.int64))
    few = {k: jnp.asarray(np.asarray(v)[rows]) for k, v in data.items()}
    return attach_nb2(model, pair, y_key, unravel, flat0, data, few, refuse)
