"""The runner's long-run features: resume, checkpoints, budget, starts, self-audit and the verdict."""

import dataclasses
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.acceptance.base import Decision

warnings.filterwarnings("ignore", category=tm.TrustWarning)


@pytest.fixture(scope="module")
def problem():
    data, _ = tm.models.LogisticRegression.simulate(3000, d=2, seed=4)
    return tm.models.LogisticRegression(), data


BASE = dict(test=tm.acceptance.Austerity(epsilon=0.05, batch_size=200), num_chains=2, seed=3, progress=False)


def _stop_after(k):
    calls = {"n": 0}

    def cb(info):
        calls["n"] += 1
        if calls["n"] == k:
            raise KeyboardInterrupt

    return cb


@pytest.mark.slow
def test_resume_equals_one_long_run_bit_for_bit(problem, tmp_path):
    model, data = problem
    full = tm.sample(model, data, num_warmup=60, num_samples=90, chunk_size=25, **BASE)
    # stopped during warmup, then resumed through a checkpoint file
    part = tm.sample(model, data, num_warmup=60, num_samples=90, chunk_size=25, callback=_stop_after(2), **BASE)
    assert part.partial and part.flat_warmup.shape[1] == 50 and part.flat_samples.shape[1] == 0
    path = part.save(tmp_path / "run.ckpt")
    loaded = tm.load_result(path)
    mid = tm.sample(model, data, num_warmup=60, num_samples=90, chunk_size=25, resume=loaded,
                    callback=_stop_after(3))
    assert mid.partial and 0 < mid.flat_samples.shape[1] < 90
    rest = tm.sample(model, data, num_warmup=60, num_samples=90, resume=mid)
    assert not rest.partial
    np.testing.assert_array_equal(rest.flat_warmup, full.flat_warmup)
    np.testing.assert_array_equal(rest.flat_samples, full.flat_samples)
    for k in full.stats:
        np.testing.assert_array_equal(rest.stats[k], full.stats[k])
    # the adapted proposal is kept: extending a finished run continues the same chain
    longer = tm.sample(model, data, num_warmup=60, num_samples=120, resume=full)
    np.testing.assert_array_equal(longer.flat_samples[:, :90], full.flat_samples)
    assert longer.flat_samples.shape == (2, 120, 3)


@pytest.mark.slow
def test_resume_rejects_other_data(problem):
    model, data = problem
    r = tm.sample(model, data, num_warmup=10, num_samples=10, **BASE)
    other, _ = tm.models.LogisticRegression.simulate(2000, d=2, seed=4)
    with pytest.raises(tm.ConfigError, match="N = 3000"):
        tm.sample(model, other, num_warmup=10, num_samples=20, resume=r)
    with pytest.raises(tm.ConfigError, match="at least as many"):
        tm.sample(model, data, num_warmup=10, num_samples=5, resume=r)


def test_load_result_errors(tmp_path):
    with pytest.raises(tm.ConfigError, match="no saved run"):
        tm.load_result(tmp_path / "missing")
    p = tmp_path / "junk"
    p.write_bytes(b"not a checkpoint")
    with pytest.raises(tm.ConfigError, match="not a tallmh checkpoint"):
        tm.load_result(p)


def test_budget_stops_sampling(problem):
    model, data = problem
    r = tm.sample(model, data, num_warmup=20, num_samples=10**7, budget_s=1.0, **BASE)
    assert not r.partial
    assert 0 < r.flat_samples.shape[1] < 10**7
    assert r.timings["sampling_s"] < 4.0


@pytest.mark.slow
def test_starts_at_the_mode_dispersed(problem):
    model, data = problem
    r = tm.sample(model, data, num_warmup=0, num_samples=1, audit=0.0, **BASE)
    info = r.resume_info["start_info"]
    assert info["mode_found"] and info["laplace"]
    # the first draws of the chains differ (dispersed starts) and lie near the mode (within ~6 Laplace sd)
    mode, _ = tm.setup_passes.find_center(model, {k: jnp.asarray(v) for k, v in data.items()}, 3000,
                                              lambda x: x, jnp.zeros(3))
    first = r.flat_samples[:, 0]
    assert not np.allclose(first[0], first[1])
    assert np.all(np.abs(first - np.asarray(mode)) < 0.5)
    # an explicit init without jitter: every chain starts there, and the run says R-hat is blind
    r2 = tm.sample(model, data, num_warmup=0, num_samples=5, init=jnp.zeros(3), audit=0.0, **BASE)
    assert any("same point" in w for w in r2.warnings)


@dataclasses.dataclass(frozen=True)
class _Biased:
    """A deliberately wrong test: exact MH on a log ratio lowered by 1.5 (the negative control of the audit)."""

    name = "biased"
    tracks_log_lik = False
    error_target = 0.05

    def check(self, n):
        return None

    def decide(self, key, problem):
        dec = tm.acceptance.Exact().decide(key, problem._replace(log_lik_current=None,
                                                                 log_base=problem.log_base - 1.5))
        return Decision(dec.accept, dec.n_data, dec.rounds)


@pytest.mark.slow
def test_audit_counts_and_agrees_with_an_exact_limit(problem):
    model, data = problem
    # austerity with a batch of N decides exactly: every audited step agrees
    r = tm.sample(model, data, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=3000), num_warmup=60,
                  num_samples=30, num_chains=2, seed=0, progress=False, audit=0.3)
    a = r.audit
    assert a["audit_steps"] > 10
    assert a["audit_wrong"] == 0
    assert a["audit_items"] == 3000 * a["audit_steps"]
    assert np.all(r.stats["n_data"] == 3000)  # audit items are not in n_data
    assert not any("audited" in w for w in r.warnings)


