"""Unsupported Python and misused tile operations: CompileError at the right file:line:col."""

from __future__ import annotations

import inspect
from collections.abc import Callable
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
    first, source, caret = rendered.splitlines()[:3]
    assert first.startswith(f"{__file__}:{err.where.line}:{err.where.col}: ")
    assert source.strip() == err.where.text.strip()
    # The caret sits under the reported column of the shown (dedented) line.
    indent = len(err.where.text) - len(err.where.text.lstrip())
    assert caret.index("^") - 4 == err.where.col - 1 - indent


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
    assert f"in bad_helper(), called at {__file__}:{call_line}:" in str(err)
