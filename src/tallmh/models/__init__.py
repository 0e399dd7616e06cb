"""Built-in models."""

from .gaussian import Gaussian, GaussianMean
from .ica import ICA
from .linear import LinearRegression
from .logistic import LogisticRegression
from .mixture import GaussianMixture
from .selection import VariableSelection

__all__ = ["LogisticRegression", "LinearRegression", "GaussianMean", "Gaussian", "GaussianMixture", "ICA", "VariableSelection"]
