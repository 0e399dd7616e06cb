"""The benchmark scripts' shared helpers (``benchmarks/_common.py``): options, tables, and the analysis pieces.

Fast checks on small hand-made inputs; the scripts themselves run in the ``slow`` smoke tests.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# loaded under the name the papers' ``_common`` gives it, so that no other test's ``import _common`` is shadowed
if "benchmarks_common" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("benchmarks_common", os.path.join(ROOT, "benchmarks", "_common.py"))
    sys.modules["benchmarks_common"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["benchmarks_common"])
C = sys.modules["benchmarks_common"]


def test_add_options_takes_each_type_from_its_default():
    ap = C.parser("Title line.\n\nMore text.")
    C.add_options(ap, n=100_000, proposal_sd=0.1, sizes="1e3,1e4", hand_written=False)
    C.add_run_options(ap, "/tmp/x")
    a = ap.parse_args([])
    assert (a.n, a.proposal_sd, a.sizes, a.hand_written, a.seed, a.smoke, a.out) == (
        100_000, 0.1, "1e3,1e4", False, 0, False, "/tmp/x")
    a = ap.parse_args(["--n", "7", "--proposal-sd", "2", "--hand-written", "--seed", "3"])
    assert (a.n, a.proposal_sd, a.hand_written, a.seed) == (7, 2.0, True, 3)
    assert isinstance(a.n, int) and isinstance(a.proposal_sd, float)
    assert ap.description == "Title line."
    with pytest.raises(TypeError, match="--bad"):
        C.add_options(ap, bad=None)
    assert C.numbers("1e3,2500", int) == [1000, 2500]


def test_print_table_aligns_titles_with_their_columns(capsys):
    rows = [{"N": 1000, "test": "exact", "frac": 0.25}, {"N": 10000, "test": "austerity", "frac": 0.5}]
    C.print_table(rows, [("N", "6d", "N"), ("test", "<10s", "test"), ("data %", "7.1f", C.percent("frac")),
                         ("diff", "+6.2f", lambda r: r["frac"] - 0.3)])
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["     N test        data %   diff", "  1000 exact         25.0  -0.05",
                     " 10000 austerity     50.0  +0.20"]


def test_running_means_at_wall_times():
    v = np.arange(1.0, 11.0)  # 10 draws over 5 s: one every 0.5 s
    out = C.running_means_at(v, 5.0, [0.2, 0.5, 2.6, 5.0])
    assert np.isnan(out[0])  # before the first draw
    np.testing.assert_array_equal(out[1:], [1.0, 3.0, 5.5])  # means of the first 1, 5 and 10 draws
    two = C.running_means_at(np.c_[v, -v], 5.0, [5.0])
    np.testing.assert_array_equal(two, [[5.5, -5.5]])


def test_wrong_decisions_counts_against_the_exact_decisions():
    exact = np.array([[True, False, True, False], [True, True, False, False]])
    acc = np.array([[True, True, True, False], [False, True, False, False]])  # one wrong accept, one wrong reject
    nd = np.full(acc.shape, 50)
    row, per_pair = C.wrong_decisions(acc, nd, exact, 100)
    np.testing.assert_array_equal(per_pair, [0.25, 0.25])
    assert row["decisions"] == 8 and row["data_fraction"] == 0.5
    assert row["wrong_rate"] == 0.25 and row["wrong_accept_rate"] == 0.125 and row["wrong_reject_rate"] == 0.125
    assert row["wrong_rate_binomial_se"] == pytest.approx(np.sqrt(0.25 * 0.75 / 8))
    assert row["wrong_rate_pair_clustered_se"] == 0.0 and row["max_pair_wrong_rate"] == 0.25
    assert np.isnan(C.wrong_decisions(acc[:1], nd[:1], exact[:1], 100)[0]["wrong_rate_pair_clustered_se"])


def test_logistic_newton_finds_the_map():
    rng = np.random.default_rng(0)
    X = np.c_[np.ones(400), rng.standard_normal((400, 2))]
    y = (rng.random(400) < 1 / (1 + np.exp(-X @ np.array([0.5, -1.0, 2.0])))).astype(float)

    def grad(theta):
        return X.T @ (y - 1 / (1 + np.exp(-X @ theta))) - theta / 4.0

    theta, H, steps = C.logistic_newton(X, y, 4.0, 50, chunk=150)  # chunks of 150 rows: three partial sums
    assert np.max(np.abs(grad(theta))) < 1e-8 < np.max(np.abs(grad(np.zeros(3))))  # negative control: the start
    assert 2 <= steps < 50 and np.all(np.linalg.eigvalsh(H) > 0)
    theta1, H1, _ = C.logistic_newton(X, y, 4.0, 50)  # one chunk: the same MAP
    np.testing.assert_allclose(theta1, theta, rtol=1e-10)
