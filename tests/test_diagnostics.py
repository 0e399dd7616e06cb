"""tallmh's own rank-normalised ESS and R-hat against ArviZ's, parameter by parameter.

Draws of several kinds: independent, strongly autocorrelated (AR(1), rho = 0.95), chains at different
locations (R-hat well above 1), heavy tails, ties (discrete values), a constant parameter, odd draw counts
and a single chain. A deliberately wrong estimate (the ESS of the draws without the rank normalisation, on
heavy-tailed draws) must differ from ArviZ's, so the comparison can fail.
"""

import warnings

import numpy as np
import pytest

from tallmh.reporting import diagnostics


def _draws(chains, n, seed=0):
    rng = np.random.default_rng(seed)
    cols = [rng.standard_normal((chains, n))]
    ar = np.zeros((chains, n))
    e = rng.standard_normal((chains, n))
    for t in range(1, n):
        ar[:, t] = 0.95 * ar[:, t - 1] + e[:, t]
    cols.append(ar)
    cols.append(rng.standard_normal((chains, n)) + np.arange(chains)[:, None] * 0.5)
    cols.append(rng.standard_cauchy((chains, n)))
    cols.append(rng.poisson(2.0, (chains, n)).astype(float))
    cols.append(np.full((chains, n), 3.0))
    return np.stack(cols, axis=-1)


def _arviz_values(x, method):
    az = diagnostics._arviz()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "rhat":
            return np.array([float(np.ravel(az.rhat(x[:, :, j]))[0]) for j in range(x.shape[-1])])
        return np.array([float(np.ravel(az.ess(x[:, :, j], method=method, **diagnostics.ess_kwargs(method, az)))[0])
                         for j in range(x.shape[-1])])


# (4, 402): halves of 201 draws, whose FFT length (the smallest fast one from 402) is odd, where the inverse
# transform's length must be given; (2, 4000): the autocovariances read from the first lags, then all lags
@pytest.mark.parametrize("chains,n", [(4, 500), (2, 301), (1, 400), (3, 7), (4, 402), (2, 4000)])
@pytest.mark.parametrize("method", ["bulk", "tail", "mean", "rhat"])
def test_matches_arviz(chains, n, method):
    x = _draws(chains, n, seed=chains * 1000 + n)
    ours = diagnostics.rhat_all(x) if method == "rhat" else diagnostics.ess_all(x, method)
    ref = _arviz_values(x, method)
    if method == "rhat" and chains == 1:
        assert np.isnan(ours).all()
        return
    # ArviZ gives NaN or a number exactly where we do; the numbers agree to rounding
    assert np.array_equal(np.isnan(ours), np.isnan(ref)), (ours, ref)
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(ours[ok], ref[ok], rtol=1e-9)
    # the one-parameter wrappers are the same numbers
    one = diagnostics.rhat(x[:, :, 0]) if method == "rhat" else diagnostics.ess(x[:, :, 0], method)
    np.testing.assert_allclose(one, ours[0], rtol=1e-12, equal_nan=True)


def test_wrong_estimate_differs_from_arviz():
    """Negative control: without rank normalisation, the heavy-tailed column's bulk ESS is not ArviZ's."""
    x = _draws(4, 500, seed=3)[:, :, 3:4]
    wrong = diagnostics._ess_core(diagnostics._split_chains(x))
    ref = _arviz_values(x, "bulk")
    assert abs(wrong[0] - ref[0]) / ref[0] > 1e-3


def test_nan_and_short():
    x = _draws(2, 100)
    x[1, 5, 0] = np.nan
    assert np.isnan(diagnostics.ess_all(x)[0]) and np.isfinite(diagnostics.ess_all(x)[1])
    assert np.isnan(diagnostics.rhat_all(x)[0]) and np.isfinite(diagnostics.rhat_all(x)[1])
    assert np.isnan(diagnostics.ess_all(x[:, :3])).all()
    with pytest.raises(ValueError, match="method"):
        diagnostics.ess_all(x, "median")


