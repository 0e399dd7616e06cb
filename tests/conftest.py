import os
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
warnings.filterwarnings("ignore", category=FutureWarning, module="arviz")
