"""A remainder bound for PyMC (and Bambi) models whose likelihood is a Bernoulli-logit or Poisson-log GLM.

:func:`attach_bound` reads the converted model's graph (see :mod:`tallmh.linear_predictor` for why each step is
needed for the exact subsampled test to stay exact):

1. exactly one observed variable, one value per row (a 1-d observed array);
2. its distribution is PyMC's ``Bernoulli`` with ``p = sigmoid(eta)`` (``logit_p=eta``, ``p=pm.math.invlogit(eta)``,
   or Bambi's logit link, which replaces a ``p`` that rounds to exactly 0 or 1 by 2.2e-16 or 1 - 2.2e-16), or
   ``Poisson`` with ``mu = exp(eta)`` (Bambi's and PyMC's log link);
3. ``eta``, as a function of the flat unconstrained parameters and the data, is affine
   (:func:`tallmh.linear_predictor.affine_in`): a predictor with group-level terms (``offset * sigma``), a
   transformed parameter (``exp(log sigma)``) or any other non-linearity is refused;
4. the responses fit the family (0/1; whole non-negative counts), and, as a cross-check of the reading, the
   model's own per-row log-likelihood equals the family's at two parameter values on up to 64 rows.

When all hold the model gets ``factor_bound()`` (the built-in logistic or Poisson bound on the design rows that
``eta`` defines); otherwise it has none and ``reason`` says why. The exact test then targets the GLM's exact
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


def _linear_predictor(graph):
    """``(family, eta graph)`` of an observed variable's graph, or ``(None, why)``."""
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
    return None, f"a {op or 'computed'} likelihood (bounds exist for Bernoulli-logit and Poisson-log GLMs)"


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
