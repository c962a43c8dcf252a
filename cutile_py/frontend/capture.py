"""Capturing a kernel at definition: its source, AST, file position and the names it can see."""

from __future__ import annotations

import ast
import contextlib
import hashlib
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cutile_py.frontend.errors import CompileError, SourceLocation


@dataclass(frozen=True)
class CapturedFunction:
    fn: Callable[..., Any]
    name: str
    file: str
    first_line: int  # line of the `def` (after decorators) in the file
    indent: int  # columns removed by dedenting
    lines: tuple[str, ...]  # the file's lines of the function, undedented
    tree: ast.FunctionDef
    source_hash: str
    #: Names the body reads that are neither parameters nor assigned in it, sorted.
    free_names: tuple[str, ...]
    #: Local names of the scope the kernel was defined in (for string annotations and TypeVars
    #: defined in a function); module globals are read live from `fn.__globals__`.
    scope: dict[str, Any]

    def location(self, node: ast.AST) -> SourceLocation:
        rel = getattr(node, "lineno", 1)
        line = self.first_line + rel - 1
        col = getattr(node, "col_offset", 0) + self.indent + 1
        text = self.lines[rel - 1] if 0 < rel <= len(self.lines) else ""
        end = getattr(node, "end_col_offset", None)
        # An expression spanning lines is underlined to the end of its first line.
        same_line = getattr(node, "end_lineno", None) == rel
        end_col = end + self.indent + 1 if end is not None and same_line else None
        return SourceLocation(self.file, line, col, text, end_col)

    def error(self, node: ast.AST, message: str) -> CompileError:
        return CompileError(message, self.location(node), self.name)

    def fingerprint(self) -> tuple[tuple[str, Any], ...]:
        """The current values of the names the body reads from outside (globals, closure,
        defining scope): part of the JIT cache key, so that a changed constant recompiles.
        Numbers and strings count by value, anything else (modules, functions) by identity."""
        closure = dict(zip(self.fn.__code__.co_freevars, self.fn.__closure__ or ()))
        glob = self.fn.__globals__
        out = []
        for name in self.free_names:
            if name in closure:
                try:
                    value = closure[name].cell_contents
                except ValueError:
                    continue
            elif name in self.scope:
                value = self.scope[name]
            elif name in glob:
                value = glob[name]
            else:
                continue
            out.append((name, _value_key(value)))
        return tuple(out)

    def visible_names(self) -> dict[str, Any]:
        """Module globals, shadowed by the defining scope's locals and the closure's variables."""
        names = dict(self.fn.__globals__)
        names.update(self.scope)
        code = self.fn.__code__
        for name, cell in zip(code.co_freevars, self.fn.__closure__ or ()):
            with contextlib.suppress(ValueError):  # a free variable not yet bound
                names[name] = cell.cell_contents
        return names


def capture(fn: Callable[..., Any], scope: dict[str, Any] | None = None) -> CapturedFunction:
    """Read and parse `fn`'s source; raise CompileError if it cannot be found.

    `scope` holds the local names where `fn` was defined, when that was inside a function.
    """
    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "kernel"))
    try:
        lines, start = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or inspect.getfile(fn)
    except (OSError, TypeError) as e:
        raise CompileError(
            f"cannot read the source of {name} ({e}); kernels must be defined in a file", None, name
        ) from e
    source = "".join(lines)
    dedented = textwrap.dedent(source)
    indent = len(lines[0]) - len(lines[0].lstrip()) if lines else 0
    module = ast.parse(dedented)
    fdef = next((n for n in module.body if isinstance(n, ast.FunctionDef)), None)
    if fdef is None:
        raise CompileError(f"{name} is not a plain function definition", None, name)
    # Report lines relative to the `def`, not the first decorator.
    offset = fdef.lineno - 1
    for node in ast.walk(fdef):
        if isinstance(node, (ast.expr, ast.stmt, ast.arg, ast.keyword)):
            node.lineno -= offset
            if node.end_lineno is not None:
                node.end_lineno -= offset
    body_lines = tuple(line.rstrip("\n") for line in lines[offset:])
    digest = hashlib.sha256(source.encode()).hexdigest()
    return CapturedFunction(
        fn=fn,
        name=getattr(fn, "__name__", name),
        file=file,
        first_line=start + offset,
        indent=indent,
        lines=body_lines,
        tree=fdef,
        source_hash=digest,
        scope=dict(scope or {}),
        free_names=_free_names(fdef),
    )


def _free_names(fdef: ast.FunctionDef) -> tuple[str, ...]:
    params = {a.arg for a in fdef.args.args}
    loads: set[str] = set()
    stores: set[str] = set()
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name):
            (stores if isinstance(node.ctx, ast.Store) else loads).add(node.id)
    return tuple(sorted(loads - stores - params))


def _value_key(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return (type(value).__name__, value)
    if isinstance(value, tuple):
        return tuple(_value_key(v) for v in value)
    return ("id", id(value))
