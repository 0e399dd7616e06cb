"""The stratum of exact rows (tallmh.strata) and stratified austerity inside tm.sample."""

import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh import control_variates as cvm
from tallmh import setup_passes as setup
from tallmh import strata


def _rare(n=5000, rare=10, coef=4.0, seed=0):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.standard_normal((n, 3)) * [1.0, 3.0, 0.3], np.zeros(n)])
    where = np.sort(rng.choice(n, rare, replace=False))
    X[where, -1] = 1.0
    beta = np.array([-1.0, 0.5, 0.1, 1.0, coef])
    y = (rng.random(n) < 1 / (1 + np.exp(-(X @ beta)))).astype(np.float32)
    return {"X": jnp.asarray(X, jnp.float32), "y": jnp.asarray(y)}, where


class _GenericLogistic(tm.models.LogisticRegression):
    """The same likelihood written anew: no closed forms (so no remainder_weight), the generic weight."""

    def log_lik(self, theta, batch):
        z = batch["X"] @ theta
        return -jnp.logaddexp(0.0, jnp.where(batch["y"] > 0.5, -z, z))


def _stratum(model, data, k, min_share=0.0):
    n = data["y"].shape[0]
    center, _ = setup.find_center(model, data, n, lambda x: x, jnp.zeros(5))
    cv = cvm.proxy_sums(model, data, n, lambda x: x, center, 2)
    cov = setup.laplace_cov(model, lambda x: x, cv)
    return strata.choose(model, data, n, lambda x: x, center, cov, k, min_share)


@pytest.mark.parametrize("model", [tm.models.LogisticRegression(prior_scale=10.0), _GenericLogistic(prior_scale=10.0)],
                         ids=["rho-cubed", "generic-third-derivative"])
def test_stratum_holds_the_rare_rows(model):
    data, where = _rare()
    st = _stratum(model, data, 16)
    assert st.rows.dtype == np.int32 and len(st.rows) == 16 and np.all(np.diff(st.rows) > 0)
    assert set(where) <= set(st.rows.tolist())
    assert 0.5 < st.share <= 1.0


def test_negative_control_a_plain_feature_does_not_concentrate():
    # without the rare feature no handful of rows holds most of the weight
    data, _ = _rare(coef=0.0)
    data = {"X": data["X"].at[:, -1].set(jnp.asarray(np.random.default_rng(1).standard_normal(5000), jnp.float32)),
            "y": data["y"]}
    st = _stratum(tm.models.LogisticRegression(prior_scale=10.0), data, 16)
    assert st.share < 0.1


def test_exact_rows_option_checked():
    with pytest.raises(tm.errors.ConfigError):
        tm.ControlVariates(exact_rows=-1)
    with pytest.raises(tm.errors.ConfigError):
        tm.ControlVariates(exact_rows="most")
    assert tm.ControlVariates(exact_rows="auto").exact_row_cap(10**6) == cvm.EXACT_ROWS_AUTO
    assert tm.ControlVariates(exact_rows="auto").exact_row_cap(1000) == 50
    assert tm.ControlVariates(exact_rows="auto").exact_row_count(10**6) == 0  # known only from the data
    assert tm.ControlVariates(exact_rows=7).exact_row_count(5) == 5


def test_auto_takes_the_rows_that_hold_the_weight():
    data, where = _rare()
    model = tm.models.LogisticRegression(prior_scale=10.0)
    st = _stratum(model, data, 64, cvm.AUTO_RATIO / 5000)
    assert np.array_equal(st.rows, where)  # the 10 rare rows, and no other
    plain, _ = _rare(coef=0.0)
    plain = {"X": plain["X"].at[:, -1].set(jnp.asarray(np.random.default_rng(1).standard_normal(5000), jnp.float32)),
             "y": plain["y"]}
    assert len(_stratum(model, plain, 64, cvm.AUTO_RATIO / 5000).rows) == 0  # negative control: no row stands out


def _sample(data, cvo):
    return tm.sample(tm.models.LogisticRegression(prior_scale=10.0), data, test=tm.acceptance.Austerity(),
                     control_variates=cvo, num_samples=50, num_warmup=50, num_chains=2, progress=False)


@pytest.mark.filterwarnings("ignore::tallmh.errors.TrustWarning")
def test_sample_reads_the_stratum_at_every_step():
    data, _ = _rare()
    r = _sample(data, tm.ControlVariates(exact_rows="auto"))
    assert any("10 rows read exactly at every step" in n for n in r.notes)
    assert np.all(np.asarray(r.stats["n_data"]) >= 10)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.errors.TrustWarning")
def test_the_pass_choosing_the_stratum_is_counted():
    data, _ = _rare()
    r = _sample(data, tm.ControlVariates(exact_rows=16))
    assert any("16 rows read exactly at every step" in n for n in r.notes)
    plain = _sample(data, tm.ControlVariates())
    assert not any("read exactly" in n for n in plain.notes)
    assert r.setup_items == plain.setup_items + 5000
    # "auto" where no row stands out: the pass is made and counted, no stratum, the unstratified test
    flat, _ = _rare(coef=0.0)
    flat = {"X": flat["X"].at[:, -1].set(1.0), "y": flat["y"]}
    none = _sample(flat, tm.ControlVariates(exact_rows="auto"))
    assert any("none is read exactly" in n for n in none.notes)
    assert none.setup_items == _sample(flat, tm.ControlVariates()).setup_items + 5000


def test_exact_rows_refused_with_another_test():
    data, _ = _rare(n=500)
    with pytest.raises(tm.errors.ConfigError, match="stratifies the austerity test"):
        tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Barker(),
                  control_variates=tm.ControlVariates(exact_rows=8), num_samples=10, num_warmup=10, progress=False)
