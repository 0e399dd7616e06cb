#!/usr/bin/env bash
# The README's install lines, each in a fresh virtual environment, as a new user would run them:
#   pip install .                       then tallmh run on a small table
#   pip install ".[pymc]" bambi         then import bambi and arviz, and tallmh run on a small table
#   pip install ".[test]"               then import pytest, numpyro, pymc, bambi, formulaic and arviz
# Usage: scripts/fresh_env_check.sh [--skip-test-extra]   (from anywhere; the environments go to a temporary
# folder, removed at the end). --skip-test-extra: where the caller installs ".[test]" fresh itself (.ci/run).
# Prints each step's duration and exits non-zero at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
skip_test=0
[[ "${1:-}" == "--skip-test-extra" ]] && skip_test=1
python=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/tallmh-fresh-XXXXXX")
trap 'rm -rf "$work"' EXIT
start=$SECONDS
"$python" - "$work/table.csv" <<'PY'
import csv, math, random, sys
random.seed(1)
with open(sys.argv[1], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["a", "b", "y"])
    for _ in range(400):
        a, b = random.gauss(0, 1), random.gauss(0, 1)
        w.writerow([f"{a:.6f}", f"{b:.6f}", int(random.random() < 1 / (1 + math.exp(-(0.5 + a - 0.5 * b))))])
PY

step() {  # step NAME PIP-ARGS... : a fresh venv, the install line, a small run
  local name=$1; shift
  local t0=$SECONDS
  "$python" -m venv "$work/$name"
  "$work/$name/bin/python" -m pip install --quiet --upgrade pip
  (cd "$repo" && "$work/$name/bin/python" -m pip install --quiet "$@")
  echo "fresh environment '$name': pip install $* ($((SECONDS - t0)) s)"
}

run_table() {  # run_table NAME: tallmh run on the small table, from outside the checkout
  local name=$1 t0=$SECONDS
  (cd "$work" && "$work/$name/bin/tallmh" run table.csv --target y --model logistic --samples 200 --warmup 100 \
      --chains 1 --quiet --out "$work/run-$name" >/dev/null)
  test -s "$work/run-$name/posterior.nc"
  echo "fresh environment '$name': tallmh run on a 400-row table ($((SECONDS - t0)) s)"
}

step plain .
run_table plain

step pymc ".[pymc]" bambi            # the README's PyMC/Bambi line
"$work/pymc/bin/python" -c "import arviz, bambi, pymc, tallmh; print('  arviz', arviz.__version__, 'bambi', bambi.__version__, 'pymc', pymc.__version__)"
run_table pymc

if [[ $skip_test == 0 ]]; then
  step test ".[test]"
  "$work/test/bin/python" -c "import pytest, numpyro, pymc, bambi, formulaic, arviz, tallmh"
fi
echo "fresh environment check passed in $((SECONDS - start)) s"
