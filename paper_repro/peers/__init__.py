"""Peers measured beside cutile_py: PyTorch, CuPy and Triton, imported lazily.

None of them is a dependency: where one cannot be imported (or there is no GPU for it) its
rows say "missing" with the reason.
"""

from __future__ import annotations

import functools
import importlib
from typing import Any


@functools.cache
def load(name: str) -> tuple[Any, str]:
    """(module, "") when `name` imports and can use the GPU, else (None, why not)."""
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # ImportError, or a broken install raising anything
        return None, f"{name} not importable ({type(e).__name__})"
    try:
        if name == "torch" and not mod.cuda.is_available():
            return None, "torch has no CUDA device"
        if name == "cupy" and mod.cuda.runtime.getDeviceCount() < 1:
            return None, "cupy sees no CUDA device"
        if name == "triton":
            torch, why = load("torch")
            if torch is None:
                return None, f"triton needs torch tensors here: {why}"
    except Exception as e:
        return None, f"{name} cannot use the GPU ({type(e).__name__}: {e})"[:200]
    return mod, ""


def row_warps(block: int) -> int:
    """Warps a block of the Triton row kernels (`triton_kernels`) for rows padded to `block`
    elements: more for longer rows keeps the per-thread register footprint bounded."""
    return 4 if block <= 1024 else 8 if block <= 4096 else 16 if block <= 16384 else 32


def version(name: str) -> str:
    mod, why = load(name)
    return str(getattr(mod, "__version__", "?")) if mod is not None else f"missing: {why}"


def torch_stream() -> int:
    """PyTorch's current stream as a raw CUstream value (0: the legacy default stream)."""
    torch, _ = load("torch")
    return int(torch.cuda.current_stream().cuda_stream)


def cupy_stream() -> int:
    cupy, _ = load("cupy")
    return int(cupy.cuda.get_current_stream().ptr)


TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def torch_rand(shape: tuple[int, ...], dtype: str, seed: int) -> Any:
    """A random CUDA tensor (never zeros)."""
    torch, _ = load("torch")
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    t = torch.randn(shape, generator=g, device="cuda", dtype=getattr(torch, TORCH_DTYPES[dtype]))
    t[t == 0] = 0.5
    return t
