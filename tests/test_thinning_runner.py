"""The exact subsampled test through ``tm.sample``: its table built after the set-up (and again on resume),
no self-audit, a few items per step, the same draws after an interruption, the exact posterior, and one-line
refusals of what it cannot run with."""

import os

import numpy as np
import pytest

import tallmh as tm
from tallmh.reporting import diagnostics

DATA, _ = tm.models.LogisticRegression.simulate(20000, d=3, seed=1)
KW = dict(num_warmup=300, num_chains=2, seed=0, progress=False)


def test_runs_through_sample_without_audit_and_resumes_bit_for_bit(tmp_path):
    thin = tm.acceptance.PoissonThinning()
    full = tm.sample(tm.models.LogisticRegression(), DATA, test=thin, num_samples=600, **KW)
    assert full.audit.get("audit_steps", 0) == 0  # an exact test: nothing to audit
    assert any("its table of the items' remainder bounds" in m for m in full.notes)
    assert full.setup_items >= 20000  # (the table's pass is counted)
    assert float(np.mean(full.stats["n_data"])) < 2.0  # a few items per step (here well below one)

    def stop(info):
        if info["phase"] == "sampling" and info["done"] >= 200:
            raise KeyboardInterrupt

    cut = tm.sample(tm.models.LogisticRegression(), DATA, test=thin, num_samples=600, callback=stop, chunk_size=100,
                    **KW)
    assert cut.partial
    path = os.fspath(tmp_path / "cut.npz")
    cut.save(path)
    resumed = tm.sample(tm.models.LogisticRegression(), DATA, resume=tm.load_result(path), num_samples=600, **KW)
    assert any("its table of the items' remainder bounds" in m for m in resumed.notes)
    np.testing.assert_array_equal(resumed.flat_samples, full.flat_samples)


def test_refuses_what_it_cannot_run_with():
    thin = tm.acceptance.PoissonThinning()
    with pytest.raises(tm.ConfigError, match="control variates"):
        tm.sample(tm.models.LogisticRegression(), DATA, test=thin, control_variates=False, num_samples=10, **KW)
    with pytest.raises(tm.ConfigError, match="order=2"):
        tm.sample(tm.models.LogisticRegression(), DATA, test=thin, control_variates=tm.ControlVariates(order=1),
                  num_samples=10, **KW)

    class NoBound(tm.models.LogisticRegression):
        def log_lik(self, theta, batch):  # (a model of its own likelihood keeps none of the parent's bounds)
            return super().log_lik(theta, batch)

    with pytest.raises(tm.ConfigError, match="factor_bound"):
        tm.sample(NoBound(), DATA, test=thin, num_samples=10, **KW)


def test_is_the_default_where_the_model_bounds_its_remainders():
    """tm.sample's default: the exact subsampled test (with the Laplace independence proposal, said in the notes
    and the summary) for a model with a factor_bound(); austerity with control variates, audited, for the same
    likelihood without one, whose summary says that a slow drift is not bounded."""
    r = tm.sample(tm.models.LogisticRegression(), DATA, num_samples=200, **KW)
    assert r.label.startswith("exact-subsampled") and isinstance(r.proposal, tm.proposals.LaplaceChoice)
    assert r.proposal.chosen == "crank-nicolson" and any(m.startswith("proposal: independence") for m in r.notes)
    assert any(m.startswith("default method: exact-subsampled+cv (the model bounds") for m in r.notes)
    assert r.audit.get("audit_steps", 0) == 0 and "\nexact: the chain targets the exact posterior" in str(r.summary())
    assert float(np.mean(r.stats["n_data"])) < 2.0

    class NoBound(tm.models.LogisticRegression):
        def log_lik(self, theta, batch):
            return super().log_lik(theta, batch)

    a = tm.sample(NoBound(), DATA, num_samples=200, **KW)
    assert a.label.startswith("austerity") and a.audit.get("audit_steps", 0) > 0
    assert any("no bound on its Taylor remainders" in m for m in a.notes)
    assert "\napproximate: each step's error is audited, a slow drift" in str(a.summary())


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_control_variates_it_cannot_use_keep_the_approximate_default():
    """control_variates=False, first order or stratified with the default test: austerity as before (the exact
    test would refuse them), said in the note; second order as given: the exact test."""
    want = {False: "austerity(error=0.05)", tm.ControlVariates(order=1): "austerity(error=0.05)+cv1",
            tm.ControlVariates(exact_rows="auto"): "austerity(error=0.05)+cv",
            tm.ControlVariates(): "exact-subsampled+cv"}
    for cv, label in want.items():
        r = tm.sample(tm.models.LogisticRegression(), DATA, control_variates=cv, num_samples=20, num_warmup=20,
                      num_chains=1, seed=0, progress=False)
        assert r.label == label, (cv, r.label)
        if label.startswith("austerity"):
            assert any("control variates given that the exact test cannot use" in m for m in r.notes)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_posterior_matches_exact_mh_within_monte_carlo_error():
    """Every coordinate's mean within 4 combined Monte Carlo standard errors of exact MH's, and every sd within 4
    of its own; the negative control: the same check tells apart the same draws spread as a posterior tempered by
    0.8 would be."""
    kw = dict(num_samples=4000, num_warmup=500, num_chains=4, progress=False)
    thin = tm.sample(tm.models.LogisticRegression(), DATA, test=tm.acceptance.PoissonThinning(), seed=0, **kw)
    ref = tm.sample(tm.models.LogisticRegression(), DATA, test=tm.acceptance.Exact(), seed=1, **kw)

    def worst(a, b):
        zs = []
        for j in range(a.shape[-1]):
            x, y = a[..., j], b[..., j]
            se = np.hypot(float(diagnostics.mcse_mean(x)), float(diagnostics.mcse_mean(y)))
            zs.append(abs(x.mean() - y.mean()) / se)
            vx, vy = (x - x.mean()) ** 2, (y - y.mean()) ** 2
            se_sd = np.hypot(float(diagnostics.mcse_mean(vx)) / (2 * x.std()),
                             float(diagnostics.mcse_mean(vy)) / (2 * y.std()))
            zs.append(abs(x.std() - y.std()) / se_sd)
        return max(zs)

    assert worst(thin.flat_samples, ref.flat_samples) < 4.0
    x = thin.flat_samples
    tempered = x.mean(axis=(0, 1)) + (x - x.mean(axis=(0, 1))) / np.sqrt(0.8)  # (a sampler 12% too wide)
    assert worst(tempered, ref.flat_samples) > 4.0
