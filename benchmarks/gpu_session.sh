#!/usr/bin/env bash
# One prepared call on a machine with a CUDA GPU: tallmh against NumPyro's HMCECS and NUTS on that GPU, in
# the order that matters most when time runs out. Every step is time-boxed against one deadline, so the
# script ends inside its budget and keeps what finished.
#
#   1. check: JAX sees the GPU, tallmh and NumPyro import, one tiny tm.sample runs there;
#   2. time to a trusted posterior (benchmarks/time_to_trusted.py: each method in a fresh process, min bulk
#      ESS ~1,000) at N = 10^6: tallmh's default call on the GPU and on the same machine's CPU
#      (JAX_PLATFORMS=cpu), HMCECS with its proxy at the exact MAP and NUTS on the GPU, cold caches; then
#      tallmh and HMCECS at 10^7;
#   3. benchmarks/gpu.py (vectorised chains, sampling throughput at 10^7 and 10^8, data made on the GPU)
#      with what is left.
#
# Needs tallmh's dependencies and NumPyro >= 0.22 there (0.21's HMCECS fails at init under jax 0.11: "all
# sites must have unique names but got `_biased_corrected_log_likelihood` duplicated").
# Usage (on the GPU machine, from the repository root; results under $OUT, else benchmarks/results/gpu):
#   BUDGET_S=480 bash benchmarks/gpu_session.sh
set -u
O=${OUT:-benchmarks/results/gpu}
mkdir -p "$O"
BUDGET_S=${BUDGET_S:-480}
END=$(( $(date +%s) + BUDGET_S ))
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

left() { echo $(( END - $(date +%s) )); }
step() {  # step NAME MIN_SECONDS CAP_SECONDS CMD...: run CMD with the time left (at most CAP), if MIN is left
    local name=$1 min=$2 cap=$3; shift 3
    local l; l=$(left)
    if (( l < min )); then echo "== $name: skipped, ${l}s left (< ${min}s)" | tee -a "$O/steps.txt"; return; fi
    (( l > cap )) && l=$cap
    echo "== $name: up to ${l}s ($(date -u +%T))"
    local t0; t0=$(date +%s)
    timeout --kill-after=10 "$l" "$@"
    echo "== $name: rc=$? in $(( $(date +%s) - t0 ))s" | tee -a "$O/steps.txt"
}

{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  $PY -c "import jax, numpyro, arviz, numpy; print('jax', jax.__version__, jax.devices(), 'numpyro', numpyro.__version__, 'arviz', arviz.__version__, 'numpy', numpy.__version__)"
} 2>&1 | tee "$O/machine.txt"
$PY - <<'EOF' 2>&1 | tee "$O/check.txt"
import time, jax, numpy as np, tallmh as tm
import os
assert jax.default_backend() == "gpu" or os.environ.get("ALLOW_CPU"), jax.devices()
t = time.perf_counter()
data, _ = tm.models.LogisticRegression.simulate(20000, 5, seed=0)
r = tm.sample(tm.models.LogisticRegression(), data, num_samples=200, num_warmup=200, progress=False)
print("check: tm.sample on", jax.devices()[0].device_kind, f"{time.perf_counter() - t:.1f}s", r.verdict)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || { echo "check failed: nothing else run"; exit 3; }

TTT="benchmarks/time_to_trusted.py --auto --laplace-ref --out $O"
step "tallmh on the CPU (JAX_PLATFORMS=cpu), N=1e6" 40 60 env JAX_PLATFORMS=cpu $PY $TTT --N 1e6 --methods tallmh --cache cold --timeout 50 --tag hostcpu_1e6
step "tallmh on the GPU, N=1e6" 40 100 $PY $TTT --N 1e6 --methods tallmh --cache cold --timeout 90 --tag gpu_1e6
step "HMCECS (MAP) and NUTS on the GPU, N=1e6" 60 200 $PY $TTT --N 1e6 --methods hmcecs-map nuts --cache cold --timeout 90 --tag gpu_1e6_peers
step "tallmh (CPU) and HMCECS (MAP, GPU), N=1e7" 60 200 sh -c "JAX_PLATFORMS=cpu $PY $TTT --N 1e7 --methods tallmh --cache cold --timeout 90 --tag hostcpu_1e7; $PY $TTT --N 1e7 --methods hmcecs-map --cache cold --timeout 100 --tag gpu_1e7_peers"
B=$(( $(left) - 50 ))
step "gpu.py" 80 400 $PY benchmarks/gpu.py --sizes 1e7,1e8 --perm-sizes '' --budget-s "$B" --nuts-reserve-s 40 --out "$O/gpu.json"
cat "$O/steps.txt"
