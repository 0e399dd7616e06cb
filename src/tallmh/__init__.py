"""tallmh: Metropolis-Hastings for tall data, deciding each step from a small random part of the data.

Quick start::

    import tallmh as tm
    data, _ = tm.models.LogisticRegression.simulate(100_000, d=10)
    result = tm.sample(tm.models.LogisticRegression(), data,
                       test=tm.acceptance.Austerity(epsilon=0.05, batch_size=500), seed=0)
    print(result.summary())
"""

from . import acceptance, blocks, diagnostics, models, proposals
from .blocks import Cycle, sample_program
from .control_variates import ControlVariates
from .errors import ConfigError, DataError, ModelError, TallmhError, TrustWarning
from .kernel import build_kernel
from .model import Model
from .numpyro_model import from_numpyro
from .pymc_model import from_bambi, from_pymc
from .results import Result, Summary, load_result
from .sampling import decide, decision_fn, sample

__version__ = "0.1.0"

from . import _cache  # noqa: E402
from ._cache import compilation_cache_dir, set_compilation_cache  # noqa: E402

_cache.setup_default()  # JAX's persistent compilation cache in the user's cache folder (opt out: see _cache)

__all__ = [
    "Model", "from_numpyro", "from_pymc", "from_bambi", "ControlVariates", "sample", "decide", "decision_fn", "build_kernel", "Result",
    "Summary", "acceptance", "proposals", "models", "diagnostics", "blocks", "Cycle", "sample_program",
    "TallmhError", "DataError", "ModelError", "ConfigError", "TrustWarning", "load_result",
    "set_compilation_cache", "compilation_cache_dir",
]
