"""Stop signals of the ``tallmh`` command: the first Ctrl-C, SIGTERM or SIGHUP stops sampling and keeps the
draws made so far (the outputs are then written); any later one ends the process at once."""

from __future__ import annotations

import os
import signal
import sys

from .console import PROG
from .errors import Stopped

__all__ = ["STOP_SIGNALS", "status_of_stop", "arm_second_interrupt", "arm_deferred_stop", "stopped",
           "install_interrupt_counter", "disarm"]

STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n))
_STOPPED_BY: list = []  # the first stop signal this process received (Ctrl-C, SIGTERM, SIGHUP)


def status_of_stop() -> int:
    """Exit status of a stopped command: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + (_STOPPED_BY[0] if _STOPPED_BY else int(signal.SIGINT))


def stopped() -> bool:
    """Whether a stop signal reached the command line's handlers."""
    return bool(_STOPPED_BY)


def arm_deferred_stop():
    """While a finished run writes its outputs: the first stop signal is recorded (the outputs are finished,
    then the command ends with the stop's status), never raised where it lands (a weakref callback, a
    finaliser, ...); a second one ends the process at once. Returns the previous handlers."""
    def handler(signum, frame):
        if _STOPPED_BY:
            _stop_now(signum)
        _STOPPED_BY.append(int(signum))
        try:
            sys.stderr.write(f"\n{PROG}: {signal.Signals(signum).name}: finishing the outputs, then stopping\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            if sig != signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break
    return previous


def _stop_now(signum):
    try:
        sys.stderr.write(f"\n{PROG}: {signal.Signals(signum).name} again; stopping now (files already written are "
                         "complete)\n" if signum != signal.SIGINT else
                         f"\n{PROG}: interrupted again; stopping now (files already written are complete)\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # the terminal is gone
        pass
    finally:
        os._exit(128 + (_STOPPED_BY[0] if _STOPPED_BY else signum))


def arm_second_interrupt():
    """From now on a stop signal (Ctrl-C, SIGTERM, SIGHUP) ends the process at once: the first one is being
    handled. Returns the previous handlers (empty when not in the main thread)."""
    def handler(signum, frame):
        _stop_now(signum)

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            previous[sig] = signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break
    return previous


def install_interrupt_counter():
    """The real command line: the first Ctrl-C, SIGTERM or SIGHUP raises KeyboardInterrupt (tm.sample turns it
    into a partial result, which is written out); any later one ends the process at once, whatever it is
    doing. A signal the caller ignores (``nohup``) stays ignored."""

    def handler(signum, frame):
        if _STOPPED_BY:
            _stop_now(signum)
        _STOPPED_BY.append(int(signum))
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    for sig in STOP_SIGNALS:
        try:
            if sig != signal.SIGINT and signal.getsignal(sig) == signal.SIG_IGN:
                continue
            signal.signal(sig, handler)
        except ValueError:  # not the main thread
            break


def disarm(previous):
    """Put back the handlers :func:`arm_second_interrupt` returned."""
    for sig, h in (previous or {}).items():
        if h is None:
            continue
        try:
            signal.signal(sig, h)
        except ValueError:
            pass
