"""Every row the automatic program's analysis of a group-level model reads (the data-free check, the GLM
recognition, the centre's Newton passes, the bounds) is counted in ``result.setup_items``, and its time in the
set-up's (tallmh.setup_reads)."""

import pytest

import tallmh as tm
from tallmh import hierarchical, setup_reads

pytest.importorskip("pymc")

from .test_glm_effects import _groups_model  # noqa: E402 - (needs PyMC)


def test_the_ledger_counts_inside_its_block_only_and_nests():
    setup_reads.add(5)  # (no ledger open: not recorded, no error)
    with setup_reads.counting() as outer:
        setup_reads.add(3)
        with setup_reads.counting() as inner:
            setup_reads.add(4)
        assert inner[0] == 4
        assert outer[0] == 7
    setup_reads.add(2)
    assert outer[0] == 7


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_the_automatic_programs_reads_are_in_setup_items():
    n_j = (100,) * 6
    model, data = _groups_model(n_j)
    n = sum(n_j)
    with setup_reads.counting() as ledger:
        got = hierarchical.auto_program(model, data)
    assert got is not None and "glm_effects" in got[1].blocks[-1].label
    # the data-free check reads every row for the scale (one pass), the recognition all rows once for the
    # design and twice for its checks, the bounds one pass: at least 5 passes
    assert ledger[0] >= 5 * n
    r = tm.sample(model, data, num_samples=30, num_warmup=30, num_chains=2, seed=0, progress=False)
    assert r.label.startswith("cycle(")
    assert r.setup_items == ledger[0]  # (the same deterministic analysis; the blocks' runner adds no pass)
    assert 0 < r.timings["setup_s"] <= r.timings["total_s"]
