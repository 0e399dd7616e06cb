"""Argument types of the ``tallmh`` command: each turns a string into a value or refuses it with a message
that names the option and what it needs."""

from __future__ import annotations

import argparse
import math

__all__ = ["positive_float", "int_at_least", "fraction", "batch_size", "samples"]


def positive_float(name):
    def f(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {s!r}") from None
        if not (math.isfinite(v) and v > 0):
            raise argparse.ArgumentTypeError(f"{name} must be positive; got {s}")
        return v
    return f


def int_at_least(name, lo):
    def f(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer; got {s!r}") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{name} must be at least {lo}; got {v}")
        return v
    return f


def fraction(name, lo_open=True):
    def f(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number; got {s!r}") from None
        ok = (0.0 < v < 1.0) if lo_open else (0.0 <= v < 1.0)
        if not ok:
            raise argparse.ArgumentTypeError(f"{name} must be in {'(0, 1)' if lo_open else '[0, 1)'}; got {s}")
        return v
    return f


def batch_size(s):
    if str(s).strip().lower() == "auto":
        return "auto"
    return int_at_least("--batch-size", 2)(s)


def auto_or_int(name, lo):
    """``'auto'``, or an integer of at least ``lo`` (``--warmup``, ``--samples``)."""
    def f(s):
        if str(s).strip().lower() == "auto":
            return "auto"
        try:
            return int_at_least(name, lo)(s)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"{name} must be 'auto' or an integer of at least {lo}; got {s!r}") from None
    return f


warmup = auto_or_int("--warmup", 0)
samples = auto_or_int("--samples", 4)
