"""Tile IR: builder type rules, the verifier and the printer."""

from __future__ import annotations

import pytest

from cutile_py import ir
from cutile_py.ir import ops as o
from cutile_py.ir.types import TileType, scalar


def tiny_kernel() -> tuple[ir.Builder, ir.Kernel]:
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (ir.TensorParam("z", ir.f32, 1, True, (8,), 8),)
    bid = b.grid("bid", 0)
    one = b.broadcast(b.constant(1.0, ir.f32), (8,))
    b.store(0, [bid], one)
    return b, ir.Kernel("tiny", params, (None,), b.region)


def test_valid_kernel_verifies_and_prints() -> None:
    _, k = tiny_kernel()
    ir.verify(k)
    text = ir.print_kernel(k)
    assert text.splitlines() == [
        "kernel tiny(@0: partition<f32; 8; align 8> z) grid_rank=1 {",
        "  %0 = grid[bid axis=0] : i32",
        "  %1 = constant[1.0] : f32",
        "  %2 = broadcast %1 : f32<8>",
        "  store[param=0] %0, %2",
        "}",
    ]


def test_builder_rejects_mismatched_operands() -> None:
    b = ir.Builder()
    x = b.constant(1.0, ir.f32)
    y = b.constant(1, ir.i32)
    with pytest.raises(ir.IRTypeError, match="operand types differ"):
        b.binary("add", x, y)
    with pytest.raises(ir.IRTypeError, match="true division needs floating-point"):
        b.binary("div", y, y)
    with pytest.raises(ir.IRTypeError, match="exp needs a floating-point operand"):
        b.unary("exp", y)


def test_verifier_catches_use_before_definition() -> None:
    _, k = tiny_kernel()
    stray = o.Value(scalar(ir.i32))
    k.body.ops.insert(0, o.UnaryOp((stray,), (o.Value(scalar(ir.i32)),), kind="neg"))
    with pytest.raises(ir.VerifyError, match="not defined before"):
        ir.verify(k)


def test_verifier_catches_store_into_shared_tensor_and_missing_yield() -> None:
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (ir.TensorParam("x", ir.f32, 1, False, (None,), 1),)
    bid = b.grid("bid", 0)
    b.store(0, [bid], b.broadcast(b.constant(0.0, ir.f32), (4,)))
    with pytest.raises(ir.VerifyError, match="read-only"):
        ir.verify(ir.Kernel("bad", params, (None,), b.region))

    b2 = ir.Builder()
    zero = b2.constant(0, ir.i32)
    b2.for_loop(zero, zero, b2.constant(1, ir.i32), [])
    with pytest.raises(ir.VerifyError, match="must end with yield"):
        ir.verify(ir.Kernel("bad", (), (), b2.region))


def test_tile_type_text() -> None:
    assert str(TileType(ir.bf16, (64, 48))) == "bf16<64x48>"
    assert str(scalar(ir.i32)) == "i32"
