"""The set-up's statistics over data in files in one sweep: the logistic model's host statistics (largest and smallest
entry, largest row norm) made slice by slice are the three whole-array sweeps' numbers bit for bit, and the leaves
that sweep proves finite skip the separate finiteness check, which still refuses a NaN or an infinity, naming its
rows and count, before any error of the model's."""

import numpy as np
import pytest

import tallmh as tm
from tallmh.models import logistic
from tallmh.storage import datasource as ds


def _three_sweeps(X):
    """The host statistics as they were made before: a maximum, a minimum and the row norms, each over X whole."""
    hi, lo = X.max(), X.min()
    if not (np.isfinite(hi) and np.isfinite(lo)):
        return None
    biggest = max(float(hi), -float(lo))
    if biggest > logistic.MAX_FEATURE:
        return biggest, np.inf
    return biggest, float(np.sqrt(np.max(np.einsum("ij,ij->i", X, X))))


def _same_verdict(X):
    """The one sweep's statistics against the three sweeps': the same largest row norm bit for bit, the same range
    check, and the largest entry itself where the check's error would name it."""
    got, want = logistic._feature_stats_host(X), _three_sweeps(X)
    if want is None:
        return got is None
    (b, norm), (b0, norm0) = got, want
    if b0 > logistic.MAX_FEATURE / 2:
        return b == b0 and norm == norm0
    return norm == norm0 and b0 <= b * (1 + 1e-6) and b <= logistic.MAX_FEATURE  # (b: the norm, a bound of b0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 5000, 3 * logistic.STATS_SLICE + 17])
def test_one_sweep_statistics_equal_the_three_sweeps_bit_for_bit(dtype, n):
    rng = np.random.default_rng(n)
    X = (rng.standard_normal((n, 11)) * np.geomspace(1e-3, 1e3, 11)).astype(dtype)
    X[n // 2, 4] = -7e3  # (the largest magnitude a negative entry)
    assert _same_verdict(X)
    for bad in (np.nan, np.inf, -np.inf):  # in the last slice, and in the first with the last NaN
        Y = X.copy()
        Y[-1, 2] = bad
        assert logistic._feature_stats_host(Y) is None and _three_sweeps(Y) is None
        Y[0, 0] = bad
        assert logistic._feature_stats_host(Y) is None
    for big in (-6e14, 9e14, -2e15, 3e19, 1e25):  # (near and beyond the range: the largest entry, exactly)
        Y = X.copy()
        Y[n // 3, 1] = big
        assert _same_verdict(Y)
    if n > 1:
        Y = X.copy()
        Y[n // 3, 1], Y[-1, 0] = 3e19, np.nan  # (a square that overflows before a NaN: still refused)
        assert logistic._feature_stats_host(Y) is None


def _files(tmp_path, monkeypatch, X, y):
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    monkeypatch.setattr(ds, "CHECK_NOW_MAX_ROWS", 10)  # (the finiteness check deferred to the first pass)
    data = tm.data.from_npy({"X": str(tmp_path / "X.npy"), "y": str(tmp_path / "y.npy")})
    assert ds.unchecked_leaves(data)
    return data


def _clean(n=3000, seed=0):
    data, _ = tm.models.LogisticRegression.simulate(n, d=4, seed=seed)
    return data["X"], data["y"]


def _feed(model, data, n, block=1024):
    tap = ds.StatsTap(model, data, n, ds.unchecked_leaves(data))
    try:
        for a in range(0, n, block):
            b = min(n, a + block)
            tap.feed(a, b, ds.read_rows(data, a, b))
    except ds.StatsFailed:  # (stops the pass that fed it; result() raises the error)
        pass
    return tap.result()


class _OwnSetup(tm.models.LogisticRegression):
    """A subclass with its own setup: the parent's setup_checked is not used for it."""

    def setup(self, data):
        return super().setup(data)


def test_the_leaves_the_statistics_prove_finite_skip_the_separate_check(tmp_path, monkeypatch):
    X, y = _clean()
    data = _files(tmp_path, monkeypatch, X, y)
    checked = []
    check = ds._check_rows
    monkeypatch.setattr(ds, "_check_rows", lambda rows, leaves, *a: checked.append(len(leaves)) or check(rows, leaves, *a))
    stats = _feed(tm.models.LogisticRegression(), data, X.shape[0])
    assert checked and max(checked) == 0  # (X and y proven by the one sweep)
    assert float(stats["max_norm"]) == _three_sweeps(X)[1]
    assert not ds.unchecked_leaves(data)  # (marked checked, as by the separate check)
    data = _files(tmp_path, monkeypatch, X, y)
    checked.clear()
    _feed(_OwnSetup(), data, X.shape[0])
    assert checked and min(checked) == 2  # (a subclass's own setup: the full check)


@pytest.mark.parametrize("model", [tm.models.LogisticRegression(), _OwnSetup()])
def test_non_finite_values_are_still_refused_naming_rows_and_count(tmp_path, monkeypatch, model):
    X, y = _clean()
    X = X.copy()
    X[2100, 1], X[2200, 3] = np.nan, -np.inf
    data = _files(tmp_path, monkeypatch, X, y)
    with pytest.raises(tm.DataError, match=r"\['X'\] holds 2 NaN or infinite value\(s\) in rows 2,048 to 2,999"):
        _feed(model, data, X.shape[0])
    X, y = _clean()
    y = y.copy()
    y[1500] = np.nan  # (fails the binary check too: the finiteness error comes first, as before)
    data = _files(tmp_path, monkeypatch, X, y)
    with pytest.raises(tm.DataError, match=r"\['y'\] holds 1 NaN or infinite value\(s\) in rows 1,024 to 2,047"):
        _feed(model, data, X.shape[0])


def test_the_models_own_errors_come_after_the_finiteness_check(tmp_path, monkeypatch):
    X, y = _clean()
    y = y.copy()
    y[100] = 2.0  # (past the first rows, which the tap's probe reads)
    data = _files(tmp_path, monkeypatch, X, y)
    with pytest.raises(tm.DataError, match="binary target"):
        _feed(tm.models.LogisticRegression(), data, X.shape[0])
    X = X.copy()
    X[120, 0] = np.inf  # (and a non-finite X in the same block: named first)
    data = _files(tmp_path, monkeypatch, X, y)
    with pytest.raises(tm.DataError, match="1 NaN or infinite value"):
        _feed(tm.models.LogisticRegression(), data, X.shape[0])
