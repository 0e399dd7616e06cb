"""The old import path of :mod:`tallmh.storage.data` (``from tallmh.data import ...`` in users' code): the same module."""

import sys

from .storage import data as _module

sys.modules[__name__] = _module
