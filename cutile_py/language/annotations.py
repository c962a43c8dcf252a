"""The types kernel parameters are annotated with: `Mut[...]`, `Atomic[...]`, `Dyn`,
`Constant[...]`.

`Tensor[dtype, dims...]` itself is the host tensor class (`cutile_py.host.tensor.Tensor`); the
frontend recognizes it by its `__cutile_tensor__` marker, so this layer need not import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Generic, TypeVar

from cutile_py.language.tile import Tile

T = TypeVar("T")


class Dyn:
    """A tensor dimension whose size is known only at run time."""


class Mut(Generic[T]):
    """`Mut[Tensor[dtype, d0, ...]]`: an exclusive, writable tile of a partitioned tensor.

    The host passes a `Partition`; inside the kernel each block sees its own tile, whose
    shape is `(d0, ...)`.
    """

    if TYPE_CHECKING:
        # Inside a kernel: the tile's static shape, and its load and store.
        shape: tuple[int, ...]
        dtype: Any

        def load(self) -> Tile: ...

        def store(self, tile: Tile | float) -> None: ...


class Atomic(Generic[T]):
    """`Atomic[Tensor[dtype, Dyn, ...]]`: a whole tensor the kernel only updates atomically
    (`ct.atomic_add`, `atomic_max`, `atomic_min`), never reads or stores. The host passes the
    Tensor itself; the launch holds it exclusively, so nothing else races on it."""

    if TYPE_CHECKING:
        shape: tuple[int, ...]
        dtype: Any


if TYPE_CHECKING:
    # To mypy a `Constant[int]` parameter is the int it holds, so it can size tiles.
    Constant = Annotated[T, "cutile_py.Constant"]
else:

    class Constant(Generic[T]):
        """`Constant[int]` / `Constant[float]`: a parameter compiled into the kernel (one
        variant per distinct value)."""


def is_tensor_class(obj: object) -> bool:
    return isinstance(obj, type) and bool(getattr(obj, "__cutile_tensor__", False))
