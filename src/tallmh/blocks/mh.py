"""Plain (exact) MH on one site, e.g. a hyperparameter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from .state import BlockInfo, check_site, require


@dataclass(frozen=True)
class MH:
    """Plain (exact) random-walk MH on one site, e.g. a hyperparameter (the paper's ``(mh alpha all 1)``).

    The target is the model's ``log_conditional(site, value, values, aux, data)`` when it has one (cheap,
    e.g. a CRP's alpha depends on the cluster counts only); otherwise ``site_log_prior`` plus all N local
    log densities (an O(N) step, counted in ``n_data``).
    """

    site: str
    scale: float = 0.1
    proposal: Any = None

    def __post_init__(self):
        if self.proposal is None:
            from ..proposals import RandomWalk

            object.__setattr__(self, "proposal", RandomWalk(self.scale))

    @property
    def label(self):
        return f"mh({self.site})"

    def validate(self, model, values, n):
        check_site(values, self.site, self.label)
        if not callable(getattr(model, "log_conditional", None)):
            require(model, ["site_log_prior", "local_log_density"], self.label)

    def init(self, model, values, aux, data, n):
        flat, _ = ravel_pytree(values[self.site])
        return self.proposal.init(flat, n)

    def _target(self, model, value, values, aux, data, n):
        own = getattr(model, "log_conditional", None)
        if callable(own):
            return own(self.site, value, values, aux, data), 0
        has_local = getattr(model, "has_local_sections", None)
        if callable(has_local) and not has_local(self.site):  # e.g. a DP's alpha: no item depends on it
            return model.site_log_prior(self.site, value, values, aux), 0
        idx = jnp.arange(n, dtype=jnp.int32)
        lp = model.site_log_prior(self.site, value, values, aux)
        return lp + jnp.sum(model.local_log_density(self.site, value, values, aux, data, idx)), n

    def step(self, key, model, values, aux, members, bstate, data, n):
        value = values[self.site]
        flat, unravel = ravel_pytree(value)
        k_prop, k_u = jax.random.split(key)
        flat_p, log_q = self.proposal.propose(k_prop, flat, bstate)
        value_p = unravel(flat_p)
        cur, cost = self._target(model, value, values, aux, data, n)
        new, _ = self._target(model, value_p, values, aux, data, n)
        log_a = new - cur + log_q
        acc = jnp.log(jax.random.uniform(k_u, (), flat.dtype)) < jnp.where(jnp.isnan(log_a), -jnp.inf, log_a)
        value = jax.tree_util.tree_map(lambda a, b: jnp.where(acc, a, b), value_p, value)
        info = BlockInfo(jnp.int32(2 * cost), jnp.int32(1), acc.astype(jnp.int32))
        return {**values, self.site: value}, aux, members, bstate, info
