"""Def-use of a kernel: the op that defines each value, the ops that use it, and the op whose
region holds each op. Built once per kernel (`def_use`) as a frozen snapshot; the kernel must
not change while it is in use (lowering never changes the IR)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cutile_py.ir import ops as o


@dataclass(frozen=True)
class DefUse:
    """Values and ops are keyed by identity (neither defines equality)."""

    _users: Mapping[o.Value, tuple[o.Op, ...]]
    _producer: Mapping[o.Value, o.Op]
    _enclosing: Mapping[o.Op, o.Op]

    def users(self, v: o.Value) -> tuple[o.Op, ...]:
        """The ops that take `v` as an operand, in program order (once per operand slot)."""
        return self._users.get(v, ())

    def producer(self, v: o.Value) -> o.Op | None:
        """The op whose result `v` is; None for a region argument or a parameter."""
        return self._producer.get(v)

    def enclosing(self, op: o.Op) -> o.Op | None:
        """The op whose region holds `op`; None at the kernel's top level."""
        return self._enclosing.get(op)


def walk(region: o.Region) -> Iterator[o.Op]:
    """Every op of `region`, nested regions included, in program order."""
    for op in region.ops:
        yield op
        for r in op.regions():
            yield from walk(r)


def def_use(kernel: o.Kernel) -> DefUse:
    users: dict[o.Value, list[o.Op]] = {}
    producer: dict[o.Value, o.Op] = {}
    enclosing: dict[o.Op, o.Op] = {}

    def visit(region: o.Region, parent: o.Op | None) -> None:
        for op in region.ops:
            if parent is not None:
                enclosing[op] = parent
            for v in op.operands:
                users.setdefault(v, []).append(op)
            for r in op.results:
                producer[r] = op
            for sub in op.regions():
                visit(sub, op)

    visit(kernel.body, None)
    return DefUse(
        MappingProxyType({v: tuple(ops) for v, ops in users.items()}),
        MappingProxyType(producer),
        MappingProxyType(enclosing),
    )
