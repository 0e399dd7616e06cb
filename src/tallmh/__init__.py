"""tallmh: Metropolis-Hastings for tall data, deciding each step from a small random part of the data.

Quick start::

    import tallmh as tm
    data, _ = tm.models.LogisticRegression.simulate(100_000, d=10)
    result = tm.sample(tm.models.LogisticRegression(), data,
                       test=tm.acceptance.Austerity(epsilon=0.05, batch_size=500), seed=0)
    print(result.summary())
"""

import importlib

# Names are imported on first use (PEP 562), so that ``import tallmh`` (and the ``tallmh`` command's
# argument checks) do not load JAX until something needs it.
_SUBMODULES = ("acceptance", "blocks", "diagnostics", "models", "proposals", "data", "datasource", "compare",
               "report", "results", "sampling", "distributed", "datasets", "errors", "kernel", "model",
               "control_variates", "numpyro_model", "cli")
_NAMES = {
    "Cycle": "blocks", "sample_program": "blocks", "ControlVariates": "control_variates",
    "ConfigError": "errors", "DataError": "errors", "ModelError": "errors", "TallmhError": "errors",
    "TrustWarning": "errors", "build_kernel": "kernel", "Model": "model", "from_numpyro": "numpyro_model",
    "Result": "results", "Summary": "results", "load_result": "results", "decide": "sampling",
    "decision_fn": "sampling", "sample": "sampling",
}


def __getattr__(name):
    if name in _NAMES:
        value = getattr(importlib.import_module("." + _NAMES[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + name, __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES) | set(_SUBMODULES))


__version__ = "0.1.0"

__all__ = [
    "Model", "from_numpyro", "ControlVariates", "sample", "decide", "decision_fn", "build_kernel", "Result",
    "Summary", "acceptance", "proposals", "models", "diagnostics", "blocks", "Cycle", "sample_program",
    "TallmhError", "DataError", "ModelError", "ConfigError", "TrustWarning", "load_result",
]
