"""cutile_py: tile-based GPU kernels in Python, with cuTile Rust's ownership discipline.

The public names of API.md, and nothing else.
"""

from cutile_py import profiling
from cutile_py.frontend.errors import CompileError
from cutile_py.host.creation import (
    arange,
    empty,
    from_dlpack,
    from_numpy,
    full,
    ones,
    randn,
    zeros,
)
from cutile_py.host.device_op import DeviceOp, OpLike
from cutile_py.host.errors import (
    AliasError,
    BorrowError,
    LaunchError,
    MovedError,
    PerformanceWarning,
)
from cutile_py.host.graph import Graph, graph
from cutile_py.host.kernel import CompiledKernel, Kernel, cache_info, kernel
from cutile_py.host.pipeline import zip
from cutile_py.host.raw_kernel import RawKernel
from cutile_py.host.report import KernelReport
from cutile_py.host.specs import PartitionSpec, TensorSpec
from cutile_py.host.streams import Stream
from cutile_py.host.tensor import Partition, Tensor
from cutile_py.ir.dtypes import DType, bf16, bool_, f16, f32, i32, i64
from cutile_py.language.annotations import Atomic, Constant, Dyn, Mut
from cutile_py.language.functions import (
    abs,
    argmax,
    argmin,
    bid,
    broadcast_to,
    cdiv,
    cos,
    cumsum,
    erf,
    exp,
    exp2,
    expand_dims,
    fma,
    function,
    load,
    load_tile_like,
    log,
    log2,
    max,
    maximum,
    min,
    minimum,
    mma,
    num_blocks,
    num_tiles,
    permute,
    pow,
    reshape,
    rsqrt,
    sigmoid,
    sin,
    sqrt,
    store,
    sum,
    tanh,
    where,
)
from cutile_py.language.indexed import atomic_add, atomic_max, atomic_min, gather, scatter
from cutile_py.language.tile import Tile
from cutile_py.ptx.target import Target
from cutile_py.runtime.select import set_backend as set_backend

__version__ = "0.1.0"


def backend() -> str:
    """The name of the active backend: 'cuda', 'sim' or 'interpret'."""
    from cutile_py.runtime.select import active_backend

    return active_backend().name


__all__ = [
    "AliasError",
    "Atomic",
    "BorrowError",
    "CompileError",
    "CompiledKernel",
    "Constant",
    "DType",
    "DeviceOp",
    "Dyn",
    "Graph",
    "Kernel",
    "KernelReport",
    "LaunchError",
    "MovedError",
    "OpLike",
    "Mut",
    "Partition",
    "PerformanceWarning",
    "PartitionSpec",
    "RawKernel",
    "Stream",
    "Target",
    "Tensor",
    "TensorSpec",
    "Tile",
    "abs",
    "arange",
    "argmax",
    "argmin",
    "atomic_add",
    "atomic_max",
    "atomic_min",
    "backend",
    "bf16",
    "bid",
    "bool_",
    "broadcast_to",
    "cache_info",
    "cdiv",
    "cos",
    "cumsum",
    "erf",
    "exp",
    "exp2",
    "expand_dims",
    "f16",
    "f32",
    "fma",
    "from_dlpack",
    "from_numpy",
    "full",
    "function",
    "gather",
    "graph",
    "i32",
    "i64",
    "kernel",
    "load",
    "load_tile_like",
    "log",
    "log2",
    "max",
    "maximum",
    "min",
    "minimum",
    "mma",
    "num_blocks",
    "num_tiles",
    "ones",
    "permute",
    "pow",
    "profiling",
    "randn",
    "reshape",
    "rsqrt",
    "scatter",
    "set_backend",
    "sigmoid",
    "sin",
    "sqrt",
    "store",
    "sum",
    "tanh",
    "where",
    "zeros",
    "empty",
    "zip",
]