@pytest.mark.slow
def test_audit_catches_a_wrong_test(problem):
    model, data = problem
    # the default rate: at most 5% of the steps (here about 45 audited chain-steps)
    r = tm.sample(model, data, test=_Biased(), num_warmup=400, num_samples=50, num_chains=2, seed=0,
                  progress=False)
    a = r.audit
    assert a["audit_steps"] >= 30 and a["audit_wrong"] >= 0.15 * a["audit_steps"]
    assert a["audit_bias"] < 0  # it rejects proposals that exact MH accepts, never the other way
    acc, ex = r.warmup_stats["accepted"], r.warmup_stats["audit_exact"]
    assert not np.any(acc & ~ex & r.warmup_stats["audited"])
    assert any("audited wrong-decision rate" in w for w in r.warnings)
    assert not r.trusted and r.verdict.startswith("NOT trusted")
    with pytest.warns(tm.TrustWarning):
        warnings.simplefilter("always", tm.TrustWarning)
        tm.sample(model, data, test=_Biased(), num_warmup=400, num_samples=5, num_chains=2, seed=0, progress=False)


@pytest.mark.slow
def test_default_audit_reads_at_most_its_item_budget(problem, monkeypatch):
    """The default self-audit reads at most DEFAULT_AUDIT_ITEMS items (each audit reads all N) and at most 5%
    of the steps, says so in the notes with the power left when that cuts it below the count that flags
    twice the target with probability 0.8, and an explicit rate is not cut."""
    from tallmh.run import selfaudit

    model, data = problem
    n = 3000
    kw = dict(test=tm.acceptance.Austerity(epsilon=0.05, batch_size=200), num_warmup=800, num_samples=10,
              num_chains=1, seed=0, progress=False)
    monkeypatch.setattr(selfaudit, "DEFAULT_AUDIT_ITEMS", 0)
    r = tm.sample(model, data, **kw)
    assert r.audit["audit_steps"] == 0 and r.audit["audit_items"] == 0
    assert any(note.startswith("self-audit: about 0 audited") for note in r.notes)
    r = tm.sample(model, data, audit=0.2, **kw)  # an explicit rate is the user's choice
    assert r.audit["audit_steps"] > 100 and not any(note.startswith("self-audit") for note in r.notes)
    monkeypatch.setattr(selfaudit, "DEFAULT_AUDIT_ITEMS", 10**9)
    r = tm.sample(model, data, **kw)  # 810 chain-steps: the 5% cap (about 40) cuts the 198 wanted
    assert 25 <= r.audit["audit_steps"] <= 60
    assert any(note.startswith("self-audit: about 40") and "at most 0.05" in note for note in r.notes)
    assert r.audit["audit_items"] == n * r.audit["audit_steps"]
    # warmup and sampling are both audited, and a long enough run gets the full count
    r = tm.sample(model, data, **{**kw, "num_warmup": 2000, "num_samples": 2000, "num_chains": 1})
    assert r.warmup_stats["audited"].any() and r.stats["audited"].any()
    assert 198 * 0.75 <= r.audit["audit_steps"] <= 198 * 1.25 and not any(n.startswith("self-audit") for n in r.notes)


def test_out_of_support_proposals_read_no_data():
    # prior support mu > 0; the chain starts near 0 so many proposals fall outside
    data = {"x": np.abs(np.random.default_rng(0).standard_normal(500)).astype(np.float32) * 0.1}
    model = tm.Model(log_prior=lambda th: jnp.where(th[0] > 0, 0.0, -jnp.inf),
                     log_lik=lambda th, b: -0.5 * (b["x"] - th[0]) ** 2)
    r = tm.sample(model, data, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100),
                  proposal=tm.proposals.RandomWalk(0.5), init=jnp.array([0.01]), num_warmup=0, num_samples=200,
                  num_chains=1, progress=False, audit=0.0)
    rejected = ~r.stats["accepted"]
    assert rejected.sum() > 20
    assert np.all(r.flat_samples > 0)
    # steps whose proposal left the support read nothing
    assert np.any(r.stats["n_data"][rejected] == 0)
    # ... nor do their audits: every audited step reads all 500 items, and the out-of-support ones none
    ra = tm.sample(model, data, test=tm.acceptance.Austerity(epsilon=0.05, batch_size=100),
                   proposal=tm.proposals.RandomWalk(0.5), init=jnp.array([0.01]), num_warmup=0, num_samples=200,
                   num_chains=1, progress=False, audit=1.0)
    out = ra.stats["n_data"] == 0  # the proposal left the support (in support, austerity reads >= 100)
    assert out.sum() > 10
    assert ra.audit["audit_steps"] == (~out).sum() and ra.audit["audit_items"] == 500 * (~out).sum()


@pytest.mark.slow
def test_partial_run_is_not_trusted(problem):
    model, data = problem
    r = tm.sample(model, data, num_warmup=20, num_samples=100, chunk_size=10, callback=_stop_after(4), **BASE)
    assert r.partial and any("partial run" in w for w in r.warnings)
    assert "NOT trusted" in str(r.summary())
