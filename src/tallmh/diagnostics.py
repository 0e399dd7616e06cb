"""The old import path of :mod:`tallmh.reporting.diagnostics` (``from tallmh.diagnostics import ...`` in users' code): the same module."""

import sys

from .reporting import diagnostics as _module

sys.modules[__name__] = _module
