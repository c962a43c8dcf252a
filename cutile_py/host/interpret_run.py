"""The `interpret` backend's launch: the kernel's own Python, once per block, on NumPy tiles."""

from __future__ import annotations

import itertools
import traceback
import types
import typing
from pathlib import Path
from typing import Any

import numpy as np

from cutile_py.frontend.signature import Specialization
from cutile_py.host.tensor import Partition, Tensor
from cutile_py.ir.dtypes import from_storage, to_storage
from cutile_py.ir.grid_order import grouped
from cutile_py.language.block import CURRENT_BLOCK, BlockContext
from cutile_py.language.interpret import KernelFault, TensorView, TileView
from cutile_py.language.tile import Tile
from cutile_py.runtime.backend import Completion, Finished, HostBuffer, LaunchFailure

#: The package's own files, skipped when a fault names the kernel line that made it.
_PACKAGE = Path(__file__).resolve().parent.parent


def _with_typevars(fn: Any, spec: Specialization) -> Any:
    """`fn` seeing each TypeVar it names as the value this launch gave it."""
    if not spec.typevars and not spec.dtypevars:
        return fn
    values: dict[str, object] = {**dict(spec.typevars), **dict(spec.dtypevars)}
    glob = fn.__globals__
    overrides = {
        k: values[v.__name__]
        for k, v in glob.items()
        if isinstance(v, typing.TypeVar) and v.__name__ in values
    }
    cells = []
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            cells.append(cell)
            continue
        if isinstance(v, typing.TypeVar) and v.__name__ in values:
            cells.append(types.CellType(values[v.__name__]))
        else:
            cells.append(cell)
    if not overrides and not fn.__closure__:
        return fn
    new_globals = {**glob, **overrides} if overrides else glob
    return types.FunctionType(fn.__code__, new_globals, fn.__name__, fn.__defaults__, tuple(cells))


def _user_line(e: BaseException) -> str:
    """'file, line n' of the innermost frame of `e`'s traceback outside cutile_py: the
    kernel's (or helper's) line that made the fault."""
    where = "an unknown line"
    for frame, line in traceback.walk_tb(e.__traceback__):
        name = frame.f_code.co_filename
        if not Path(name).resolve().is_relative_to(_PACKAGE):
            where = f"{name}, line {line}"
    return where


def run_interpreted(
    fn: Any,
    spec: Specialization,
    grid: tuple[int, ...],
    args: tuple[Any, ...],
    group_m: int | None = None,
) -> Completion:
    """Run the kernel's Python once per block, on NumPy tiles, in grid order; with `group_m`,
    each block owns the tile the L2-grouped order gives it (`grid_order.grouped`)."""
    arrays: list[np.ndarray | None] = []
    for a in args:
        t = a.tensor if isinstance(a, Partition) else a
        if isinstance(t, Tensor):
            buf = t.buffer
            assert isinstance(buf, HostBuffer)
            raw = buf.view(t.dtype.storage, t.size).reshape(t.shape)
            arrays.append(from_storage(raw, t.dtype) if t.dtype.storage != t.dtype.compute else raw)
        else:
            arrays.append(None)
    # Run-time scalars as typed scalars, so that they promote as the compiled kernel's
    # i32/f32 parameters do (a bare Python number would be weak); made once for all blocks.
    values = [
        Tile(np.array(a, dtype=bp.dtype.compute), bp.dtype) if bp.spec.kind == "scalar" else a
        for bp, a in zip(spec.params, args)
    ]
    body = _with_typevars(fn, spec)
    g = (*grid, 1, 1, 1)[:3]
    try:
        with np.errstate(all="ignore"):
            for hw in itertools.product(*(range(n) for n in grid)):
                bid = (*hw, 0, 0, 0)[:3]
                if group_m is not None:
                    bid = grouped((bid[0], bid[1], bid[2]), (g[0], g[1], g[2]), group_m)
                block = bid[: len(grid)]
                call_args: list[Any] = []
                for bp, a, arr, value in zip(spec.params, args, arrays, values):
                    if isinstance(a, Partition):
                        assert arr is not None
                        call_args.append(TileView(arr, bp.dtype, a.tile_shape, block))
                    elif isinstance(a, Tensor):
                        assert arr is not None
                        call_args.append(TensorView(arr, bp.dtype))
                    else:
                        call_args.append(value)
                ctx = BlockContext(
                    (bid[0], bid[1], bid[2]),
                    (g[0], g[1], g[2]),
                    spec.typevars,
                    spec.dtypevars,
                )
                token = CURRENT_BLOCK.set(ctx)
                try:
                    body(*call_args)
                except KernelFault as e:
                    raise LaunchFailure(f"block {bid}: {e}, at {_user_line(e)}") from e
                finally:
                    CURRENT_BLOCK.reset(token)
    finally:
        # Write back what blocks stored into tensors whose compute form is a copy.
        for a, arr in zip(args, arrays):
            if isinstance(a, Partition) and arr is not None and a.dtype.storage != a.dtype.compute:
                buf = a.tensor.buffer
                assert isinstance(buf, HostBuffer)
                buf.view(a.dtype.storage, a.tensor.size)[:] = to_storage(arr, a.dtype).reshape(-1)
    return Finished()
