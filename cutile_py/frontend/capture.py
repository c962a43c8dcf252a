"""Capturing a kernel at definition: its source, AST, file position and the names it can see;
and what it reads from outside (names, module attributes, helpers), the input of its cache keys."""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import inspect
import struct
import textwrap
import types
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

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
    #: Each free name the body reads, and each attribute chain read from one (`settings.EPS`
    #: is ("settings", "EPS")), sorted.
    read_paths: tuple[tuple[str, ...], ...] = ()

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

    @functools.cached_property
    def _cells(self) -> dict[str, Any]:
        """The closure's cells by name (fixed per function object; their contents are not)."""
        return dict(zip(self.fn.__code__.co_freevars, self.fn.__closure__ or ()))

    def lookup(self, name: str) -> Any:
        """The current value of a name the body reads from outside: the closure's, else the
        defining scope's, else the module's; `UNBOUND` if none has it (a builtin)."""
        cell = self._cells.get(name)
        if cell is not None:
            try:
                return cell.cell_contents
            except ValueError:  # a free variable not yet bound
                return UNBOUND
        if name in self.scope:
            return self.scope[name]
        return self.fn.__globals__.get(name, UNBOUND)

    @functools.cached_property
    def _read_plan(self) -> tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]:
        """`read_paths` grouped by their first name."""
        roots: dict[str, list[tuple[str, ...]]] = {}
        for path in self.read_paths:
            roots.setdefault(path[0], []).append(path)
        return tuple((root, tuple(paths)) for root, paths in roots.items())

    def reads(self) -> list[tuple[tuple[str, ...], Any]]:
        """(path, current value) of everything the body reads from outside: each name, and
        each attribute chain read from a module (`settings.EPS`, `a.b.c`, followed while the
        value is a module). A name whose value is not a module, or is one of cutile_py's own
        (the compiler version covers those), is one read of the name itself. Unbound names
        (builtins) are left out."""
        out: list[tuple[tuple[str, ...], Any]] = []
        for root, paths in self._read_plan:
            value = self.lookup(root)
            if value is UNBOUND:
                continue
            if not isinstance(value, types.ModuleType) or _is_ours(value):
                out.append(((root,), value))
                continue
            for path in paths:
                v = value
                for attr in path[1:]:
                    if not isinstance(v, types.ModuleType) or _is_ours(v):
                        break
                    try:
                        v = getattr(v, attr)
                    except Exception:  # a module's __getattr__ may raise anything
                        v = UNBOUND
                        break
                out.append((path, v))
        return out

    def fingerprint(self) -> tuple[tuple[tuple[str, ...], Hashable], ...]:
        """The in-memory cache key of what the body reads (see `reads`), through every helper
        it calls, at any depth: numbers and strings by value (floats by their bits), tuples
        item by item, user functions by identity and, recursively, what they read; anything
        else by identity. A changed constant, module attribute or helper recompiles."""
        watch = self.__dict__.get("_fingerprint_watch")
        if watch is not None:  # (every launch asks: the names compared in place)
            for where, name, value in watch[0]:
                if type(where) is types.CellType:
                    try:
                        now = where.cell_contents
                    except ValueError:  # a free variable not yet bound
                        now = UNBOUND
                else:
                    now = where.get(name, UNBOUND)
                if now is not value:
                    break
            else:
                known: tuple[tuple[tuple[str, ...], Hashable], ...] = watch[1]
                return known
        reads = self.reads()
        memo = self.__dict__.get("_fingerprint_memo")
        if memo is not None and len(memo[0]) == len(reads):
            # The same objects as last time give the same key (an immutable value is unchanged;
            # anything else keys by identity); kept only where no helper's reads are involved.
            for (_, old), (_, new) in zip(memo[0], reads):
                if old is not new:
                    break
            else:
                key: tuple[tuple[tuple[str, ...], Hashable], ...] = memo[1]
                return key
        key = _fingerprint(self, ())
        flat = not any(is_user_function(v) or isinstance(v, tuple) for _, v in reads)
        self.__dict__["_fingerprint_memo"] = (reads, key) if flat else None
        watched = self._watch(reads) if flat else None
        self.__dict__["_fingerprint_watch"] = None if watched is None else (watched, key)
        return key

    def _watch(self, reads: list[tuple[tuple[str, ...], Any]]) -> tuple[_Watched, ...] | None:
        """Where each of `reads` lives (a closure cell, the defining scope or the module's
        globals), with its value: what a launch compares by identity to know the key is still
        right, without building `reads` again. None where a name reads through a module
        outside cutile_py (its attributes are followed by `reads`)."""
        found = {path[0]: value for path, value in reads if len(path) == 1}
        watched: list[_Watched] = []
        for root, _ in self._read_plan:
            value = found.get(root, UNBOUND)
            if isinstance(value, types.ModuleType) and not _is_ours(value):
                return None
            cell = self._cells.get(root)
            if cell is not None:
                watched.append((cell, root, value))
            elif root not in self.scope:  # (the scope is a snapshot: it never changes)
                watched.append((self.fn.__globals__, root, value))
        return tuple(watched)

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
    free = _free_names(fdef)
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
        free_names=free,
        read_paths=_read_paths(fdef, frozenset(free)),
    )


