"""The set-up passes on hierarchical geometry: the mode search on a centred hierarchical model, the
positive-definite fallback covariance, and the PyMC log-sigma regression."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh import setup_passes as setup

G = 8  # groups


def _centred_poisson(n, mu, tau, seed):
    """A centred hierarchical Poisson regression as a flat-vector tm.Model:
    theta = (mu, log tau, alpha_1..G, beta); mu ~ N(0, 1), tau ~ HalfNormal(1) (with the log-Jacobian),
    alpha_g ~ N(mu, tau), beta ~ N(0, 1), y_i ~ Poisson(exp(alpha[g_i] + x_i beta))."""
    rng = np.random.default_rng(seed)
    alpha = mu + tau * rng.standard_normal(G)
    g = rng.integers(0, G, n).astype(np.int32)
    x = rng.standard_normal(n)
    y = rng.poisson(np.exp(alpha[g] + 0.3 * x)).astype(float)

    def log_prior(t):
        m, s, a, b = t[0], t[1], t[2:2 + G], t[2 + G]
        tau_ = jnp.exp(s)
        return (-0.5 * m**2 - 0.5 * tau_**2 + s  # N(0,1), HalfNormal(1) and the log-Jacobian of exp
                - G * s - 0.5 * jnp.sum((a - m) ** 2) / tau_**2 - 0.5 * b**2)

    def log_lik(t, batch):
        eta = t[2:2 + G][batch["g"]] + t[2 + G] * batch["x"]
        return batch["y"] * eta - jnp.exp(eta)

    def init(data):  # the prior's centre, as a user (or a front end's prior median) would start
        return jnp.zeros(3 + G).at[1].set(np.log(0.67)) + 0.1 * jnp.asarray(rng.standard_normal(3 + G))

    model = tm.Model(log_prior, log_lik, init=init, name="centred hierarchical Poisson")
    return model, {"g": g, "x": x, "y": y}


def _log_post_np(data):
    gi, x, y = data["g"], data["x"], data["y"]

    def f(t):
        m, s, a, b = t[0], t[1], t[2:2 + G], t[2 + G]
        eta = a[gi] + b * x
        lp = -0.5 * m**2 - 0.5 * np.exp(2 * s) + s - G * s - 0.5 * np.sum((a - m) ** 2) * np.exp(-2 * s) - 0.5 * b**2
        return lp + np.sum(y * eta - np.exp(eta))

    return f


def _scipy_mode(model, data, start):
    from scipy.optimize import minimize

    f = _log_post_np(data)
    with enable_x64(True):
        jd = jax.tree_util.tree_map(jnp.asarray, data)
        grad = jax.jit(jax.grad(lambda t: model.log_prior(t) + jnp.sum(model.log_lik(t, jd))))
        res = minimize(lambda t: -f(t), np.asarray(start, float), jac=lambda t: -np.asarray(grad(jnp.asarray(t))),
                       method="L-BFGS-B", options={"maxiter": 5000, "gtol": 1e-9, "ftol": 1e-15})
    return res.x


def test_mode_search_finds_the_mode_of_a_centred_hierarchical_model():
    """Newton from the prior's centre first overshoots log tau far down the funnel, where the log posterior
    is not concave; the eigenvalue-modified steps climb back to the mode scipy finds on the same log
    density (to 0.01 posterior sd), where the Laplace covariance exists. (With the Levenberg shift that was
    used before, the search ended in the funnel with an indefinite Hessian.)"""
    with enable_x64(True):
        model, data = _centred_poisson(4000, 0.5, 0.2, seed=0)
        jd = jax.tree_util.tree_map(jnp.asarray, data)
        flat0, unravel = ravel_pytree(model.init(jd))
        found = setup.mode_search(model, jd, 4000, unravel, flat0)
        sums = cvm.state_at_mode(found) or cvm.proxy_sums(model, jd, 4000, unravel, found.center, 2)
        cov = setup.laplace_cov(model, unravel, sums)
        assert cov is not None, "the search ended where the Hessian is not negative definite"
        want = _scipy_mode(model, data, found.center)
        sd = np.sqrt(np.diag(np.asarray(cov)))
        assert np.max(np.abs(np.asarray(found.center) - want) / sd) < 0.01
        assert abs(float(found.center[1]) - np.log(0.2)) < 1.0  # the interior mode, not the funnel's tip


def test_positive_part_is_the_matrix_when_positive_definite_and_positive_definite_otherwise():
    rng = np.random.default_rng(0)
    q = np.linalg.qr(rng.standard_normal((5, 5)))[0]
    scale = np.diag([1.0, 10.0, 100.0, 1e3, 1e4])
    pd = scale @ (q * np.array([1.0, 2.0, 3.0, 4.0, 5.0])) @ q.T @ scale
    np.testing.assert_allclose(setup.positive_part(pd), pd, rtol=1e-8, atol=1e-8 * np.abs(pd).max())
    indef = scale @ (q * np.array([-3.0, 2.0, 3.0, 4.0, 5.0])) @ q.T @ scale
    with pytest.raises(np.linalg.LinAlgError):  # negative control: the matrix itself is not PD
        np.linalg.cholesky(indef)
    m = setup.positive_part(indef)
    np.linalg.cholesky(m)
    # an ascent direction: the modified step has a positive inner product with the gradient
    g = rng.standard_normal(5)
    assert g @ setup.modified_newton_step(indef, g) > 0


def test_fallback_covariance_is_positive_definite_where_there_is_no_mode():
    """Where the search ends at a point that is not a mode (here: a point down the funnel, with the sums
    made there), start_cov gives a positive-definite covariance from the positive part of the negative
    Hessian (flagged as not Laplace); at the mode it is the Laplace covariance."""
    with enable_x64(True):
        model, data = _centred_poisson(4000, 0.5, 0.2, seed=0)
        jd = jax.tree_util.tree_map(jnp.asarray, data)
        flat0, unravel = ravel_pytree(model.init(jd))
        found = setup.mode_search(model, jd, 4000, unravel, flat0)
        at_mode = cvm.proxy_sums(model, jd, 4000, unravel, found.center, 2)
        cov, laplace = setup.start_cov(model, unravel, at_mode)
        assert laplace
        np.testing.assert_allclose(cov, setup.laplace_cov(model, unravel, at_mode))
        funnel = found.center.at[1].set(-4.0)  # tau = 0.018, with the alphas at their mode: not concave
        sums = cvm.proxy_sums(model, jd, 4000, unravel, funnel, 2)
        assert setup.laplace_cov(model, unravel, sums) is None  # negative control: no Laplace covariance
        cov, laplace = setup.start_cov(model, unravel, sums)
        assert not laplace
        np.linalg.cholesky(np.asarray(cov))


@pytest.mark.filterwarnings("ignore::tallmh.errors.TrustWarning")  # a short run: only the start is checked
def test_default_run_on_the_centred_model_starts_dispersed_from_the_mode():
    """tm.sample with defaults on the centred model: no note about a failed mode search, chains dispersed."""
    model, data = _centred_poisson(4000, 0.5, 0.2, seed=0)
    res = tm.sample(model, data, num_samples=200, num_warmup=200, num_chains=2, seed=0, progress=False)
    assert not any("not negative definite" in n or "same point" in n for n in res.notes), res.notes
    first = res.flat_warmup[:, 0]
    assert not np.allclose(first[0], first[1])


def test_pymc_log_sigma_regression_mode():
    """A PyMC linear regression with sigma ~ HalfNormal (moved as log sigma): from the zero start the
    search reaches the mode that scipy finds on the same log density, within 0.01 posterior sd, with a
    Laplace covariance. (The Levenberg-shifted search stopped after 60 passes far from it at this N.)"""
    pm = pytest.importorskip("pymc")
    from scipy.optimize import minimize

    n = 2000
    rng = np.random.default_rng(2)
    x = rng.normal(size=n)
    y = 1.0 + 2.0 * x + 0.5 * rng.normal(size=n)
    with pm.Model() as m:
        xd = pm.Data("x", x)
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5)
        s = pm.HalfNormal("sigma", 1)
        pm.Normal("y", a + b * xd, s, observed=y)
    model, data = tm.from_pymc(m)
    jd = jax.tree_util.tree_map(jnp.asarray, data)
    flat0, unravel = ravel_pytree(model.init(jd))
    found = setup.mode_search(model, jd, n, unravel, flat0)
    sums = cvm.state_at_mode(found) or cvm.proxy_sums(model, jd, n, unravel, found.center, 2)
    cov = setup.laplace_cov(model, unravel, sums)
    assert cov is not None

    def neg_log_post(t):  # N(0, 5) priors, HalfNormal(1) on sigma = exp(u) with its log-Jacobian u
        a_, b_, u = t
        r = y - a_ - b_ * x
        return -(-(a_**2 + b_**2) / 50 - 0.5 * np.exp(2 * u) + u - 0.5 * np.sum(r**2) * np.exp(-2 * u) - n * u)

    want = minimize(neg_log_post, np.zeros(3), method="BFGS", options={"gtol": 1e-8}).x
    sd = np.sqrt(np.diag(np.asarray(cov, np.float64)))
    assert np.max(np.abs(np.asarray(found.center, np.float64) - want) / sd) < 0.01


def _newton_from_2(log_lik):
    """``_newton`` from theta = 2 on ten items y_i = 0 with ``log_lik`` and a N(0, 100^2) prior (float64)."""
    model = tm.Model(log_prior=lambda t: -0.5 * (t["a"] / 100.0) ** 2, log_lik=log_lik)
    flat0, unravel = ravel_pytree({"a": jnp.asarray(2.0)})
    return setup._newton(model, {"y": jnp.zeros(10)}, 10, unravel, flat0, 30, 1e-10)


def test_unchecked_newton_step_that_loses_falls_back_to_the_line_search():
    """A full Newton step taken without a line search is checked by the next pass; where it lowers the log
    posterior (here it overshoots from 2 to -8 on ell_i = -sqrt(1 + theta^2)), the search goes back and
    halves along it, and still ends at the mode (0). A quadratic log-likelihood is the contrast: its full step
    is right, so no line-search pass is made at all."""
    with enable_x64(True):
        th, passes, _ = _newton_from_2(lambda t, b: -jnp.sqrt(1.0 + (t["a"] - b["y"]) ** 2))
        assert abs(float(th[0])) < 1e-4, th
        th_q, passes_q, _ = _newton_from_2(lambda t, b: -0.5 * (t["a"] - b["y"]) ** 2)
        assert abs(float(th_q[0])) < 1e-4 and passes_q == 2, (th_q, passes_q)  # the step, then its check
        assert passes > passes_q + 2, passes  # the failed check and the line search's halvings


def test_unchecked_steps_below_the_values_rounding_are_checked_by_their_decrement():
    """A log posterior whose value is too large for its rounding to show a small gain (a constant -1e6 per
    item): a Newton step there is checked by the next pass's decrement, not by a line-search pass. On a
    quadratic the step lands on the mode (2 passes, not 3); on a pseudo-Huber it overshoots, the decrement
    grows, and the line search takes over and still finds the mode."""
    with enable_x64(True):
        big = 1e6  # |log posterior| ~ 1e7: its rounding margin (~10) exceeds the gains below
        th_q, passes_q, _ = _newton_from_2(lambda t, b: -0.5 * (t["a"] - b["y"]) ** 2 - big)
        assert abs(float(th_q[0])) < 1e-4 and passes_q == 2, (th_q, passes_q)
        th, passes, _ = _newton_from_2(lambda t, b: -jnp.sqrt(1.0 + (t["a"] - b["y"]) ** 2) - big)
        assert abs(float(th[0])) < 1e-4, th
        # the overshoot is rejected as where the value can show it: the same passes as without the offset (a
        # step kept unchecked there went on from -8 and took 13 passes)
        _, passes_v, _ = _newton_from_2(lambda t, b: -jnp.sqrt(1.0 + (t["a"] - b["y"]) ** 2))
        assert passes == passes_v > passes_q + 2, (passes, passes_v)


def test_warm_start_rows_gathered_on_the_host_are_the_rows():
    """The warm start's rows by NumPy indexing equal a compiled gather's, for the user's array read in place
    (a pytree node whose child is the flat buffer: indexing that instead of the rows would be wrong)."""
    import jax
    from tallmh.storage.data import take, validate_data
    from tallmh.storage.datasource import InPlaceArray

    rng = np.random.default_rng(0)
    n, d = 10**6, 11  # 44 MB: above the size below which tallmh copies instead
    raw = np.empty(n * d + 16, np.float32)
    k = next(i for i in range(1, 16) if raw[i:].ctypes.data % 64)  # not 64-byte aligned: read in place
    X = raw[k:k + n * d].reshape(n, d)
    X[:] = rng.standard_normal((n, d))
    data = validate_data({"X": X, "y": (X[:, 0] > 0).astype(np.float32)}, in_place=True)
    if not isinstance(data["X"], InPlaceArray):
        pytest.skip("the CPU backend did not alias this array here")
    idx = setup.warm_rows(10**6)
    got = setup._gather_rows(data, idx)
    want = jax.jit(take)(data, jnp.asarray(idx))
    for k in ("X", "y"):
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))
        np.testing.assert_array_equal(np.asarray(got[k]), {"X": X, "y": (X[:, 0] > 0)}[k][idx])


def test_a_mode_search_failing_without_a_message_starts_at_init(monkeypatch):
    """A model Newton cannot handle falls back to the model's init with a note naming the error, also when
    the error has no message (NumPyro's bare assertions)."""
    def fail(*a, **k):
        raise AssertionError()

    monkeypatch.setattr(setup, "mode_search", fail)
    rng = np.random.default_rng(1)
    model = tm.Model(lambda t: -0.5 * jnp.sum(t**2), lambda t, b: -0.5 * (b["y"] - t[0]) ** 2,
                     init=lambda data: jnp.zeros(1), name="normal mean")
    res = tm.sample(model, {"y": rng.standard_normal(200)}, num_samples=50, num_warmup=50, num_chains=2, seed=0,
                    progress=False)
    assert any("posterior mode not found (AssertionError: AssertionError)" in n for n in res.notes), res.notes
    assert np.all(np.isfinite(res.flat_samples)) and res.flat_samples.shape[:2] == (2, 50)
