"""Dtype TypeVars: `Tensor[T, ...]` bound at launch from the arguments, one compiled variant per
dtype; disagreeing or unbound TypeVars are errors naming the parameter or the source line."""

from __future__ import annotations

import inspect
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

T = TypeVar("T")
U = TypeVar("U")
B = TypeVar("B")
FLOATS = [(ct.f32, 2.0**-24), (ct.f16, 2.0**-11), (ct.bf16, 2.0**-8)]
#: Half the spacing of each dtype's subnormals: the rounding error of a result that small,
#: where a relative bound does not hold (f16 rounds -3.4e-5 to a multiple of 2^-24).
SUBNORMAL_HALF_STEP = {"f32": 2.0**-150, "f16": 2.0**-25, "bf16": 2.0**-134}


@ct.kernel
def mul_add(z: Mut[Tensor[T, B]], x: Tensor[T, Dyn], y: Tensor[T, Dyn], a: float) -> None:
    tx = ct.load_tile_like(x, z).astype(f32)
    ty = ct.load_tile_like(y, z).astype(f32)
    z.store((tx * ty + a).astype(z.dtype))


@ct.kernel
def names_t_in_body(z: Mut[Tensor[T, B]], x: Tensor[T, Dyn]) -> None:
    # At run time the body may name T itself (mypy allows it in annotations only).
    z.store(ct.load_tile_like(x, z).astype(f32).astype(T))  # type: ignore[misc]


@ct.kernel
def to_other(z: Mut[Tensor[U, B]], x: Tensor[T, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z).astype(z.dtype))


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize(("dt", "rel"), FLOATS, ids=lambda v: getattr(v, "name", ""))
def test_one_kernel_serves_each_float_dtype(
    backend: str, dt: type[ct.DType], rel: float, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    n, a = 777, float(rng.standard_normal())
    x = ct.from_numpy(rng.standard_normal(n).astype(np.float32), dt)
    y = ct.from_numpy(rng.standard_normal(n).astype(np.float32), dt)
    hx, hy = (t.to_numpy().astype(np.float32) for t in (x, y))
    z, _, _, _ = mul_add(ct.empty((n,), dt).partition(128), x, y, a).sync()
    got = z.unpartition()
    assert got.dtype is dt
    want = hx * hy + np.float32(a)
    err = np.abs(got.to_numpy().astype(np.float32) - want)
    assert (err <= rel * np.abs(want) + SUBNORMAL_HALF_STEP[dt.name]).all()


def test_each_dtype_compiles_its_own_variant_once() -> None:
    args = {
        dt: (ct.PartitionSpec((300,), (64,), dt), ct.TensorSpec((300,), dt)) for dt, _ in FLOATS
    }
    ptx = {dt.name: names_t_in_body.ptx(*a) for dt, a in args.items()}
    assert len(set(ptx.values())) == 3  # one variant per dtype
    assert "cvt.rn.f16.f32" not in ptx["f32"] and "cvt.rn.bf16.f32" not in ptx["f32"]
    assert "cvt.rn.f16.f32" in ptx["f16"] and "cvt.rn.bf16.f32" in ptx["bf16"]
    before = ct.cache_info()
    for a in args.values():
        names_t_in_body.compile(*a)
    assert ct.cache_info().compiles == before.compiles  # all three were cached


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_two_dtype_typevars_bind_independently(backend: str, rng: np.random.Generator) -> None:
    ct.set_backend(backend)
    xs = rng.standard_normal(200).astype(np.float32)
    x = ct.from_numpy(xs)
    z, _ = to_other(ct.empty((200,), ct.f16).partition(64), x).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), xs.astype(np.float16))


@ct.function
def affine_in_t(t: ct.Tile, a: float) -> ct.Tile:
    """A helper that names the kernel's dtype TypeVar T in its body (a cast and a fill), which
    takes this launch's value on every backend."""
    ramp = ct.arange(t.shape[0], T).astype(f32)  # type: ignore[misc]
    half = ct.full(t.shape, 0.5, T).astype(f32)  # type: ignore[misc]
    return (t.astype(f32) * a + half + ramp).astype(T)  # type: ignore[misc]


@ct.kernel
def helper_names_t(z: Mut[Tensor[T, B]], x: Tensor[T, Dyn], a: float) -> None:
    z.store(affine_in_t(ct.load_tile_like(x, z), a))


