"""Informed sub-sampling's settings: ``tm.sample(model, data, test=Informed(subset_size=n, ...))``.

The test brings its own kernel (its subset is part of the chain's state): :mod:`tallmh.informed` builds it, and
:func:`tallmh.build_kernel` (:mod:`tallmh.kernel_choice`) or the runner choose it; nothing here imports the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from ..errors import ConfigError

__all__ = ["Informed"]


@dataclass(frozen=True)
class Informed:
    """Informed sub-sampling MCMC: ``tm.sample(model, data, test=Informed(subset_size=n, ...))``.

    Parameters
    ----------
    subset_size : n, the items in the subset (the likelihood is the subset's raised to N/n).
    swap : k, members swapped for non-members in each subset proposal (1 <= k <= n, k <= N - n).
    epsilon : eps >= 0 of ``nu_{n,eps}(U) ∝ exp(-eps ||Delta(U)||^2)`` (report eq. (3)); 0 gives uniform
        subsets (no information), large eps the most representative ones.
    statistic : ``f(batch) -> (b,) or (b, s)`` per-item summary statistics (additive, report eq. (1));
        None: whitened scores at the posterior mode (ours, see the module docstring).
    center : flat theta_hat for the default statistic (None: from ``tm.sample``'s mode, else Newton).
    newton_steps : at most this many Newton passes per chain when the mode has to be found in ``init``.
    chunk : items per chunk of the set-up passes.

    See the module docstring for the target (approximate: a noisy MCMC, not the posterior) and the costs.
    ``tracks_log_lik = False`` and ``audit = False``: the exact self-audit does not apply.
    """

    subset_size: int
    swap: int = 1
    epsilon: float = 1.0
    statistic: Optional[Callable] = None
    center: Any = None
    newton_steps: int = 20
    chunk: int = 4096

    name = "informed"
    own_kernel = True  # (built by tallmh.informed: tallmh.kernel_choice.build_kernel)
    tracks_log_lik = False
    # its stationary law is an approximation of the posterior (report, Sec. 3): every verdict says so
    approximate_target = "informed sub-sampling samples an approximation of the posterior, not the posterior"
    audit = False  # the approximate target makes the self-audit against exact MH meaningless

    def __post_init__(self):
        for nm in ("subset_size", "swap", "newton_steps", "chunk"):
            v = getattr(self, nm)
            if isinstance(v, bool) or int(v) != v or v < 1:
                raise ConfigError(f"Informed {nm} must be a positive integer; got {v!r}")
            object.__setattr__(self, nm, int(v))
        if self.swap > self.subset_size:
            raise ConfigError(f"Informed swap ({self.swap}) cannot exceed subset_size ({self.subset_size})")
        eps = float(self.epsilon)
        if not (np.isfinite(eps) and eps >= 0.0):
            raise ConfigError(f"Informed epsilon must be finite and >= 0; got {self.epsilon!r}")
        object.__setattr__(self, "epsilon", eps)
        if self.statistic is not None and not callable(self.statistic):
            raise ConfigError("Informed statistic must be a callable f(batch) -> per-item statistics, or None")
        if self.center is not None:
            c = np.asarray(self.center, float).ravel()
            if not np.all(np.isfinite(c)):
                raise ConfigError("Informed center must be finite")
            object.__setattr__(self, "center", tuple(float(v) for v in c))

    @property
    def wants_mode(self) -> bool:
        """True when the default statistic needs the posterior mode and Hessian (``tm.sample`` may pass them)."""
        return self.statistic is None and self.center is None

    @property
    def label(self) -> str:
        stat = "scores" if self.statistic is None else "user"
        return f"informed(n={self.subset_size}, k={self.swap}, eps={self.epsilon:g}, stat={stat})"

    def check(self, n: int):
        if self.subset_size >= n:
            raise ConfigError(f"Informed subset_size ({self.subset_size}) must be below N ({n})")
        if self.swap > n - self.subset_size:
            raise ConfigError(f"Informed swap ({self.swap}) exceeds the N - n = {n - self.subset_size} non-members")

    def decide(self, key, problem):
        raise ConfigError("Informed brings its own kernel (the subset is chain state): use it through "
                          "tm.sample or tm.build_kernel, not as a per-step decision")

    @staticmethod
    def setup_items_of(states, n_items: int) -> int:
        """Items the kernels' ``init`` read for ``states`` (vmapped over chains): what set-up should count.

        Newton passes are per chain; the pass for the statistic's sum is shared by the chains (it does not
        depend on theta, so under ``vmap`` it runs once); each chain also reads its initial subset.
        """
        ex = states.extra
        cp = np.asarray(ex.chain_passes).ravel()
        sp = np.asarray(ex.shared_passes).ravel()
        m = np.asarray(ex.idx).shape[-1]
        return int(cp.sum() * n_items + (sp.max() if sp.size else 0) * n_items + cp.size * m)
