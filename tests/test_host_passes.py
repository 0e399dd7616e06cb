"""The set-up passes in NumPy (``setup_passes.HostPasses``) for the built-in GLMs on host data: the same
sums as the compiled passes, the same bits wherever the data lies and however many threads reduce it, and
used only where the model's closed forms belong to its likelihood."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import enable_x64
from jax.flatten_util import ravel_pytree

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh.storage import datasource as ds
from tallmh import setup_passes as setup


def _data(n=20_000, seed=3):
    data, _ = tm.models.LogisticRegression.simulate(n, d=5, seed=seed)
    data["X"][:, 2] *= 7.0  # unequal scales
    return {k: np.asarray(v) for k, v in data.items()}


def _compiled_sums(model, data, th):
    """The compiled per-chunk closed form, summed the way the compiled pass sums it."""
    n = data["y"].shape[0]
    chunk_vgh, chunk_dv = setup._newton_chunk_fns(model, lambda t: t, th)
    v, g, h = 0.0, 0.0, 0.0
    for cv, cg, ch in setup.full_pass(chunk_vgh, {k: jnp.asarray(a) for k, a in data.items()}, n, (th,)):
        v, g, h = v + float(cv), g + np.asarray(cg, np.float64), h + np.asarray(ch, np.float64)
    return v, g, h


def test_host_sums_equal_the_compiled_closed_form_and_float64_autodiff():
    model = tm.models.LogisticRegression(prior_scale=3.0)
    data = _data()
    n = data["y"].shape[0]
    th = jnp.asarray(np.linspace(-0.3, 0.4, 6), jnp.float32)
    host = setup.HostPasses.of(model, data, n, lambda t: t, th)
    assert host is not None
    v, g, h = host.sums(th)
    cv, cg, ch = _compiled_sums(model, data, th)
    # float32 chunk sums against float64: relative agreement at float32's resolution of the terms
    np.testing.assert_allclose(v, cv, rtol=2e-6)
    np.testing.assert_allclose(g, cg, rtol=1e-4, atol=1e-3 * np.sqrt(n))
    np.testing.assert_allclose(h, ch, rtol=1e-5)
    # float64 autodiff of the float64 log-likelihood: the host form to float64 rounding
    with enable_x64():
        X, y = jnp.asarray(data["X"], jnp.float64), jnp.asarray(data["y"], jnp.float64)
        t64 = jnp.asarray(np.asarray(th, np.float64))
        total = lambda t: jnp.sum(-jax.nn.softplus(jnp.where(y > 0.5, -(X @ t), X @ t)))  # noqa: E731
        np.testing.assert_allclose(v, float(total(t64)), rtol=1e-12)
        np.testing.assert_allclose(g, np.asarray(jax.grad(total)(t64)), rtol=1e-9, atol=1e-8)
        np.testing.assert_allclose(h, np.asarray(jax.hessian(total)(t64)), rtol=1e-9, atol=1e-8)
    # the line search's difference, and the prior's NumPy derivatives against autodiff
    th1 = th + 0.01
    lp = lambda t: model.log_lik(t, {k: jnp.asarray(a) for k, a in data.items()})  # noqa: E731
    np.testing.assert_allclose(host.diff(th, th1), float(jnp.sum(lp(th1) - lp(th))), rtol=1e-3)
    pv, pg, ph = model.log_prior_vgh_host(np.asarray(th, np.float64))
    np.testing.assert_allclose(pv, float(model.log_prior(th)), rtol=1e-6)
    np.testing.assert_allclose(pg, np.asarray(jax.grad(model.log_prior)(th)), rtol=1e-6)
    np.testing.assert_allclose(ph, np.asarray(jax.hessian(model.log_prior)(th)), rtol=1e-6)


def test_host_sums_are_the_same_bits_on_disk_in_memory_and_with_threads(tmp_path, monkeypatch):
    model = tm.models.LogisticRegression()
    data = _data(n=300_000)
    n = data["y"].shape[0]
    th = jnp.asarray(np.linspace(-0.2, 0.2, 6), jnp.float32)
    paths = {}
    for k, a in data.items():
        paths[k] = str(tmp_path / f"{k}.npy")
        np.save(paths[k], a)
    disk = tm.data.from_npy(paths, gather="callback", check_finite=False)
    assert isinstance(disk["X"], ds.HostArray)
    mem = setup.HostPasses.of(model, {k: jnp.asarray(a) for k, a in data.items()}, n, lambda t: t, th).sums(th)
    dsk = setup.HostPasses.of(model, disk, n, lambda t: t, th).sums(th)
    monkeypatch.setattr(setup, "HOST_THREADS", 3)  # (in-memory data reduced by threads: the same bits)
    one = setup.HostPasses.of(model, data, n, lambda t: t, th).sums(th)
    for a, b, c in zip(mem, dsk, one):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_host_passes_only_where_the_closed_forms_are_the_likelihoods():
    data = _data(n=1000)
    th = jnp.zeros(6, jnp.float32)

    class Tempered(tm.models.LogisticRegression):  # its own likelihood: the parent's closed forms do not hold
        def log_lik(self, theta, batch):
            return 0.5 * super().log_lik(theta, batch)

    assert setup.HostPasses.of(tm.models.LogisticRegression(), data, 1000, lambda t: t, th) is not None
    assert setup.HostPasses.of(Tempered(), data, 1000, lambda t: t, th) is None
    # and the Tempered model's set-up sums are its own (half the parent's), by the compiled pass
    center = jnp.asarray(np.full(6, 0.1), jnp.float32)
    jd = {k: jnp.asarray(a) for k, a in data.items()}
    full = cvm.proxy_sums(tm.models.LogisticRegression(), jd, 1000, lambda t: t, center)
    half = cvm.proxy_sums(Tempered(), jd, 1000, lambda t: t, center)
    np.testing.assert_allclose(np.asarray(half.grad_sum), 0.5 * np.asarray(full.grad_sum), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(half.hess_sum), 0.5 * np.asarray(full.hess_sum), rtol=1e-4)


@pytest.mark.parametrize("host", [True, False])
def test_mode_by_host_passes_is_the_float64_mode_on_data_sorted_by_the_target(host, monkeypatch):
    """Sorted by the target (the hard case for the sub-sample warm start), the centre the host passes find
    is the float64 mode to within the centre tolerance (Newton decrement <= centre_tol(d)), which keeps the
    mean squared distance of posterior draws from the centre within 1% of theirs from the mode."""
    model = tm.models.LogisticRegression()
    data = _data(n=400_000, seed=5)
    order = np.argsort(data["y"], kind="stable")
    data = {k: a[order] for k, a in data.items()}
    n = data["y"].shape[0]
    if not host:  # above HOST_MAX_ROWS: the compiled passes (float32 chunks), to the same tolerance
        monkeypatch.setattr(setup, "HOST_MAX_ROWS", 1000)
    flat0, unravel = ravel_pytree(model.init(data))
    assert (setup.HostPasses.of(model, data, n, unravel, flat0) is not None) == host
    d = flat0.shape[0]
    found = setup.mode_search(model, data, n, unravel, flat0, tol=setup.centre_tol(d))
    ref = setup.HostPasses(model, data, n, ds.host_reader(data))  # (float64 sums, whichever passes searched)
    _, g, h = ref.sums(found.center)
    _, pg, ph = model.log_prior_vgh_host(np.asarray(found.center, np.float64))
    g, h = g + pg, h + ph
    decrement = float(g @ np.linalg.solve(-h, g))
    assert decrement <= setup.centre_tol(d) and (d + decrement) / d <= 1.01
    assert found.warm_items > 0 and found.passes <= 3, found.passes
    # the sums handed back are those at the centre
    np.testing.assert_allclose(np.asarray(found.grad_sum), g - pg, rtol=1e-5, atol=1e-2)


def test_the_default_configuration_is_chosen_without_compiling_for_the_logistic_model(monkeypatch):
    """``differentiable`` (which picks the default test) answers from the NumPy closed forms where the model has
    them, the same answer as the compiled check, and falls back to the compiled check where it has not."""
    from tallmh.run import configure

    data = _data(n=2000)
    init = tm.models.LogisticRegression().init(data)
    flat, unravel = ravel_pytree(init)

    class Tempered(tm.models.LogisticRegression):
        def log_lik(self, theta, batch):
            return 0.5 * super().log_lik(theta, batch)

    assert configure.host_derivatives(tm.models.LogisticRegression(), data, 2000, unravel, flat) is True
    assert configure.host_derivatives(Tempered(), data, 2000, unravel, flat) is None
    compiled = []
    real = jax.jit
    monkeypatch.setattr(jax, "jit", lambda f, *a, **k: compiled.append(f) or real(f, *a, **k))
    assert configure.differentiable(tm.models.LogisticRegression(), data, 2000, init)
    assert not compiled
    assert configure.differentiable(Tempered(), data, 2000, init)
    assert compiled  # the compiled check


def test_model_check_by_the_host_closed_forms(monkeypatch):
    """``check_model`` on the built-in logistic regression with data in memory evaluates its NumPy closed forms
    (no compiled probe); a non-finite row still fails it (then the compiled and eager checks name the
    problem); a subclass with its own likelihood takes the compiled probe (the negative control)."""
    from tallmh import model as mm
    from tallmh.errors import ModelError

    data, _ = tm.models.LogisticRegression.simulate(100, d=3, seed=1)
    th = np.zeros(4, np.float32)
    probed = []
    real = mm._passes_compiled
    monkeypatch.setattr(mm, "_passes_compiled", lambda *a: probed.append(1) or real(*a))
    mm.check_model(tm.models.LogisticRegression(), data, th, 100)
    assert probed == []
    bad = dict(data, X=data["X"].copy())
    bad["X"][3, 1] = np.nan
    with pytest.raises(ModelError, match="non-finite"):
        mm.check_model(tm.models.LogisticRegression(), bad, th, 100)
    assert probed == [1]

    class Own(tm.models.LogisticRegression):
        def log_lik(self, theta, batch):
            return super().log_lik(theta, batch) * 1.0

    mm.check_model(Own(), data, th, 100)
    assert probed == [1, 1]


def test_first_full_step_takes_the_warm_starts_hessian_and_the_exact_passes_decide(monkeypatch):
    """Compiled passes with a warm start large enough (m >= WARM_TARGET sqrt(d N)): the first full pass makes
    the value and gradient only, its step uses the sub-sample's Hessian scaled to N, and the search still ends
    where an exact pass finds the decrement within the centre's tolerance, with that pass's sums handed back.
    A badly wrong hint (three times the Hessian) costs passes but not the answer: the passes after the first
    decide, not the hint."""
    monkeypatch.setattr(setup, "HOST_MAX_ROWS", 1000)
    model = tm.models.LogisticRegression()
    data = _data(n=300_000, seed=7)
    n = data["y"].shape[0]
    flat0, unravel = ravel_pytree(model.init(data))
    d = flat0.shape[0]
    assert setup.warm_sizes(n, d) == [setup.WARM_ROWS] and setup.WARM_ROWS**2 >= setup.WARM_TARGET**2 * d * n
    calls = []
    vg = setup._newton_vg_fn
    monkeypatch.setattr(setup, "_newton_vg_fn", lambda *a: calls.append(1) or vg(*a))
    found = setup.mode_search(model, data, n, unravel, flat0, tol=setup.centre_tol(d))
    assert len(calls) == 1 and found.grad_sum is not None
    ref = setup.HostPasses(model, data, n, ds.host_reader(data))

    def decrement(th):
        _, g, h = ref.sums(th)
        _, pg, ph = model.log_prior_vgh_host(np.asarray(th, np.float64))
        return float((g + pg) @ np.linalg.solve(-(h + ph), g + pg)), g

    dec, g = decrement(found.center)
    assert dec <= setup.centre_tol(d), dec
    np.testing.assert_allclose(np.asarray(found.grad_sum), g, rtol=1e-5, atol=1e-2)
    assert found.passes == 2, found.passes  # value and gradient, then one exact pass that stops
    # the wrong hint: from the same warm start, the exact passes take over
    sub = setup._gather_rows(data, setup.warm_rows(n, setup.WARM_ROWS))
    th_w, _, last_w = setup._newton(model, sub, setup.WARM_ROWS, unravel, jnp.asarray(flat0), 30,
                                    setup.centre_tol(d), scale=n / setup.WARM_ROWS)
    bad = 3.0 * np.asarray(last_w[2], np.float64) * (n / setup.WARM_ROWS)
    th_bad, passes_bad, _ = setup._newton(model, data, n, unravel, th_w, 30, setup.centre_tol(d), h_hint=bad)
    assert decrement(th_bad)[0] <= setup.centre_tol(d) and passes_bad > found.passes
