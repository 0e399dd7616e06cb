"""Remainder bounds for models whose rows are a known GLM of a linear predictor, found in the model's own code.

A front-end model (PyMC, Bambi, NumPyro) gives its per-row log-likelihood only as a program. Where that program
is ``ell_i(theta) = f(y_i, eta_i(theta))`` with ``f`` the Bernoulli-logit or Poisson-log log-likelihood and
``eta_i`` *affine* in the flat parameter vector, ``eta_i(theta) = a_i + x_i . theta``, the built-in bounds of the
exact subsampled test apply with the design row ``x_i`` (Cornish et al., ICML 2019, eq. 8 and Sec. 3.2; see
:mod:`tallmh.factor_bounds`): :class:`~tallmh.models.logistic.LogisticCubicBound` and
:class:`~tallmh.factor_bounds.PoissonTrustBound`.

Two facts are needed, and both are established without trusting numbers:

- the family and link: read from the model's graph by the front end (e.g. PyMC's ``Bernoulli`` whose ``p`` is
  ``sigmoid(eta)``; :mod:`tallmh.frontends.pymc_glm`);
- affinity of ``eta`` in ``theta``: :func:`affine_in` traces ``eta`` to a JAX program (a jaxpr) and follows every
  value that depends on ``theta`` through it. Such a value may only be added to, subtracted from, negated,
  multiplied or divided by values that do not depend on ``theta``, contracted with them (``dot_general``),
  reshaped, broadcast, sliced, gathered at indices that do not depend on ``theta``, concatenated, selected by a
  predicate that does not depend on ``theta``, summed, or converted between float types. Any other operation on
  it (``exp``, a product of two such values, a transform of a constrained parameter, a loop) makes the answer
  "not affine", and the model gets no bound: its default stays the approximate test. The analysis never
  says "affine" for a program that is not (it may refuse one that is).

The design rows are then the Jacobian of ``eta`` (exact for an affine map) and ``a_i = eta_i(0)``, computed for
the rows a bound reads (the set-up pass: every row once; a step: the rows its thinning keeps).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .model import count_conversion

__all__ = ["affine_in", "LinearPredictorBound", "FAMILIES"]

FAMILIES = ("bernoulli_logit", "poisson_log")

_CONST, _AFFINE = 0, 1

# operations that map affine values to affine values whatever their other (theta-free) operands are
_STRUCTURAL = {"reshape", "broadcast_in_dim", "squeeze", "expand_dims", "transpose", "slice", "rev", "copy",
               "copy_p", "reduce_sum", "concatenate", "neg", "add", "sub", "add_any", "cumsum", "real",
               "reduce_precision", "pad", "optimization_barrier", "split"}


def _float(aval) -> bool:
    return jnp.issubdtype(getattr(aval, "dtype", np.int32), jnp.floating)


def _eqn_state(eqn, ins, dep_ops) -> Optional[int]:
    """The state of the outputs of one equation given its inputs' states (None: not affine)."""
    name = eqn.primitive.name
    if not any(ins):
        return _CONST
    sub = eqn.params.get("jaxpr", None) or eqn.params.get("call_jaxpr", None)
    if sub is not None and name in ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "remat",
                                    "checkpoint", "custom_vjp_call", "custom_vjp_call_jaxpr"):
        inner = getattr(sub, "jaxpr", sub)
        outs = _states(inner, list(ins), dep_ops)
        if outs is None or len(outs) != len(eqn.outvars):
            return None
        return max(outs) if outs else _CONST  # (one state for all outputs: conservative)
    if name in _STRUCTURAL:
        if name in ("pad",) and ins[1:] and any(ins[1:]):  # the padding value must not depend on theta
            return None
        if not all(_float(v.aval) for v in eqn.outvars):
            return None
        return _AFFINE
    if name == "convert_element_type":
        return _AFFINE if _float(eqn.outvars[0].aval) and _float(eqn.invars[0].aval) else None
    if name in ("mul", "dot_general"):
        return _AFFINE if sum(ins) == 1 else None
    if name == "div":
        return _AFFINE if ins[0] and not ins[1] else None
    if name in ("gather", "dynamic_slice"):
        return _AFFINE if ins[0] and not any(ins[1:]) else None
    if name == "select_n":
        return _AFFINE if not ins[0] else None
    dep_ops.add(name)
    return None


