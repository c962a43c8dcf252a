"""Models built from the library's kernels: `Qwen3` (a decoder served by graph replay)."""

from cutile_py_kernels.models.checkpoint import Qwen3Config
from cutile_py_kernels.models.qwen3 import Qwen3

__all__ = ["Qwen3", "Qwen3Config"]
