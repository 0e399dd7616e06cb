"""Automatic blocking for models with group-level terms: data-free hyperparameters apart from the effects.

In a hierarchical GLM (``y ~ x1 + x2 + (1|g)`` in Bambi, the same in PyMC or NumPyro) the group scale
``sigma`` touches no data given the group effects ``a_j``: its full conditional is ``p(sigma) prod_j
N(a_j | 0, sigma^2)``, a few thousand flops whatever N is. The probabilistic-programs paper's scaffold
(Chen, Mansinghka & Ghahramani, "Sublinear-time approximate MCMC transitions for probabilistic programs",
Sec. 3-4: global sites with local sections, hyperparameters by ordinary MH, Fig. 7's ``cycle``) then gives a
cycle of two kinds of block:

1. **the hyperparameters** (every parameter that no row's likelihood reads given the others): exact random-walk
   MH on their data-free conditional, ``HYPER_STEPS`` steps per cycle (:class:`tallmh.blocks.MH` with the
   model's ``log_conditional``; no data read);
2. **the effects** (fixed effects, group effects, a family's own parameters: everything a row's likelihood
   reads): one subsampled MH step (:class:`tallmh.blocks.SubsampledMH`) with the default approximate test
   (``Austerity(error=0.05)``; ``Exact()`` up to ``EXACT_BELOW`` rows, where a subsample would not read fewer)
   and Taylor control variates centred at the effects' conditional mode, proposed by Langevin (MALA
   with the control variates' minibatch gradient, as the single-block default) preconditioned by the inverse
   of the effects' negative log-posterior Hessian at the start (made on up to ``PILOT_ROWS`` rows drawn at
   random), with the fixed step ``1.65^2 d^(-1/3)``; above ``DENSE_MAX`` effects a random walk with
   per-effect sds from that Hessian's diagonal and no control variates (no d x d array anywhere).

Which parameter goes where is found, not declared (:func:`split_sites`): a parameter is data-free when the
model's per-row log-likelihood, evaluated on rows of the data, does not change when it moves and the others
are held (a graph's inputs are not a guide: PyTensor's compiled likelihood takes every free variable). For a
Bambi-style group term written ``effect = offset * sigma``
(:class:`~tallmh.frontends.pymc_model.RecentredPyMCModel`) the program runs on the term's centred effects
``a = offset * sigma`` (every weight 1), where ``sigma`` is data-free.

``tm.sample(model, data)`` builds this program by default for such a model (no ``test``, ``proposal``,
``control_variates`` or ``program`` given); ``result.notes`` says what was built; a user's own ``program=``
(or any of those arguments) wins.

**Where an exact effects test plugs in.** The effects block is :func:`effects_block`: one
``SubsampledMH("effects", test=..., control_variates=...)``. A test that decides exactly from a subsample
(factorised acceptance with per-item bounds on the Taylor remainder) replaces the ``test=`` there; its per-item
bounds need the effects' per-row structure, which :class:`BlockedModel` exposes as ``local_log_density`` of
the ``"effects"`` site.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from . import setup_reads
from .errors import ConfigError

HYPER_STEPS = 10  # data-free MH steps on the hyperparameters per cycle
PILOT_ROWS = 2**16  # rows (drawn at random) of the Hessian that sets the effects' proposal
DENSE_MAX = 400  # above this many effects the proposal uses the Hessian's diagonal only
CV_ORDER2_MAX = 400  # above this many effects no control variates (their sums are effects x effects)
LANGEVIN = True
AUTO_DEFAULT = True  # tm.sample's default for a recognised group-level GLM from PyMC/Bambi/NumPyro: the blocks
EXACT_GLM = True  # a recognised GLM's effects by the exact block of glm_effects.py (else austerity + control variates)
GLM_TEST = "thinning"  # that block's decision: "thinning" (exact, subsampled) or "exact" (every row)
GLM_PCN = 0.9  # its Crank-Nicolson parameter (measured at 10^5 x 100: 0.5, 0.8, 1.0 gave ESS/s 132, 567, 1,097)
EXACT_BELOW = 1000  # rows: up to this many the effects block decides exactly (a subsample would not read fewer)
RECORD_VALUES = 128  # the exact GLM block makes ceil(effects / this) steps per recorded draw (see glm_steps)

__all__ = ["split_sites", "centred_view", "BlockedModel", "auto_program", "effects_block"]


def centred_view(model):
    """For a :class:`~tallmh.frontends.pymc_model.RecentredPyMCModel`: the same model with every weight 1 (its
    group terms' keys hold the centred effects ``a_j = offset_j * sigma``), started at the same point; any other
    model as it is."""
    from .frontends.pymc_model import RecentredPyMCModel

    if not isinstance(model, RecentredPyMCModel):
        return model
    init = {k: np.asarray(v) for k, v in model._init.items()}
    weights = {}
    for _, sig, new in model.terms:
        w = np.asarray(model.weights[new], np.float64)
        s = np.exp(np.asarray(init[sig], np.float64))
        init[new] = np.asarray(np.asarray(init[new], np.float64) * s ** (1.0 - w), init[new].dtype)
        weights[new] = np.ones_like(w)
    cm = RecentredPyMCModel(model.inner, model.terms, weights, init, list(model.notes))
    cm.mode_fixed = []
    return cm


CHECK_ROWS = 2**16  # rows per compiled call of the data-free check


def _differs_fn(model):
    """``differs(theta, moved, data, idx)``: whether any of the rows ``idx`` has a log-likelihood at ``moved`` other than
    at ``theta`` (to float rounding); one compiled program for every key (the data an argument, not a constant)."""
    from .storage.data import take

    @jax.jit
    def differs(theta, moved, data, idx):
        rows = take(data, idx)
        a, b = model.log_lik(theta, rows), model.log_lik(moved, rows)
        tol = 1e-4 * jnp.maximum(1.0, jnp.abs(a))
        return jnp.any(~jnp.isfinite(b) | (jnp.abs(b - a) > tol))

    return differs


def _lik_ignores(model, theta, data, n, key, differs=None) -> bool:
    """Whether every row's log-likelihood stays the same (to float rounding) when ``theta[key]`` moves by a random
    Gaussian shift (sd 0.7 on the unconstrained scale), the rest held: checked on all N rows (a predictor that is
    zero on most rows must not pass for data-free), in calls of ``CHECK_ROWS`` rows."""
    rng = np.random.default_rng(2)
    shift = jnp.asarray(0.7 * rng.standard_normal(np.shape(theta[key])), theta[key].dtype)
    moved = dict(theta, **{key: theta[key] + shift})
    differs = differs or _differs_fn(model)
    b = min(n, CHECK_ROWS)
    for s in range(0, n, b):
        idx = jnp.asarray(np.minimum(np.arange(s, s + b), n - 1).astype(np.int32))
        setup_reads.add(min(b, n - s))
        if bool(differs(theta, moved, data, idx)):
            return False
    return True


def split_sites(model, data) -> Tuple[List[str], List[str], str]:
    """``(hyper keys, effect keys, how)``: the keys of ``model``'s parameter that no row's log-likelihood reads
    given the others (checked numerically on every row: the likelihood does not change when the key moves, the
    others held; one pass over the N rows per key, at set-up), and the rest. ``model`` should be
    :func:`centred_view`'s: a Bambi group scale is data-free given the centred effects, not given the offsets."""
    theta = {k: jnp.asarray(v) for k, v in (model.init(data) if _init_takes_data(model) else model.init()).items()}
    n = int(jax.tree_util.tree_leaves(data)[0].shape[0])
    data = jax.tree_util.tree_map(jnp.asarray, data)
    differs = _differs_fn(model)
    hyper = [k for k in theta if _lik_ignores(model, theta, data, n, k, differs)]
    effects = [k for k in theta if k not in hyper]
    return hyper, effects, f"the likelihood checked not to change with them on all {n:,} rows"


def _init_takes_data(model) -> bool:
    import inspect

    try:
        return len(inspect.signature(model.init).parameters) >= 1
    except (TypeError, ValueError):
        return False


class BlockedModel:
    """A tallmh :class:`~tallmh.model.Model` (``theta`` a dict) seen through the blocks' protocol with two sites:
    ``"hyper"`` (the flat vector of the data-free keys) and ``"effects"`` (the flat vector of the others).

    ``log_conditional("hyper", ...)`` is the model's log prior (the likelihood does not read the hyperparameters:
    :func:`split_sites`); ``local_log_density("effects", ...)`` is the model's per-row log-likelihood of the rows
    ``idx``, evaluated with the hyperparameters at their start (it does not depend on them). A draw records ``model.constrain(theta)`` (the model's names), and ``coords`` and ``notes`` are the
    model's.
    """

    wants_full_site = False

    def __init__(self, model, hyper: List[str], effects: List[str], start: Dict[str, np.ndarray],
                 jitter: Dict[str, np.ndarray]):
        self.model = model
        self.hyper_keys, self.effect_keys = list(hyper), list(effects)
        h0, self._unravel_h = ravel_pytree({k: jnp.asarray(start[k]) for k in self.hyper_keys})
        e0, self._unravel_e = ravel_pytree({k: jnp.asarray(start[k]) for k in self.effect_keys})
        self.start = {"hyper": h0, "effects": e0}
        self.jitter = {k: jnp.asarray(v, self.start[k].dtype) for k, v in jitter.items()}
        self.coords = getattr(model, "coords", None)
        self.notes = list(getattr(model, "notes", None) or [])
        self.name = getattr(model, "name", "model")

    def theta(self, values, site=None, value=None):
        v = dict(values)
        if site is not None:
            v[site] = value
        return {**self._unravel_h(v["hyper"]), **self._unravel_e(v["effects"])}

    def init(self, key, data):
        kh, ke = jax.random.split(key)
        values = {s: self.start[s] + self.jitter[s] * jax.random.normal(k, self.start[s].shape, self.start[s].dtype)
                  for s, k in (("hyper", kh), ("effects", ke))}
        return values, ()

    def site_log_prior(self, site, value, values, aux):
        return self.model.log_prior(self.theta(values, site, value))

    def log_conditional(self, site, value, values, aux, data):
        if site != "hyper":
            raise ValueError("only the hyperparameters have a data-free conditional")
        return self.model.log_prior(self.theta(values, site, value))

    def has_local_sections(self, site):
        return site != "hyper"

    def local_log_density(self, site, value, values, aux, data, idx):
        from .storage.data import take

        # the hyperparameters at their start: the likelihood does not depend on them (split_sites), and reading them
        # here would tie the effects' control-variate sums to the other block's site
        v = dict(values, hyper=self.start["hyper"])
        return self.model.log_lik(self.theta(v, site, value), take(data, idx))

    def record(self, values, aux):
        th = self.theta(values)
        con = getattr(self.model, "constrain", None)
        return con(th) if callable(con) else th

    def __repr__(self):
        return f"BlockedModel({self.model!r}, hyper {self.hyper_keys}, effects {self.effect_keys})"


def _effects_precision(model, data, n, start, effect_keys, dense: bool):
    """The negative Hessian (dense) or its diagonal (``dense=False``: the sum over rows of the per-row gradient
    squares, the outer-product approximation, plus the prior's diagonal) of the log posterior in the effects at
    ``start``, from up to ``PILOT_ROWS`` rows drawn at random (their log-likelihood scaled by ``n / rows``)."""
    from .storage.data import take

    e0, unravel = ravel_pytree({k: jnp.asarray(start[k]) for k in effect_keys})
    rest = {k: jnp.asarray(v) for k, v in start.items() if k not in effect_keys}
    m = min(n, PILOT_ROWS)
    setup_reads.add(m)
    idx = np.sort(np.random.default_rng(1).choice(n, m, replace=False)) if m < n else np.arange(n)
    chunk = 4096

    def lp(e):
        return model.log_prior({**rest, **unravel(e)})

    def ll(e, rows):
        return jnp.sum(model.log_lik({**rest, **unravel(e)}, rows))

    if dense:
        h = -np.asarray(jax.hessian(lp)(e0), np.float64)
        hl = jax.jit(jax.hessian(ll))
        for s in range(0, m, chunk):
            rows = take(data, jnp.asarray(idx[s:s + chunk].astype(np.int32)))
            h -= (n / m) * np.asarray(hl(e0, rows), np.float64)
        return h
    d = e0.shape[0]

    def prior_diag(e):  # the prior's Hessian diagonal, one coordinate at a time (in batches: no d x d array)
        g = jax.grad(lp)

        def one(i):
            t = jnp.zeros_like(e).at[i].set(1.0)
            return jax.jvp(g, (e,), (t,))[1][i]

        return -jax.lax.map(one, jnp.arange(d), batch_size=min(d, 256))

    diag = np.asarray(jax.jit(prior_diag)(e0), np.float64)
    per_row = jax.jit(lambda e, rows: jnp.sum(jax.vmap(lambda r: jax.grad(
        lambda x: ll(x, jax.tree_util.tree_map(lambda a: a[None], r)))(e))(rows) ** 2, axis=0))
    for s in range(0, m, chunk):
        rows = take(data, jnp.asarray(idx[s:s + chunk].astype(np.int32)))
        diag += (n / m) * np.asarray(per_row(e0, rows), np.float64)
    return diag


def effects_block(model: BlockedModel, data, n, test=None):
    """The subsampled block on the effects: ``SubsampledMH("effects")`` with ``test`` (default
    ``Austerity(error=0.05)``), Taylor control variates centred at the start (order 2 up to ``CV_ORDER2_MAX``
    effects, order 1 above; no recentring) and a random walk preconditioned by the effects' precision at the
    start (:func:`_effects_precision`), scaled by ``2.38 / sqrt(d)``. An exact subsampled test goes in ``test``."""
    from .acceptance import Austerity
    from .blocks.subsampled import SubsampledMH
    from .control_variates import ControlVariates
    from .proposals import RandomWalk

    e0 = model.start["effects"]
    d = int(e0.shape[0])
    dense = d <= DENSE_MAX
    start = {**{k: np.asarray(v) for k, v in model._unravel_h(model.start["hyper"]).items()},
             **{k: np.asarray(v) for k, v in model._unravel_e(e0).items()}}
    prec = _effects_precision(model.model, data, n, start, model.effect_keys, dense)
    c = 2.38 ** 2 / d
    if dense:
        w, v = np.linalg.eigh(0.5 * (prec + prec.T))
        w = np.maximum(w, 1e-8 * max(1.0, float(np.max(np.abs(w)))))
        cov = c * (v / w) @ v.T
        scale = 0.5 * (cov + cov.T)
        sd = np.sqrt(np.diag(cov) / c)
    else:
        p = np.maximum(prec, 1e-8 * max(1.0, float(np.max(prec))))
        scale = np.sqrt(c / p)
        sd = 1.0 / np.sqrt(p)
    # control variates of order 2 keep d x d sums: above CV_ORDER2_MAX effects none (the block then reads more
    # rows per decision; per-group sums are the way to many groups)
    cv = ControlVariates(order=2, center=np.asarray(e0), recenter=False) if d <= CV_ORDER2_MAX else None
    if dense and LANGEVIN:
        # MALA preconditioned by the Laplace covariance, its step h = 1.65^2 d^(-1/3) (Roberts & Rosenthal 1998)
        prop = _PreconditionedLangevin(cov / c, 1.65 ** 2 * d ** (-1.0 / 3.0), min(100, n))
    else:
        prop = RandomWalk(scale) if dense else DiagonalRandomWalk(scale)
    if test is None:
        # below EXACT_BELOW rows a subsample saves nothing (a look reads 100 rows, the Langevin gradient 100 more)
        from .acceptance import Exact

        test = Exact() if n <= EXACT_BELOW else Austerity(error=0.05)
    block = SubsampledMH("effects", test=test, proposal=prop, control_variates=cv)
    return block, sd


class _PreconditionedLangevin:
    """:class:`~tallmh.proposals.Langevin` (MALA with the control variates' minibatch gradient) started with the
    preconditioner ``cov`` (the effects' Laplace covariance at the start) and a fixed step size (a block's
    proposal does not adapt)."""

    needs_data = True
    uses_cov_hint = True

    def __init__(self, cov, step_size, batch_size):
        from .proposals import Langevin

        self.inner = Langevin(step_size=float(step_size), batch_size=int(batch_size), precondition=True, adapt=False)
        self.cov = np.asarray(cov)
        self.name = "langevin"

    def __getattr__(self, k):
        if k in ("inner", "cov"):
            raise AttributeError(k)
        return getattr(self.inner, k)

    def init(self, theta, n: int, cov_hint=None):
        return self.inner.init(theta, n, cov_hint=jnp.asarray(self.cov, theta.dtype))

    def propose_with_data(self, key, theta, state, grad_fn, n: int):
        return self.inner.propose_with_data(key, theta, state, grad_fn, n)


class DiagonalRandomWalk:
    """Gaussian random walk with per-coordinate sds ``scale`` (a vector): ``theta' = theta + scale * z``; O(d) memory
    and work per step (:class:`~tallmh.proposals.RandomWalk` keeps a d x d Cholesky factor)."""

    name = "diagonal-random-walk"

    def __init__(self, scale):
        self.scale = np.asarray(scale, float)

    def init(self, theta, n: int):
        return jnp.asarray(self.scale, theta.dtype)

    def propose(self, key, theta, state):
        return theta + state * jax.random.normal(key, theta.shape, theta.dtype), jnp.zeros((), theta.dtype)

    def update(self, state, theta, accepted, step):
        return state


def _conditional_start(model, data, n, start, hyper, rounds=3):
    """The start moved to the effects' conditional mode given the hyperparameters (``rounds=1``), or then also the
    hyperparameters' given the effects and the effects' again (``rounds=3``): damped Newton on all N rows
    (streamed passes), not to the joint mode (a centred group scale's joint mode is the spike at 0). Kept as it
    was above ``DENSE_MAX`` parameters (the Newton step is dense) or if a step fails."""
    from . import setup_passes as setup

    flat, unravel = ravel_pytree({k: jnp.asarray(v) for k, v in start.items()})
    d = int(flat.shape[0])
    if d > DENSE_MAX:
        return start
    pos = unravel(jnp.arange(d))
    is_h = np.zeros(d, bool)
    for k in hyper:
        is_h[np.asarray(pos[k]).astype(int).reshape(-1)] = True
    full = jax.tree_util.tree_map(jnp.asarray, data)
    th = flat
    try:
        for fixed in (is_h, ~is_h, is_h)[:rounds]:
            new, passes, _ = setup._newton(model, full, n, unravel, th, 30, 1e-6, label="start", fixed=fixed)
            setup_reads.add(passes * n)
            if not np.all(np.isfinite(np.asarray(new))):
                return start
            th = new
    except Exception:  # noqa: BLE001 - e.g. no finite Hessian: keep the model's start
        return start
    return {k: np.asarray(v, start[k].dtype) for k, v in unravel(th).items()}


def auto_program(model, data):
    """``(BlockedModel, program, note)`` for a model with data-free hyperparameters and effects (see the module),
    or None for any other (or one that cannot be blocked: a model without a dict parameter or a gradient)."""
    from .blocks.cycle import Cycle, Repeat
    from .blocks.mh import MH
    from .frontends.pymc_model import RecentredPyMCModel
    from .model import Model
    from .proposals import RandomWalk

    if not isinstance(model, Model) or not callable(getattr(model, "init", None)):
        return None
    try:
        cm = centred_view(model)
        start = cm.init(data) if _init_takes_data(cm) else cm.init()
        if not isinstance(start, dict) or not start:
            return None
        hyper, effects, how = split_sites(cm, data)
    except Exception:  # noqa: BLE001 - a model the analysis cannot read is run as before
        return None
    if not hyper or not effects:
        return None
    n = int(jax.tree_util.tree_leaves(data)[0].shape[0])
    start = {k: np.asarray(v) for k, v in start.items()}
    # the control variates' centre and the chains' start: the effects' mode given the hyperparameters on all rows
    # (a recentred Bambi model's hyperparameters start at its pilot fit's estimate, kept)
    # (a recentred Bambi model recognised as a logistic GLM: the exact block's own Newton on the arrow-shaped
    # precision finds that mode, in place of the dense one)
    recentred = isinstance(cm, RecentredPyMCModel)
    zero = {"hyper": 0.0, "effects": 0.0}
    glm = _exact_glm_block(BlockedModel(cm, hyper, effects, start, zero), data, n) if EXACT_GLM and recentred \
        else None
    if glm is None:
        start = _conditional_start(cm, data, n, start, hyper, rounds=1 if recentred else 3)
        if EXACT_GLM and not recentred:
            glm = _exact_glm_block(BlockedModel(cm, hyper, effects, start, zero), data, n)
    bm0 = BlockedModel(cm, hyper, effects, start, zero)
    if glm is not None:
        centre = bm0._unravel_e(jnp.asarray(np.asarray(glm[0].setup.center), bm0.start["effects"].dtype))
        start = {**start, **{k: np.asarray(v, start[k].dtype) for k, v in centre.items()}}
        eblock, sd_e, extra = glm
    else:
        extra = {}
        try:
            eblock, sd_e = effects_block(bm0, data, n)
        except Exception:  # noqa: BLE001 - e.g. a likelihood JAX cannot differentiate: run as before
            return None
    # the hyperparameters' random walk: sd 1 / sqrt(2 J) on a log scale with J effects (the conditional of
    # log sigma given J effects), at most 0.5
    n_eff = max(1, int(sum(np.size(start[k]) for k in effects)))
    h_sd = min(0.5, 1.0 / np.sqrt(2.0 * n_eff))
    hblock = Repeat(MH("hyper", proposal=RandomWalk(h_sd)), times=HYPER_STEPS)
    k_e = glm_steps(n_eff) if glm is not None else 1
    if k_e > 1:
        eblock = Repeat(eblock, times=k_e)
    jitter = {"hyper": np.full(bm0.start["hyper"].shape, h_sd), "effects": np.asarray(sd_e)}
    bm = BlockedModel(cm, hyper, effects, start, jitter)
    bm.extra_data = extra
    program = Cycle([hblock, eblock])
    note = (f"automatic blocks (group-level model): the data-free parameters {hyper} by exact MH ({HYPER_STEPS} "
            f"steps per cycle, no data read; {how}), then the {n_eff} effects {_short(effects)} by "
            f"{'one subsampled MH step' if k_e == 1 else f'{k_e} subsampled MH steps (one draw recorded a cycle)'} "
            f"({eblock.label}; {_proposal_words(_inner(eblock))}); program=... replaces it")
    return bm, program, note


def glm_steps(n_eff: int) -> int:
    """Exact GLM effects steps per cycle (per recorded draw): ``ceil(n_eff / RECORD_VALUES)``. A step of that block
    reads a few rows and costs O(effects) flops, so a chain makes hundreds of thousands of them in minutes; recording
    each (``n_eff`` values a chain) made the stored draws, and the summary's copies of them at the end, grow to
    gigabytes at 1,000 groups. With this many steps a cycle the values recorded per step stay about
    ``RECORD_VALUES`` whatever the number of effects (consecutive steps of the Crank-Nicolson proposal are strongly
    correlated, so little ESS is lost); the hyperparameters' steps run once per cycle as before."""
    return max(1, -(-int(n_eff) // RECORD_VALUES))


def _inner(block):
    """The block a :class:`~tallmh.blocks.cycle.Repeat` repeats (any other block as it is)."""
    inner = getattr(block, "block", None)
    return inner if inner is not None and hasattr(block, "times") else getattr(block, "proposal", block)


def _default_blocks(model, data):
    """The default for a PyMC, Bambi or NumPyro model with group-level terms whose effects' likelihood is a
    recognised GLM (:func:`tallmh.glm_effects.recognise`: logistic, Poisson-log, Gaussian with a known noise sd):
    the automatic blocks with the exact effects block (:func:`auto_program`); any other model as it is (a model
    written directly as a :class:`~tallmh.model.Model` included: its author chose its method)."""
    import sys

    # (the front ends' classes where their modules are loaded, as they are for any model they made: a built-in
    # model's run does not import them, nor the blocks, for this check)
    kinds = tuple(k for k in (getattr(sys.modules.get("tallmh.frontends.numpyro_model"), "NumPyroModel", None),
                              getattr(sys.modules.get("tallmh.frontends.pymc_model"), "PyMCModel", None))
                  if k is not None)
    if not kinds or not isinstance(model, kinds) or callable(getattr(model, "factor_bound", None)):
        return model, None, None  # (a GLM without group terms: the exact subsampled test over all its parameters)
    from .glm_effects import GLMEffects

    got = auto_program(model, data)
    if got is None or not isinstance(_inner(got[1].blocks[-1]), GLMEffects):
        return model, None, None
    bm, program, note = got
    from .glm_families import WORDS

    fam = WORDS[_inner(got[1].blocks[-1]).family]
    return bm, program, f"default for a group-level {fam} GLM (exact effects step): " + note


def _exact_glm_block(bm, data, n):
    """``(GLMEffects block, jitter sds, its data arrays)`` where the effects' likelihood is a logistic, Poisson-log
    or known-sd Gaussian GLM with one group key (:mod:`tallmh.glm_effects`), else None."""
    from . import glm_effects as ge

    try:
        view = ge.recognise(bm, jax.tree_util.tree_map(jnp.asarray, data), n)
        if view is None:
            return None
        setup, order = ge.glm_setup(bm, view, bm.start["effects"])
    except Exception:  # noqa: BLE001 - a likelihood the recognition cannot read keeps the approximate block
        return None
    # (a Gaussian's surrogate is its likelihood: r = 1 draws the effects' exact conditional given the hyperparameters)
    block = ge.GLMEffects(setup, view.fixed, view.group, test=GLM_TEST, r=1.0 if view.family == "gaussian" else GLM_PCN,
                          family=view.family)
    sd = np.zeros(int(bm.start["effects"].shape[0]))
    sd[view.group] = np.asarray(setup.s, np.float64)
    if view.fixed.size:
        lt = np.asarray(setup.lstf, np.float64)
        sd[view.fixed] = np.sqrt(np.diag(np.linalg.inv(lt.T @ lt)))
    extra = dict(zip(ge.DATA_KEYS, (view.x, view.g, view.c, view.b, order)))
    return block, sd, extra


def data_for(model, data):
    """The data the program reads: ``data`` and, for an exact GLM effects block, the design arrays it made
    (:mod:`tallmh.glm_effects`) under their own keys."""
    extra = getattr(model, "extra_data", None)
    if not extra or not isinstance(data, dict):
        return data
    return {**data, **extra}


def _proposal_words(p) -> str:
    from .glm_effects import GLMEffects

    if isinstance(p, GLMEffects):
        from .glm_families import WORDS

        if p.family == "gaussian":
            return ("a Gaussian likelihood: the effects drawn from their conditional Gaussian at the current "
                    "hyperparameters (a zero remainder: no row read per step)")
        return (f"{WORDS[p.family]} likelihood; preconditioned Crank-Nicolson (r = {p.r}) on the surrogate's "
                "Gaussian at the current hyperparameters; per-group remainder bounds"
                + (f", on a trust region of radius {p.radius:g} (every row decides outside it)"
                   if p.family == "poisson" else ""))
    if isinstance(p, _PreconditionedLangevin):
        return (f"Langevin proposal with the control variates' gradient on {p.inner.batch_size} rows, preconditioned "
                f"by the effects' Laplace covariance at the start, step {p.inner.step_size:.3g}")
    if isinstance(p, DiagonalRandomWalk):
        return "random walk with per-effect sds from the Hessian's diagonal at the start"
    return "random walk preconditioned by the effects' Laplace covariance at the start"


def _short(keys, most=6):
    return str(keys) if len(keys) <= most else f"[{', '.join(map(repr, keys[:most]))}, ... {len(keys)} in all]"


def default_program(model, data, test, proposal, control_variates, program, resume):
    """The runner's hook for ``program="auto"``: ``(model, program, note)`` to run instead of ``model``
    (:func:`auto_program`); a resumed run of it rebuilds the same blocked model; any other ``program`` (None
    included: the default single-block method) is returned as it is, with note None."""
    auto = isinstance(program, str) and program == "auto"
    if isinstance(program, str) and not auto:
        raise ConfigError(f"program must be an inference program (tm.Cycle of blocks) or 'auto'; got {program!r}")
    if resume is not None and (program is None or auto) and test is None and resume.resume_info.get("program") \
            and not callable(getattr(model, "site_log_prior", None)):
        # resuming a run of the automatic program on the model it was built from: the same blocked model again
        # (its construction is deterministic); the program itself comes from the checkpoint
        got = auto_program(model, data)
        return (got[0], None, None) if got is not None else (model, None, None)
    if not auto:
        if program is None and resume is None and AUTO_DEFAULT and all(x is None for x in (test, proposal,
                                                                                           control_variates)):
            return _default_blocks(model, data)
        return model, program, None
    if any(x is not None for x in (test, proposal, control_variates)):
        raise ConfigError("program='auto' builds its blocks with their own tests and proposals: pass no test, "
                          "proposal or control_variates")
    got = auto_program(model, data)
    if got is None:
        raise ConfigError("program='auto': the model has no group-level structure to block (no parameter that "
                          "the data do not touch given the others); leave program out for the default method")
    return got