def _states(jaxpr, in_states, dep_ops):
    """States of ``jaxpr``'s outputs, or None when some output is not affine in the marked inputs."""
    env = {}
    for v, s in zip(jaxpr.invars, in_states):
        env[v] = s
    for v in jaxpr.constvars:
        env[v] = _CONST

    def read(v):
        return env.get(v, _CONST) if not hasattr(v, "val") else _CONST  # (a literal is a constant)

    live = {v for v in jaxpr.outvars if not hasattr(v, "val")}
    needed = []
    for eqn in reversed(jaxpr.eqns):  # only what the outputs depend on (the rest of a traced program is ignored)
        if any(v in live for v in eqn.outvars):
            needed.append(eqn)
            live.update(v for v in eqn.invars if not hasattr(v, "val"))
    for eqn in reversed(needed):
        ins = [read(v) for v in eqn.invars]
        s = _eqn_state(eqn, ins, dep_ops)
        if s is None:
            return None
        for v in eqn.outvars:
            env[v] = s
    return [read(v) for v in jaxpr.outvars]


_SHAPE_ONLY = ("reshape", "broadcast_in_dim", "squeeze", "expand_dims", "copy", "copy_p")


def _outer_path(jp, outer):
    """The values ``jp``'s one output is computed from along ``outer`` (a name or a sequence of steps: a unary
    operation's name, or ``(name, k)`` for the ``k``-th operand of a binary one), shape-only operations skipped
    before each step (they commute with the step and keep a value affine); ``None`` where the program differs."""
    steps = (outer,) if isinstance(outer, str) else tuple(outer)
    if len(jp.outvars) != 1:
        return None
    target = jp.outvars[0]
    k = len(jp.eqns)
    for step in steps:
        name, arg = (step, 0) if isinstance(step, str) else step
        while True:
            found = [j for j in range(k) if any(v is target for v in jp.eqns[j].outvars)]
            if not found:
                return None
            k = found[0]
            eqn = jp.eqns[k]
            if eqn.primitive.name in _SHAPE_ONLY and eqn.primitive.name != name:
                target = eqn.invars[0]
                continue
            break
        if eqn.primitive.name != name or arg >= len(eqn.invars) or hasattr(eqn.invars[arg], "val"):
            return None
        target = eqn.invars[arg]
    return SimpleNamespace(invars=jp.invars, constvars=jp.constvars, eqns=jp.eqns[:k], outvars=[target])


def _form(outer) -> str:
    """``(("div", 1), "exp")`` -> ``"div(_, exp(linear predictor))"``."""
    text = "linear predictor"
    for step in reversed((outer,) if isinstance(outer, str) else tuple(outer)):
        name, arg = (step, 0) if isinstance(step, str) else step
        text = f"{name}({', '.join(['_'] * arg + [text])})"
    return text


def affine_in(fn: Callable, theta, *rest, outer=None):
    """``(True, "")`` when ``fn(theta, *rest)`` is, as a program, affine in the flat vector ``theta`` (see the
    module); else ``(False, why)``. Only the program's structure is read (``jax.make_jaxpr`` at these shapes).
    ``outer="exp"``: the program's one output must be ``exp`` of a value affine in ``theta`` (a Poisson rate);
    a sequence of steps (:func:`_outer_path`), e.g. ``(("div", 1), "exp")``: ``c / exp(affine)``."""
    try:
        closed = jax.make_jaxpr(fn)(theta, *rest)
    except Exception as e:  # noqa: BLE001 - a program that cannot be traced is not certified
        return False, f"the linear predictor cannot be traced ({type(e).__name__})"
    n_theta = len(jax.tree_util.tree_leaves(theta))
    jp = closed.jaxpr
    if outer is not None:
        jp = _outer_path(jp, outer)
        if jp is None:
            return False, f"the parameter is not {_form(outer)} in the program"
    marks = [_AFFINE] * n_theta + [_CONST] * (len(jp.invars) - n_theta)
    dep_ops: set = set()
    out = _states(jp, marks, dep_ops)
    if out is None:
        ops = ", ".join(sorted(dep_ops)) or "an operation on the parameters"
        return False, f"the linear predictor is not affine in the parameters (it applies {ops} to them)"
    return True, ""


