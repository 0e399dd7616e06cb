"""Particle Gibbs (conditional SMC) on per-series latent paths."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import jax
import jax.numpy as jnp

from ..storage.data import make_permutation, permute
from ..errors import ConfigError
from .state import BlockInfo, check_site, require


@dataclass(frozen=True)
class ParticleGibbs:
    """Conditional SMC (particle Gibbs, Andrieu, Doucet & Holenstein 2010) on windows of a latent path.

    The site is a path ``h`` of shape (S, T): S independent series (the plate) of T steps. Each step picks
    a window ``[a, a + window)`` (a uniform, the same for all series) and ``series_per_step`` distinct series
    (default all; drawn by a keyed permutation, O(series_per_step)), and runs a bootstrap conditional SMC
    with ``particles`` particles on each chosen series' window, the current path as the reference
    particle. The window's law is conditioned on ``h[a-1]`` (through the transition) and on ``h[a+window]``
    (its transition density enters the last weight), as in the paper's ``(pgibbs h (ordered_range h
    h+L) P 1)``. Multinomial resampling; the reference keeps ancestor 0.
    """

    site: str
    particles: int = 20
    window: Optional[int] = None
    series_per_step: Optional[int] = None
    _ignore_future: bool = False  # a deliberately wrong variant, for the tests' negative control

    @property
    def label(self):
        return f"pgibbs({self.site})"

    def validate(self, model, values, n):
        check_site(values, self.site, self.label)
        if callable(getattr(model, "pg_weights", None)):
            model.pg_check(self.site)
        else:
            require(model, ["ssm_transition_sample", "ssm_transition_logpdf", "ssm_obs_logpdf"], self.label)
        h = values[self.site]
        if h.ndim != 2:
            raise ConfigError(f"{self.label}: the path must have shape (series, time); got {h.shape}")
        if int(self.particles) < 2:
            raise ConfigError(f"ParticleGibbs needs at least 2 particles; got {self.particles}")
        t = h.shape[1]
        if self.window is not None and not (1 <= int(self.window) <= t):
            raise ConfigError(f"ParticleGibbs window must be in 1..{t}; got {self.window}")
        if self.series_per_step is not None and not (1 <= int(self.series_per_step) <= h.shape[0]):
            raise ConfigError(f"ParticleGibbs series_per_step must be in 1..{h.shape[0]}")

    def init(self, model, values, aux, data, n):
        return ()

    def _window(self, key, h_all):
        s_all, t_len = h_all.shape
        win = int(self.window or t_len)
        m = int(self.series_per_step or s_all)
        k_a, k_s, k_run = jax.random.split(key, 3)
        a = jax.random.randint(k_a, (), 0, t_len - win + 1)
        if m < s_all:
            series = permute(make_permutation(k_s), jnp.arange(m, dtype=jnp.int32), s_all)
        else:
            series = jnp.arange(s_all, dtype=jnp.int32)
        return win, m, a, series, k_run

    def _step_paths(self, key, model, values, aux, members, bstate, data, n):
        """Conditional SMC carrying whole paths (models with ``pg_weights``/``pg_propose``, e.g. NumPyro
        models: :mod:`tallmh.blocks.numpyro`). Particles are full paths (m, P, T) that differ from the current
        path only inside the window; proposals come from the latent's own per-time law (so its density
        cancels in the weights; a Gaussian path whose steps are dependent, such as a ``GaussianRandomWalk``,
        runs on its innovations through the model's ``pg_innovations``/``pg_path``, and ``pg_check`` refuses
        other dependent paths), the weight at window step j is the other sites' log density at time a + j,
        and at the last window step every later time and the per-item terms are added (their dependence on
        the window). Resampling is multinomial; particle 0 is the reference and keeps ancestor 0."""
        site = self.site
        h_all = values[site]
        t_len = h_all.shape[1]
        p = int(self.particles)
        win, m, a, series, k_run = self._window(key, h_all)
        to_z = getattr(model, "pg_innovations", None)  # a Gaussian path runs on its innovations
        ref = h_all[series] if to_z is None else to_z(site, values, data, series, h_all[series])  # (m, T)
        k_prop, k_res, k_pick = jax.random.split(k_run, 3)
        paths0 = jnp.broadcast_to(ref[:, None, :], (m, p, t_len))
        draws = model.pg_propose(site, k_prop, values, data, series, paths0)  # (m, P, T)
        tt = jnp.arange(t_len)

        def weights(paths, j):
            t = a + j
            lt, li = model.pg_weights(site, values, data, series, paths)
            now = jax.lax.dynamic_index_in_dim(lt, t, axis=2, keepdims=False)
            rest = jnp.sum(jnp.where(tt >= t, lt, 0.0), axis=2) + li
            if self._ignore_future:  # negative control: the later times' dependence on the window dropped
                rest = now + li
            return jnp.where(j == win - 1, rest, now)

        def body(c, j):
            paths, lw = c
            t = a + j
            anc = jax.random.categorical(jax.random.fold_in(k_res, j), lw[:, None, :], axis=-1, shape=(m, p - 1))
            anc = jnp.concatenate([jnp.zeros((m, 1), jnp.int32), anc.astype(jnp.int32)], axis=1)
            anc = jnp.where(j == 0, jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (m, p)), anc)
            paths = jnp.take_along_axis(paths, anc[:, :, None], axis=1)
            col = jax.lax.dynamic_index_in_dim(draws, t, axis=2, keepdims=False)  # (m, P)
            col = col.at[:, 0].set(jax.lax.dynamic_index_in_dim(ref, t, axis=1, keepdims=False))
            paths = jax.lax.dynamic_update_index_in_dim(paths, col[:, :, None].astype(paths.dtype), t, axis=2)
            return (paths, weights(paths, j)), None

        lw0 = jnp.zeros((m, p), h_all.dtype)
        (paths, lw), _ = jax.lax.scan(body, (paths0, lw0), jnp.arange(win))
        b = jax.random.categorical(k_pick, lw, axis=-1).astype(jnp.int32)  # (m,)
        new = jnp.take_along_axis(paths, b[:, None, None], axis=1)[:, 0]
        if to_z is not None:
            new = model.pg_path(site, values, data, series, new)
        h_all = h_all.at[series].set(new.astype(h_all.dtype))
        info = BlockInfo(jnp.int32(m * win), jnp.int32(m), jnp.sum(b != 0).astype(jnp.int32))
        return {**values, site: h_all}, aux, members, bstate, info

    def step(self, key, model, values, aux, members, bstate, data, n):
        if callable(getattr(model, "pg_weights", None)):
            return self._step_paths(key, model, values, aux, members, bstate, data, n)
        site = self.site
        h_all = values[site]
        s_all, t_len = h_all.shape
        p = int(self.particles)
        win, m, a, series, k_run = self._window(key, h_all)
        h = h_all[series]  # (m, T)
        dtype = h.dtype

        def trans_sample(kk, prev, t):
            return model.ssm_transition_sample(site, kk, prev, t, values)

        def obs(x, t):
            return model.ssm_obs_logpdf(site, x, t, values, data, series)

        ref = jax.lax.dynamic_slice_in_dim(h, a, win, axis=1)  # (m, win)
        prev0 = jax.lax.dynamic_index_in_dim(h, jnp.maximum(a - 1, 0), axis=1, keepdims=False)
        prev0 = jnp.broadcast_to(prev0[:, None], (m, p))
        has_next = a + win < t_len
        h_next = jax.lax.dynamic_index_in_dim(h, jnp.minimum(a + win, t_len - 1), axis=1, keepdims=False)

        def future(x, t):
            if self._ignore_future:
                return jnp.zeros_like(x)
            lf = model.ssm_transition_logpdf(site, jnp.broadcast_to(h_next[:, None], x.shape), x, t + 1, values)
            return jnp.where(has_next, lf, 0.0)

        def weight(x, j):
            t = a + j
            lw = obs(x, t)
            return jnp.where(j == win - 1, lw + future(x, t), lw)

        keys = jax.random.split(k_run, win + 1)
        x0 = trans_sample(keys[0], prev0, a)
        x0 = x0.at[:, 0].set(ref[:, 0])
        lw0 = weight(x0, 0)

        def scan_body(c, j):
            x_prev, lw = c
            kr, kt = jax.random.split(keys[j])
            anc = jax.random.categorical(kr, lw[:, None, :], axis=-1, shape=(m, p - 1)) if p > 1 else None
            anc = jnp.concatenate([jnp.zeros((m, 1), jnp.int32), anc.astype(jnp.int32)], axis=1)
            xp = jnp.take_along_axis(x_prev, anc, axis=1)
            x = trans_sample(kt, xp, a + j)
            x = x.at[:, 0].set(jax.lax.dynamic_index_in_dim(ref, j, axis=1, keepdims=False))
            lw_new = weight(x, j)
            return (x, lw_new), (x, anc)

        if win > 1:
            (x_last, lw_last), (xs, ancs) = jax.lax.scan(scan_body, (x0, lw0), jnp.arange(1, win))
            xs = jnp.concatenate([x0[None], xs], axis=0)  # (win, m, p)
        else:
            x_last, lw_last = x0, lw0
            xs = x0[None]
            ancs = jnp.zeros((0, m, p), jnp.int32)
        b = jax.random.categorical(keys[win], lw_last, axis=-1).astype(jnp.int32)  # (m,)

        def back(bcur, j):  # j = win-1 .. 1
            anc_j = ancs[j - 1]  # ancestors of step j's particles at step j-1
            val = jnp.take_along_axis(xs[j], bcur[:, None], axis=1)[:, 0]
            return jnp.take_along_axis(anc_j, bcur[:, None], axis=1)[:, 0], val

        if win > 1:
            b0, vals_rev = jax.lax.scan(back, b, jnp.arange(win - 1, 0, -1))
            first = jnp.take_along_axis(xs[0], b0[:, None], axis=1)[:, 0]
            path = jnp.concatenate([first[None], vals_rev[::-1]], axis=0).T  # (m, win)
        else:
            path = jnp.take_along_axis(xs[0], b[:, None], axis=1)
        h = jax.lax.dynamic_update_slice_in_dim(h, path.astype(dtype), a, axis=1)
        h_all = h_all.at[series].set(h)
        info = BlockInfo(jnp.int32(m * win), jnp.int32(m), jnp.sum(b != 0).astype(jnp.int32))
        return {**values, site: h_all}, aux, members, bstate, info
