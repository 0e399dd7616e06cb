"""``tallmh.reporting.compare``: the demo's comparison workflow as a library, on a user's own model and data."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.reporting import compare


def _gaussian_mean_model(sigma=2.0, prior_sd=10.0):
    """A user's model, written as callables: x_i ~ N(mu, sigma^2), mu ~ N(0, prior_sd^2)."""
    return tm.Model(
        log_prior=lambda th: -0.5 * jnp.sum(th**2) / prior_sd**2,
        log_lik=lambda th, b: -0.5 * ((b["x"] - th[0]) / sigma) ** 2,
        init=lambda data: jnp.zeros(1),
        name="my-gaussian-mean",
    )


def test_posterior_mode_of_a_user_model_is_the_closed_form():
    rng = np.random.default_rng(0)
    x = (3.0 + 2.0 * rng.standard_normal(5000)).astype(np.float32)
    mode = compare.posterior_mode(_gaussian_mean_model(), {"x": x})
    prec = len(x) / 4.0 + 1 / 100.0
    mean = (x.astype(np.float64).sum() / 4.0) / prec
    np.testing.assert_allclose(mode.theta, [mean], rtol=1e-5)
    np.testing.assert_allclose(mode.cov, [[1 / prec]], rtol=1e-3)
    assert mode.passes >= 2  # Newton's passes and the one for the Hessian sums are counted


def test_logistic_mode_in_float64_agrees_with_autodiff_newton():
    data, _ = tm.models.LogisticRegression.simulate(3000, d=3, seed=2)
    builtin = tm.models.LogisticRegression(prior_scale=5.0)
    fast = compare.posterior_mode(builtin, data)
    # the same model as a user would write it: the generic (autodiff) path
    user = tm.Model(log_prior=builtin.log_prior, log_lik=builtin.log_lik, init=builtin.init)
    generic = compare.posterior_mode(user, data)
    np.testing.assert_allclose(generic.theta, fast.theta, atol=2e-3 * np.max(fast.sd) + 1e-4)
    np.testing.assert_allclose(np.sqrt(np.diag(generic.cov)), fast.sd, rtol=5e-3)


def test_linear_mode_with_the_noise_sd_sampled():
    data, _ = tm.models.LinearRegression.simulate(2000, d=2, noise_sd=2.0, seed=5)
    model = tm.models.LinearRegression(noise_sd=None)
    mode = compare.posterior_mode(model, data)
    mean, cov = model.posterior(data)
    # the mode and the mean of log sigma differ by O(1/N); the coefficients agree closely
    np.testing.assert_allclose(mode.theta[:2], mean[:2], atol=0.05 * np.sqrt(cov[0, 0]))
    assert abs(np.exp(mode.theta[2]) - 2.0) < 0.15
    np.testing.assert_allclose(mode.sd, np.sqrt(np.diag(cov)), rtol=0.02)


def test_sort_rows_puts_accurate_methods_first_then_ess_per_s():
    rows = [{"method": "a", "accurate": False, "ess_per_s": 900.0},
            {"method": "b", "accurate": True, "ess_per_s": 10.0},
            {"method": "c", "accurate": True, "ess_per_s": 50.0},
            {"method": "d", "accurate": False, "ess_per_s": float("nan")}]
    assert [r["method"] for r in compare.sort_rows(rows)] == ["c", "b", "a", "d"]


def test_lesson_is_computed_from_the_table():
    def row(method, ok, eps, verdict="trusted"):
        return {"method": method, "label": method + "(...)", "trusted_all": ok, "ess_per_s": eps,
                "verdict_line": verdict if ok else "NOT trusted: " + verdict}

    def lesson(rows):
        return compare.Comparison(runs=[], rows=rows, names=["a"], n=10).lesson()

    text = lesson([row("recommended", True, 900.0), row("exact", False, 3.0, "bulk ESS 20 < 100")])
    assert text.startswith("use recommended (recommended(...)); it was 300x faster per ESS than exact here")
    # negative control: a recommended method that failed here is not recommended
    text = lesson([row("recommended", False, 900.0, "R-hat 1.2 > 1.01"), row("exact", True, 3.0)])
    assert text.startswith("the recommended method") and "R-hat 1.2 > 1.01" in text and "faster" not in text
    assert "3.0x slower" in lesson([row("recommended", True, 1.0), row("exact", True, 3.0)])
    unchecked = {**row("recommended", True, 900.0), "accurate": None}
    assert "too few effective draws" in lesson([unchecked, row("exact", True, 3.0)])


