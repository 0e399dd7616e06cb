import os
import tempfile
import warnings

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")

import jax  # noqa: E402

try:  # ArviZ 0.x with numba installed (PyMC brings it): its numba mcse returns arrays, or fails for the sd
    import arviz as _az

    if hasattr(_az, "Numba"):
        _az.Numba.disable_numba()
except Exception:  # noqa: BLE001 - an ArviZ that does not import is reported by the tests that use it
    pass

# Tests build many kernels; identical programs (same test, model and shapes) compile once per session.
jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "tallmh-test-jax-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