def reads_data(fn: Callable, theta, *rest) -> bool:
    """Whether ``fn(theta, *rest)``'s outputs depend, as a program, on any of ``rest`` (conservatively: an
    operation with such an input makes all its outputs depend on it)."""
    jp = jax.make_jaxpr(fn)(theta, *rest).jaxpr
    n_theta = len(jax.tree_util.tree_leaves(theta))
    dep = set(jp.invars[n_theta:])
    for eqn in jp.eqns:
        if any(not hasattr(v, "val") and v in dep for v in eqn.invars):
            dep.update(eqn.outvars)
    return any(not hasattr(v, "val") and v in dep for v in jp.outvars)


class LinearPredictorBound:
    """A built-in GLM bound (logistic or Poisson) whose design rows come from an affine linear predictor.

    ``eta(theta_flat, batch) -> (b,)`` is affine in ``theta_flat`` (checked by :func:`affine_in` before this is
    made); ``y_key`` names the response in the batch (or is a function of the batch giving it). The batch is turned into ``{"X": Jacobian of eta (b, d),
    "y": response, "_a": eta(0)}`` and handed to the built-in bound; weights computed in the working precision
    are inflated by 1e-3 for their rounding (as :func:`tallmh.factor_bounds.prepare` does on the device).
    """

    any_whitening = True  # valid for weights and z whitened by any invertible A (tallmh.fused_table)

    def __init__(self, family: str, eta: Callable, y_key: str, dim: int, radius: float = 6.0):
        from .factor_bounds import PoissonTrustBound
        from .models.logistic import LogisticLocalBound

        if family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}; got {family!r}")
        self.family, self.eta, self.y_key, self.dim = family, eta, y_key, int(dim)
        self.base = LogisticLocalBound(offset="_a") if family == "bernoulli_logit" else \
            PoissonTrustBound(radius, offset="_a")
        self._design_host = jax.jit(lambda batch: self.design(batch))  # (the set-up pass: compiled once per shape)

    def design(self, batch, dtype=None):
        """``{"X", "y", "_a"}`` of a batch (the Jacobian by forward differentiation: ``d`` passes of ``eta``)."""
        leaves = jax.tree_util.tree_leaves(batch)
        dt = dtype or (jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)
        zero = jnp.zeros(self.dim, dt)
        b = leaves[0].shape[0]

        def eta_b(t):
            return jnp.broadcast_to(jnp.asarray(self.eta(t, batch), dt), (b,))

        a = eta_b(zero)
        X = jax.jacfwd(eta_b)(zero)
        y = self.y_key(batch) if callable(self.y_key) else batch[self.y_key]
        return {"X": X, "y": jnp.reshape(jnp.asarray(y), (b,)).astype(dt), "_a": a}

    def weights(self, center, rinv, batch):
        return self.base.weights(center, rinv, self.design(batch, center.dtype)) * (1 + 1e-3)

    def weights_host(self, center, rinv, batch):
        d = self._design_host(jax.tree_util.tree_map(jnp.asarray, batch))
        host = {k: np.asarray(v, np.float64) for k, v in d.items()}
        return self.base.weights_host(center, rinv, host) * (1 + 1e-3)

    def phi(self, z, zp):
        return self.base.phi(z, zp)

    def region(self, z, zp):
        return self.base.region(z, zp)

    def remainder(self, theta, theta_p, center, batch):
        d = self.design(batch, theta.dtype)
        if self.family == "poisson_log":
            return self.base.remainder(theta, theta_p, center, d)
        from .models.logistic import logistic_remainder_diff

        md = d["X"] @ jnp.stack([center, theta - center, theta_p - center], axis=-1)
        s = jnp.where(d["y"] > 0.5, 1.0, -1.0).astype(md.dtype)
        return logistic_remainder_diff(s * (md[..., 0] + d["_a"]), s * md[..., 1], s * md[..., 2])


