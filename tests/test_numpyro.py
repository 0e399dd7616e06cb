"""The NumPyro front end (tm.from_numpyro): log density, posteriors against NUTS, construction checks.

Paper: Chen, Mansinghka & Ghahramani, sublinear MH for probabilistic programs, Sec. 3.1-3.2 (global /
local partition of the scaffold, eqs. 5-6); here the local sections are the entries of the data plate.
"""

import os

import numpy as np
import pytest
from scipy import stats

numpyro = pytest.importorskip("numpyro")

import arviz as az  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.infer.util import potential_energy  # noqa: E402

import tallmh as tm  # noqa: E402
from tallmh.errors import ModelError  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# models


def regression(X, y):
    """Linear regression with a constrained noise scale (HalfNormal) and a Beta-distributed weight."""
    w = numpyro.sample("w", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    rho = numpyro.sample("rho", dist.Beta(2.0, 2.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("obs", dist.Normal(X @ w * rho, sigma), obs=y)


def linreg(X, y):
    """Linear regression with a constrained noise scale (an identified model for the posterior tests)."""
    w = numpyro.sample("w", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("obs", dist.Normal(X @ w, sigma), obs=y)


def regression_subsample(X, y, N, batch=10):
    """The same written HMCECS-style: a subsampled plate whose indices pick the rows."""
    w = numpyro.sample("w", dist.Normal(0.0, 2.0).expand([X.shape[1]]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    rho = numpyro.sample("rho", dist.Beta(2.0, 2.0))
    with numpyro.plate("data", N, subsample_size=batch) as idx:
        numpyro.sample("obs", dist.Normal(X[idx] @ w * rho, sigma), obs=y[idx])


def scaled_and_simplex(X, y):
    """A simplex (Dirichlet) global, a LogNormal scale, and the user's own handlers.scale on the data."""
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(3)))
    s = numpyro.sample("s", dist.LogNormal(0.0, 1.0))
    with numpyro.plate("data", X.shape[0]), handlers.scale(scale=0.5):
        numpyro.sample("obs", dist.Normal(X @ p, s), obs=y)


def mixture(y):
    """Two-component Gaussian mixture with per-item assignments z_i (enumerated)."""
    w = numpyro.sample("w", dist.Beta(2.0, 2.0))
    mu = numpyro.sample("mu", dist.Normal(jnp.array([-2.0, 2.0]), 1.0).to_event(1))  # no label switching
    with numpyro.plate("data", y.shape[0]):
        z = numpyro.sample("z", dist.Bernoulli(w))
        numpyro.sample("obs", dist.Normal(mu[z], 1.0), obs=y)


def mixture_marginal(y):
    """The same mixture with z summed out by hand (the NUTS reference; funsor is not needed)."""
    w = numpyro.sample("w", dist.Beta(2.0, 2.0))
    mu = numpyro.sample("mu", dist.Normal(jnp.array([-2.0, 2.0]), 1.0).to_event(1))  # no label switching
    mix = dist.MixtureSameFamily(dist.Categorical(probs=jnp.stack([1 - w, w])), dist.Normal(mu, 1.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("obs", mix, obs=y)


def hierarchical(g, y, G):
    """Hierarchical intercepts: a groups plate outside the data plate, a HalfNormal group scale."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    with numpyro.plate("groups", G):
        alpha = numpyro.sample("alpha", dist.Normal(mu, tau))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("obs", dist.Normal(alpha[g], sigma), obs=y)


def regression_data(n=120, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 2)).astype(np.float32)
    y = (X @ np.array([1.0, -0.5]) + 0.5 * rng.standard_normal(n)).astype(np.float32)
    return X, y


def unconstrained_points(model, k=3, seed=0):
    rng = np.random.default_rng(seed)
    th0 = model.init()
    return [jax.tree_util.tree_map(lambda a: a + 0.5 * jnp.asarray(rng.standard_normal(np.shape(a)), a.dtype), th0)
            for _ in range(k)]


# ---------------------------------------------------------------------------------------------------
# log density


@pytest.mark.slow
@pytest.mark.parametrize("name", ["regression", "subsample", "scaled_simplex"])
def test_log_density_equals_numpyro_potential_energy(name):
    X, y = regression_data()
    if name == "regression":
        fn, args, kwargs = regression, (X, y), {}
    elif name == "subsample":
        fn, args, kwargs = regression_subsample, (X, y, X.shape[0]), {}
    else:
        fn, args, kwargs = scaled_and_simplex, (np.abs(X) @ np.ones((2, 3), np.float32) / 2, y), {}
    model, data = tm.from_numpyro(fn, *args, **kwargs)
    assert set(data) == {"X", "y"}
    ref_model = fn
    if name == "subsample":  # NumPyro's own density of the full data (no subsample)
        def ref_model(X, y, N, batch=10):
            return regression_subsample(X, y, N, batch=N)
    for th in unconstrained_points(model):
        ours = float(model.log_prior(th) + jnp.sum(model.log_lik(th, data)))
        ref = -float(potential_energy(ref_model, args, kwargs, th))
        assert np.isclose(ours, ref, rtol=1e-5, atol=1e-3), (ours, ref)
    if name == "scaled_simplex":
        assert model.init()["p"].shape == (2,)  # a simplex of 3 has 2 unconstrained coordinates


def test_log_lik_is_per_item_and_unscaled():
    X, y = regression_data(50)
    model, data = tm.from_numpyro(regression_subsample, X, y, 50, batch=7)
    th = model.init()
    ll = np.asarray(model.log_lik(th, {k: v[:5] for k, v in data.items()}))
    c = model.constrain(th)
    mean = X[:5] @ np.asarray(c["w"]) * float(c["rho"])
    expect = stats.norm.logpdf(y[:5], mean, float(c["sigma"]))
    np.testing.assert_allclose(ll, expect, rtol=1e-5, atol=1e-5)


def _runs_in_two_threads(model, thetas, batch):
    """``model.log_lik`` (its Python body, not the compiled one) at each theta, each in its own thread,
    started 50 ms apart; returns the values and the errors by thread."""
    import threading
    import time

    out, errors = {}, {}

    def one(i):
        try:
            out[i] = np.asarray(model._item_log_lik(thetas[i], batch))
        except Exception as e:  # noqa: BLE001 - reported to the test
            errors[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(thetas))]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    return out, errors


def test_model_runs_in_two_threads_at_once_keep_their_own_values(monkeypatch):
    """tallmh traces a model in two threads at once (the chain's program compiles beside the set-up's
    passes); NumPyro's handler stack is one list for all threads, so each run of the model holds a lock.
    The model sleeps between its two sites so that the runs overlap; negative control: without the lock,
    the runs see each other's handlers (a wrong value, or NumPyro's own error)."""
    import time

    import tallmh.frontends.numpyro_trace as nt

    pause = {"s": 0.0}

    def slow(y):
        a = numpyro.sample("a", dist.Normal(0.0, 1.0))
        time.sleep(pause["s"])
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Normal(a, 1.0), obs=y)

    y = np.linspace(-1.0, 1.0, 6).astype(np.float32)
    model, data = tm.from_numpyro(slow, y)
    thetas = [{"a": jnp.asarray(-1.0)}, {"a": jnp.asarray(2.0)}]
    expect = [stats.norm.logpdf(y, float(t["a"]), 1.0) for t in thetas]
    pause["s"] = 0.2
    out, errors = _runs_in_two_threads(model, thetas, data)
    assert not errors, errors
    for i in range(2):
        np.testing.assert_allclose(out[i], expect[i], rtol=1e-5)
    import contextlib

    monkeypatch.setattr(nt, "STACK_LOCK", contextlib.nullcontext())
    try:
        out, errors = _runs_in_two_threads(model, thetas, data)
    finally:
        numpyro.primitives._PYRO_STACK.clear()  # (whatever the broken runs left on the shared stack)
    assert errors or any(not np.allclose(out[i], expect[i], rtol=1e-5) for i in range(2))


@pytest.mark.slow
def test_enumerated_mixture_log_lik():
    rng = np.random.default_rng(1)
    y = np.concatenate([rng.normal(-2, 1, 30), rng.normal(2, 1, 20)]).astype(np.float32)
    model, data = tm.from_numpyro(mixture, y)
    assert model.enumerated_sites == ["z"] and sorted(model.global_sites) == ["mu", "w"]
    ref, _ = tm.from_numpyro(mixture_marginal, y)
    for th in unconstrained_points(model):
        np.testing.assert_allclose(model.log_lik(th, data), ref.log_lik(th, data), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.log_prior(th), ref.log_prior(th), rtol=1e-6)


def test_constrain_round_trip_and_names():
    X, y = regression_data()
    model, _ = tm.from_numpyro(regression, X, y)
    th = unconstrained_points(model, 1)[0]
    c = model.constrain(th)
    assert float(c["sigma"]) > 0 and 0 < float(c["rho"]) < 1
    back = model.unconstrain(c)
    for k in th:
        np.testing.assert_allclose(back[k], th[k], rtol=1e-5, atol=1e-5)


def _short_run(model, data, test, **kw):
    return tm.sample(model, data, test=test, proposal=tm.proposals.RandomWalk(0.05), num_samples=30,
                     num_warmup=10, num_chains=2, seed=0, init=model.init(), init_jitter=0.01, progress=False, **kw)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")  # 30-draw runs: not meant to be trusted
def test_sample_output_is_constrained_by_site_name():
    X, y = regression_data(300)
    model, data = tm.from_numpyro(regression, X, y)
    r = _short_run(model, data, tm.acceptance.Austerity(epsilon=0.05, batch_size=50))
    s = r.samples
    assert set(s) == {"w", "sigma", "rho"}
    assert s["w"].shape == (2, 30, 2) and np.all(s["sigma"] > 0) and np.all((s["rho"] > 0) & (s["rho"] < 1))
    assert list(r.summary().table.index) == ["rho", "sigma", "w[0]", "w[1]"]
    assert set(r.to_arviz().posterior.data_vars) == {"w", "sigma", "rho"}
    assert r.flat_samples.shape == (2, 30, 4) and np.mean(r.stats["n_data"]) < 300


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")  # 30-draw runs: not meant to be trusted
def test_a_loaded_run_keeps_the_constrained_view(tmp_path):
    """Saved and loaded, a NumPyro run still reports its sites by name on the constrained scale (sigma > 0,
    not log sigma under the name sigma); resumed, it goes on from the chains' own coordinates."""
    X, y = regression_data(300)
    model, data = tm.from_numpyro(linreg, X, y)
    r = _short_run(model, data, tm.acceptance.Exact())
    path = tmp_path / "run.npz"
    r.save(path)
    back = tm.load_result(path)
    assert set(back.samples) == {"w", "sigma"} and np.all(back.samples["sigma"] > 0)
    np.testing.assert_allclose(back.samples["sigma"], r.samples["sigma"], rtol=1e-6)
    assert list(back.summary().table.index) == list(r.summary().table.index)
    np.testing.assert_allclose(back.to_arviz().posterior["sigma"].values, r.samples["sigma"], rtol=1e-6)
    # the chains' coordinates are unconstrained (log sigma can be negative): the view is not them
    assert not np.allclose(back.flat_samples[..., back.param_names.index("sigma")], back.samples["sigma"])
    back.save(tmp_path / "again.npz")  # a loaded run saves its view again
    np.testing.assert_allclose(tm.load_result(tmp_path / "again.npz").samples["sigma"], r.samples["sigma"], rtol=1e-6)
    # draws streamed to disk are not pulled into memory for the view: the loaded run names its coordinates
    # as unconstrained instead of showing log sigma under the name sigma
    s = _short_run(model, data, tm.acceptance.Exact(), checkpoint=os.fspath(tmp_path / "streamed.npz"),
                   stream_draws=True)
    sb = tm.load_result(tmp_path / "streamed.npz")
    assert set(sb.samples) == {"unconstrained_w", "unconstrained_sigma"}
    np.testing.assert_array_equal(sb.samples["unconstrained_sigma"],
                                  np.asarray(s.flat_samples)[..., s.param_names.index("sigma")])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_every_test_and_control_variates_run():
    X, y = regression_data(300)
    model, data = tm.from_numpyro(regression, X, y)
    for test in (tm.acceptance.Exact(), tm.acceptance.Confidence(delta=0.1, initial_batch=50),
                 tm.acceptance.Barker(batch_size=100), tm.acceptance.Informed(subset_size=50)):
        r = _short_run(model, data, test)
        assert np.all(np.isfinite(r.flat_samples)) and np.all(r.samples["sigma"] > 0)
    # control variates (Newton mode, Taylor proxies through the NumPyro model)
    # (adaptive Metropolis: the default with control variates, Langevin, reads 2 x 100 gradient items more)
    r = tm.sample(model, data, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=50),
                  control_variates=tm.ControlVariates(), num_samples=30, num_warmup=10, num_chains=2, seed=0,
                  progress=False, proposal=tm.proposals.AdaptiveMetropolis())
    assert np.all(np.isfinite(r.flat_samples)) and np.mean(r.stats["n_data"]) < 300


# ---------------------------------------------------------------------------------------------------
# construction checks


def test_error_no_data_plate():
    def m(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        numpyro.sample("obs", dist.Normal(mu, 1).expand([y.shape[0]]).to_event(1), obs=y)

    with pytest.raises(ModelError, match="no data plate"):
        tm.from_numpyro(m, np.zeros(10, np.float32))


def test_error_two_candidate_plates_and_wrong_name():
    def m(y, z):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("a", y.shape[0]):
            numpyro.sample("oa", dist.Normal(mu, 1), obs=y)
        with numpyro.plate("b", z.shape[0]):
            numpyro.sample("ob", dist.Normal(mu, 1), obs=z)

    y = np.zeros(10, np.float32)
    with pytest.raises(ModelError, match="several plates"):
        tm.from_numpyro(m, y, y)
    with pytest.raises(ModelError, match="no plate named 'c'"):
        tm.from_numpyro(m, y, y, data_plate="c")
    # with 'a' as the data plate, plate 'b' (same length) reads the rows too: a site outside 'a' that
    # depends on the items
    with pytest.raises(ModelError, match="'ob' is outside the data plate 'a' but depends on the items"):
        tm.from_numpyro(m, y, np.ones(10, np.float32) * np.arange(10, dtype=np.float32), data_plate="a")


def test_error_not_additive():
    def m(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Normal(mu + jnp.mean(y), 1), obs=y)  # couples the items

    with pytest.raises(ModelError, match="not additive"):
        tm.from_numpyro(m, np.arange(20, dtype=np.float32))


def test_error_global_site_depends_on_items():
    def m(y):
        mu = numpyro.sample("mu", dist.Normal(jnp.sum(y), 1))  # the prior reads the data
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y)

    with pytest.raises(ModelError, match="'mu' is outside the data plate 'data' but depends on the items"):
        tm.from_numpyro(m, np.arange(1, 21, dtype=np.float32))


def test_error_continuous_local_latent_and_describe_state():
    def m(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("data", y.shape[0]):
            h = numpyro.sample("h", dist.Normal(mu, 1))
            numpyro.sample("obs", dist.Normal(h, 1), obs=y)

    y = np.arange(8, dtype=np.float32)
    with pytest.raises(ModelError, match="'h' is a continuous latent inside the data plate"):
        tm.from_numpyro(m, y)
    model, data = tm.numpyro_model.describe(m, y, local="state")
    assert model.local_latent_sites == ["h"]
    th = model.init()
    h = jnp.arange(3.0)
    ll = model.item_log_lik(th, {"y": data["y"][:3]}, {"h": h})
    mu = float(model.constrain(th)["mu"])
    expect = stats.norm.logpdf(np.arange(3.0), mu, 1) + stats.norm.logpdf(np.arange(3.0), np.arange(3.0), 1)
    np.testing.assert_allclose(ll, expect, rtol=1e-5)


def test_error_plate_around_scan():
    from numpyro.contrib.control_flow import scan

    def m(y):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("data", y.shape[0]):
            def step(c, yt):
                numpyro.sample("obs", dist.Normal(mu, 1), obs=yt)
                return c, None
            scan(step, None, y.T)

    with pytest.raises(ModelError, match="scan"):
        tm.from_numpyro(m, np.zeros((6, 4), np.float32))


def test_error_second_subsampled_plate_and_global_discrete():
    def m(y, g):
        mu = numpyro.sample("mu", dist.Normal(0, 1))
        with numpyro.plate("groups", 50, subsample_size=5):
            numpyro.sample("a", dist.Normal(0, 1))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Normal(mu, 1), obs=y)

    with pytest.raises(ModelError, match="draw their own subsample"):
        tm.from_numpyro(m, np.zeros(8, np.float32), np.zeros(8, np.int32))

    def m2(y):
        k = numpyro.sample("k", dist.Bernoulli(0.5))
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("obs", dist.Normal(k, 1), obs=y)

    with pytest.raises(ModelError, match="discrete latent outside the data plate"):
        tm.from_numpyro(m2, np.zeros(8, np.float32))


# ---------------------------------------------------------------------------------------------------
# posteriors against NumPyro NUTS (two-sample z-tests with MCSE from ESS, Bonferroni at p = 0.01)


def two_sample_check(a, b, p=0.01):
    """z-tests of each coordinate's mean and sd between draws ``a`` and ``b`` ((chain, draw, d) each)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = a.shape[-1]
    zcrit = stats.norm.isf(p / (2 * 2 * d))
    ok, lines = True, []
    for j in range(d):
        xa, xb = a[:, :, j], b[:, :, j]
        zm = (xa.mean() - xb.mean()) / np.hypot(float(az.mcse(xa, method="mean")), float(az.mcse(xb, method="mean")))
        zs = (xa.std(ddof=1) - xb.std(ddof=1)) / np.hypot(float(az.mcse(xa, method="sd")),
                                                           float(az.mcse(xb, method="sd")))
        ok &= abs(zm) < zcrit and abs(zs) < zcrit
        lines.append(f"[{j}] mean {xa.mean():.4g} vs {xb.mean():.4g} (z {zm:+.2f}); sd {xa.std():.4g} vs "
                     f"{xb.std():.4g} (z {zs:+.2f}); crit {zcrit:.2f}")
    return bool(ok), "\n".join(lines)


def nuts_draws(fn, args, names, num_samples=2000, seed=0):
    from numpyro.infer import MCMC, NUTS, init_to_median

    mcmc = MCMC(NUTS(fn, init_strategy=init_to_median), num_warmup=500, num_samples=num_samples, num_chains=4, chain_method="vectorized",
                progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), *args)
    s = mcmc.get_samples(group_by_chain=True)
    return np.concatenate([np.asarray(s[k], float).reshape(4, num_samples, -1) for k in names], axis=-1)


def tm_draws(fn, args, names, test=None, seed=1, num_samples=3000):
    model, data = tm.from_numpyro(fn, *args)
    r = tm.sample(model, data, test=test, num_samples=num_samples, num_warmup=1000, num_chains=4, seed=seed,
                  progress=False)
    s = r.samples
    return np.concatenate([np.asarray(s[k], float).reshape(4, num_samples, -1) for k in names], axis=-1), r


@pytest.mark.slow
def test_posterior_constrained_scale_matches_nuts():
    X, y = regression_data(100, seed=3)
    names = ["w", "sigma"]
    ref = nuts_draws(linreg, (X, y), names)
    ours, r = tm_draws(linreg, (X, y), names)
    ok, rep = two_sample_check(ours, ref)
    assert ok, rep
    # negative control: the same chain read as if sigma were not constrained (its log) must fail
    bad = ours.copy()
    bad[:, :, 2] = np.log(bad[:, :, 2])
    assert not two_sample_check(bad, ref)[0]


@pytest.mark.slow
def test_posterior_enumerated_mixture_matches_nuts():
    rng = np.random.default_rng(5)
    y = np.concatenate([rng.normal(-1.5, 1, 140), rng.normal(2.0, 1, 60)]).astype(np.float32)
    names = ["w", "mu"]
    ref = nuts_draws(mixture_marginal, (y,), names)
    ours, r = tm_draws(mixture, (y,), names)
    ok, rep = two_sample_check(ours, ref)
    assert ok, rep
    assert abs(ref[:, :, 0].mean() - 0.3) < 0.1  # one mode (the priors on mu fix the labels)
    # negative control: a mixture with the assignment probability ignored (w fixed at 1/2) must fail
    def wrong(y):
        w = numpyro.sample("w", dist.Beta(2.0, 2.0))
        mu = numpyro.sample("mu", dist.Normal(jnp.array([-2.0, 2.0]), 1.0).to_event(1))  # no label switching
        with numpyro.plate("data", y.shape[0]):
            z = numpyro.sample("z", dist.Bernoulli(0.5))
            numpyro.sample("obs", dist.Normal(mu[z], 1.0), obs=y)
    bad, _ = tm_draws(wrong, (y,), names, num_samples=1500)
    assert not two_sample_check(bad, ref)[0]


@pytest.mark.slow
def test_posterior_hierarchical_intercepts_matches_nuts():
    rng = np.random.default_rng(7)
    G = 4
    g = rng.integers(0, G, 200).astype(np.int32)
    alpha = np.array([-1.0, 0.0, 0.5, 2.0])
    y = (alpha[g] + 0.8 * rng.standard_normal(200)).astype(np.float32)
    names = ["mu", "tau", "alpha", "sigma"]
    ref = nuts_draws(hierarchical, (g, y, G), names, num_samples=3000)
    ours, r = tm_draws(hierarchical, (g, y, G), names, num_samples=4000)
    ok, rep = two_sample_check(ours, ref)
    assert ok, rep


@pytest.mark.slow
def test_posterior_austerity_through_front_end_matches_nuts():
    X, y = regression_data(2000, seed=4)
    names = ["w", "sigma"]
    ref = nuts_draws(linreg, (X, y), names)
    ours, r = tm_draws(linreg, (X, y), names, test=tm.acceptance.Austerity(epsilon=0.01, batch_size=200))
    assert r.data_fraction < 1.0
    ok, rep = two_sample_check(ours, ref)
    assert ok, rep
