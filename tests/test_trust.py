"""The verdict: the audit's power, what each kind of test promises, approximate targets, and advice.

The decision-level checks of the normal-approximation estimate are in tests/acceptance/test_skew.py.
"""

import warnings

import numpy as np
import pytest

import tallmh as tm
from tallmh.results import audit_power, audits_for_power, error_target

warnings.filterwarnings("ignore", category=tm.TrustWarning)


def _flags(m, rate, reps, rng):
    """Fraction of simulated audits of m decisions, wrong with probability ``rate``, that the verdict flags."""
    from tallmh.results import _wilson

    wrong = rng.binomial(m, rate, size=reps)
    return np.mean([_wilson(int(k), m)[0] > 0.05 for k in wrong])


def test_audit_power_matches_simulation_and_the_default_count_has_power():
    rng = np.random.default_rng(0)
    reps = 4000
    m = audits_for_power(0.05)
    assert 150 <= m <= 250
    for count in (40, m):
        p = audit_power(count, 0.05)
        sim = _flags(count, 0.10, reps, rng)
        assert abs(sim - p) <= 3.29 * np.sqrt(p * (1 - p) / reps) + 1e-3, (count, p, sim)
    assert audit_power(m, 0.05) >= 0.8
    # negative control: the previous default of 40 audits misses a doubled rate most of the time
    assert audit_power(40, 0.05) < 0.5
    # and at the target itself, the default count flags rarely (the interval is 95%)
    assert _flags(m, 0.05, reps, rng) < 0.05
    assert audits_for_power(0.01) > audits_for_power(0.05)


def test_what_each_test_promises():
    A = tm.acceptance.Austerity
    assert error_target(A(error=0.02)) == 0.02
    assert error_target(A(epsilon=0.05)) is None  # per look: no per-step promise to audit against
    assert error_target(tm.acceptance.Exact()) is None
    assert error_target(tm.acceptance.Confidence(delta=0.01)) == 0.01


def _gauss(n=2000, seed=0):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32) + 0.3
    return tm.models.GaussianMean(sigma=1.0), {"x": x}


def test_per_look_form_reports_its_rate_without_a_target():
    model, data = _gauss()
    r = tm.sample(model, data, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=200), num_warmup=200,
                  num_samples=200, num_chains=2, seed=0, progress=False, audit=0.2)
    o = r.summary().overall
    assert o["audit_steps"] > 20 and o["audit_target"] is None
    assert "no per-step promise" in str(r.summary())
    assert not any("audited wrong-decision" in w for w in r.warnings)


def test_approximate_target_is_in_the_verdict():
    model, data = _gauss()
    r = tm.sample(model, data, test=tm.acceptance.Informed(subset_size=200), num_warmup=100, num_samples=200,
                  num_chains=2, seed=0, progress=False)
    assert any(w.startswith("approximate target") for w in r.warnings)
    assert not r.trusted
    # negative control: exact MH on the same model carries no such warning
    r = tm.sample(model, data, test=tm.acceptance.Exact(), num_warmup=100, num_samples=200, num_chains=2,
                  seed=0, progress=False)
    assert not any(w.startswith("approximate target") for w in r.warnings)


def test_every_warning_says_what_to_do():
    model, data = _gauss()
    r = tm.sample(model, data, test=tm.acceptance.Exact(), num_warmup=10, num_samples=20, num_chains=2,
                  seed=0, progress=False)
    ws = [w for w in r.warnings if w.startswith("bulk ESS")]
    assert ws and "run longer (num_samples=" in ws[0] and "--samples" in ws[0]
    # the suggested count is larger than what was run
    n = int(ws[0].split("num_samples=")[1].split(",")[0])
    assert n > 20
