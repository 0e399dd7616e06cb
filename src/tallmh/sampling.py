"""The old import path of :mod:`tallmh.run.sampling` (``from tallmh.sampling import ...`` in users' code): the same module."""

import sys

from .run import sampling as _module

sys.modules[__name__] = _module
