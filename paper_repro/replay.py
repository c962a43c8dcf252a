"""Timing a `cutile_py_kernels` host function by the launches it makes.

A host function allocates its output (an upload of zeros) and waits for the result on every
call, which would time the allocation and the wait, not the kernel. So it is called once while
`Kernel.__call__` is observed from outside (restored afterwards; cutile_py is not edited), and
the launches it made are then issued again on preallocated outputs and rotated inputs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cutile_py as ct
from paper_repro.timing import OpPending, Pending


@dataclass(frozen=True)
class Recorded:
    """One launch a host function made: the kernel and its arguments, in parameter order."""

    kernel: Any
    args: tuple[Any, ...]


@contextlib.contextmanager
def recording() -> Iterator[list[Recorded]]:
    """Collect every `@ct.kernel` launch built inside the `with` block."""
    from cutile_py.host.kernel import Kernel

    log: list[Recorded] = []
    original = Kernel.__call__

    def observed(self: Kernel, *args: Any, **kwargs: Any) -> Any:
        op = original(self, *args, **kwargs)
        log.append(Recorded(self, tuple(op.args)))
        return op

    Kernel.__call__ = observed  # type: ignore[method-assign]
    try:
        yield log
    finally:
        Kernel.__call__ = original  # type: ignore[method-assign]


class Replay:
    """The launches of `fn(*args)` on `sets`: per rotation slot, the tensors to use in place
    of the tensor arguments in `args` (same positions); outputs are allocated per slot."""

    def __init__(
        self, fn: Callable[..., Any], args: Sequence[Any], sets: Sequence[Sequence[Any]]
    ) -> None:
        with recording() as log:
            self.result = fn(*args)
        if not log:
            raise RuntimeError(f"{getattr(fn, '__name__', fn)} launched no cutile_py kernel")
        self.launches = list(log)
        self.kernel_names = [r.kernel.name for r in log]
        tensor_positions = [i for i, a in enumerate(args) if isinstance(a, ct.Tensor)]
        self.slots: list[list[tuple[Any, ...]]] = []
        for replacement in sets:
            mapping = {id(args[i]): t for i, t in zip(tensor_positions, replacement)}
            outputs: dict[int, Any] = {}
            calls = []
            for rec in log:
                new: list[Any] = []
                for a in rec.args:
                    if isinstance(a, ct.Partition):
                        if id(a) not in outputs:
                            fresh = ct.zeros(a.shape, a.dtype)
                            outputs[id(a)] = fresh.partition(a.tile_shape)
                        new.append(outputs[id(a)])
                    elif isinstance(a, ct.Tensor):
                        # An intermediate the function made itself is read as recorded.
                        new.append(mapping.get(id(a), a))
                    else:
                        new.append(a)
                calls.append(tuple(new))
            self.slots.append(calls)

    def launch(self, slot: int) -> list[Pending]:
        """Queue this slot's launches (waiting first only where one needs another's output)."""
        pending: list[tuple[OpPending, set[int]]] = []
        for rec, args in zip(self.launches, self.slots[slot]):
            parts = {id(a) for a in args if isinstance(a, ct.Partition)}
            for p, held in pending:
                if held & parts:
                    p.wait()
            pending.append((OpPending(rec.kernel(*args)), parts))
        return [p for p, _ in pending]
