"""Every bad input named in the issue raises an error that names the problem."""

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm


@pytest.fixture(scope="module")
def logistic():
    data, _ = tm.models.LogisticRegression.simulate(300, d=2, seed=0)
    return tm.models.LogisticRegression(), data


def _run(model, data, **kw):
    kw.setdefault("num_samples", 5)
    kw.setdefault("num_warmup", 0)
    kw.setdefault("num_chains", 1)
    kw.setdefault("progress", False)
    return tm.sample(model, data, **kw)


def test_mismatched_leading_lengths(logistic):
    model, data = logistic
    with pytest.raises(tm.DataError, match="different leading lengths"):
        _run(model, {"X": data["X"], "y": data["y"][:-1]})


def test_empty_data(logistic):
    model, _ = logistic
    with pytest.raises(tm.DataError, match="empty"):
        _run(model, {"X": np.zeros((0, 3)), "y": np.zeros(0)})


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_data(logistic, bad):
    model, data = logistic
    X = np.array(data["X"])
    X[5, 1] = bad
    with pytest.raises(tm.DataError, match=r"\['X'\].*NaN or infinite"):
        _run(model, {"X": X, "y": data["y"]})


def test_log_lik_wrong_shape(logistic):
    _, data = logistic
    model = tm.Model(log_prior=lambda th: jnp.sum(th**2), log_lik=lambda th, b: jnp.sum(b["X"] @ th))
    with pytest.raises(tm.ModelError, match="one value per item"):
        _run(model, data, init=jnp.zeros(3))


def test_log_lik_non_finite_at_init(logistic):
    _, data = logistic
    model = tm.Model(log_prior=lambda th: 0.0, log_lik=lambda th, b: jnp.log(b["X"] @ th * 0.0))
    with pytest.raises(tm.ModelError, match="non-finite"):
        _run(model, data, init=jnp.zeros(3))


def test_non_finite_initial_log_prior(logistic):
    _, data = logistic
    model = tm.Model(log_prior=lambda th: -jnp.inf, log_lik=lambda th, b: b["X"] @ th)
    with pytest.raises(tm.ModelError, match="log prior at the initial point is not finite"):
        _run(model, data, init=jnp.zeros(3))


def test_model_without_init_needs_init(logistic):
    _, data = logistic
    model = tm.Model(log_prior=lambda th: 0.0, log_lik=lambda th, b: b["X"] @ th)
    with pytest.raises(tm.ModelError, match="init"):
        _run(model, data)


@pytest.mark.parametrize("eps", [0.0, 1.0, -0.1, 1.5])
def test_epsilon_outside_unit_interval(eps):
    with pytest.raises(tm.ConfigError, match="epsilon must be in"):
        tm.acceptance.Austerity(epsilon=eps)


@pytest.mark.parametrize("delta", [0.0, 1.0, 2.0])
def test_delta_outside_unit_interval(delta):
    with pytest.raises(tm.ConfigError, match="delta must be in"):
        tm.acceptance.Confidence(delta=delta)
    with pytest.raises(tm.ConfigError, match="delta must be in"):
        tm.acceptance.Barker(delta=delta)


@pytest.mark.parametrize("make", [
    lambda b: tm.acceptance.Austerity(batch_size=b),
    lambda b: tm.acceptance.Confidence(initial_batch=b),
    lambda b: tm.acceptance.Barker(batch_size=b),
])
def test_batch_sizes_too_small_or_too_large(logistic, make):
    model, data = logistic
    with pytest.raises(tm.ConfigError, match="at least 2"):
        make(1)
    with pytest.raises(tm.ConfigError, match="exceeds the number of data items N = 300"):
        _run(model, data, test=make(301))


def test_unknown_bound():
    with pytest.raises(tm.ConfigError, match="unknown bound 'chernoff'"):
        tm.acceptance.Confidence(bound="chernoff")


def test_unknown_exact_kind():
    with pytest.raises(tm.ConfigError, match="metropolis"):
        tm.acceptance.Exact(kind="gibbs")


def test_logistic_needs_binary_target(logistic):
    model, data = logistic
    with pytest.raises(tm.DataError, match="binary"):
        _run(model, {"X": data["X"], "y": data["y"] * 2})


def test_bad_run_lengths(logistic):
    model, data = logistic
    with pytest.raises(tm.ConfigError, match="num_chains"):
        _run(model, data, num_chains=0)
    with pytest.raises(tm.ConfigError, match="num_samples"):
        _run(model, data, num_samples=-1)


def test_random_walk_bad_scale():
    with pytest.raises(tm.ConfigError):
        tm.proposals.RandomWalk(scale=-1.0)
    with pytest.raises(tm.ConfigError, match="positive definite"):
        tm.proposals.RandomWalk(scale=np.array([[1.0, 2.0], [2.0, 1.0]]))


def test_api_mistakes_are_one_line_errors_naming_what_was_expected():
    data, _ = tm.models.LogisticRegression.simulate(500, d=3, seed=0)
    model = tm.models.LogisticRegression()
    kw = dict(num_samples=5, num_warmup=5, num_chains=1, progress=False)
    cases = [
        (dict(data=(data["X"], data["y"])), "data must be a dict of arrays"),
        (dict(data={"features": data["X"], "target": data["y"]}), r"reads data\['X'\], which this data does not have"),
        (dict(data=data, test="fast"), "one of 'exact', 'austerity'"),
        (dict(data=data, init=np.zeros(7)), r"init has shape \(7,\); this model's parameter has shape \(4,\)"),
        (dict(data=data, num_samples="many"), "num_samples must be an integer >= 0 or 'auto'"),
    ]
    for args, match in cases:
        with pytest.raises(tm.ConfigError, match=match) as e:
            tm.sample(model, **{**kw, **args})
        assert "\n" not in str(e.value)
    # a test given by name is that test with its default settings (negative control: it runs)
    r = tm.sample(model, data, test="exact", **kw)
    assert type(r.test).__name__ == "Exact"
