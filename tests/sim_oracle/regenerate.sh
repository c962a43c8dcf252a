#!/usr/bin/env bash
# Regenerate every committed .ptx in this directory from its CUDA C source:
#
#     tests/sim_oracle/regenerate.sh
#
# Each NAME.cu becomes NAME.ptx (sm_80); the files listed in SM90 below also become
# NAME.sm_90.ptx. The PTX is committed so that the tests (and CI) never need nvcc.
#
# nvcc is taken from $NVCC, else from PATH, else from pip's CUDA 13 packages:
#
#     pip install nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-crt
#
# (nvidia-cuda-nvcc carries nvcc and ptxas under site-packages/nvidia/cu13/bin; nvcc needs
# nvidia-nvvm for cicc/libnvvm, and nvidia-cuda-runtime / nvidia-cuda-crt for the headers.)
# Set PYTHON to the interpreter whose site-packages hold them (default: python3).
#
# The committed files were made with nvcc 13.0 (V13.0.88). Other versions produce different
# (equally valid) PTX; the tests check semantics, not text, so either is fine.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# Files also compiled for sm_90, as NAME.sm_90.ptx. Empty: with nvcc 13.0 the sm_90 PTX of every
# file here differed from the sm_80 PTX only in its .target line. Add names when that changes.
SM90=""

find_nvcc() {
    if [[ -n "${NVCC:-}" ]]; then
        echo "$NVCC"
        return
    fi
    if command -v nvcc >/dev/null 2>&1; then
        command -v nvcc
        return
    fi
    local py="${PYTHON:-python3}" root
    root="$("$py" -c 'import nvidia; print(list(nvidia.__path__)[0])' \
        2>/dev/null || true)"
    for cand in "$root"/cu13/bin/nvcc "$root"/cuda_nvcc/bin/nvcc; do
        if [[ -x "$cand" ]]; then
            echo "$cand"
            return
        fi
    done
    echo "regenerate.sh: nvcc not found (set NVCC, put nvcc on PATH, or pip install" \
        "nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-runtime nvidia-cuda-crt)" >&2
    exit 1
}

nvcc="$(find_nvcc)"
echo "using $nvcc: $("$nvcc" --version | tail -n 2 | head -n 1)"

flags=(-O3 -ptx -std=c++17)
for cu in "$here"/*.cu; do
    name="$(basename "$cu" .cu)"
    echo "  $name.ptx"
    "$nvcc" "${flags[@]}" -arch=sm_80 "$cu" -o "$here/$name.ptx"
    if [[ " $SM90 " == *" $name "* ]]; then
        echo "  $name.sm_90.ptx"
        "$nvcc" "${flags[@]}" -arch=sm_90 "$cu" -o "$here/$name.sm_90.ptx"
    fi
done
