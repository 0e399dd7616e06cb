"""The old import path of :mod:`tallmh.reporting.results` (``from tallmh.results import ...`` in users' code): the same module."""

import sys

from .reporting import results as _module

sys.modules[__name__] = _module
