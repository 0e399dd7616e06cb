"""Acceptance tests: exact MH and the three approximate tests of the papers.

Every test is a frozen dataclass with ``decide(key, problem) -> Decision`` (see :mod:`.base`).
"""

from .austerity import Austerity
from .barker import Barker
from .base import Decision, Problem
from .confidence import BOUNDS, Confidence
from .exact import Exact
from .informed import Informed
from .none import AlwaysAccept

__all__ = ["AlwaysAccept", "Exact", "Informed", "Austerity", "Confidence", "Barker", "Decision", "Problem", "BOUNDS"]
