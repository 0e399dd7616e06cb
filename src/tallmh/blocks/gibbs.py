"""Gibbs updates of a discrete per-item site, item by item."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from ..errors import ConfigError
from .state import BlockInfo, check_site, require


@dataclass(frozen=True)
class Gibbs:
    """Random-scan single-site Gibbs on a discrete per-item site z (the paper's ``(gibbs z one step_z)``).

    Each step updates ``items_per_step`` items drawn uniformly with replacement (default: N). For each item
    i: the model removes i from its group's statistics, returns the K log conditional weights
    ``log p(z_i = k | rest)``, the block draws k, the model adds i to group k, and the member lists move i
    in O(1). The cost is O(items_per_step * K) (plus the model's O(K) refresh), never a full-data pass.
    """

    site: str
    items_per_step: Optional[int] = None

    @property
    def label(self):
        return f"gibbs({self.site})"

    def validate(self, model, values, n):
        check_site(values, self.site, self.label)
        if callable(getattr(model, "gibbs_logits_batch", None)):
            model.gibbs_check(self.site)
        else:
            require(model, ["gibbs_remove", "gibbs_logits", "gibbs_add"], self.label)
        if self.items_per_step is not None and int(self.items_per_step) < 1:
            raise ConfigError(f"Gibbs items_per_step must be at least 1; got {self.items_per_step}")

    def init(self, model, values, aux, data, n):
        return ()

    def moves(self, site, n):
        """The most member-list moves of ``site`` one step makes (a journal's capacity)."""
        return int(self.items_per_step or n) if site == self.site else 0

    def step(self, key, model, values, aux, members, bstate, data, n):
        m = int(self.items_per_step or n)
        site = self.site
        mem0 = members.get(site)
        refresh = getattr(model, "gibbs_refresh", None)
        k_items, k_loop = jax.random.split(key)
        items = jax.random.randint(k_items, (m,), 0, n, dtype=jnp.int32)
        if callable(getattr(model, "gibbs_logits_batch", None)):
            return self._step_batched(k_loop, model, values, aux, members, bstate, data, items)

        def body(j, c):
            vals, ax, mem = c
            kr, kd = jax.random.split(jax.random.fold_in(k_loop, j))
            i = items[j]
            if callable(refresh):
                vals, ax = refresh(site, kr, vals, ax)
            old = vals[site][i]
            vals, ax = model.gibbs_remove(site, vals, ax, data, i)
            logits = model.gibbs_logits(site, vals, ax, data, i)
            k = jax.random.categorical(kd, logits).astype(jnp.int32)
            vals, ax = model.gibbs_add(site, vals, ax, data, i, k)
            vals = {**vals, site: vals[site].at[i].set(k)}
            if mem is not None:
                mem = mem.move(i, old, k)
            return vals, ax, mem

        values, aux, mem = jax.lax.fori_loop(0, m, body, (values, aux, mem0))
        if mem0 is not None:
            members = {**members, site: mem}
        return values, aux, members, bstate, BlockInfo(jnp.int32(m), jnp.int32(m), jnp.int32(m))


    def _step_batched(self, key, model, values, aux, members, bstate, data, items):
        """Models whose per-item latents are conditionally independent given the globals (NumPyro models,
        :mod:`tallmh.blocks.numpyro`): the m items' K log weights in one batched evaluation (O(m K)), then
        the m draws applied in order (a repeated item is drawn twice from the same full conditional; the
        later draw stands, which is again a draw from it)."""
        site = self.site
        m = items.shape[0]
        logits = model.gibbs_logits_batch(site, values, data, items)  # (m, K)
        ks = jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
        newv = model.gibbs_value(site, ks).astype(values[site].dtype)
        mem0 = members.get(site)

        def body(j, c):
            z, mem = c
            i = items[j]
            old = z[i]
            z = jax.lax.dynamic_update_slice(z, newv[j][None], (i,))
            if mem is not None:
                mem = mem.move(i, old.astype(jnp.int32), ks[j])
            return z, mem

        z, mem = jax.lax.fori_loop(0, m, body, (values[site], mem0))
        values = {**values, site: z}
        if mem0 is not None:
            members = {**members, site: mem}
        return values, aux, members, bstate, BlockInfo(jnp.int32(m), jnp.int32(m), jnp.int32(m))