def test_lesson_gives_the_speed_up_with_its_interval():
    """The ratio of ESS per second comes with the interval of the two ESS (the baseline's of ~5 dominates);
    results.json's "speedup" holds the same numbers."""
    rec = {"method": "recommended", "label": "r", "trusted_all": True, "ess_per_s": 900.0, "ess_min": 9000.0,
           "ess_per_s_interval": [800.0, 1000.0], "verdict_line": "trusted"}
    exact = {"method": "exact", "label": "e", "trusted_all": False, "ess_per_s": 3.0, "ess_min": 5.0,
             "ess_per_s_interval": [1.0, 9.0], "verdict_line": "NOT trusted: bulk ESS 5 < 100"}
    cmp = compare.Comparison(runs=[], rows=[rec, exact], names=["a"], n=10)
    sp = cmp.speedup()
    assert sp["ratio"] == pytest.approx(300.0)
    assert sp["interval"] == pytest.approx([800.0 / 9.0, 1000.0 / 1.0])
    assert sp["interval"][0] < sp["ratio"] < sp["interval"][1]
    text = cmp.lesson()
    assert "about 300x faster per ESS than exact" in text and "95% interval 89x-1,000x" in text, text
    assert "exact's ESS of 5.0 is itself uncertain" in text
    # without intervals (rows from an older results.json) the lesson gives the ratio alone
    plain = [{k: v for k, v in r.items() if k != "ess_per_s_interval"} for r in (rec, exact)]
    assert "95% interval" not in compare.Comparison(runs=[], rows=plain, names=["a"], n=10).lesson()


def test_accurate_is_the_readmes_rule():
    """Accurate: every mean within 0.1 reference sd + 3 MCSE of the reference's, every sd ratio in [0.8, 1.2].
    The old rule (0.2 sd, sd ratios 0.8-1.25 beyond 3 standard errors) passed the first and third cases."""
    def problems(err, mcse, ratio):
        pp = {"err_sd": np.array([err]), "err_z": np.array([err / mcse]), "mcse_sd": np.array([mcse]),
              "sd_ratio": np.array([ratio]), "sd_ratio_se": np.array([0.1])}
        return compare._accuracy_problems({"per_param": pp})

    assert problems(0.15, 0.01, 1.0)          # 0.15 > 0.1 + 3 x 0.01
    assert not problems(0.15, 0.02, 1.0)      # 0.15 <= 0.1 + 3 x 0.02
    assert problems(0.0, 0.01, 1.21) and problems(0.0, 0.01, 0.79)
    assert not problems(0.0, 0.01, 1.19) and not problems(0.0, 0.01, 0.81)
    assert problems(float("nan"), 0.01, 1.0)  # no number is not agreement
    assert compare.ACCURATE_MEAN_SD == 0.1 and compare.ACCURATE_SD_RATIO == (0.8, 1.2)


def test_data_digest_follows_the_data():
    a = {"x": np.arange(10.0)}
    assert compare.data_digest(a) == compare.data_digest({"x": np.arange(10.0)})
    assert compare.data_digest(a) != compare.data_digest({"x": np.arange(10.0) + 1e-9 * (np.arange(10) == 3)})
    assert compare.data_digest(a) != compare.data_digest({"z": np.arange(10.0)})


@pytest.fixture(scope="module")
def comparison(tmp_path_factory):
    """Exact MH against a deliberately wrong sampler (every proposal accepted) on a user's model."""
    rng = np.random.default_rng(1)
    x = (1.0 + 2.0 * rng.standard_normal(2000)).astype(np.float32)
    cache = tmp_path_factory.mktemp("cache")
    return compare.compare(
        _gaussian_mean_model(), {"x": x},
        {"exact": tm.acceptance.Exact(), "always-accept": tm.acceptance.AlwaysAccept()},
        budget_s=0.5, num_chains=2, seed=0, reference_draws=2000, reference_chains=2,
        cache_dir=str(cache), names=["mu"])


