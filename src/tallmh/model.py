"""The model interface: a log prior and a per-item log-likelihood.

A model is ``Model(log_prior=f, log_lik=g)`` where ``f(theta) -> scalar`` and ``g(theta, batch) -> (b,)``
gives one log-likelihood per item of ``batch`` (a slice of the data pytree with leading length b).
That is all a user model needs. Optional extras are used when present:

``init(data) -> theta``
    a default starting point (used when :func:`tallmh.sample` gets no ``init``);
``setup(data) -> stats``
    statistics computed once before sampling with one full pass over the data (counted and reported as
    set-up items), for example ``max_i ||x_i||`` for the logistic-regression bound;
``log_lik_ratio(theta, theta_prop, batch) -> (b,)``
    the per-item ratios ``log p(x_i|theta') - log p(x_i|theta)`` computed without cancellation (an
    algebraic difference rather than a difference of two rounded log-likelihoods). When present, every
    test reads it instead of two ``log_lik`` calls, and the exact test sums it instead of tracking the
    full log-likelihood, so that float32 rounding of each item's ``log p`` (about ``eps |log p_i|``) no
    longer enters Delta;
``lik_ratio_bound(theta, theta_prop, stats) -> scalar``
    an upper bound on ``C = max_i |log p(x_i|theta') - log p(x_i|theta)|`` (Bardenet et al. 2014, eq. 8),
    used by the confidence test instead of a full pass.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from .errors import ModelError

__all__ = ["Model", "check_model", "count_conversion"]


class Model:
    """A Bayesian model for tall data: ``log_prior(theta)`` plus per-item ``log_lik(theta, batch)``.

    Built-in models (``tallmh.models``) subclass this and define the methods; user models pass callables.
    """

    name = "model"

    def __init__(
        self,
        log_prior: Optional[Callable] = None,
        log_lik: Optional[Callable] = None,
        *,
        init: Optional[Callable] = None,
        setup: Optional[Callable] = None,
        lik_ratio_bound: Optional[Callable] = None,
        name: Optional[str] = None,
    ):
        if log_prior is not None:
            self.log_prior = log_prior
        if log_lik is not None:
            self.log_lik = log_lik
        if init is not None:
            self.init = init
        if setup is not None:
            self.setup = setup
        if lik_ratio_bound is not None:
            self.lik_ratio_bound = lik_ratio_bound
        if name is not None:
            self.name = name
        if not callable(getattr(self, "log_prior", None)) or not callable(getattr(self, "log_lik", None)):
            raise ModelError("a Model needs callables log_prior(theta) and log_lik(theta, batch)")

    # Optional extras default to "absent".
    init: Any = None
    setup: Any = None
    lik_ratio_bound: Any = None

    @property
    def has_bound(self) -> bool:
        return callable(self.lik_ratio_bound)

    def __repr__(self):
        return f"{type(self).__name__}({self.name!r})"


def check_model(model: Model, data, theta, n: int):
    """Evaluate the model at ``theta`` on a few items and raise :class:`ModelError` on misbehaviour.

    Checks: the log prior is a finite scalar; ``log_lik`` on a batch of b items returns shape ``(b,)`` of
    finite values. Touches at most 16 items (not counted: it happens once, before sampling).
    """
    b = min(n, 16)
    if _passes_host(model, theta, data, b):
        return  # (the model's NumPy closed forms: no program to compile or load)
    batch = jax.tree_util.tree_map(lambda a: a[:b], data)
    if _passes_compiled(model, theta, batch, b):
        return  # (one compiled program instead of a dozen eager ones; any doubt: the eager checks below)
    try:
        lp = jnp.asarray(model.log_prior(theta))
    except Exception as e:  # noqa: BLE001 - re-raised with context
        raise ModelError(f"log_prior failed at the initial point: {type(e).__name__}: {e}") from e
    if lp.shape != ():
        raise ModelError(f"log_prior must return a scalar; it returned shape {lp.shape}")
    if not np.isfinite(float(lp)):
        raise ModelError(f"the log prior at the initial point is not finite ({float(lp)})")
    try:
        ll = jnp.asarray(model.log_lik(theta, batch))
    except Exception as e:  # noqa: BLE001
        raise ModelError(f"log_lik failed at the initial point: {type(e).__name__}: {e}") from e
    if ll.shape != (b,):
        raise ModelError(
            f"log_lik(theta, batch) must return one value per item, shape ({b},) for a batch of {b}; "
            f"it returned shape {ll.shape}"
        )
    if not np.all(np.isfinite(np.asarray(ll))):
        raise ModelError("log_lik returns non-finite values at the initial point")


def count_conversion(model, rows: int) -> None:
    """Add ``rows`` to the rows a front end read while it converted ``model`` (its checks, pilot fits and the
    reading of a GLM's design): ``tm.sample`` counts them once in its set-up's items and says so in the notes."""
    model.conversion_items = int(getattr(model, "conversion_items", 0) or 0) + int(rows)


def own_method(model, name: str, partner: str = "log_lik"):
    """``model.name`` where it is defined by the class that defines ``partner`` or by a subclass of it
    (:func:`owns_closed_form`), or given to the instance itself; else None: a per-item ratio or a bound
    written for one likelihood is not used with a subclass's own ``log_lik`` (it would silently describe the
    parent's model). A view of a model (a class with a
    ``viewed_model()`` method, such as the row-sharded :class:`tallmh.distributed.RowView`) answers for the
    model it views."""
    fn = getattr(model, name, None)
    if not callable(fn):
        return None
    target = model.viewed_model() if callable(getattr(type(model), "viewed_model", None)) else model
    own = getattr(target, "__dict__", {})
    if name in own:  # given to this model itself (``Model(log_lik=..., lik_ratio_bound=...)``)
        return fn
    if partner in own:  # the instance's own likelihood, the class's closed form
        return None
    return fn if owns_closed_form(target, name, partner) else None


def owns_closed_form(model, name, partner) -> bool:
    """Whether ``model.name`` is defined by the class that defines ``partner`` or by a subclass of it: a
    subclass with its own likelihood or prior does not inherit another's closed forms, while one that keeps
    the likelihood and gives its own closed form (a bound, say) has it used. Classes only: see
    :func:`own_method`."""
    mro = type(model).__mro__
    owner = next((c for c in mro if name in vars(c)), None)
    partner_owner = next((c for c in mro if partner in vars(c)), None)
    return owner is not None and partner_owner is not None and issubclass(owner, partner_owner)


def _passes_host(model, theta, data, b) -> bool:
    """Whether the checks of :func:`check_model` pass by the model's NumPy closed forms (``log_lik_host``,
    ``log_prior_vgh_host``: the built-in logistic regression) at a flat ``theta``, on the first ``b`` rows
    of data in memory. False where it has none, or on any failure: the compiled and eager checks then run."""
    if not (owns_closed_form(model, "log_lik_host", "log_lik")
            and owns_closed_form(model, "log_prior_vgh_host", "log_prior")):
        return False
    try:
        th = np.asarray(theta, np.float64)
        leaves = jax.tree_util.tree_leaves(data)
        if th.ndim != 1 or not all(isinstance(a, np.ndarray) for a in leaves):
            return False
        batch = jax.tree_util.tree_map(lambda a: a[:b], data)
        lp = model.log_prior_vgh_host(th)[0]
        ll = np.asarray(model.log_lik_host(th, batch))
        return bool(np.isfinite(lp)) and ll.shape == (b,) and bool(np.all(np.isfinite(ll)))
    except Exception:  # noqa: BLE001 - the other checks report it
        return False


def _passes_compiled(model, theta, batch, b) -> bool:
    """Whether the checks of :func:`check_model` pass when the log prior and log-likelihood are evaluated
    in one compiled program (the batch an argument, not a constant, so the program is cached across
    processes). False on any failure, including a model that cannot be traced: the eager checks then
    run and name the problem."""
    def probe(th, rows):
        return jnp.asarray(model.log_prior(th)), jnp.asarray(model.log_lik(th, rows))

    try:
        lp, ll = jax.jit(probe)(theta, batch)
        return (lp.shape == () and ll.shape == (b,) and bool(np.isfinite(float(lp)))
                and bool(np.all(np.isfinite(np.asarray(ll)))))
    except Exception:  # noqa: BLE001 - the eager checks report it
        return False
