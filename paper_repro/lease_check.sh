#!/usr/bin/env bash
# One bounded call on a lent GPU (a lease of minutes, not hours): the GPU-marked tests with
# xdist; one GEMM config timed every way the project times it (`gemm_timing_check`: the
# experiment/sweep gap); the persistent candidates beside their one-block-per-tile twins
# (8192 and 4096); the GEMM experiment at 4096 and 8192 (f16 and bf16, the tuner's choice
# and its own timing named); the timing crossing again for f16; the norms at 1024..4096 with
# 16 and 32 elements per thread (`row_sweep`: confirms `_common.PER_THREAD_BY_WIDTH`); the
# causal softmax by block size beside Triton's; the row kernels' bandwidth at every width;
# the sweep of every sm_90 GEMM candidate at 8192 with run-after-run timing of the fastest
# (what its 30 s allow). GEMM rows carry the GPU's clocks while timed (`gpu_monitor`).
# Everything lands in $OUT/results.tgz (re-packed after each step, so a call cut short still
# returns what finished) and a summary is printed last. Runs from the working tree
# (PYTHONPATH=.): numpy, cuda-python, pytest, pytest-xdist, pytest-timeout, PyTorch and Triton
# must be installed there.
#
#   OUT=DIR paper_repro/lease_check.sh    (at most 575 s of steps; about 5 minutes on an H200)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:?set OUT to the directory that receives results.tgz}
base=$(mktemp -d)
work=$base/results
mkdir -p "$work" "$out"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  git rev-parse HEAD 2>/dev/null || echo "commit unknown"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,power.limit \
    --format=csv 2>&1
  python3 -c "import cuda.bindings, numpy; print('cuda-bindings', cuda.bindings.__version__,
    'numpy', numpy.__version__)" 2>&1
} > "$work/machine.txt"
cat "$work/machine.txt"

# step NAME LIMIT COMMAND...: output to NAME.txt, bounded; the archive is re-packed after it.
step() {
  local name=$1 limit=$2
  shift 2
  timeout -k 5 "$limit" "$@" > "$work/$name.txt" 2>&1
  local rc=$?
  [ "$rc" -eq 124 ] && echo "stopped after ${limit}s" >> "$work/$name.txt"
  echo "== $name: exit $rc"
  tar czf "$out/results.tgz" -C "$base" results
  return "$rc"
}

# Steps in the order of what the open questions need most (a call cut short by the lease
# still returns the finished ones): the GEMM timing gap, the persistent configs against
# their twins, the library GEMM at 4096/8192, the row kernels, then the full sweeps.
# No driver JIT cache: a kernel served from it logs no ptxas report (test_register_moves).
CUDA_CACHE_DISABLE=1 step gpu-tests 90 python3 -m pytest -m gpu -q -p no:cacheprovider -n 8 \
  --timeout 80 -rfE
grep -E "^(FAILED|ERROR)| passed| failed" "$work/gpu-tests.txt" | cut -c1-200 | tail -15
step timing-check 75 python3 -m paper_repro.gemm_timing_check --n 8192
# The persistent candidates beside their one-block-per-tile twins, in the same run.
pairs="128,256,64,3,0,8,1;128,256,64,3,0,8,1,1;256,128,64,3,0,8,1;256,128,64,3,0,8,1,1"
pairs="$pairs;128,128,64,4,0,8,1;128,128,64,4,0,8,1,1"
step sweep-persistent 50 python3 -m paper_repro.gemm_sweep --n 8192 --configs "$pairs" \
  --sustained 6
# At 4096 (3.9 waves of 128x256 tiles) a tile's fill and epilogue weigh twice as much.
step sweep-persistent-4096 30 python3 -m paper_repro.gemm_sweep --n 4096 --configs "$pairs" \
  --sustained 6
step gemm 60 python3 -m paper_repro gemm --lean --out "$work/gemm"
# f16 ran 11 points below bf16 at 8192 on the H200 (67% / 78%): the same crossing for f16.
step timing-check-f16 60 python3 -m paper_repro.gemm_timing_check --n 8192 --dtype f16
step rows 60 python3 -m paper_repro.row_sweep
step rows-causal 30 python3 -m paper_repro.row_sweep --kernels softmax_causal
step bandwidth 90 python3 -m paper_repro bandwidth \
  --only rms_norm,add_rms_norm,layer_norm,softmax,softmax_causal --out "$work/bandwidth"
step sweep-bf16 30 python3 -m paper_repro.gemm_sweep --n 8192 --only wgmma --sustained 4 \
  --budget 15

echo "== summary"
grep -E "^\| (cutile_py|cuBLAS \(torch\)) \| (f16|bf16) \| (4096|8192)" "$work/gemm/REPORT.md" \
  | cut -d'|' -f2-9
grep -E "^\||^The tuner|^- finalist" "$work/timing-check.txt" "$work/timing-check-f16.txt"
head -8 "$work/sweep-bf16.txt"
sed -n '/run after run/,$p' "$work/sweep-bf16.txt" "$work/sweep-persistent.txt" \
  "$work/sweep-persistent-4096.txt"
grep -E "^\| (rms_norm|add_rms_norm|layer_norm|softmax)" "$work/bandwidth/REPORT.md" \
  | grep -E "x(8192|16384|32768)|1x4096|16x1024" | cut -d'|' -f2-9
grep -E "^\| (rms_norm|add_rms_norm|layer_norm) \|" "$work/rows.txt" | cut -d'|' -f2-6,9
grep -E "^\| (softmax_causal|triton) \|" "$work/rows-causal.txt" | cut -d'|' -f2-4,6-9
exit 0
