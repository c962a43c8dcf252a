"""Tile IR: builder type rules, the verifier and the printer."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py import ir
from cutile_py.ir import ops as o
from cutile_py.ir import reference
from cutile_py.ir.types import TileType, scalar
from cutile_py.ir.uses import def_use, walk


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


def test_broadcast_shape_rule() -> None:
    b = ir.Builder()
    row = b.load(0, ir.f32, [b.grid("bid", 0), b.grid("bid", 1)], (1, 8), 0)
    assert b.broadcast(row, (4, 8)).type == TileType(ir.f32, (4, 8))
    assert b.broadcast(row, (1, 8)) is row
    with pytest.raises(ir.IRTypeError, match=r"cannot broadcast a tile of shape \(1, 8\)"):
        b.broadcast(row, (4, 6))
    with pytest.raises(ir.IRTypeError, match="cannot broadcast"):
        b.broadcast(row, (2, 1, 8))  # a rank change goes through reshape


def test_reduce_type_rules() -> None:
    b = ir.Builder()
    x = b.broadcast(b.constant(1.0, ir.f16), (4, 6))
    assert b.reduce("sum", x, 1).type == TileType(ir.f16, (4, 1))
    assert b.reduce("max", x, 0).type == TileType(ir.f16, (1, 6))
    assert b.reduce("argmin", x, 1).type == TileType(ir.i32, (4, 1))
    flags = b.broadcast(b.constant(True, ir.bool_), (4,))
    with pytest.raises(ir.IRTypeError, match="sum of a bool tile"):
        b.reduce("sum", flags, 0)
    assert b.reduce("argmax", flags, 0).type == TileType(ir.i32, (1,))
    with pytest.raises(ir.IRTypeError, match="axis 2 is out of range"):
        b.reduce("min", x, 2)
    with pytest.raises(ir.IRTypeError, match="unknown reduction"):
        b.reduce("prod", x, 0)
    with pytest.raises(ir.IRTypeError, match="needs a tile"):
        b.reduce("sum", b.constant(1.0, ir.f32), 0)


def test_reshape_and_permute_rules() -> None:
    b = ir.Builder()
    x = b.broadcast(b.constant(1, ir.i32), (4, 6))
    assert b.reshape(x, (2, 3, 4)).type == TileType(ir.i32, (2, 3, 4))
    assert b.reshape(x, (1, 4, 6, 1)).type.shape == (1, 4, 6, 1)
    with pytest.raises(ir.IRTypeError, match=r"\(4, 6\) \(24 elements\) to \(5, 5\)"):
        b.reshape(x, (5, 5))
    with pytest.raises(ir.IRTypeError, match="only a tile of one element"):
        b.reshape(x, ())
    one = b.broadcast(b.constant(1, ir.i32), (1, 1))
    assert b.reshape(one, ()).type == scalar(ir.i32)
    with pytest.raises(ir.IRTypeError, match="1 to 4 positive dims"):
        b.reshape(x, (1, 1, 4, 6, 1))
    assert b.permute(x, (1, 0)).type == TileType(ir.i32, (6, 4))
    assert b.permute(x, (0, 1)) is x
    with pytest.raises(ir.IRTypeError, match="not a permutation"):
        b.permute(x, (0, 0))


def test_within_loads_and_stores() -> None:
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (ir.TensorParam("z", ir.f32, 2, True, (4, 64), 16),)
    zero = b.constant(0, ir.i32)
    k = b.constant(1, ir.i32)
    part = b.load(0, ir.f32, [zero, k], (4, 16), 0.0, within=(4, 64))
    b.store(0, [zero, k], b.binary("add", part, part), within=(4, 64))
    with pytest.raises(ir.IRTypeError, match="must be a multiple"):
        b.load(0, ir.f32, [zero, k], (4, 24), 0.0, within=(4, 64))
    kernel = ir.Kernel("sub", params, (None,), b.region)
    ir.verify(kernel)
    text = ir.print_kernel(kernel)
    assert "load[param=0 shape=(4, 16) padding=0.0 within=(4, 64)]" in text
    assert "store[param=0 within=(4, 64)]" in text

    b2 = ir.Builder()
    zero = b2.constant(0, ir.i32)
    b2.store(0, [zero, zero], b2.broadcast(b2.constant(1.0, ir.f32), (4, 16)), within=(4, 32))
    with pytest.raises(ir.VerifyError, match="block tile is"):
        ir.verify(ir.Kernel("bad", params, (None,), b2.region))


def test_new_ops_print_and_verify() -> None:
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (ir.TensorParam("z", ir.f32, 1, True, (8,), 8),)
    x = b.broadcast(b.constant(2.0, ir.f32), (2, 4))
    t = b.permute(x, (1, 0))
    s = b.reduce("sum", t, 0)
    r = b.reshape(s, (2,))
    row = b.broadcast(b.reshape(r, (1, 2)), (4, 2))
    b.store(0, [b.grid("bid", 0)], b.reshape(row, (8,)))
    k = ir.Kernel("shapes", params, (None,), b.region)
    ir.verify(k)
    text = ir.print_kernel(k)
    assert "permute[axes=(1, 0)] %1 : f32<4x2>" in text
    assert "reduce[sum axis=0] %2 : f32<1x2>" in text
    assert "reshape %3 : f32<2>" in text


def test_reference_reductions() -> None:
    x = np.array([[1.0, np.nan, 3.0, np.nan], [2.0, -1.0, 5.0, 5.0]], dtype=np.float32)
    np.testing.assert_array_equal(reference.reduce("max", x, 1, ir.f32), [[np.nan], [5.0]])
    np.testing.assert_array_equal(reference.reduce("argmax", x, 1, ir.f32), [[1], [2]])
    np.testing.assert_array_equal(reference.reduce("argmin", x, 1, ir.f32), [[1], [1]])
    assert reference.reduce("argmax", x, 1, ir.f32).dtype == np.int32
    # f16 sums accumulate in f32 and round once: 2048 + 1 + 1 is 2050 in f16, not 2048.
    h = np.array([2048.0, 1.0, 1.0], dtype=np.float32)
    assert reference.reduce("sum", h, 0, ir.f16)[0] == 2050.0
    i = np.array([2**31 - 1, 1], dtype=np.int32)
    assert reference.reduce("sum", i, 0, ir.i32)[0] == -(2**31)  # wraps, as the hardware does
    np.testing.assert_array_equal(
        reference.permute(np.arange(6).reshape(2, 3), (1, 0)), [[0, 3], [1, 4], [2, 5]]
    )


def test_def_use_links_values_to_their_producer_and_users() -> None:
    b = ir.Builder()
    zero, one = b.constant(0, ir.i32), b.constant(1, ir.i32)
    acc0 = b.broadcast(b.constant(0.0, ir.f32), (8,))
    loop = b.for_loop(zero, b.constant(4, ir.i32), one, [acc0])
    with b.inside(loop.body):
        iv, acc = loop.body.args
        x = b.load(0, ir.f32, [iv], (8,), 0)
        total = b.binary("add", acc, x)
        b.yield_([b.binary("add", total, x)])
    b.store(1, [zero], loop.results[0])
    params: tuple[ir.Param, ...] = (
        ir.TensorParam("x", ir.f32, 1, False, (None,), 8),
        ir.TensorParam("z", ir.f32, 1, True, (8,), 8),
    )
    k = ir.Kernel("loop", params, (None, None), b.region)
    ir.verify(k)
    du = def_use(k)
    load, add1, add2, yld = loop.body.ops
    assert du.producer(x) is load and du.users(x) == (add1, add2)
    assert du.users(acc) == (add1,) and du.producer(acc) is None  # a region argument
    assert du.users(iv) == (load,)
    assert du.users(add2.result) == (yld,)
    assert du.users(zero) == (loop, k.body.ops[-1])  # the loop's bound and the store's index
    assert du.enclosing(load) is loop and du.enclosing(loop) is None
    assert du.users(k.body.ops[-1].operands[0]) == du.users(zero)
    assert [op.opname for op in walk(k.body)][-6:] == [
        "for",
        "load",
        "binary",
        "binary",
        "yield",
        "store",
    ]
