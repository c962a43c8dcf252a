#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU-marked tests (cuda backend against NumPy, and the
# cuda-vs-sim differential tests on nvcc-made PTX) and PTX validation, then the benchmark
# harness (`python -m paper_repro`), with the machine described, written under
# ${OUT:-paper_repro/results/gpu-check-<date>}. Runs from the working tree (PYTHONPATH=.), so
# it needs no package registry: numpy, cuda-python and pytest must already be installed.
#
#   gpu_check.sh [all [EXP...]]  tests, then the experiments (default every one)
#   gpu_check.sh tests           the GPU tests and PTX validation only
#   gpu_check.sh bench [EXP...]  experiments only (default all), e.g. `bench gemm`
#
# REPRO_FLAGS adds options to `python -m paper_repro` (e.g. "--lean": the largest sizes only);
# PYTEST_ADDOPTS, pytest's own variable, adds options to the tests (e.g. "-n 8" with xdist).
#
# Each step is bounded (TESTS_TIMEOUT, default 240 s; REPRO_TIMEOUT, default 540 s) so that a
# hang cannot eat a lent machine's time; a step cut short says so. Where one command may run
# at most 10 minutes, run `tests` and `bench` as separate commands: each step writes into its
# own directory under $out, so the second does not overwrite the first.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
step=${1:-all}
[ $# -gt 0 ] && shift
case "$step" in
  all | tests | bench) ;;
  *) echo "usage: $0 [all | tests | bench [EXPERIMENT ...]]" >&2; exit 2 ;;
esac
out=${OUT:-paper_repro/results/gpu-check-$(date +%Y-%m-%d)}
mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>&1
  python3 --version
  python3 -c "import numpy, cuda.bindings; print('numpy', numpy.__version__, 'cuda-bindings', cuda.bindings.__version__)"
} > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

# `timeout` exits 124 when it stops a step; say so beside that step's output.
bounded() {
  local limit=$1 log=$2
  shift 2
  timeout "$limit" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "stopped after ${limit}s: $*" | tee -a "$log"
  return "$rc"
}

status=0
if [ "$step" != bench ]; then
  bounded "${TESTS_TIMEOUT:-240}" "$out/gpu-tests.txt" \
    python3 -m pytest -m gpu -q -p no:cacheprovider -rs --junitxml="$out/gpu-tests.xml"
  status=$?
  # pytest exits 5 when nothing was collected: no GPU tests is a failure here.
  python3 -m cutile_py.tools.validate_ptx > "$out/validate-ptx.txt" 2>&1 || status=1
  tail -n 1 "$out/validate-ptx.txt"
fi
if [ "$step" != tests ]; then
  # PyTorch, CuPy and Triton are used where installed and reported missing otherwise.
  # Progress goes to stderr; the results (CSV, JSON, REPORT.md) to $out/repro[-EXP...].
  name=repro${*:+-$(echo "$*" | tr ' ' '-')}
  bounded "${REPRO_TIMEOUT:-540}" "$out/$name.txt" \
    python3 -m paper_repro "${@:-all}" ${REPRO_FLAGS:-} --out "$out/$name"
  rc=$?
  [ "$rc" -eq 0 ] || { echo "paper_repro exited with status $rc" | tee -a "$out/$name.txt"; status=$rc; }
fi
exit "$status"
