"""The verdict: the audit's power, what each kind of test promises, approximate targets, and advice.

The decision-level checks of the normal-approximation estimate are in tests/acceptance/test_skew.py.
"""

import warnings

import numpy as np
import pytest

import tallmh as tm
from tallmh.reporting.results import audit_power, audits_for_power, error_target

warnings.filterwarnings("ignore", category=tm.TrustWarning)


def _flags(m, rate, reps, rng):
    """Fraction of simulated audits of m decisions, wrong with probability ``rate``, that the verdict flags."""
    from tallmh.reporting.results import _wilson

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


def _two_stage_flags(first, planned, rate, reps, rng, clear_at_most=0):
    """Fraction flagged by the default audit's two-stage design, simulated: ``first`` audits, stop when at most
    ``clear_at_most`` are wrong, else all ``planned``, flagged by the 95% Wilson rule as the verdict does."""
    from tallmh.reporting.results import _wilson

    k1 = rng.binomial(first, rate, size=reps)
    k2 = rng.binomial(planned - first, rate, size=reps)
    return np.mean([(a > clear_at_most) and _wilson(int(a + b), planned)[0] > 0.05 for a, b in zip(k1, k2)])


def test_the_two_stage_audit_keeps_its_power():
    """The default audit stops after its first stage (44 audits at a target of 0.05) when none was wrong: a
    doubled rate is still flagged with the whole plan's power less 0.01, and the target rate rarely; a first
    stage that clears with up to 3 wrong decisions (a negative control) loses most of the power."""
    from tallmh.reporting.results import audit_first_stage, design_power

    first = audit_first_stage(0.05)
    assert first == 44 and 0.9 ** 44 <= 0.01 < 0.9 ** 43
    assert audit_first_stage(None) is None
    rng = np.random.default_rng(1)
    reps = 4000
    planned = audits_for_power(0.05)
    design = {"planned": planned, "first_stage": first, "cleared_after": first}
    bound = design_power(design, first, 0.05)
    assert bound >= 0.79 and bound >= audit_power(planned, 0.05) - 0.01
    assert design_power(dict(design, cleared_after=None), 60, 0.05) == audit_power(60, 0.05)
    sim = _two_stage_flags(first, planned, 0.10, reps, rng)
    assert sim >= bound - 3.29 * np.sqrt(bound * (1 - bound) / reps), (sim, bound)
    assert _two_stage_flags(first, planned, 0.05, reps, rng) < 0.05
    lenient = _two_stage_flags(first, planned, 0.10, reps, rng, clear_at_most=3)
    assert lenient < bound - 0.2, (lenient, bound)


def _audited_run(**kw):
    data, _ = tm.models.LogisticRegression.simulate(5000, d=3, seed=2)
    kw.setdefault("test", tm.acceptance.Austerity(error=0.05))  # (the audited approximate default)
    kw.setdefault("control_variates", tm.ControlVariates())
    return tm.sample(tm.models.LogisticRegression(), data, num_samples=600, num_warmup=300, num_chains=4, seed=0,
                     progress=False, **kw)


def test_a_run_skips_the_rest_of_its_audits_when_none_was_wrong():
    r = _audited_run()
    design = r.resume_info["audit_design"]
    a = r.audit
    assert design is not None and design["cleared_after"] is not None
    assert a["audit_wrong"] == 0 and a["audit_steps"] < design["planned"]
    # no sampling audit after the first stage: the rate went to 0 for the later chunks
    assert int(np.sum(r.stats["audited"])) == design["cleared_after"] >= design["first_stage"]
    # ... and it closed at the audited step that brought its count (an audited step is 4 chain-steps)
    assert design["cleared_after"] < design["first_stage"] + 4, design
    assert a["audit_power"] >= 0.79
    assert any(n.startswith("self-audit: no wrong decision in the first") for n in r.notes)
    # an explicit rate audits every step it plans
    r2 = _audited_run(audit=0.03)
    assert r2.resume_info["audit_design"] is None
    assert not any(n.startswith("self-audit: no wrong decision in the first") for n in r2.notes)


@pytest.mark.slow
def test_a_run_whose_audits_find_wrong_decisions_keeps_its_whole_plan():
    """Negative control: batches of 2 items without control variates err; the audit keeps auditing."""
    bad = _audited_run(test=tm.acceptance.Austerity(error=0.05, batch_size=2), control_variates=False,
                       proposal=tm.proposals.RandomWalk(0.05))
    design = bad.resume_info["audit_design"]
    assert bad.audit["audit_wrong"] > 0
    assert design["cleared_after"] is None
    assert bad.audit["audit_steps"] > 100  # planned 180 at 5% of the 3,600 chain-steps
    assert not any(n.startswith("self-audit: no wrong decision in the first") for n in bad.notes)
