"""A user's kernel file type-checks with `mypy --strict` after the README's install, from a
directory outside the repository where none of our configuration applies (API.md §1)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

HELPER_KERNEL = """
from typing import TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

R = TypeVar("R")
C = TypeVar("C")


@ct.function
def scaled(t: ct.Tile, s: float) -> ct.Tile:
    return t * s


T = TypeVar("T")


@ct.kernel
def scale_any(z: Mut[Tensor[T, R]], x: Tensor[T, Dyn], s: float) -> None:
    z.store((ct.load_tile_like(x, z).astype(f32) * s).astype(x.dtype))


@ct.kernel
def gather_scan_count(
    z: Mut[Tensor[f32, R]],
    x: Tensor[f32, Dyn],
    idx: Tensor[ct.i32, Dyn],
    h: ct.Atomic[Tensor[ct.i32, Dyn]],
) -> None:
    i = ct.load(idx, ct.bid(0), z.shape, padding=-1)
    ct.atomic_add(h, i, 1)
    ct.atomic_max(h, 0, i)
    z.store(ct.cumsum(ct.gather(x, i, padding=0.0), 0))
    ct.scatter(z, (ct.arange(z.shape[0], ct.i32),), 0.0)


@ct.kernel
def row_softmax(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn], s: float) -> None:
    t = scaled(ct.load_tile_like(x, z), s)
    e = ct.exp(t - ct.max(t, axis=1, keepdims=True))
    z.store(e / ct.sum(e, axis=1, keepdims=True))
"""


def _readme_first_kernel() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## A first kernel", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "README.md lost its first kernel"
    return match.group(1)


def _mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mypy", reason="mypy comes with the dev extra")
    (tmp_path / "user_kernels.py").write_text(source)
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "user_kernels.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_users_kernel_files_pass_mypy_strict(tmp_path: Path) -> None:
    result = _mypy(tmp_path, _readme_first_kernel() + "\n" + HELPER_KERNEL)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues found" in result.stdout


def test_mypy_still_sees_a_users_type_error(tmp_path: Path) -> None:
    """The check above is not vacuous: cutile_py is resolved and its types are used."""
    result = _mypy(tmp_path, HELPER_KERNEL + "\nn: int = ct.cdiv\n")
    assert result.returncode == 1
    assert "user_kernels.py:" in result.stdout and "[assignment]" in result.stdout
    assert "cutile_py/" not in result.stdout  # nothing reported inside the library