def _free_names(fdef: ast.FunctionDef) -> tuple[str, ...]:
    params = {a.arg for a in fdef.args.args}
    loads: set[str] = set()
    stores: set[str] = set()
    for node in ast.walk(fdef):
        if isinstance(node, ast.Name):
            (stores if isinstance(node.ctx, ast.Store) else loads).add(node.id)
    return tuple(sorted(loads - stores - params))


def _read_paths(fdef: ast.FunctionDef, free: frozenset[str]) -> tuple[tuple[str, ...], ...]:
    """The longest name or attribute chain read at each place, for chains rooted at a free name."""
    paths: set[tuple[str, ...]] = set()
    # The body only: annotations, defaults and decorators were evaluated at the definition.
    stack: list[ast.AST] = list(fdef.body)
    while stack:
        node = stack.pop()
        chain = _chain(node)
        if chain is not None:
            if chain[0] in free:
                paths.add(chain)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return tuple(sorted(paths))


def _chain(node: ast.AST) -> tuple[str, ...] | None:
    """`a.b.c` read as ("a", "b", "c"); None if `node` is not such a read."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
        attrs.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        return (node.id, *reversed(attrs))
    return None


class _Unbound:
    def __repr__(self) -> str:
        return "UNBOUND"


#: What `CapturedFunction.lookup` returns for a name bound nowhere the kernel can see.
UNBOUND: Any = _Unbound()

_HELPERS: dict[Callable[..., Any], CapturedFunction] = {}
#: Functions whose source cannot be read: keyed by identity alone, not tried at every launch.
_NO_SOURCE: set[Callable[..., Any]] = set()


def capture_helper(fn: Callable[..., Any]) -> CapturedFunction:
    """`capture(fn)`, once per function object (a helper is captured when first called or
    keyed, and reused by every kernel); CompileError if its source cannot be read."""
    cap = _HELPERS.get(fn)
    if cap is None:
        cap = _HELPERS[fn] = capture(fn)
    return cap


def is_user_function(value: object) -> bool:
    """A plain Python function outside cutile_py (a helper whose body a kernel may inline)."""
    return isinstance(value, types.FunctionType) and not _is_ours(value)


def _is_ours(value: object) -> bool:
    module = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
    return isinstance(module, str) and (module == "cutile_py" or module.startswith("cutile_py."))


#: A name a kernel reads, where it lives (a closure cell or a globals dict) and its value.
_Watched = tuple[Any, str, Any]


def float_bits(value: float) -> int:
    """The IEEE bits of a float: 0.0 and -0.0 differ, and every NaN equals itself."""
    return int.from_bytes(struct.pack("<d", value), "little")


class _Identity:
    """A key part equal only to the same object; it holds the object, so that its `id` is not
    reused by another while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: object) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _fingerprint(
    cap: CapturedFunction, stack: tuple[int, ...]
) -> tuple[tuple[tuple[str, ...], Hashable], ...]:
    stack = (*stack, id(cap.fn))
    return tuple((path, _value_key(value, stack)) for path, value in cap.reads())


def _value_key(value: Any, stack: tuple[int, ...]) -> Hashable:
    if value is None or isinstance(value, (bool, int, str)):
        return (type(value).__name__, value)
    if isinstance(value, float):
        return (type(value).__name__, float_bits(value))
    if isinstance(value, tuple):
        return ("tuple", tuple(_value_key(v, stack) for v in value))
    if is_user_function(value) and id(value) not in stack and value not in _NO_SOURCE:
        try:
            helper = capture_helper(value)
        except CompileError:
            _NO_SOURCE.add(value)
            return cast(Hashable, value)
        return (value, _fingerprint(helper, stack))
    if isinstance(value, _BY_IDENTITY):
        return cast(Hashable, value)  # equal only to itself, and held by the key
    return ("id", _Identity(value))


#: Types whose equality is identity: their objects key as themselves.
_BY_IDENTITY = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    TypeVar,
)
