"""Float headroom in the confidence test's range bounds of every built-in model.

``Confidence`` needs ``C >= max_i |l_i|`` for the *computed* ``l_i`` (or the control-variate remainders
``l~_i``), which in float32 carry rounding far above their exact values near the centre. For
``VariableSelection`` and ``ICA`` (the other built-in models are covered in
``tests/acceptance/test_confidence_ranges.py``), on random pairs from tiny steps to large ones, with and
without control variates of order 1 and 2, every bound must cover the largest computed ``|l_i|`` over all
N items. Negative control: the analytic bounds without the headroom are exceeded. A completeness check
makes every model of ``tallmh.models`` that provides a bound appear in one of the two files.
"""

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from jax.scipy.linalg import expm

import tallmh as tm
import tallmh.control_variates as cvm
from tallmh.kernel import make_problem

N = 20_000
SCALES = (1e-9, 1e-8, 1e-7, 1e-5, 1e-3, 1e-1)  # steps of a few ulps to large ones


def _selection():
    data, beta = tm.models.LogisticRegression.simulate(N, d=5, seed=0)
    beta = beta.astype(np.float32)
    gamma = np.ones_like(beta)
    beta[3], gamma[3] = 0.0, 0.0  # one feature out of the model
    model = tm.models.VariableSelection(nu_shape=1.0, nu_scale=1.0)
    return model, data, {"beta": beta, "gamma": gamma}


def _ica():
    data, info = tm.models.ICA.simulate(N, seed=0)
    w0 = np.asarray(info["W0"], float)
    u, _, vt = np.linalg.svd(w0)
    w = (u @ vt).astype(np.float32)  # the nearest orthogonal matrix
    return tm.models.ICA(), data, w


def _pairs(model_name, center, count=24, seed=0, offset=0.01, step_scales=SCALES):
    """(theta, theta') pairs near ``center`` with step sizes from 1e-7 to 1e-1 (flat float32 vectors)."""
    rng = np.random.default_rng(seed)
    flat, unravel = ravel_pytree(jax.tree_util.tree_map(jnp.asarray, center))
    scales = np.array(step_scales)[np.arange(count) % len(step_scales)]
    ths, thps = [], []
    for s in scales:
        if model_name == "ica":  # stay on the orthogonal matrices: W exp(A) with A skew-symmetric
            w = np.asarray(center, np.float64)
            d = w.shape[0]

            def rot(scale):
                a = scale * rng.standard_normal((d, d))
                return np.asarray(expm(jnp.asarray(a - a.T, jnp.float32)), np.float64)

            th = w @ rot(offset)
            thp = th @ rot(s)
            ths.append(th.ravel())
            thps.append(thp.ravel())
        else:
            c = np.asarray(flat, np.float64)
            d = c.shape[0] // 2
            on = c[d:] > 0.5
            th = c.copy()
            th[:d] += np.where(on, offset * rng.standard_normal(d), 0.0)
            thp = th.copy()
            thp[:d] += np.where(on, s * rng.standard_normal(d), 0.0)
            ths.append(th)
            thps.append(thp)
    return np.array(ths, np.float32), np.array(thps, np.float32), flat, unravel


def _max_l_and_bound(model, data, flat_center, unravel, order, pairs):
    """Largest computed |l_i| (or |l~_i|) over all N items, and the model's bound, per pair (float32)."""
    data = jax.tree_util.tree_map(jnp.asarray, data)
    stats = model.setup(data)
    cv = None
    if order is not None:
        cv = cvm.proxy_sums(model, data, N, unravel, jnp.asarray(flat_center), order)

    @jax.jit
    def one(th, thp):
        p = make_problem(model, data, N, unravel, stats, th, thp, jnp.float32(0.0), None, cv, order or 2)
        return jnp.max(jnp.abs(p.lik_ratio(jnp.arange(N)))), p.bound()

    out = [one(jnp.asarray(a), jnp.asarray(b)) for a, b in zip(*pairs)]
    return np.array([float(o[0]) for o in out]), np.array([float(o[1]) for o in out])


CASES = [("selection", None), ("selection", 1), ("selection", 2), ("ica", None)]


def _setting(name):
    return _selection() if name == "selection" else _ica()


@pytest.mark.parametrize("name,order", CASES)
def test_bound_covers_computed_ratios(name, order):
    model, data, center = _setting(name)
    near = _pairs(name, center, offset=1e-4)  # near the centre: the remainders are mostly rounding
    ml0, b0 = _max_l_and_bound(model, data, near[2], near[3], order, near[:2])
    assert np.all(np.isfinite(b0)) and np.all(ml0 <= b0), (ml0, b0)
    th, thp, flat, unravel = _pairs(name, center)
    ml, b = _max_l_and_bound(model, data, flat, unravel, order, (th, thp))
    assert np.all(np.isfinite(b)) and np.all(ml <= b), (ml, b)
    # not vacuous: on the large steps the analytic part is what counts
    big = np.arange(len(ml)) % len(SCALES) == len(SCALES) - 1
    tight = {None: 0.05, 1: 0.005, 2: 1e-4}[order]
    assert np.max(ml[big] / b[big]) > tight, ml / b


@pytest.mark.parametrize("name,order", [("selection", 2), ("selection", None), ("ica", None)])
def test_negative_control_bound_without_headroom_is_exceeded(name, order, monkeypatch):
    # Without the rounding term, the computed l_i of steps of a few ulps (and the order-2 remainders near
    # the centre: 3e-7 against an analytic bound of 1e-11 to 1e-9 here) exceed the analytic bound.
    model, data, center = _setting(name)
    tiny = (1e-9, 3e-9, 1e-8, 3e-8) if order is None else SCALES[2:]
    th, thp, flat, unravel = _pairs(name, center, offset=1e-4, step_scales=tiny)
    mod = __import__(type(model).__module__, fromlist=["rounding_headroom"])
    monkeypatch.setattr(mod, "rounding_headroom", lambda c, magnitude, ops=8.0: jnp.asarray(c))
    ml, b = _max_l_and_bound(model, data, flat, unravel, order, (th, thp))
    assert np.any(ml > b), (ml, b)


def test_every_builtin_bound_is_checked():
    # every model in tallmh.models with a range bound has a float32 check here or in the acceptance file
    covered = {"VariableSelection", "ICA",  # this file
               "GaussianMean", "Gaussian", "GaussianMixture", "LogisticRegression", "LinearRegression"}
    with_bounds = {name for name, cls in inspect.getmembers(tm.models, inspect.isclass)
                   if callable(getattr(cls, "lik_ratio_bound", None))
                   or callable(getattr(cls, "cv_remainder_bound", None))}
    assert with_bounds - covered == set(), with_bounds - covered
    for name in with_bounds:  # and each adds the rounding term
        src = inspect.getsource(inspect.getmodule(getattr(tm.models, name)))
        assert "rounding_headroom(" in src, name
