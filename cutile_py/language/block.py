"""Which block of the interpreted launch runs, and the values its TypeVars took."""

from __future__ import annotations

import typing
from contextvars import ContextVar
from dataclasses import dataclass

from cutile_py.ir.dtypes import DType


@dataclass(frozen=True)
class BlockContext:
    bid: tuple[int, int, int]
    num_blocks: tuple[int, int, int]
    #: The launch's TypeVar values by name (helpers may name a TypeVar in a shape).
    typevars: tuple[tuple[str, int], ...] = ()
    #: The launch's dtype TypeVars by name (helpers may name one as a dtype).
    dtypevars: tuple[tuple[str, type[DType]], ...] = ()


CURRENT_BLOCK: ContextVar[BlockContext | None] = ContextVar("cutile_py_block", default=None)


def block() -> BlockContext:
    ctx = CURRENT_BLOCK.get()
    if ctx is None:
        raise RuntimeError("this function is only meaningful inside a running kernel")
    return ctx


def resolve_shape(shape: object) -> tuple[int, ...]:
    """A shape as a tuple of ints: an int alone is a 1-D shape; a TypeVar takes its value
    from the running launch."""
    dims = shape if isinstance(shape, (tuple, list)) else (shape,)
    out = []
    for d in dims:
        if isinstance(d, typing.TypeVar):
            ctx = CURRENT_BLOCK.get()
            value = dict(ctx.typevars).get(d.__name__) if ctx is not None else None
            if value is None:
                raise ValueError(f"TypeVar {d.__name__} has no value in this launch")
            d = value
        out.append(int(d))
    return tuple(out)


def resolve_dtype(dtype: object) -> object:
    """`dtype`, or, for a dtype TypeVar (which a helper's body may name, unlike the kernel's,
    whose names the launch rebinds), the dtype the running launch bound it to."""
    if not isinstance(dtype, typing.TypeVar):
        return dtype
    ctx = CURRENT_BLOCK.get()
    value = dict(ctx.dtypevars).get(dtype.__name__) if ctx is not None else None
    if value is None:
        raise TypeError(f"dtype TypeVar {dtype.__name__} has no value in this launch")
    return value
