"""The exact subsampled test's chain compiled first without its fallback's full pass
(``tallmh.run.programs.FULL_PASS_LATER``): a chunk in which a step needs the pass is made again by the whole program,
so the draws and statistics are the whole program's, bit for bit, whether the pass is never, sometimes or often
needed."""

import numpy as np
import pytest

import tallmh as tm
from tallmh.run import programs


def _run(max_rate):
    data, _ = tm.models.LogisticRegression.simulate(2000, d=3, seed=4)
    programs.RUNNERS.clear()  # (as in a new process)
    return tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.PoissonThinning(max_rate=max_rate),
                     num_samples=80, num_warmup=60, num_chains=2, seed=3, chunk_size=40, progress=False)


def _same(a, b):
    np.testing.assert_array_equal(a.flat_samples, b.flat_samples)
    for k in ("accepted", "n_data", "rounds", "nonfinite"):
        np.testing.assert_array_equal(np.asarray(a.stats[k]), np.asarray(b.stats[k]), err_msg=k)


# (read: whether the discarded first run of the chunk made again read rows; at max_rate 0.02 every step of it
# falls back, and a step that falls back reads none in that program)
@pytest.mark.parametrize("max_rate, switches, read", [(None, 0, False), (1.0, 1, True), (0.02, 1, False)])
def test_the_draws_are_the_whole_programs(monkeypatch, max_rate, switches, read):
    monkeypatch.setattr(programs, "FULL_PASS_LATER", False)
    whole = _run(max_rate)
    monkeypatch.setattr(programs, "FULL_PASS_LATER", True)
    made = []
    real = programs.whole_chunk
    monkeypatch.setattr(programs, "whole_chunk", lambda run, args: made.append(1) or real(run, args))
    try:
        later = _run(max_rate)
    finally:
        programs.RUNNERS.clear()
    assert len(made) == switches
    full = np.asarray(whole.stats["n_data"]) >= 2000  # (steps that took the full pass)
    assert full.any() == bool(switches)
    _same(whole, later)
    # every row read is counted: a chunk made again adds the rows its first run read
    assert (later.setup_items > whole.setup_items) == read and later.setup_items >= whole.setup_items


def test_a_chunk_not_made_again_would_differ(monkeypatch):
    """Negative control: the first program's outcome kept at the steps that needed the full pass is not the whole
    program's (what the comparison above would catch)."""
    monkeypatch.setattr(programs, "FULL_PASS_LATER", False)
    whole = _run(1.0)
    monkeypatch.setattr(programs, "FULL_PASS_LATER", True)
    monkeypatch.setattr(programs, "whole_chunk", lambda run, args: run.compiled)  # (never switches)
    try:
        kept = _run(1.0)
    finally:
        programs.RUNNERS.clear()
    with pytest.raises(AssertionError):
        _same(whole, kept)


def test_both_programs_are_kept_and_a_later_call_loads_them(tmp_path, monkeypatch):
    import jax

    from tallmh.run import _exec_cache

    previous = jax.config.jax_compilation_cache_dir
    tm.set_compilation_cache(str(tmp_path))
    loaded = []
    real_load = _exec_cache.load

    def spy(key):
        compiled = real_load(key)
        loaded.append(compiled is not None)
        return compiled

    monkeypatch.setattr(_exec_cache, "load", spy)
    try:
        first = _run(1.0)  # (a step needs the full pass: the whole program is compiled, and kept, too)
        assert loaded == [False, False]
        assert len(list((tmp_path / "tallmh-executables").glob("*.pkl"))) == 2
        second = _run(1.0)  # (as in a new process: both read from the disk, none traced)
        assert loaded[2:] == [True, True]
        _same(first, second)
    finally:
        programs.RUNNERS.clear()
        tm.set_compilation_cache(previous)
