"""Ready kernels written in cutile_py, each with a host function that allocates its output.

This release has the element-wise basics; the memory-bound library (norms, softmax, rope, ...)
and GEMM follow.
"""

from cutile_py_kernels.elementwise import add, saxpy

__all__ = ["add", "saxpy"]
