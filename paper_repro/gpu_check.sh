#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: the GPU-marked tests (cuda backend against NumPy, and the
# cuda-vs-sim differential tests on nvcc-made PTX), then the benchmark harness
# (`python -m paper_repro all`, sized to finish in under 8 minutes on an H200; bounded by
# REPRO_TIMEOUT seconds), with the machine described, written under
# ${OUT:-paper_repro/results/gpu-check-<date>}. Runs from the working tree (PYTHONPATH=.), so
# it needs no package registry: numpy, cuda-python and pytest must already be installed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
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
python3 -m pytest -m gpu -q -p no:cacheprovider -rs --junitxml="$out/gpu-tests.xml" 2>&1 | tee "$out/gpu-tests.txt"
status=${PIPESTATUS[0]}
python3 -m cutile_py.tools.validate_ptx 2>&1 | tee "$out/validate-ptx.txt"
# The benchmarks: PyTorch, CuPy and Triton are used where installed and reported missing
# otherwise. Progress goes to stderr; the results (CSV, JSON, REPORT.md) to $out/repro.
timeout "${REPRO_TIMEOUT:-600}" python3 -m paper_repro all --out "$out/repro" 2>&1 | tee "$out/repro.txt"
repro=${PIPESTATUS[0]}
[ "$repro" -eq 0 ] || echo "paper_repro exited with status $repro" | tee -a "$out/repro.txt"
exit "$status"