@pytest.mark.parametrize("backend", ["sim", "interpret"])
@pytest.mark.parametrize(("dt", "rel"), FLOATS, ids=lambda v: getattr(v, "name", ""))
def test_a_helper_may_name_a_dtype_typevar(
    backend: str, dt: type[ct.DType], rel: float, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    n, a = 300, float(rng.standard_normal())
    x = ct.from_numpy(rng.standard_normal(n).astype(np.float32), dt)
    hx = x.to_numpy().astype(np.float32)
    z, _, _ = helper_names_t(ct.empty((n,), dt).partition(64), x, a).sync()
    got = z.unpartition()
    assert got.dtype is dt
    want = hx * np.float32(a) + np.float32(0.5) + (np.arange(n) % 64).astype(np.float32)
    err = np.abs(got.to_numpy().astype(np.float32) - want)
    assert (err <= rel * np.abs(want) + SUBNORMAL_HALF_STEP[dt.name]).all()


def test_a_dtype_typevar_that_disagrees_names_both_parameters() -> None:
    x = ct.zeros(64, ct.f32)
    y = ct.zeros(64, ct.f16)
    with pytest.raises(TypeError) as info:
        mul_add(ct.zeros(64, ct.f32).partition(32), x, y, 1.0)
    msg = str(info.value)
    assert "kernel mul_add, parameter 'y'" in msg
    assert "dtype T = f16 disagrees with T = f32 bound by 'z'" in msg


def k_unbound(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t.astype(U).astype(f32))  # type: ignore[misc]


def k_both_roles(z: Mut[Tensor[f32, B]], x: Tensor[B, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z))


def _line(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_an_unbound_dtype_typevar_is_a_compile_error_at_its_line() -> None:
    with pytest.raises(ct.CompileError) as info:
        ct.kernel(k_unbound).ir(ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))
    msg = str(info.value)
    assert f"line {_line(k_unbound, 'astype(U)')}" in msg
    assert "TypeVar U has no value in this launch: no parameter binds it" in msg


def test_a_typevar_as_dtype_and_dim_is_a_compile_error_naming_the_parameter() -> None:
    with pytest.raises(ct.CompileError) as info:
        ct.kernel(k_both_roles).ir(ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))
    msg = str(info.value)
    assert "parameter 'x': TypeVar B is its dtype here but a dim of 'z'" in msg
    assert f"line {_line(k_both_roles, 'def k_both_roles')}" in msg


def test_a_non_dtype_in_the_dtype_slot_names_the_parameter() -> None:
    def k_bad(z: Mut[Tensor[f32, B]], x: Tensor[int, Dyn]) -> None:  # type: ignore[type-var]
        z.store(ct.load_tile_like(x, z))

    with pytest.raises(ct.CompileError, match="parameter 'x': write Tensor\\[dtype"):
        ct.kernel(k_bad).ir(ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))


H = TypeVar("H", ct.f16, ct.bf16)


@ct.kernel
def halves_only(z: Mut[Tensor[H, B]], x: Tensor[H, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z))


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_a_constrained_dtype_typevar_takes_only_its_dtypes(
    backend: str, rng: np.random.Generator
) -> None:
    ct.set_backend(backend)
    xs = rng.standard_normal(100).astype(np.float32)
    for dt in (ct.f16, ct.bf16):
        x = ct.from_numpy(xs, dt)
        z, _ = halves_only(ct.empty((100,), dt).partition(32), x).sync()
        np.testing.assert_array_equal(z.unpartition().to_numpy(), x.to_numpy())
    with pytest.raises(TypeError) as info:
        halves_only(ct.empty((100,), f32).partition(32), ct.from_numpy(xs))
    msg = str(info.value)
    assert "kernel halves_only, parameter 'z'" in msg
    assert "dtype H = f32 is not one of H's dtypes: f16, bf16" in msg


def test_a_typevar_constrained_to_non_dtypes_is_a_compile_error() -> None:
    N = TypeVar("N", int, float)

    def k_bad(z: Mut[Tensor[N, B]], x: Tensor[f32, Dyn]) -> None:  # type: ignore[type-var]
        z.store(ct.load_tile_like(x, z))

    with pytest.raises(ct.CompileError) as info:
        ct.kernel(k_bad).ir(ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))
    msg = str(info.value)
    assert "parameter 'z': TypeVar N is constrained to int, float; a dtype TypeVar" in msg
    assert f"line {_line(k_bad, 'def k_bad')}" in msg
