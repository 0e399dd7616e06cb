"""Acceptance tests: exact MH and the three approximate tests of the papers.

Every test is a frozen dataclass with ``decide(key, problem) -> Decision`` (see :mod:`.base`).
"""

from .austerity import Austerity
from .barker import Barker
from .base import Decision, Problem
from .confidence import BOUNDS, Confidence
from .exact import Exact
from .none import AlwaysAccept
from .thinning import PoissonThinning

__all__ = ["AlwaysAccept", "PoissonThinning", "Exact", "Austerity", "Confidence", "Barker", "Decision", "Problem", "BOUNDS"]


def __getattr__(name):
    # informed sub-sampling brings its own kernel, so it lives beside the kernel (tallmh.informed); it is
    # offered here, with the tests it is chosen among, without importing the kernel into this package
    if name == "Informed":
        from ..informed import Informed

        return Informed
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