UNREAD = ("{k} parameter coordinate(s) that the likelihood does not read enter the prior of those it reads (group "
          "scales or other hyperparameters: a hierarchical model, whose Laplace approximation over all parameters "
          "the exact test's table needs is often poor; program='auto' blocks such models)")


def hyper_coordinates(eta_flat: Callable, log_prior_flat: Callable, theta, data) -> int:
    """How many coordinates the linear predictor does not read (:func:`unread_coordinates`) yet the prior couples
    to coordinates it reads (a nonzero cross term of the log prior's Hessian at ``theta`` moved at random: at a
    start with every effect 0 a scale's cross terms vanish): a hierarchical model's scales. An unread coefficient
    with its own independent prior (a column of zeros) is not counted."""
    unread = unread_coordinates(eta_flat, theta, data)
    if not unread.size:
        return 0
    t = jnp.asarray(theta)
    moved = t + 0.3 * jnp.asarray(np.random.default_rng(2).standard_normal(t.shape), t.dtype)
    # (compiled as one program: run op by op, each of the Hessian's primitives was compiled on its own, most of a
    # NumPyro model's conversion; the prior is traced either way, so a prior that branches on values fails both ways)
    h = np.abs(np.asarray(jax.jit(jax.hessian(log_prior_flat))(moved), np.float64))
    read = np.setdiff1d(np.arange(h.shape[0]), unread)
    return int(np.sum(np.any(h[np.ix_(unread, read)] != 0, axis=1)))


def unread_coordinates(eta_flat: Callable, theta, data, block: int = 1 << 16) -> np.ndarray:
    """The coordinates of the flat parameter no row's linear predictor depends on: where the gradient of
    ``sum_i w_i eta_i(theta)`` with random positive weights, over every row in blocks (one pass), is exactly 0,
    which for an affine predictor means every row's design entry is 0."""
    n = int(np.shape(next(iter(data.values())))[0])
    rng = np.random.default_rng(0)
    grad = jax.jit(jax.grad(lambda t, b, w: jnp.sum(w * eta_flat(t, b))))
    total = np.zeros(np.shape(theta), np.float64)
    for a in range(0, n, block):
        b = {k: jnp.asarray(np.asarray(v)[a:a + block]) for k, v in data.items()}
        w = jnp.asarray(rng.uniform(0.5, 1.5, min(n, a + block) - a), jnp.asarray(theta).dtype)
        total += np.abs(np.asarray(grad(theta, b, w), np.float64))
    return np.flatnonzero(total == 0)


def attach_bound(model, family: str, eta_flat: Callable, y, unravel, flat0, data, refuse, make_bound=None):
    """Give a front end's ``model`` its ``factor_bound`` (a :class:`LinearPredictorBound` on ``eta_flat``'s design
    rows, or ``make_bound()``), unless a hyperparameter (:func:`hyper_coordinates`: of those ``eta_flat`` reads)
    makes it a hierarchical model: then ``refuse(why)``. ``y``: the response's data key or a function of a batch."""
    try:
        k = hyper_coordinates(eta_flat, lambda t: jnp.asarray(model.log_prior(unravel(t)), t.dtype), flat0, data)
    except Exception as e:  # noqa: BLE001 - no bound, not an error: the model runs as before
        return refuse(f"the design's columns could not be read ({type(e).__name__})")
    count_conversion(model, int(np.shape(next(iter(data.values())))[0]))  # (unread_coordinates' pass over all rows)
    if k:
        return refuse(UNREAD.format(k=k))
    dim = int(np.shape(flat0)[0])

    def factor_bound():
        """The built-in logistic or Poisson bound on the design rows of the affine linear predictor
        (:class:`tallmh.linear_predictor.LinearPredictorBound`)."""
        return LinearPredictorBound(family, eta_flat, y, dim)

    if make_bound is not None:
        def factor_bound():  # noqa: F811 - the family's own
            return make_bound()

        factor_bound.__doc__ = make_bound.__doc__
    model.factor_bound = factor_bound
    model.factor_bound_reason = None
    model.glm_family = family
    return factor_bound
