"""A subclass of a built-in model with its own likelihood gets no closed form written for the parent's.

The built-in models carry per-item ratios (``log_lik_ratio``), bounds (``lik_ratio_bound``,
``cv_remainder_bound``) and derivative sums written for their own ``log_lik``. A user who subclasses one and
overrides ``log_lik`` (a tempered or weighted likelihood) must get a sampler of *that* likelihood: the
parent's closed forms would silently describe the parent's model.
"""

import jax
import jax.numpy as jnp
import numpy as np

import tallmh as tm
from tallmh.distributed import RowView
from tallmh.kernel import make_problem, tracks_log_lik
from tallmh.model import own_method


class Tempered(tm.models.LogisticRegression):
    """The logistic likelihood raised to the power 0.1 (a tempered posterior)."""

    def log_lik(self, theta, batch):
        return 0.1 * super().log_lik(theta, batch)


def test_the_subclass_gets_its_own_ratio_and_no_parent_bound():
    data, _ = tm.models.LogisticRegression.simulate(200, d=2, seed=0)
    data = jax.tree_util.tree_map(jnp.asarray, data)
    th, thp = jnp.array([0.1, -0.2, 0.3]), jnp.array([0.15, -0.1, 0.2])
    ident = lambda t: t  # noqa: E731
    idx = jnp.arange(200)
    for model, scale, owns in ((tm.models.LogisticRegression(), 1.0, True), (Tempered(), 0.1, False)):
        prob = make_problem(model, data, 200, ident, None, th, thp, jnp.float32(0.0))
        parent = tm.models.LogisticRegression()
        want = scale * (parent.log_lik(thp, data) - parent.log_lik(th, data))
        np.testing.assert_allclose(prob.lik_ratio(idx), want, rtol=2e-4, atol=1e-6)
        assert (prob.bound is not None) == owns
        assert tracks_log_lik(tm.acceptance.Exact(), model) == (not owns)
        for name in ("log_lik_ratio", "lik_ratio_bound", "cv_remainder_bound", "lik_grad_remainder"):
            assert (own_method(model, name) is not None) == owns, name


def test_views_and_instances_answer_for_their_own_likelihood():
    base = tm.models.LogisticRegression()
    assert own_method(RowView(base, {}, 1), "log_lik_ratio") is not None  # the row-sharded view of the model
    assert own_method(RowView(Tempered(), {}, 1), "log_lik_ratio") is None
    given = tm.Model(lambda t: 0.0, lambda t, b: b["x"] * t, lik_ratio_bound=lambda t, tp, s: 1.0)
    assert own_method(given, "lik_ratio_bound") is not None  # given with the model's own log_lik
    class OwnBound(tm.models.LogisticRegression):  # the parent's likelihood, a bound of its own: used
        def lik_ratio_bound(self, theta, theta_prop, stats):
            return 2.0 * super().lik_ratio_bound(theta, theta_prop, stats)

    assert own_method(OwnBound(), "lik_ratio_bound") is not None
    assert own_method(OwnBound(), "log_lik_ratio") is not None
    patched = tm.models.LogisticRegression()
    patched.log_lik = Tempered().log_lik  # a likelihood set on the instance: the class's closed forms go
    assert own_method(patched, "log_lik_ratio") is None


def test_a_tempered_subclass_samples_the_tempered_posterior():
    # the tempered posterior's sd is sqrt(10) times the untempered one's (both near-Gaussian at N = 20,000, the
    # prior's share of the precision below 1e-4); with the parent's ratio the sampler drew the untempered
    # posterior (sd ratio 1), which this check rejects
    data, _ = tm.models.LogisticRegression.simulate(20_000, d=2, seed=1)
    sds, rel_se = [], []
    for model in (tm.models.LogisticRegression(), Tempered()):
        r = tm.sample(model, data, num_samples=1500, num_warmup=500, seed=0, progress=False, audit=0)
        x = np.asarray(r.flat_samples, float)
        sds.append(x.reshape(-1, 3).std(axis=0))
        # Monte Carlo error of an sd, relative: 1 / sqrt(2 ESS) with the ESS of the squared deviations
        rel_se.append(np.array([1.0 / np.sqrt(2.0 * tm.diagnostics.ess((x[..., j] - x[..., j].mean()) ** 2))
                                for j in range(3)]))
    z = (sds[1] / sds[0] / np.sqrt(10) - 1) / np.hypot(rel_se[0], rel_se[1])
    # within 4 Monte Carlo standard errors (about 0.02 each here); the untempered answer (ratio 1) is ~30 away
    assert np.all(np.abs(z) < 4), z
