"""Certified audit decisions (:mod:`tallmh.certify`).

The bound: on data sorted by the target and on skewed, heavy-tailed features, every pair of points has its
whole-data log ratio within ``B`` of the Taylor quadratic's difference, and the float32 sum of the model's
ratios within ``R`` of the exact one; a bound scaled down 100 times does not hold (negative control).
In a run: the audited decisions the certificate settles are those the exact test's full passes take (Metropolis
and Barker oracles), they read nothing, and the certificate's one pass is counted; a certificate with its bound
scaled down disagrees with the full passes (negative control).
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import certify
from tallmh.run import selfaudit
from tallmh.storage.datasource import host_reader


def _data(n, kind, seed=0):
    rng = np.random.default_rng(seed)
    d = 5
    if kind == "skewed":  # lognormal features: heavy right tails, all positive (correlated with the intercept)
        X = np.exp(rng.standard_normal((n, d)) * np.array([0.2, 0.4, 0.6, 0.8, 1.0])).astype(np.float32)
    else:
        X = (rng.standard_normal((n, d)) * np.array([0.1, 0.5, 1.0, 3.0, 10.0])).astype(np.float32)
    X[:, 0] = 1.0
    theta = rng.standard_normal(d) / np.sqrt(d) / np.std(X, axis=0).clip(0.1)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(X @ theta)))).astype(np.float32)
    if kind == "sorted":
        order = np.argsort(y, kind="stable")
        X, y = X[order], y[order]
    return {"X": X, "y": y}


def _log_lik64(X, y, th):
    z = X.astype(np.float64) @ th
    return float(np.sum(y * z - np.logaddexp(0.0, z)))


def _map(X, y, prior_scale=10.0):
    X64, y64 = X.astype(np.float64), y.astype(np.float64)
    th = np.zeros(X.shape[1])
    for _ in range(30):
        p = 1.0 / (1.0 + np.exp(-(X64 @ th)))
        g = X64.T @ (y64 - p) - th / prior_scale**2
        H = -(X64 * (p * (1 - p))[:, None]).T @ X64 - np.eye(len(th)) / prior_scale**2
        th = th - np.linalg.solve(H, g)
    return th, H


@pytest.mark.parametrize("kind", ["sorted", "skewed"])
def test_remainder_and_rounding_within_their_bounds(kind, monkeypatch):
    data = _data(20000, kind)
    X, y = data["X"], data["y"]
    n, d = X.shape
    c64, H = _map(X, y)
    c = c64.astype(np.float32)  # the chain's centre is a float32 value
    prior = -np.eye(d) / 100.0
    cert, rows = certify.build(tm.models.LogisticRegression(), host_reader(data), n, c, H - prior, prior, np.float32)
    assert cert is not None and rows == n
    A = np.linalg.cholesky(np.linalg.inv(-H))
    ratio = jax.jit(jax.vmap(tm.models.LogisticRegression().log_lik_ratio, in_axes=(None, None, 0)))
    rng = np.random.default_rng(1)
    lam, thetas, props, computed = [], [], [], []
    for scale in (0.3, 1.0, 2.0, 4.0):  # up to 4 posterior sds (Laplace metric) from the centre
        for _ in range(10):
            th = (c64 + scale * A @ rng.standard_normal(d)).astype(np.float32)
            thp = (th + 0.5 * A @ rng.standard_normal(d)).astype(np.float32)
            lam.append(_log_lik64(X, y, thp.astype(np.float64)) - _log_lik64(X, y, th.astype(np.float64)))
            # the float32 ratios the exact test sums (compensated: as good as an exact sum of float32 values)
            li = ratio(jnp.asarray(th), jnp.asarray(thp), {"X": jnp.asarray(X)[:, None], "y": jnp.asarray(y)[:, None]})
            computed.append(math.fsum(np.asarray(li, np.float64).ravel()))
            thetas.append(th)
            props.append(thp)
    lam, computed = np.array(lam), np.array(computed)
    P, B, R, small = certify.bounds(cert, np.array(thetas), np.array(props))
    assert small.mean() > 0.5  # (R's allowance for the ratios holds for items' steps up to certify.MAX_STEP)
    assert np.all(np.abs(lam - P) <= B), np.max(np.abs(lam - P) / B)
    assert np.all(np.abs(computed - lam)[small] <= R[small]), np.max(np.abs(computed - lam) / R)
    assert np.median(np.abs(lam - P)) > 1e-4  # (the remainders are not trivially zero here)
    # negative control: a bound 100 times smaller does not hold
    monkeypatch.setattr(certify, "M3", certify.M3 / 100)
    _, B_small, _, _ = certify.bounds(cert, np.array(thetas), np.array(props))
    assert np.any(np.abs(lam - P) > B_small)


def _audits(r):
    return {k: np.concatenate([np.asarray(r.warmup_stats[k]), np.asarray(r.stats[k])], axis=1)
            for k in ("audited", "audit_exact", "audit_items", "accepted")}


def _run(monkeypatch, test=None, cert=True, scale=None, **kw):
    monkeypatch.setattr(selfaudit, "CERTIFY", cert)
    if scale is not None:  # a deliberately wrong certificate: bound and margins scaled down
        monkeypatch.setattr(certify, "M3", certify.M3 * scale)
        monkeypatch.setattr(certify, "SP_EPS", 0.0)
    data = _data(20000, "plain", seed=3)
    # (None: the approximate default for a model without a remainder bound, austerity + control variates)
    extra = {"test": test or tm.acceptance.Austerity(error=0.05), "control_variates": tm.ControlVariates()}
    r = tm.sample(tm.models.LogisticRegression(), data, num_warmup=200, num_samples=400, num_chains=4, audit=0.5,
                  seed=5, progress=False, **extra, **kw)
    monkeypatch.undo()
    return r


@pytest.mark.parametrize("test", [None, "barker"])
def test_certified_audits_take_the_full_passes_decisions(monkeypatch, test):
    tst = tm.acceptance.Barker() if test == "barker" else None
    full = _run(monkeypatch, tst, cert=False)
    got = _run(monkeypatch, tst)
    a, b = _audits(full), _audits(got)
    np.testing.assert_array_equal(np.asarray(got.flat_samples), np.asarray(full.flat_samples))
    np.testing.assert_array_equal(b["audited"], a["audited"])
    assert a["audited"].sum() > 800
    np.testing.assert_array_equal(b["audit_exact"], a["audit_exact"])
    aud = b["audited"]
    certified = aud & (b["audit_items"] == 0)
    assert certified.sum() > 0.3 * aud.sum()  # (0.7-0.8 of them here)
    assert 0 < b["audit_exact"][certified].sum() < certified.sum()  # both outcomes among them
    # every other audited step read all N, and the certificate's one pass is counted at the first audited step
    note = [m for m in got.notes if "certified without reading the data" in m]
    assert len(note) == 1 and not any("certified" in m for m in full.notes)
    count = int(re.search(r"self-audit: (\d+) audited decision", note[0]).group(1))
    assert certified.sum() <= count <= certified.sum() + 1
    n = 20000
    assert set(np.unique(b["audit_items"][aud])) <= {0, n, 2 * n}
    assert got.audit["audit_items"] == n * (aud.sum() - count) + n
    assert full.audit["audit_items"] == n * aud.sum()


def test_a_certificate_scaled_down_disagrees_with_the_full_passes(monkeypatch):
    """Negative control: the same run with the remainder's bound 1,000 times too small and no allowance for the
    ratios' rounding settles decisions the full passes take the other way."""
    a = _audits(_run(monkeypatch, cert=False))
    b = _audits(_run(monkeypatch, scale=1e-3))
    np.testing.assert_array_equal(b["audited"], a["audited"])
    assert np.sum(b["audit_exact"] != a["audit_exact"]) >= 5  # (17 of 1,236 here)


