import os
import tempfile
import warnings

warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")

import jax  # noqa: E402

# Tests build many kernels; identical programs (same test, model and shapes) compile once per session.
jax.config.update("jax_compilation_cache_dir", os.path.join(tempfile.gettempdir(), "tallmh-test-jax-cache"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
