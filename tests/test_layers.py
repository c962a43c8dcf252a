"""Layering: each cutile_py subpackage imports only the layers below it (DESIGN.md, "Layers").

The sources are read with `ast`, never imported, so a broken or half-written module cannot hide
an upward import. Imports inside functions and under `if TYPE_CHECKING:` count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = "cutile_py"

# package -> the other packages of ours it may import; None: anything. Keep in step with
# DESIGN.md. Top-level modules (cutile_py/__init__.py and cutile_py/*.py) may import anything.
LAYERS: dict[str, frozenset[str] | None] = {
    "ir": frozenset(),
    "ptx": frozenset(),
    "language": frozenset({"ir"}),
    "frontend": frozenset({"ir", "language"}),
    "lower": frozenset({"ir", "ptx"}),
    "sim": frozenset({"ptx"}),
    "runtime": frozenset({"ptx", "sim"}),
    "host": frozenset({"runtime", "frontend", "lower", "ir", "language", "ptx"}),
    "tools": None,
}

# Clients of the public API only: they may import `cutile_py` and its public names, never
# `cutile_py.<subpackage>`. (`paper_repro` is not one: it times the compiler's phases and
# the driver's events from inside, as `cutile_py.tools` does.)
CLIENT_DIRS = ("cutile_py_kernels", "examples")

TOP = "the top-level cutile_py"


@dataclass(frozen=True)
class Import:
    line: int
    text: str  # the import as written, for the message
    module: str  # absolute dotted name of the module named in the statement
    target: str  # absolute dotted name of what is imported: module, or module.name


def _subpackages(root: Path) -> frozenset[str]:
    """Names that, after `cutile_py.`, denote a subpackage: the table's and those on disk."""
    on_disk = {p.name for p in (root / PKG).iterdir() if p.is_dir() and p.name != "__pycache__"}
    return frozenset(LAYERS) | on_disk


def _resolve_relative(module: str, is_package: bool, level: int, name: str | None) -> str | None:
    parts = module.split(".") if is_package else module.split(".")[:-1]
    if level > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join(base + ([name] if name else []))


def _dynamic_target(node: ast.Call) -> str | None:
    """`importlib.import_module("x")` / `__import__("x")` with a constant name."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def imports_of(source: str, module: str, is_package: bool) -> Iterator[Import]:
    """Every import in `source` (the text of `module`), relative ones made absolute.

    `from X import a` yields `X.a`: `a` may be a submodule, and `from cutile_py import ptx`
    must count as an import of `cutile_py.ptx`.
    """
    nodes = sorted(ast.walk(ast.parse(source)), key=lambda n: getattr(n, "lineno", 0))
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, f"import {alias.name}", alias.name, alias.name)
        elif isinstance(node, ast.ImportFrom):
            written = "." * node.level + (node.module or "")
            if node.level:
                base = _resolve_relative(module, is_package, node.level, node.module)
                if base is None:
                    beyond = "<beyond top level>"
                    yield Import(node.lineno, f"from {written} import ...", beyond, beyond)
                    continue
            else:
                base = node.module or ""
            for alias in node.names:
                target = base if alias.name == "*" else f"{base}.{alias.name}"
                yield Import(node.lineno, f"from {written} import {alias.name}", base, target)
        elif isinstance(node, ast.Call):
            name = _dynamic_target(node)
            if name is not None:
                yield Import(node.lineno, f"import_module({name!r})", name, name)


def _layer_of(target: str, subpackages: frozenset[str]) -> str | None:
    """The subpackage `target` belongs to, TOP for cutile_py's top level, None if not ours."""
    parts = target.split(".")
    if parts[0] != PKG:
        return TOP if target == "<beyond top level>" else None
    return parts[1] if len(parts) > 1 and parts[1] in subpackages else TOP


def check_layer_source(
    source: str, module: str, is_package: bool, subpackages: frozenset[str], where: str
) -> list[str]:
    """Violations of the layers table by `module` (dotted name inside cutile_py)."""
    parts = module.split(".")
    own = parts[1] if len(parts) > 2 or (is_package and len(parts) > 1) else None
    if own is None:
        return []  # a top-level module may import anything
    allowed = LAYERS.get(own, frozenset())
    if allowed is None:
        return []
    out = []
    for imp in imports_of(source, module, is_package):
        layer = _layer_of(imp.target, subpackages)
        if layer is None or layer == own or layer in allowed:
            continue
        may = ", ".join(sorted(allowed)) or "nothing of cutile_py"
        out.append(
            f"{where}:{imp.line}: `{imp.text}` imports {layer} ({imp.target}); "
            f"rule: {PKG}/{own} may import {may}"
        )
    return out


def check_client_source(
    source: str, module: str, is_package: bool, subpackages: frozenset[str], where: str
) -> list[str]:
    """Violations of "clients use the public `cutile_py` only"."""
    out = []
    for imp in imports_of(source, module, is_package):
        dotted = imp.module.startswith(f"{PKG}.")
        if dotted or (imp.module == PKG and _layer_of(imp.target, subpackages) != TOP):
            out.append(
                f"{where}:{imp.line}: `{imp.text}` reaches into {imp.target}; "
                f"rule: {module.split('.')[0]} may import only the public `{PKG}`"
            )
    return out


