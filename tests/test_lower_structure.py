"""The modules of `cutile_py.lower` import each other without cycles, at module top only, and
never through private names (DESIGN.md, "Lowering: plan first, then emit")."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ir import ops as o
from cutile_py.lower import emit_ptx

LOWER = Path(__file__).resolve().parent.parent / "cutile_py" / "lower"
PREFIX = "cutile_py.lower"


def _imports(path: Path) -> tuple[list[tuple[int, str, list[str]]], list[str]]:
    """(line, module, names) of each `cutile_py.lower` import, and the problems found: imports
    below the module's top level (in a function, or under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    found: list[tuple[int, str, list[str]]] = []
    problems: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if id(node) not in top:
            problems.append(f"{path.name}:{node.lineno}: import below the module's top level")
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PREFIX:  # `from cutile_py.lower import emit_x`
                for a in node.names:
                    found.append((node.lineno, f"{PREFIX}.{a.name}", []))
            elif node.module.startswith(PREFIX + "."):
                found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(PREFIX + "."):
                    found.append((node.lineno, a.name, []))
    return found, problems


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    graph: dict[str, set[str]] = {}
    problems: list[str] = []
    for path in sorted(LOWER.glob("*.py")):
        name = f"{PREFIX}.{path.stem}"
        found, bad = _imports(path)
        problems += bad
        graph[name] = set()
        for line, module, names in found:
            graph[name].add(module)
            problems += [
                f"{path.name}:{line}: imports private {module}.{n}" for n in names if n[0] == "_"
            ]
    return graph, problems


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of `graph`, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_lower_imports_are_top_level_and_public() -> None:
    _, problems = _graph()
    assert problems == []


def test_lower_has_no_import_cycle() -> None:
    graph, _ = _graph()
    assert _cycle(graph) is None


def test_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@ct.kernel
def negate_table(z: ct.Mut[ct.Tensor[ct.f32, Literal[64]]], x: ct.Tensor[ct.f32, ct.Dyn]) -> None:
    z.store(-ct.load(x, (0,), (64,)))


def test_every_ir_op_kind_has_one_table_entry() -> None:
    """Emission dispatches through one table (op kind → handler): every op kind the IR
    defines has a handler, and an entry put in the table is what emits that kind."""
    kinds = {
        c
        for _, c in inspect.getmembers(o, inspect.isclass)
        if issubclass(c, o.Op) and c is not o.Op and c.__module__ == o.__name__
    }
    # A kind without an entry (added on a branch written before the table) is found as an
    # Emitter method `op_<opname>`; none may have neither.
    unhandled = {
        c.__name__
        for c in kinds - set(emit_ptx.HANDLERS)
        if not hasattr(emit_ptx.Emitter, f"op_{c.opname}")
    }
    assert unhandled == set()
    assert {o.MmaOp, o.ForOp, o.LoadOp, o.ReduceOp, o.BinaryOp} <= set(emit_ptx.HANDLERS)

    seen: list[str] = []
    original = emit_ptx.HANDLERS[o.UnaryOp]

    def counted(em: emit_ptx.Emitter, op: o.UnaryOp) -> None:
        seen.append(op.kind)
        original(em, op)

    ct.set_backend("sim")
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(emit_ptx.HANDLERS, o.UnaryOp, counted)
        x = np.arange(64, dtype=np.float32)
        (z, _) = negate_table(ct.zeros((64,), ct.f32).partition((64,)), ct.from_numpy(x)).sync()
    assert seen == ["neg"]
    np.testing.assert_array_equal(z.unpartition().to_numpy(), -x)
