"""Ready kernels written in cutile_py, each with a host function that allocates its output.

Element-wise (`add`, `saxpy`, `silu_mul`, `gelu`), row reductions over the last axis (`rms_norm`,
`add_rms_norm`, `layer_norm`, `softmax`, `argmax`), `rope`, data movement (`transpose`,
`embedding`), `gemv`, and `gemm` / `bmm` on tensor cores (tile shapes from
`cutile_py_kernels.autotune`). f16 and bf16 inputs are computed in f32 and the output keeps the
input dtype. `attention` is a fused flash kernel (split over the keys for short queries).
`cutile_py_kernels.models.Qwen3` is a Qwen3 decoder built from these kernels.
"""

from cutile_py_kernels.activations import gelu, silu_mul
from cutile_py_kernels.attention import attention
from cutile_py_kernels.elementwise import add, saxpy
from cutile_py_kernels.gemm import bmm, gemm
from cutile_py_kernels.gemv import gemv
from cutile_py_kernels.layout import embedding, transpose
from cutile_py_kernels.norms import add_rms_norm, layer_norm, rms_norm
from cutile_py_kernels.rope import rope
from cutile_py_kernels.softmax import argmax, softmax

__all__ = [
    "add",
    "add_rms_norm",
    "argmax",
    "attention",
    "bmm",
    "embedding",
    "gelu",
    "gemm",
    "gemv",
    "layer_norm",
    "rms_norm",
    "rope",
    "saxpy",
    "silu_mul",
    "softmax",
    "transpose",
]
