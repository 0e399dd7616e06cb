"""The helpers of ``benchmarks/_common.py`` for the papers' experiment scripts, with their results folder.

Not a benchmark itself. Each script in this folder imports it as ``_common`` (the folder of the script is
on ``sys.path`` when a script is run as ``python benchmarks/papers/NAME.py``); everything but
``DEFAULT_OUT`` (``benchmarks/papers/results``) comes from the shared module one folder up, loaded under the
name ``benchmarks_common`` so that it does not shadow this one.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_common.py")
if "benchmarks_common" not in sys.modules:
    _spec = importlib.util.spec_from_file_location("benchmarks_common", _SHARED)
    sys.modules["benchmarks_common"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["benchmarks_common"])

from benchmarks_common import *  # noqa: E402,F401,F403  (the shared helpers, under their own names)

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