def test_streamed_runs_certify_the_same_audits(monkeypatch, tmp_path):
    """Draws streamed to disk take each chunk's audits before the chunk is written: the same audits as in memory."""
    mem = _audits(_run(monkeypatch))
    r = _run(monkeypatch, checkpoint=str(tmp_path / "run"), stream_draws=True)
    assert any("certified without reading the data" in m for m in r.notes)
    got = _audits(r)
    for k in mem:
        np.testing.assert_array_equal(got[k], mem[k], err_msg=k)


def test_what_the_certificate_covers():
    model = tm.models.LogisticRegression()
    assert certify.eligible(model, tm.acceptance.Exact())
    assert certify.eligible(model, tm.acceptance.Exact(kind="barker", temperature=2.0))

    class Tilted(tm.models.LogisticRegression):  # another likelihood: the bound is not its own
        def log_lik(self, theta, batch):
            return 2.0 * super().log_lik(theta, batch)

    assert not certify.eligible(Tilted(), tm.acceptance.Exact())
    assert not certify.eligible(tm.models.LinearRegression(), tm.acceptance.Exact())
    data = _data(2000, "plain")
    c, H = _map(data["X"], data["y"])
    d = c.shape[0]
    zero = np.zeros((d, d))
    assert certify.build(model, host_reader(data), 2000, c, -H, zero, np.float32) == (None, 0)  # not definite
    bad = {"X": data["X"].copy(), "y": data["y"]}
    bad["X"][7, 2] = np.nan
    assert certify.build(model, host_reader(bad), 2000, c, H, zero, np.float32) == (None, 2000)


