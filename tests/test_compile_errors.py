"""Unsupported Python and misused tile operations: CompileError at the right file:line:col."""

from __future__ import annotations

import inspect
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")
ARGS = (ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))


def helper(x: Any) -> Any:
    return x


def line_of(fn: Callable[..., Any], text: str) -> int:
    """The file line of the first source line of `fn` containing `text`."""
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def compile_error(kernel: ct.Kernel) -> ct.CompileError:
    with pytest.raises(ct.CompileError) as info:
        kernel.ir(*ARGS)
    return info.value


def k_while(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    i = 0
    while i < 3:
        i += 1
    z.store(ct.load_tile_like(x, z))


def k_listcomp(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    ys = [t for _ in range(2)]
    z.store(t)
    del ys


def k_unknown_call(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(helper(t))


def k_dyn_shape(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load(x, (0,), (x.shape[0],))
    z.store(t)


def k_store_dtype(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).astype(ct.f16))


def k_undefined(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(not_defined_anywhere)  # type: ignore[name-defined]  # noqa: F821


def k_store_shared(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    x.store(ct.load_tile_like(x, z))  # type: ignore[attr-defined]


def k_float_mod(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) % 2.0)


def k_loop_type_change(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    acc = 0.0
    for _ in range(3):
        acc = acc + ct.load_tile_like(x, z)
    z.store(acc)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fn,needle,message",
    [
        (k_while, "while i < 3", "while loops are not supported"),
        (k_listcomp, "ys = [t for", "list comprehensions are not supported"),
        (k_unknown_call, "helper(t)", "call to unsupported function 'helper'"),
        (k_dyn_shape, "ct.load(x, (0,)", "run-time size"),
        (k_store_dtype, "z.store(", "cannot store a f16 tile into 'z' (f32)"),
        (k_undefined, "not_defined_anywhere", "name 'not_defined_anywhere' is not defined"),
        (k_store_shared, "x.store(", "'x' is a shared, read-only Tensor"),
        (
            k_loop_type_change,
            "for _ in range(3)",
            "variable 'acc' is carried through the loop as f32",
        ),
    ],
)
def test_error_names_file_line_and_column(
    fn: Callable[..., Any], needle: str, message: str
) -> None:
    err = compile_error(ct.kernel(fn))
    assert message in err.message
    assert err.where is not None
    assert err.where.file == __file__
    assert err.where.line == line_of(fn, needle)
    rendered = str(err)
    first, source, caret, *rest = rendered.splitlines()
    w = err.where
    assert first == f'File "{__file__}", line {w.line}, col {w.col}, in {fn.__name__}'
    assert source == "    " + err.where.text.strip()
    # The carets start under the reported column of the shown (dedented) line.
    indent = len(err.where.text) - len(err.where.text.lstrip())
    assert caret.index("^") - 4 == err.where.col - 1 - indent
    assert "\n".join(rest) == err.message


def test_column_points_at_the_offending_expression() -> None:
    err = compile_error(ct.kernel(k_unknown_call))
    assert err.where is not None
    assert err.where.text[err.where.col - 1 :].startswith("helper(t)")


def test_errors_come_at_first_compile_not_at_definition() -> None:
    k = ct.kernel(k_while)  # no error yet
    with pytest.raises(ct.CompileError):
        k(ct.zeros(64).partition(32), ct.zeros(64))


def test_interpret_runs_the_same_checks_and_nothing_stays_borrowed() -> None:
    k = ct.kernel(k_unknown_call)
    z, x = ct.zeros(64).partition(32), ct.zeros(64)
    with pytest.raises(ct.CompileError):
        k(z, x)
    z.unpartition()
    x.to_numpy()


def test_missing_annotation_is_a_compile_error() -> None:
    def k(z: Mut[Tensor[f32, B]], x) -> None:  # type: ignore[no-untyped-def]
        pass

    with pytest.raises(ct.CompileError, match="parameter 'x' needs a type annotation"):
        ct.kernel(k).ir(*ARGS)


def test_unbound_typevar_is_value_error_naming_the_parameter() -> None:
    C = TypeVar("C")

    def k(z: Mut[Tensor[f32, B]], x: Tensor[f32, C]) -> None:
        pass

    with pytest.raises(ValueError, match="parameter 'x': TypeVar C"):
        ct.kernel(k).ir(*ARGS)


@ct.function
def bad_helper(t: ct.Tile) -> ct.Tile:
    while True:
        pass
    return t


def k_calls_bad_helper(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(bad_helper(ct.load_tile_like(x, z)))


def test_error_inside_a_helper_shows_the_call_chain() -> None:
    err = compile_error(ct.kernel(k_calls_bad_helper))
    assert err.where is not None and err.where.line == line_of(bad_helper, "while True")
    call_line = line_of(k_calls_bad_helper, "z.store(bad_helper(")
    assert str(err) == "\n".join(
        [
            f'File "{__file__}", line {call_line}, col 13, in k_calls_bad_helper',
            "    z.store(bad_helper(ct.load_tile_like(x, z)))",
            "            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            f'File "{__file__}", line {err.where.line}, col 5, in bad_helper '
            f"(called from k_calls_bad_helper, line {call_line})",
            "    while True:",
            "    ^^^^^^^^^^^",
            "while loops are not supported in kernels; use `for i in range(...)`",
        ]
    )


# -- how a CompileError reaches the user --------------------------------------------------------
PACKAGE = str(Path(ct.__file__).resolve().parent)


def compiler_frames(err: BaseException) -> list[str]:
    """The traceback's frames that lie inside cutile_py."""
    return [
        f"{f.filename}:{f.lineno}"
        for f in traceback.extract_tb(err.__traceback__)
        if str(Path(f.filename).resolve()).startswith(PACKAGE)
    ]


def _launch(k: ct.Kernel, backend: str) -> None:
    ct.set_backend(backend)
    k(ct.zeros(64).partition(32), ct.zeros(64))


BOUNDARIES: dict[str, Callable[[ct.Kernel], Any]] = {
    "launch on sim": lambda k: _launch(k, "sim"),
    "launch on interpret": lambda k: _launch(k, "interpret"),
    ".compile": lambda k: k.compile(*ARGS),
    ".ptx": lambda k: k.ptx(*ARGS),
    ".ir": lambda k: k.ir(*ARGS),
}


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_the_traceback_shows_the_users_frames_only(boundary: str) -> None:
    with pytest.raises(ct.CompileError) as info:
        BOUNDARIES[boundary](ct.kernel(k_calls_bad_helper))
    err = info.value
    # At most the one frame that re-raises it at the public boundary.
    assert len(compiler_frames(err)) <= 1, compiler_frames(err)
    text = "".join(traceback.format_exception(err))
    assert err.__cause__ is None and err.__suppress_context__
    assert text.count('File "') == len(traceback.extract_tb(err.__traceback__)) + 2
    assert text.rstrip().endswith(
        "    ^^^^^^^^^^^\nwhile loops are not supported in kernels; use `for i in range(...)`"
    )
    assert "cutile_py.CompileError: File " in text


def k_shape_typo(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(ct.exp(t) + ct.full((16,), 1.0, f32))


def k_not_a_bool(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    if ct.sum(t):
        z.store(t)


PINNED: list[tuple[Callable[..., Any], str, list[str]]] = [
    (
        k_shape_typo,
        "ct.exp(t) +",
        [
            "    z.store(ct.exp(t) + ct.full((16,), 1.0, f32))",
            "            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            "tiles of shapes (32,) and (16,) cannot be broadcast together",
        ],
    ),
    (
        k_not_a_bool,
        "if ct.sum(t):",
        [
            "    if ct.sum(t):",
            "       ^^^^^^^^^",
            "an if condition must be a bool scalar, not f32; for tiles use ct.where",
        ],
    ),
    (
        k_unknown_call,
        "helper(t)",
        [
            "    z.store(helper(t))",
            "            ^^^^^^^^^",
            "call to unsupported function 'helper': kernels may call ct builtins (see the API) "
            "and int/float/min/max/abs/print",
        ],
    ),
]


@pytest.mark.parametrize("fn,needle,lines", PINNED)
def test_rendered_errors_read_like_pythons(
    fn: Callable[..., Any], needle: str, lines: list[str]
) -> None:
    err = compile_error(ct.kernel(fn))
    assert err.where is not None
    head = f'File "{__file__}", line {line_of(fn, needle)}, col {err.where.col}, in {fn.__name__}'
    assert str(err) == "\n".join([head, *lines])


USER_SCRIPT = """\
from typing import TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

R = TypeVar("R")
C = TypeVar("C")


@ct.kernel
def normalize_rows(z: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t / ct.sum(t, axis=1))


ct.set_backend("{backend}")
x = ct.zeros((16, 16))
normalize_rows(ct.zeros((16, 16)).partition((8, 8)), x).sync()
"""


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_a_user_script_prints_a_short_python_like_error(tmp_path: Path, backend: str) -> None:
    script = tmp_path / "user_kernel.py"
    script.write_text(USER_SCRIPT.replace("{backend}", backend))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    lines = done.stderr.rstrip().splitlines()
    frames = [line for line in lines if line.startswith('  File "')]
    assert frames[0] == f'  File "{script}", line 18, in <module>'
    assert sum(PACKAGE in f for f in frames) <= 1, done.stderr
    assert lines[-4:] == [
        f'cutile_py.CompileError: File "{script}", line 13, col 13, in normalize_rows',
        "    z.store(t / ct.sum(t, axis=1))",
        "            ^^^^^^^^^^^^^^^^^^^^^",
        "the (8,) result of ct.sum(..., axis=1) at line 13 is broadcast back against a (8, 8) "
        "tile along axis 1, not axis 0 where it came from (NumPy's rule, which mixes up rows "
        "here): keep the reduced axis with keepdims=True",
    ]
    assert len(lines) <= 12, done.stderr


# -- clearer messages for common slips --------------------------------------------------------
SCALAR_ARGS = (*ARGS, 1.0)


def k_one_branch(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    t = ct.load_tile_like(x, z)
    if s > 0.0:
        y = t * 2.0
    z.store(y)


def k_else_branch(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    t = ct.load_tile_like(x, z)
    if s > 0.0:
        pass
    else:
        y = t * 2.0
    z.store(y)


def k_not_in_else(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    t = ct.load_tile_like(x, z)
    if s > 0.0:
        y = t
    elif s < -1.0:
        y = t * 2.0
    z.store(y)


def k_slice_tensor(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    z.store(x[0:32])


def k_index_tensor(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    z.store(ct.full(z.shape, x[3], f32))


def k_slice_tile(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t[0:32])


def k_slice_mut(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    z.store(z[:] * 2.0)


def k_assign_into(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], s: float) -> None:
    z[0:32] = ct.load_tile_like(x, z)


ONE_BRANCH_FIX = "assign it before the `if` or in both branches"


@pytest.mark.parametrize(
    "fn,needle,message",
    [
        (
            k_one_branch,
            "y)",
            "`y` is assigned only in the `if` branch at line {if}; " + ONE_BRANCH_FIX,
        ),
        (
            k_else_branch,
            "y)",
            "`y` is assigned only in the `else` branch of the `if` at line {if}; " + ONE_BRANCH_FIX,
        ),
        (
            k_not_in_else,
            "y)",
            "`y` is assigned in the `if` branch at line {if} but not in its `else` branch; "
            + ONE_BRANCH_FIX,
        ),
        (
            k_slice_tensor,
            "x[0:32]",
            "`x[...]` cannot read a tensor in a kernel: load a tile with "
            "`ct.load(x, index, shape)`, whose index counts tiles of that shape "
            "(`x[0:32]` is `ct.load(x, (0,), (32,))`)",
        ),
        (
            k_index_tensor,
            "x[3]",
            "`x[...]` cannot read a tensor in a kernel: load a tile with "
            "`ct.load(x, index, shape)`, whose index counts tiles of that shape "
            "(`x[8:12]` is `ct.load(x, (2,), (4,))`)",
        ),
        (
            k_slice_tile,
            "t[0:32]",
            "a tile cannot be indexed or sliced (`t[...]`): load the part you need with "
            "`ct.load(src, index, shape)`, pick elements with `ct.where(mask, tile, 0)` (masks "
            "from `ct.arange`) and reduce, or take the one element of a size-1 tile with "
            "`.item()`",
        ),
        (
            k_slice_mut,
            "z[:]",
            "`z[...]` cannot read a tensor in a kernel: read this block's tile with `z.load()`, "
            "or a sub-tile of it with `ct.load(z, index, shape)`",
        ),
        (
            k_assign_into,
            "z[0:32] =",
            "`z[0:32] = ...` cannot write into a tensor or tile in a kernel: store a whole tile "
            "with `z.store(tile)`, or a sub-tile with `ct.store(z, index, tile)`; to change some "
            "elements of a tile, build a new one with `ct.where(mask, new, old)`",
        ),
    ],
)
def test_common_slips_say_what_to_write(fn: Callable[..., Any], needle: str, message: str) -> None:
    with pytest.raises(ct.CompileError) as info:
        ct.kernel(fn).ir(*SCALAR_ARGS)
    err = info.value
    if_line = line_of(fn, "if s > 0.0:") if "{if}" in message else 0
    assert err.message == message.replace("{if}", str(if_line))
    assert err.where is not None and err.where.line == line_of(fn, needle)
    assert err.where.text[err.where.col - 1 :].startswith(needle)
