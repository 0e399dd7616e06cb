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
# name under ``tm.`` -> module (the layers' folders: frontends/, storage/, reporting/, run/)
_SUBMODULES = {
    "acceptance": "acceptance", "blocks": "blocks", "models": "models", "proposals": "proposals",
    "errors": "errors", "kernel": "kernel", "model": "model", "control_variates": "control_variates",
    "setup_passes": "setup_passes", "informed": "informed", "distributed": "distributed", "datasets": "datasets",
    "cli": "cli", "data": "storage.data", "datasource": "storage.datasource", "diagnostics": "reporting.diagnostics",
    "compare": "reporting.compare", "report": "reporting.report", "results": "reporting.results",
    "sampling": "run.sampling", "numpyro_model": "frontends.numpyro_model", "pymc_model": "frontends.pymc_model",
    "formula": "frontends.formula",
}
_NAMES = {
    "Cycle": "blocks", "sample_program": "blocks", "ControlVariates": "control_variates",
    "ConfigError": "errors", "DataError": "errors", "ModelError": "errors", "TallmhError": "errors",
    "TrustWarning": "errors", "build_kernel": "kernel_choice", "Model": "model", "from_numpyro": "numpyro_model",
    "Result": "results", "Summary": "results", "load_result": "results", "decide": "sampling",
    "decision_fn": "sampling", "sample": "sampling", "from_pymc": "pymc_model", "from_bambi": "pymc_model",
    "set_compilation_cache": "_cache", "compilation_cache_dir": "_cache",
}
# modules that compile programs: loading one through the package sets up JAX's compilation cache first
_COMPILES = ("sampling", "kernel", "kernel_choice", "blocks", "control_variates", "setup_passes", "informed", "numpyro_model",
             "pymc_model", "distributed")


def _setup_cache():
    from . import _cache

    _cache.setup_default()  # JAX's persistent compilation cache in the user's cache folder (see _cache)


def __getattr__(name):
    if _NAMES.get(name, name) in _COMPILES:
        _setup_cache()
    if name in _NAMES:
        where = _NAMES[name]
        value = getattr(importlib.import_module("." + _SUBMODULES.get(where, where), __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module("." + _SUBMODULES[name], __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_NAMES) | set(_SUBMODULES))


__version__ = "0.1.0"

if "jax" in __import__("sys").modules:  # JAX already in use: set the cache up now, before it compiles
    _setup_cache()

__all__ = [
    "Model", "from_numpyro", "from_pymc", "from_bambi", "ControlVariates", "sample", "decide", "decision_fn", "build_kernel", "Result",
    "Summary", "acceptance", "proposals", "models", "diagnostics", "blocks", "Cycle", "sample_program",
    "TallmhError", "DataError", "ModelError", "ConfigError", "TrustWarning", "load_result",
    "set_compilation_cache", "compilation_cache_dir",
]
