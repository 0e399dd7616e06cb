"""Full-data sums in float32 keep their digits: the exact test's Delta against float64 NumPy.

JAX runs in float32 here (no x64). The reference is the float64 evaluation of the same model on the same
float32 data and parameters. What a float32 computation cannot avoid is the rounding of each item's own
log-likelihood (random, about ``sqrt(N) eps |log p|`` in all); the sums themselves must add nothing to
it. Negative control: the former computation (one float32 running mean of log p, times N, minus the
stored float32 full log-likelihood) is off by orders of magnitude more at the same N.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.acceptance.base import CompSum, Moments, Problem, StreamReader, df_add, df_sum
from tallmh.storage.data import take

N7 = 10_000_000


def test_df_sum_is_exactly_rounded_where_a_float32_sum_is_not():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 1000, 4097, 300_001):
        v = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n) - 1.4).astype(np.float32)
        hi, lo = jax.jit(df_sum)(jnp.asarray(v))
        ref = np.sum(v.astype(np.float64))
        got = float(hi) + float(lo)
        assert abs(got - ref) <= 1e-12 * np.sum(np.abs(v.astype(np.float64))) + 1e-30, (n, got, ref)
    # negative control: a plain float32 sum of the last vector is off by far more
    assert abs(float(jnp.sum(jnp.asarray(v))) - ref) > 1e3 * abs(got - ref)
    # 2-D: along an axis; and double-float addition
    m = rng.standard_normal((777, 3)).astype(np.float32)
    hi, lo = df_sum(jnp.asarray(m), axis=0)
    np.testing.assert_allclose(np.asarray(hi, float) + np.asarray(lo, float), m.astype(float).sum(0), rtol=0, atol=1e-9)
    s = df_add((jnp.float32(1e8), jnp.float32(0.0)), (jnp.float32(1.0), jnp.float32(0.0)))
    assert float(s[0]) + float(s[1]) == 1e8 + 1


def test_df_reduce_keeps_the_digits_a_float32_sum_loses():
    from tallmh.acceptance.base import df_reduce

    rng = np.random.default_rng(3)
    f = jax.jit(lambda v: df_reduce(v, jnp.isfinite(v), ~jnp.isfinite(v)))
    for n in (1, 2, 4097, 65_536, 300_001):
        v = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 4, n) - 1.4).astype(np.float32)
        hi, lo, t, bad = f(jnp.asarray(v))
        ref = np.sum(v.astype(np.float64))
        got = float(hi) + float(lo)
        assert abs(got - ref) <= 1e-12 * np.sum(np.abs(v.astype(np.float64))) + 1e-30, (n, got, ref)
        assert int(t) == n and int(bad) == 0
    # negative control: a plain float32 sum of the last vector is off by far more
    assert abs(float(jnp.sum(jnp.asarray(v))) - ref) > 1e3 * abs(got - ref)


def _gauss_data():
    rng = np.random.default_rng(1)
    x = (3.0 + rng.standard_normal(N7)).astype(np.float32)
    return tm.models.GaussianMean(), {"x": x}


def _linear_data():
    rng = np.random.default_rng(2)
    X = rng.standard_normal((N7, 3)).astype(np.float32)
    y = (X @ np.array([1.0, -2.0, 0.5]) + rng.standard_normal(N7)).astype(np.float32)
    return tm.models.LinearRegression(), {"X": X, "y": y}


def _ll64(model, data, theta):
    """float64 sum of log p(x_i|theta) on the same float32 data, in chunks."""
    th = np.asarray(theta, np.float64)
    tot = 0.0
    if isinstance(model, tm.models.GaussianMean):
        x = data["x"]
        for s in range(0, x.shape[0], 1 << 21):
            z = (x[s:s + (1 << 21)].astype(np.float64) - th[0]) / model.sigma
            tot += np.sum(-0.5 * z * z - np.log(model.sigma) - 0.5 * np.log(2 * np.pi))
        return tot
    X, y = data["X"], data["y"]
    for s in range(0, y.shape[0], 1 << 20):
        r = y[s:s + (1 << 20)].astype(np.float64) - X[s:s + (1 << 20)].astype(np.float64) @ th
        tot += np.sum(-0.5 * (r / model.noise_sd) ** 2 - np.log(model.noise_sd) - 0.5 * np.log(2 * np.pi))
    return tot


def _deltas(model, data, theta, theta_p):
    """(tracked Delta, per-item Delta, former float32 Delta) from the Exact test, as float64 numbers."""
    n = tm.data.num_items(data)
    jdata = jax.tree_util.tree_map(jnp.asarray, data)
    test = tm.acceptance.Exact()

    @jax.jit
    def run(th, thp, jdata):  # data as an argument, not a closure constant
        def ll(t):
            return lambda idx: model.log_lik(t, take(jdata, idx))

        cur = test.initial_log_lik(n, ll(th), jnp.float32)

        def prob(current):
            return Problem(n, jnp.float32(0.0), lambda idx: ll(thp)(idx) - ll(th)(idx), ll(thp), None, current)

        tracked, _, read, bad = test.log_ratio(prob(cur))
        per_item, _, _, _ = test.log_ratio(prob(None))
        # the former computation: float32 running means times N, then a difference of two ~-N numbers
        old = StreamReader(n, 4096, ll(th), permuted=False).advance(None, Moments.zero(jnp.float32), n)
        new = StreamReader(n, 4096, ll(thp), permuted=False).advance(None, Moments.zero(jnp.float32), n)
        former = new.mean * n - old.mean * n
        return tracked, per_item, former, read, bad

    tracked, per_item, former, read, bad = run(jnp.asarray(theta, jnp.float32), jnp.asarray(theta_p, jnp.float32),
                                               jdata)
    assert int(read) == n and int(bad) == 0
    f = lambda p: float(p[0]) + float(p[1])  # noqa: E731
    return f(tracked), f(per_item), float(former)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["gaussian-mean", "linear-regression"])
def test_delta_matches_float64_at_1e7(which):
    model, data = _gauss_data() if which == "gaussian-mean" else _linear_data()
    if which == "gaussian-mean":
        theta = np.array([3.0002], np.float32)
        theta_p = np.array([2.9998], np.float32)
    else:
        theta = np.array([1.0002, -2.0001, 0.4999], np.float32)
        theta_p = np.array([0.9999, -1.9998, 0.5002], np.float32)
    ref = _ll64(model, data, theta_p) - _ll64(model, data, theta)
    tracked, per_item, former = _deltas(model, data, theta, theta_p)
    # What is left is the float32 rounding of each item's log p (sd about sqrt(2 N) * 1e-7 = 4.5e-4 for
    # these models, measured in benchmarks/precision.py), not of the sums.
    assert abs(tracked - ref) < 2e-3, (tracked, ref)
    assert abs(per_item - ref) < 2e-3, (per_item, ref)
    # negative control: the former float32 computation is off by far more
    assert abs(former - ref) > 0.05, (former, ref)


def test_initial_log_lik_marks_points_outside_the_support():
    x = jnp.asarray(np.linspace(0.0, 1.0, 5000, dtype=np.float32))
    test = tm.acceptance.Exact()
    ll = test.initial_log_lik(5000, lambda idx: jnp.log(0.9 - x[idx]), jnp.float32)  # NaN / -inf above 0.9
    assert ll.shape == (2,) and float(ll[0]) == -np.inf
    ok = test.initial_log_lik(5000, lambda idx: -x[idx], jnp.float32)
    assert abs(float(ok[0]) + float(ok[1]) + float(np.sum(np.linspace(0.0, 1.0, 5000)))) < 1e-4


def test_proxy_sums_and_proxy_sum_diff_match_float64():
    from jax.flatten_util import ravel_pytree

    import tallmh.control_variates as cvm

    n = 1_000_000
    model, data = _linear_data()
    data = {k: v[:n] for k, v in data.items()}
    center = jnp.asarray([1.0, -2.0, 0.5], jnp.float32)
    _, unravel = ravel_pytree(center)
    st = cvm.proxy_sums(model, jax.tree_util.tree_map(jnp.asarray, data), n, unravel, center, 2)
    X, y = data["X"].astype(np.float64), data["y"].astype(np.float64)
    r = y - X @ np.asarray(center, np.float64)
    G, H = X.T @ r, -X.T @ X
    # G is a sum of 10^6 terms of size ~1 that nearly cancel: the float64 accumulation of chunk sums
    # keeps it to ~1e-7 of sum_i |g_i|
    scale = np.abs(X * r[:, None]).sum(0)
    assert np.all(np.abs(np.asarray(st.grad_sum, float) - G) < 1e-6 * scale), (st.grad_sum, G)
    np.testing.assert_allclose(np.asarray(st.hess_sum, float), H, rtol=1e-5)
    a = np.array([3e-4, -1e-3, 2e-4], np.float32)
    ap = np.array([-1e-3, 5e-4, 7e-4], np.float32)
    got = float(cvm.proxy_sum_diff(st, center + a, center + ap, 2))
    a64, ap64 = a.astype(float), ap.astype(float)
    want = G @ (ap64 - a64) + 0.5 * (ap64 @ H @ ap64 - a64 @ H @ a64)
    assert abs(got - want) < 1e-3 * max(1.0, abs(want)) + 1e-6 * scale @ np.abs(ap64 - a64), (got, want)


def test_comp_sum_reader_counts_and_stops_on_nonfinite():
    v = jnp.asarray(np.r_[np.ones(5000), [np.nan], np.ones(20000)].astype(np.float32))
    rd = StreamReader(25001, 1000, lambda idx: v[idx], permuted=False, stop_on_nonfinite=True)
    acc = rd.advance(None, CompSum.zero(jnp.float32), 25001)
    assert int(acc.nonfinite) == 1 and int(acc.read) == 16000  # stopped at the end of its chunk (ladder 1000, 16000)
    rd = StreamReader(25001, 1000, lambda idx: v[idx], permuted=False)
    acc = rd.advance(None, CompSum.zero(jnp.float32), 25001)
    assert int(acc.nonfinite) == 1 and int(acc.read) == 25001 and float(acc.value()) == 25000.0
