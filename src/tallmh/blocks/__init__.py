"""Inference programs: cycles of blocks over global parameters, local latents and hyperparameters.

The probabilistic-programs paper (Chen, Mansinghka & Ghahramani, "Sublinear-time approximate MCMC
transitions for probabilistic programs", Sec. 3-4, Fig. 7) runs subsampled MH on the *global* part of a
model's scaffold (a variable with N local sections that are conditionally independent given it) and
alternates it with ordinary kernels for the local latents: ``(cycle ((mh alpha all 1) (gibbs z one
step_z) (subsampled_mh w one Nbatch eps 'drift sigma 1)))``. This module is that ``cycle``::

    program = tm.Cycle([
        tm.blocks.MH("alpha", scale=0.5),                       # hyperparameter, exact MH
        tm.blocks.Gibbs("z", items_per_step=200),               # per-item assignments, O(items * K)
        tm.blocks.SubsampledMH("w", test=tm.acceptance.Austerity(epsilon=0.3, batch_size=100),
                               scale=0.1, group_by="z"),        # each cluster's weights, over its members
    ])
    result = tm.sample(model, data, program=program, num_samples=500, num_chains=2, seed=0)

Every block leaves the model's joint density invariant (for the subsampled block: up to the error of its
acceptance test), so the cycle does too (Tierney 1994, composition of kernels).

**The model** is a NumPyro model, ``model, data = tm.blocks.from_numpyro(numpyro_model, *args, state=("z",))``
(:mod:`tallmh.blocks.numpyro`: the blocks address its sample sites by name; per-item latents are kept in
the state by site name, item axis first), or a class written by hand to a small protocol (see
:mod:`tallmh.blocks.models` for the JointDPM, stochastic volatility and test models): the state is a dict of named sites ``values`` plus the
model's own ``aux`` pytree (e.g. per-cluster sufficient statistics, kept up to date in O(1) per move).
Which methods a model needs depends on the blocks used:

- :class:`SubsampledMH` on site ``s``: ``site_log_prior(s, value, values, aux)`` (the terms that are not
  per item, Jacobian included) and ``local_log_density(s, value, values, aux, data, idx) -> (b,)``, the
  per-item log densities of the items ``idx`` (the local sections ``l_i`` of the paper's eq. 5-6) with the
  site set to ``value`` (for a grouped site: the row of one group).
- :class:`MH` on site ``s``: ``log_conditional(s, value, values, aux, data)``, the log full conditional
  up to a constant (cheap for hyperparameters such as a CRP's alpha); otherwise prior + all N local terms.
- :class:`Gibbs` on a discrete per-item site ``z`` with K values: ``gibbs_remove(z, values, aux, data,
  i)``, ``gibbs_logits(z, values, aux, data, i) -> (K,)`` (with item i removed) and ``gibbs_add(z, values,
  aux, data, i, k)``, each O(K) or O(1); optionally ``gibbs_refresh(z, key, values, aux)`` (e.g. fresh
  prior draws for empty clusters, Neal 2000 Alg. 8).
- :class:`ParticleGibbs` on a path site ``h`` of shape (S, T): ``ssm_transition_sample(h, key, prev, t,
  values)``, ``ssm_transition_logpdf(h, x_t, prev, t, values)`` (t = 0 is the initial law; ``prev`` is
  then ignored) and ``ssm_obs_logpdf(h, x_t, t, values, data, series)``.

**Grouped sites and member lists.** ``SubsampledMH("w", group_by="z")`` updates each row ``w[k]`` with a
test whose population is cluster k's current members only (N_k items, the paper's Table 1). The members
are kept in the program state as per-cluster index lists with O(1) updates when an item moves
(:class:`Members`); the test reads ``members[k, pi(t)]`` for positions ``t < N_k`` of a keyed permutation
of ``range(N_k)``, so a step never costs O(N).

**Control variates** on a subsampled block: ``SubsampledMH("w", ..., group_by="z",
control_variates=tm.ControlVariates(order=2))`` expands each item's local density around a centre per row
(per cluster) and keeps each row's sums of gradients and Hessians equal to its current members' (moves of z
are read from a journal of the member lists, O(moves) per step; full O(N) passes only at set-up and when
the centres move during warmup, all counted in ``block{i}_refresh_items`` and ``n_data``). Near the
posterior a decision then reads about one batch of its cluster's items.

Run a program with ``tm.sample(model, data, program=...)``: the program is the kernel
(:mod:`tallmh.blocks.kernel`) and the run has the runner's chunks, progress bar, Ctrl-C, checkpoints,
bit-exact resume, verdict and ArviZ output by site name; chains run one after another (``lax.map``).
:func:`sample_program` is a thin alias returning the older :class:`ProgramResult` view. One file per kind
of block: :mod:`.subsampled`, :mod:`.mh`, :mod:`.gibbs`, :mod:`.particle`; :mod:`.cycle` composes them,
:mod:`.state` holds the program state. ``tm.Cycle`` and ``tm.sample_program`` are re-exported at the top
level.
"""

from __future__ import annotations

from .state import BlockInfo, Members, ProgramState, build_members
from .subsampled import SubsampledMH
from .mh import MH
from .gibbs import Gibbs
from .particle import ParticleGibbs
from .cycle import Cycle, Repeat
from .runner import ProgramResult, Runner, sample_program

__all__ = [
    "Members", "ProgramState", "BlockInfo", "SubsampledMH", "MH", "Gibbs", "ParticleGibbs", "Repeat",
    "Cycle", "Runner", "ProgramResult", "sample_program", "build_members", "from_numpyro", "NumPyroProgramModel",
]


from . import models  # noqa: E402  (the built-in models use the blocks' protocol)
from .numpyro import NumPyroProgramModel, from_numpyro  # noqa: E402,F401