@pytest.mark.slow
def test_compare_flags_a_wrong_sampler_and_lists_it_last(comparison):
    rows = comparison.rows
    assert [r["method"] for r in rows] == ["exact", "always-accept"]
    exact, wrong = rows
    assert exact["accurate"] and exact["problems"] == []
    assert not wrong["accurate"] and not wrong["trusted_all"]
    assert wrong["verdict_line"].startswith("NOT trusted: ")
    assert wrong["sd_ratio_max"] > 2  # a random walk that never rejects spreads far too wide
    lines = comparison.table().splitlines()
    assert lines[0].split()[:3] == ["method", "trusted", "accurate"]
    assert lines[2].split()[:3] == ["exact", "yes" if exact["trusted"] else "no", "yes"]
    assert comparison.verdicts()[1].startswith("always-accept: NOT trusted")
    for r in comparison.runs:
        assert r.result.flat_samples.shape[1] > 0 and not r.result.partial
        # no warmup phase with the Laplace proposal: the first 10% of the budget's draws are burn-in
        kb, ks = r.result.flat_warmup.shape[1], r.result.flat_samples.shape[1]
        assert abs(kb - 0.1 * (kb + ks)) <= 1
        assert r.result.stats["accepted"].shape[1] == ks and r.result.warmup_stats["accepted"].shape[1] == kb


@pytest.mark.slow
def test_comparison_writes_a_report(comparison, tmp_path):
    files = comparison.write_report(str(tmp_path / "rep"), title="my comparison")
    names = sorted(p.split("/")[-1] for p in files)
    assert names == sorted(["traces.png", "marginals.png", "data_per_step.png", "posterior-exact.nc",
                            "posterior-always-accept.nc", "results.json", "report.html"])
    res = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert [m["method"] for m in res["methods"]] == ["exact", "always-accept"]
    assert res["reference"]["chains"] == 2 and res["parameters"] == ["mu"]
    html = (tmp_path / "rep" / "report.html").read_text()
    assert html.index("Verdict") < html.index("Results")


def test_error_against_the_reference_is_summed_in_float64():
    """A long float32 chain's error against the reference: its mean is summed in float64 (a float32 column sum
    over 3 x 10^5 draws of 10 parameters drifts by about a fifth of a posterior sd when the mean is large next to
    the sd, as for the demo's intercept)."""
    from types import SimpleNamespace

    from tallmh.reporting.report import MethodRun, Reference, method_row

    rng = np.random.default_rng(0)
    c, k, d = 2, 150_000, 10
    x = (-1.3 + 0.0046 * rng.standard_normal((c, k, d))).astype(np.float32)
    ref = Reference(draws=(-1.3 + 0.0046 * rng.standard_normal((2, 1000, d))).astype(np.float32),
                    info={"ess": np.full(d, 2000.0)})
    res = SimpleNamespace(flat_samples=x, param_names=[f"b{j}" for j in range(d)], n=1000, setup_items=0,
                          partial=False, stats={"accepted": np.ones((c, k), bool), "n_data": np.ones((c, k))})
    run = MethodRun(name="m", result=res, times=np.zeros((c, k)), warmup_times=np.zeros((c, 0)), seconds=1.0,
                    compile_s=0.0)
    row = method_row(run, ref)
    r64 = ref.draws.astype(np.float64).reshape(-1, d)
    exact = np.abs(x.astype(np.float64).reshape(-1, d).mean(axis=0) - r64.mean(axis=0)) / r64.std(axis=0, ddof=1)
    np.testing.assert_allclose(row["per_param"]["err_sd"], exact, atol=1e-4)
    # negative control: the float32 column sum that the row used before is off by far more than that
    naive = np.abs(x.reshape(-1, d).mean(axis=0) - r64.mean(axis=0)) / r64.std(axis=0, ddof=1)
    assert np.max(np.abs(naive - exact)) > 0.05


def test_table_prints_a_tiny_share_of_the_data_in_two_digits():
    from tallmh.reporting.report import format_table

    text = format_table([{"method": "a", "data_fraction": 1.0}, {"method": "b", "data_fraction": 2.36e-6},
                         {"method": "c", "data_fraction": 0.00317}])
    cells = [line.split()[-1] for line in text.splitlines()[2:]]
    assert cells == ["100.000%", "0.00024%", "0.317%"]
