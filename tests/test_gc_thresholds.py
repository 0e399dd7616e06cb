"""tallmh._gc: the collector's youngest threshold raised within a call and the caller's put back after it."""

import gc
import threading

from tallmh import _gc


def test_raised_inside_and_restored():
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        with _gc.fewer_collections():
            assert gc.get_threshold() == (_gc.YOUNG, 10, 10)
            with _gc.fewer_collections():  # (nested: one raise)
                assert gc.get_threshold() == (_gc.YOUNG, 10, 10)
            assert gc.get_threshold() == (_gc.YOUNG, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*old)


def test_caller_settings_kept():
    old = gc.get_threshold()
    try:
        gc.set_threshold(0, 10, 10)  # automatic collection off: left off
        with _gc.fewer_collections():
            assert gc.get_threshold() == (0, 10, 10)
        gc.set_threshold(500_000, 10, 10)  # already larger: unchanged
        with _gc.fewer_collections():
            assert gc.get_threshold() == (500_000, 10, 10)
        gc.set_threshold(700, 10, 10)
        with _gc.fewer_collections():
            gc.set_threshold(1234, 5, 5)  # changed by the caller meanwhile: kept
        assert gc.get_threshold() == (1234, 5, 5)
    finally:
        gc.set_threshold(*old)


def test_concurrent_calls_restore_once_and_errors_restore():
    old = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        inside, go = threading.Event(), threading.Event()

        def other():
            with _gc.fewer_collections():
                inside.set()
                go.wait(5)

        t = threading.Thread(target=other)
        t.start()
        inside.wait(5)
        try:
            with _gc.fewer_collections():
                raise ValueError("the block's error")
        except ValueError:
            pass
        assert gc.get_threshold() == (_gc.YOUNG, 10, 10)  # (the other call still runs)
        go.set()
        t.join(5)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*old)


def test_sample_keeps_its_name_and_docstring():
    import tallmh as tm

    assert "min_ess" in tm.sample.__doc__ and tm.sample.__name__ == "sample"
