"""Shape rules of the tile language (NumPy's), shared by the frontend and the interpreter.

Each function raises `ValueError` with a message in the user's terms; the frontend turns it
into a CompileError at the call's source line.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """The shape that `shapes` broadcast to (NumPy: align right, dims equal or 1)."""
    rank = max((len(s) for s in shapes), default=0)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            if d != out[i] and 1 not in (d, out[i]):
                shown = " and ".join(str(x) for x in shapes if x)
                raise ValueError(f"tiles of shapes {shown} cannot be broadcast together")
            if d != 1:
                out[i] = d
    return tuple(out)


def broadcast_to_shape(src: tuple[int, ...], dst: tuple[int, ...]) -> None:
    """Check that a tile of shape `src` broadcasts to exactly `dst`."""
    ok = len(src) <= len(dst) and all(s in (1, d) for s, d in zip(src, dst[len(dst) - len(src) :]))
    if not ok:
        raise ValueError(f"cannot broadcast a tile of shape {src} to {dst}")


def normalize_axis(axis: object, ndim: int) -> int:
    """`axis` (negative counts from the end) as an index into `ndim` dims."""
    if not isinstance(axis, int) or isinstance(axis, bool):
        raise ValueError(f"an axis must be an integer constant, got {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} is out of range for a tile of rank {ndim}")
    return axis % ndim


def reduction_axes(axis: object, ndim: int, multiple: bool = True) -> tuple[int, ...]:
    """The sorted axes a reduction over `axis` covers: None is all of them; a tuple (where
    `multiple`) lists several, each once."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, tuple):
        if not multiple:
            raise ValueError("this reduction takes one axis or None, not a tuple")
        axes = tuple(normalize_axis(a, ndim) for a in axis)
        if len(set(axes)) != len(axes):
            raise ValueError(f"axis {axis} repeats an axis")
        return tuple(sorted(axes))
    return (normalize_axis(axis, ndim),)


def reshape_target(shape: object, size: int, source: tuple[int, ...]) -> tuple[int, ...]:
    """The shape a tile of `size` elements takes under `shape` (one dim may be -1)."""
    dims = shape if isinstance(shape, tuple) else (shape,)
    if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        raise ValueError(f"a reshape needs integer constant dims, got {shape!r}")
    ints: Sequence[int] = dims
    if ints.count(-1) > 1 or any(d <= 0 and d != -1 for d in ints):
        raise ValueError(f"reshape dims must be positive (one may be -1), got {shape}")
    if -1 in ints:
        known = prod(d for d in ints if d != -1)
        if size % known:
            raise ValueError(
                f"cannot reshape a tile of shape {source} ({size} elements) to {shape}"
            )
        ints = tuple(size // known if d == -1 else d for d in ints)
    if prod(ints) != size:
        raise ValueError(
            f"cannot reshape a tile of shape {source} ({size} elements) to {tuple(ints)} "
            f"({prod(ints)} elements)"
        )
    return tuple(ints)


def permutation(axes: object, ndim: int) -> tuple[int, ...]:
    """`axes` (negative allowed) checked to be a permutation of `ndim` dims."""
    if not isinstance(axes, tuple):
        raise ValueError(f"axes must be a tuple of integer constants, got {axes!r}")
    if len(axes) != ndim:
        raise ValueError(f"axes {axes} do not list each of the {ndim} dims of the tile once")
    out = tuple(normalize_axis(a, ndim) for a in axes)
    if sorted(out) != list(range(ndim)):
        raise ValueError(f"axes {axes} do not list each of the {ndim} dims of the tile once")
    return out


def expanded_shape(shape: tuple[int, ...], axis: object) -> tuple[int, ...]:
    """`shape` with a dim of 1 inserted at each of `axis` (NumPy `expand_dims`)."""
    axes = axis if isinstance(axis, tuple) else (axis,)
    ndim = len(shape) + len(axes)
    where = [normalize_axis(a, ndim) for a in axes]
    if len(set(where)) != len(where):
        raise ValueError(f"axis {axis} repeats an axis")
    rest = iter(shape)
    return tuple(1 if i in where else next(rest) for i in range(ndim))