def test_thresholds_are_the_exact_tests_comparisons():
    """``Lambda > t`` is ``exact_accept``'s decision for Metropolis and Barker, at any temperature."""
    from tallmh.acceptance.exact import exact_accept

    rng = np.random.default_rng(2)
    u = rng.random(2000).astype(np.float32)
    lb = rng.normal(size=2000).astype(np.float32)
    lam = rng.normal(scale=3, size=2000)
    for kind, T in (("metropolis", 1.0), ("barker", 1.0), ("barker", 2.5)):
        t, _ = certify.thresholds(u, lb, kind, T)
        want = np.asarray(exact_accept(kind, u, lb, lam, T))
        far = np.abs(lam - t) > 1e-5
        np.testing.assert_array_equal((lam > t)[far], want[far])


def test_the_default_audit_counts_the_items_it_reads(monkeypatch):
    """Where decisions are certified, the default audit is planned for its full power and stops once it has read
    its item budget (whole steps: at most one step of all chains beyond it), saying so with the power it had;
    without certification the plan is cut to the budget at N items per audit, as before."""
    n = 20000
    monkeypatch.setattr(selfaudit, "DEFAULT_AUDIT_ITEMS", 6 * n)
    data = _data(n, "plain", seed=3)
    kw = dict(num_warmup=300, num_samples=1500, num_chains=4, seed=5, progress=False,
              test=tm.acceptance.Austerity(error=0.05), control_variates=tm.ControlVariates())
    r = tm.sample(tm.models.LogisticRegression(), data, **kw)
    stop = [m for m in r.notes if m.startswith("self-audit: stopped at its budget of 120,000 items read")]
    assert len(stop) == 1 and not any("each reads all N" in m for m in r.notes)
    assert 6 * n <= r.audit["audit_items"] <= 6 * n + 4 * n
    assert r.audit["audit_steps"] > 6  # (more than the 6 the budget buys at N items each: some were certified)
    monkeypatch.setattr(selfaudit, "CERTIFY", False)
    r = tm.sample(tm.models.LogisticRegression(), data, **kw)
    assert any(m.startswith("self-audit: about 6 audited chain-step(s)") for m in r.notes)
    assert not any("stopped at its budget" in m for m in r.notes)
    assert r.audit["audit_items"] == n * r.audit["audit_steps"]