def test_average_ranks_match_scipy():
    from scipy import stats

    rng = np.random.default_rng(5)
    a = np.stack([rng.standard_normal(300), rng.integers(0, 4, 300).astype(float), np.full(300, 2.0)], axis=1)
    np.testing.assert_array_equal(diagnostics._average_ranks(a), stats.rankdata(a, method="average", axis=0))


def test_standard_library_stand_ins_for_scipy_agree_with_scipy():
    """The rank normalisation's normal quantile, the FFT length, the audit's binomial tail and the sequential
    test's normal CDF and quantile, done without importing scipy (~0.2 s of a fresh process), agree with
    SciPy's; a quantile rounded to float32 (a deliberately coarse stand-in) does not pass the same check."""
    from scipy.fft import next_fast_len
    from scipy.special import ndtr, ndtri
    from scipy.stats import binom

    from tallmh.reporting import diagnostics as dg
    from tallmh.acceptance import _sequential as seq
    from tallmh.reporting.results import _binom_sf

    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 101, 2))
    x[1, :10, 0] = 0.25  # ties: average (half) ranks
    r = dg._average_ranks(x.reshape(303, 2))
    want = ndtri((r - 0.375) / (303 + 0.25)).reshape(3, 101, 2)
    got = dg._z_scale(x)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
    assert np.max(np.abs(got.astype(np.float32).astype(float) - want)) > 1e-9
    assert all(dg._next_fast_len(m) == next_fast_len(m) for m in range(1, 3000))
    for m in (1, 44, 68, 250):
        for k in range(0, m, max(1, m // 7)):
            for p in (0.001, 0.1, 0.5):
                assert _binom_sf(k, m, p) == pytest.approx(float(binom.sf(k, m, p)), rel=1e-9, abs=1e-300)
    for v in (-7.0, -2.5, 0.0, 1.3, 6.0):
        assert seq.ndtr(v) == pytest.approx(float(ndtr(v)), rel=1e-14)
    for p in (1e-12, 0.003, 0.5, 0.97):
        assert seq.ndtri(p) == pytest.approx(float(ndtri(p)), rel=1e-13)


def _ar1(phi, n, chains, seed):
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((chains, n))
    x = np.empty((chains, n))
    x[:, 0] = e[:, 0] / np.sqrt(1.0 - phi**2)  # started in the stationary law
    for t in range(1, n):
        x[:, t] = phi * x[:, t - 1] + e[:, t]
    return x


@pytest.mark.parametrize("phi,n,least", [(0.9, 2000, 0.9), (0.99, 300, 0.8)])
def test_ess_interval_covers_the_true_ess(phi, n, least):
    """AR(1) chains, whose ESS is known (2n(1-phi)/(1+phi)): the 95% interval covers it in most of 200 runs
    (at a true ESS of 3 the estimate is rough, and the interval is only approximate there); the same
    interval at level 0.2 (a deliberately narrow one) does not."""
    from tallmh.reporting.diagnostics import ess_interval

    true = 2 * n * (1 - phi) / (1 + phi)
    cover = narrow = 0
    for seed in range(200):
        x = _ar1(phi, n, 2, seed)
        e, lo, hi = ess_interval(x)
        assert lo < e < hi
        cover += lo <= true <= hi
        _, lo2, hi2 = ess_interval(x, level=0.2)
        narrow += lo2 <= true <= hi2
    assert cover / 200 >= least, cover
    assert narrow / 200 < 0.6, narrow


def _geyer_loop_reference(rho_all, m, n, monotone=True):
    """The per-column loop that the vectorised Geyer sequences replaced (kept here as the reference); ``monotone=False``
    skips the initial monotone pass (a wrong estimate, for the negative control)."""
    out, lag = np.full(rho_all.shape[1], np.nan), np.full(rho_all.shape[1], np.nan)
    for j in range(rho_all.shape[1]):
        rho = rho_all[:, j]
        r = np.zeros(n)
        r[0], r[1] = 1.0, rho[1]
        even, odd = 1.0, rho[1]
        t = 1
        while t < n - 3 and even + odd > 0.0:
            even, odd = rho[t + 1], rho[t + 2]
            if even + odd >= 0:
                r[t + 1], r[t + 2] = even, odd
            t += 2
        max_t = t - 2
        if even > 0:
            r[max_t + 1] = even
        t = 1
        while monotone and t <= max_t - 2:
            if r[t + 1] + r[t + 2] > r[t - 1] + r[t]:
                r[t + 1] = r[t + 2] = (r[t - 1] + r[t]) / 2.0
            t += 2
        tau = -1.0 + 2.0 * np.sum(r[:max_t + 1]) + np.sum(r[max_t + 1:max_t + 2])
        tau = max(tau, 1.0 / np.log10(m * n))
        out[j] = np.nan if np.isnan(r).any() else m * n / tau
        lag[j] = max_t + 2
    return out, lag


@pytest.mark.parametrize("n", [4, 5, 8, 9, 60, 801])
def test_vectorised_geyer_sequences_equal_the_per_column_loop(n):
    """The ESS of many parameters at once (a model's group effects) equals the per-column loop's on autocorrelations
    of every shape: AR(1) from -0.9 to 0.999 (initial positive sequence stopped early, late or by the draw count),
    non-monotone ones (the monotone pass acts), and random ones; a deliberately wrong variant (no monotone pass)
    differs."""
    rng = np.random.default_rng(n)
    cols = [phi ** np.arange(n) for phi in (-0.9, -0.2, 0.0, 0.3, 0.95, 0.999)]
    cols += [np.cos(np.arange(n) * w) * 0.9 ** np.arange(n) for w in (0.3, 1.1, 2.5)]
    cols += [np.r_[1.0, rng.uniform(-0.5, 1.0, n - 1)] for _ in range(20)]
    rho = np.stack(cols, axis=1)
    m = 4
    ref_ess, ref_lags = _geyer_loop_reference(rho, m, n)
    tau, max_t, done = diagnostics._geyer_tau(rho, n)
    assert done.all()  # (every lag given)
    ours = m * n / np.maximum(tau, 1.0 / np.log10(m * n))
    np.testing.assert_allclose(ours, ref_ess, rtol=1e-12)
    np.testing.assert_array_equal(max_t + 2, ref_lags)
    if n >= 60:  # the columns exercise the monotone pass: without it the loop gives other values
        assert not np.allclose(ours, _geyer_loop_reference(rho, m, n, monotone=False)[0], rtol=1e-3)


def test_ess_of_many_parameters_equals_one_at_a_time():
    """ess_all over 300 columns of MH-like draws (repeats from rejections, ties) equals ess of each column alone."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 400, 300)).cumsum(axis=1) * 0.1 + rng.standard_normal((4, 400, 300))
    stay = rng.random((4, 400, 300)) < 0.6
    for t in range(1, 400):
        x[:, t] = np.where(stay[:, t], x[:, t - 1], x[:, t])
    allk = diagnostics.ess_all(x)
    one = np.array([diagnostics.ess(x[:, :, j]) for j in range(0, 300, 37)])
    np.testing.assert_allclose(allk[::37], one, rtol=1e-12)
    np.testing.assert_allclose(diagnostics.rhat_all(x)[::37], [diagnostics.rhat(x[:, :, j]) for j in range(0, 300, 37)],
                               rtol=1e-12)


def test_bulk_ess_and_rhat_equal_the_separate_functions():
    """The convergence check's shared computation gives ess_all and rhat_all exactly (NaN columns included), and
    no R-hat when the ESS goal is not met."""
    x = _draws(4, 300, seed=11)
    x[2, 7, 3] = np.nan
    ess, rh = diagnostics.bulk_ess_and_rhat(x)
    np.testing.assert_array_equal(ess, diagnostics.ess_all(x))
    np.testing.assert_array_equal(rh, diagnostics.rhat_all(x))
    ok = np.isfinite(ess)
    e2, r2 = diagnostics.bulk_ess_and_rhat(x[:, :, ok], min_ess=float(np.min(ess[ok])))
    np.testing.assert_array_equal(r2, diagnostics.rhat_all(x[:, :, ok]))
    assert diagnostics.bulk_ess_and_rhat(x[:, :, ok], min_ess=float(np.min(ess[ok])) + 1)[1] is None


def _ar_columns(c, n, phis, seed):
    """AR(1) draws, one column per autocorrelation in ``phis`` (c chains, n draws), started at stationarity."""
    rng = np.random.default_rng(seed)
    e = rng.standard_normal((c, n, len(phis)))
    phis = np.asarray(phis)
    x = np.empty_like(e)
    x[:, 0] = e[:, 0]
    for t in range(1, n):
        x[:, t] = phis * x[:, t - 1] + np.sqrt(1 - phis ** 2) * e[:, t]
    return x


def test_ess_from_the_first_lags_equals_all_lags(monkeypatch):
    """ESS read from the first eighth of the lags, then from all lags for the columns whose Geyer sequence had not ended
    there (an autocorrelation of 0.9995 over 3,001 draws), equals ESS from all lags; that column does need the
    second pass (its sequence read on the first lags alone has not ended, and would give another ESS)."""
    x = _ar_columns(4, 3001, [0.0, 0.5, 0.9, 0.99, 0.9995], seed=3)
    first = {m: diagnostics.ess_all(x, m) for m in ("bulk", "tail", "mean")}
    monkeypatch.setattr(diagnostics, "FIRST_LAGS_SHARE", 1)
    for m in ("bulk", "tail", "mean"):
        np.testing.assert_allclose(first[m], diagnostics.ess_all(x, m), rtol=1e-10)
    s = diagnostics._split_chains(x[:, :, -1:])
    lags = s.shape[1] // 8
    _, _, _, done = diagnostics._tau(diagnostics._autocov(s, lags), s.shape[1], np.var(s.mean(axis=1), ddof=1))
    assert not done[0]
    tau_short = diagnostics._tau(diagnostics._autocov(s, lags), s.shape[1], np.var(s.mean(axis=1), ddof=1))[0][0]
    tau_all = diagnostics._tau(diagnostics._autocov(s), s.shape[1], np.var(s.mean(axis=1), ddof=1))[0][0]
    assert abs(tau_short / tau_all - 1) > 1e-3


@pytest.mark.parametrize("chains", [1, 4])
def test_summary_columns_equal_the_separate_functions(monkeypatch, chains):
    """The summary's one pass (blocks of columns, one rank normalisation for bulk ESS and R-hat) gives ess_all (bulk
    and tail), rhat_all, the mean and the sd of every column: slow and fast columns, ties, a NaN draw, a constant
    column, an odd number of draws, blocks of 3 columns."""
    x = _ar_columns(chains, 1001, [0.0, 0.3, 0.8, 0.95, 0.99, 0.999, 0.2, 0.5, 0.1, 0.7], seed=5)
    x[:, :, 6] = np.round(x[:, :, 6])
    x[0, 7, 7] = np.nan
    x[:, :, 8] = 2.5
    monkeypatch.setattr(diagnostics, "DIAG_BLOCK_VALUES", 3 * chains * 1001)
    got = diagnostics.summary_columns(x)
    want = {"ess_bulk": diagnostics.ess_all(x), "ess_tail": diagnostics.ess_all(x, "tail"),
            "r_hat": diagnostics.rhat_all(x), "mean": x.mean(axis=(0, 1)), "sd": x.reshape(-1, 10).std(axis=0, ddof=1)}
    for key, ref in want.items():
        np.testing.assert_allclose(got[key], ref, rtol=1e-12, equal_nan=True, err_msg=key)
    assert np.isnan(got["ess_bulk"][7]) and np.isnan(got["r_hat"][7])
    assert np.isnan(got["r_hat"]).all() == (chains == 1)
    got32 = diagnostics.summary_columns(x.astype(np.float32))  # (stored draws are float32: means in float64)
    np.testing.assert_allclose(got32["mean"], x.astype(np.float32).astype(float).mean(axis=(0, 1)), rtol=1e-12)