def _module_name(path: Path, root: Path) -> tuple[str, bool]:
    rel = path.relative_to(root).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _sources(root: Path, top: str) -> Iterator[tuple[Path, str, bool]]:
    base = root / top
    if not base.is_dir():
        return
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield (path, *_module_name(path, root))


def _check_tree(root: Path) -> list[str]:
    subpackages = _subpackages(root)
    out: list[str] = []
    for top in (PKG, *CLIENT_DIRS):
        check = check_layer_source if top == PKG else check_client_source
        for path, module, is_package in _sources(root, top):
            where = str(path.relative_to(root))
            out += check(path.read_text(encoding="utf-8"), module, is_package, subpackages, where)
    return out


def test_imports_point_down() -> None:
    violations = _check_tree(ROOT)
    assert not violations, "imports against the layers table:\n" + "\n".join(violations)


def test_every_subpackage_is_in_the_table() -> None:
    on_disk = {
        p.parent.relative_to(ROOT / PKG).parts[0]
        for p in (ROOT / PKG).rglob("*.py")
        if p.parent != ROOT / PKG and "__pycache__" not in p.parts
    }
    missing = sorted(on_disk - set(LAYERS))
    assert not missing, (
        f"subpackages not in the layers table: {missing}; add each to LAYERS here and to "
        "the Layers table of DESIGN.md"
    )


# --- the checker checks: synthetic sources ---------------------------------------------------

SUBS = frozenset(LAYERS)


def _layer(source: str, module: str, is_package: bool = False) -> list[str]:
    return check_layer_source(source, module, is_package, SUBS, "x.py")


UPWARD = [
    ("from cutile_py.runtime import backend\n", "cutile_py.lower.emit", False),
    ("import cutile_py.runtime.backend\n", "cutile_py.lower.emit", False),
    ("from cutile_py import runtime\n", "cutile_py.lower.emit", False),
    ("from ..runtime import backend\n", "cutile_py.lower.emit", False),
    ("from .. import sim\n", "cutile_py.ptx.builder", False),
    ("from ...runtime import x\n", "cutile_py.lower.passes", True),
    (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cutile_py.host import T\n",
        "cutile_py.ir.ops",
        False,
    ),
    ("def f():\n    import cutile_py.frontend\n", "cutile_py.ir.ops", False),
    ("import importlib\nimportlib.import_module('cutile_py.sim')\n", "cutile_py.ptx.x", False),
    ("import cutile_py\n", "cutile_py.sim.core", False),
    ("from cutile_py import Tensor\n", "cutile_py.runtime.x", False),
    ("from .... import x\n", "cutile_py.ir.ops", False),
]


@pytest.mark.parametrize(("source", "module", "is_package"), UPWARD)
def test_checker_flags_upward_import(source: str, module: str, is_package: bool) -> None:
    found = _layer(source, module, is_package)
    assert len(found) == 1, found
    assert found[0].startswith("x.py:"), found
    assert "rule: cutile_py/" in found[0]


def test_checker_message_names_file_line_and_rule() -> None:
    [msg] = _layer("import os\n\nfrom cutile_py.host import Tensor\n", "cutile_py.lower.emit")
    assert msg.startswith("x.py:3: `from cutile_py.host import Tensor` imports host")
    assert msg.endswith("rule: cutile_py/lower may import ir, ptx")


DOWNWARD = [
    (
        "from cutile_py.ptx.builder import Module\nfrom cutile_py.ir import ops\n",
        "cutile_py.lower.a",
    ),
    ("from . import ops\nfrom .types import T\n", "cutile_py.ir.printer"),
    ("from ..ptx import builder\n", "cutile_py.sim.core"),
    ("import numpy\nfrom typing import TYPE_CHECKING\n", "cutile_py.ir.ops"),
    ("from cutile_py.host import Tensor\nimport cutile_py.runtime\n", "cutile_py.tools.check"),
    ("from cutile_py.host import Tensor\n", "cutile_py.api"),
    ("from .host import Tensor\nfrom . import ir\n", "cutile_py"),
]


@pytest.mark.parametrize(("source", "module"), DOWNWARD)
def test_checker_allows_downward_import(source: str, module: str) -> None:
    assert _layer(source, module, is_package=module == PKG) == []


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("import cutile_py as ct\nfrom cutile_py import Tensor, f32\n", False),
        ("from . import common\nimport numpy as np\n", False),
        ("from cutile_py.ir import ops\n", True),
        ("import cutile_py.runtime\n", True),
        ("from cutile_py import ir\n", True),
        ("from cutile_py._private import x\n", True),
    ],
)
def test_checker_keeps_clients_on_the_public_api(source: str, bad: bool) -> None:
    found = check_client_source(source, "examples.matmul", False, SUBS, "examples/matmul.py")
    assert bool(found) == bad, found


def test_checker_walks_a_tree(tmp_path: Path) -> None:
    files = {
        "cutile_py/__init__.py": "from cutile_py.host import Tensor\n",
        "cutile_py/lower/__init__.py": "",
        "cutile_py/lower/emit.py": "from cutile_py.ptx import builder\nfrom ..runtime import x\n",
        "cutile_py/runtime/__init__.py": "from . import backend\n",
        "examples/add.py": "import cutile_py as ct\nfrom cutile_py.ir import ops\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = _check_tree(tmp_path)
    assert [msg.split(": ")[0] for msg in found] == [
        "cutile_py/lower/emit.py:2",
        "examples/add.py:2",
    ], found
