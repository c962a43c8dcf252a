"""Loads that write no padding (`cutile_py.lower.plan_padding`): the plan leaves a load's
padding unwritten only where every use reaches stores inside the load's own edge. The sim
reads a never-written register as 0, so the kernels here pad with 5.0: a wrong skip reads 0
past the edge there, and the NumPy references catch it."""

from __future__ import annotations

import re
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.ir.uses import def_use
from cutile_py.lower.plan import LoweringPlan, plan_lowering
from cutile_py.ptx.target import Target

B = TypeVar("B")
TILE = 128
PAD = 5.0


@ct.kernel
def add_padded(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    """z = x + 2y, both read with padding PAD."""
    i = ct.bid(0)
    t = ct.load(x, (i,), z.shape, padding=PAD) + 2.0 * ct.load(y, (i,), z.shape, padding=PAD)
    z.store(t)


@ct.kernel
def sum_padded(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    """z = x + sum of the tile of x (padding PAD counts in the sum)."""
    t = ct.load(x, (ct.bid(0),), z.shape, padding=PAD)
    z.store(t + ct.sum(t, axis=0, keepdims=True))


@ct.kernel
def shifted(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    """z's tile i = x's tile i + 1 (padding PAD): a store at another index than the load."""
    i = ct.bid(0)
    ct.store(z, (0,), ct.load(x, (i + 1,), z.shape, padding=PAD))


def plan_of(kernel: Any, *args: Any) -> LoweringPlan:
    """The lowering plan of `kernel` for `args` on sm_80, made afresh (a compiled kernel read
    back from the disk cache keeps none)."""
    kir = kernel.compiled(kernel.specialize(kernel.bind_arguments(args, {})), None).ir
    return plan_lowering(kir, Target(80), def_use(kir))


def unpadded_params(kernel: Any, *args: Any) -> set[int]:
    """The tensor parameters (by index) whose loads the plan leaves unpadded."""
    return {op.param for op in plan_of(kernel, *args).unpadded}


def filled_loads(ptx: str) -> list[bool]:
    """Per ld.global of `ptx`, in order: whether every register it loads is written first."""
    written: set[str] = set()
    out = []
    for line in ptx.splitlines():
        dests = re.match(r"\s*(?:@%\w+ )?(\S+)\s+(\{[^}]*\}|%\w+)", line)
        if dests is None:
            continue
        regs = set(re.findall(r"%\w+", dests.group(2)))
        if "ld.global" in dests.group(1):
            out.append(regs <= written)
        written |= regs
    return out


def spec(n: int) -> ct.TensorSpec:
    return ct.TensorSpec((n,), f32)


def part(n: int) -> ct.PartitionSpec:
    return ct.PartitionSpec((n,), (TILE,), f32)


def test_loads_only_stored_inside_their_edge_write_no_padding() -> None:
    """x and y as long as z (or longer): their padding reaches no store; the PTX loads into
    registers it never filled."""
    assert unpadded_params(add_padded, part(300), spec(300), spec(301)) == {1, 2}
    fills = filled_loads(add_padded.ptx(part(300), spec(300), spec(300)))
    assert fills and not any(fills)


def test_a_shorter_input_keeps_its_padding() -> None:
    """x shorter than z: z's elements past x's end are PAD + 2y, so x's load fills them."""
    assert unpadded_params(add_padded, part(300), spec(296), spec(300)) == {2}
    ptx = add_padded.ptx(part(300), spec(296), spec(300))
    half = len(filled_loads(ptx)) // 2  # x's loads, then y's
    assert filled_loads(ptx) == [True] * half + [False] * half


def test_padding_reaching_a_reduction_or_another_tile_is_kept() -> None:
    assert unpadded_params(sum_padded, part(300), spec(300)) == set()
    assert unpadded_params(shifted, part(300), spec(300)) == set()
    assert all(filled_loads(sum_padded.ptx(part(300), spec(300))))
    assert all(filled_loads(shifted.ptx(part(300), spec(300))))


@pytest.mark.parametrize("nx,ny", [(300, 300), (299, 300), (300, 250), (301, 310)])
def test_values_past_the_edge(rng: np.random.Generator, nx: int, ny: int) -> None:
    """On sim: where x or y ends before z, z reads PAD there (a load that wrongly wrote no
    padding would give 0, the sim's unwritten register)."""
    ct.set_backend("sim")
    n = 300
    x = rng.standard_normal(nx).astype(np.float32)
    y = rng.standard_normal(ny).astype(np.float32)
    z, *_ = add_padded(ct.empty((n,)).partition((TILE,)), ct.from_numpy(x), ct.from_numpy(y)).sync()
    xp = np.full(3 * TILE, PAD, np.float32)
    yp = np.full(3 * TILE, PAD, np.float32)
    xp[:nx], yp[:ny] = x[: 3 * TILE], y[: 3 * TILE]
    np.testing.assert_array_equal(z.unpartition().to_numpy(), (xp + 2 * yp)[:n])


def test_reduction_sees_the_padding(rng: np.random.Generator) -> None:
    """The last tile's sum counts PAD for each element past the edge."""
    ct.set_backend("sim")
    x = rng.standard_normal(300).astype(np.float32)
    z, _ = sum_padded(ct.empty((300,)).partition((TILE,)), ct.from_numpy(x)).sync()
    xp = np.full(3 * TILE, PAD, np.float32)
    xp[:300] = x
    sums = xp.reshape(3, TILE).sum(axis=1, dtype=np.float64)
    want = xp.reshape(3, TILE) + sums[:, None]
    np.testing.assert_allclose(z.unpartition().to_numpy(), want.reshape(-1)[:300], atol=1e-4)


def test_a_store_at_another_tile_sees_the_padding(rng: np.random.Generator) -> None:
    ct.set_backend("sim")
    x = rng.standard_normal(300).astype(np.float32)
    z, _ = shifted(ct.empty((300,)).partition((TILE,)), ct.from_numpy(x)).sync()
    xp = np.full(4 * TILE, PAD, np.float32)
    xp[:300] = x
    np.testing.assert_array_equal(z.unpartition().to_numpy(), xp[TILE : TILE + 300])


def test_library_kernels() -> None:
    """Element-wise kernels write no padding; norms and softmax, whose loads reach row
    reductions (and a weight vector broadcast over rows), keep theirs."""
    from cutile_py_kernels import activations, elementwise, norms

    n = 3 * elementwise.TILE + 5
    z, f = ct.PartitionSpec((n,), (elementwise.TILE,), f32), spec(n)
    assert unpadded_params(elementwise.add_kernel, z, f, f) == {1, 2}
    assert unpadded_params(elementwise.saxpy_kernel, z, 2.0, f, f) == {2, 3}
    gelu_tile = ct.PartitionSpec((n,), (activations._tile(f32),), f32)
    assert unpadded_params(activations._gelu_kernel(f32), gelu_tile, f) == {1}
    rows = ct.TensorSpec((6, 1000), f32)
    y = ct.PartitionSpec((6, 1000), (4, 1024), f32)
    rms_tile, _, add_tile, _ = norms._rms_kernels(f32, 4)
    w = spec(1000)
    assert unpadded_params(rms_tile, y, rows, w, 1e-3, 1e-6) == set()
    assert unpadded_params(add_tile, y, y, rows, rows, w, 1e-3, 1e-6) == set()


def test_library_kernels_never_store_the_unwritten_lanes(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With never-written registers reading as NaN on sim (`CUTILE_PY_SIM_UNWRITTEN=ones`)
    the element-wise kernels, whose loads write no padding, still match NumPy at a ragged
    length: the lanes past the edge reach no store (with padding 0, a zero-reading sim
    could not tell)."""
    from cutile_py_kernels import elementwise

    monkeypatch.setenv("CUTILE_PY_SIM_UNWRITTEN", "ones")
    ct.set_backend("sim", target="sm_90")
    n = 3 * elementwise.TILE + 5
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    got = elementwise.add(ct.from_numpy(x), ct.from_numpy(y)).to_numpy()
    np.testing.assert_array_equal(got, x + y)
    got = elementwise.saxpy(1.5, ct.from_numpy(x), ct.from_numpy(y)).to_numpy()
    np.testing.assert_allclose(got, np.float32(1.5) * x + y, rtol=1e-6, atol=1e-6)


@ct.kernel
def sum_unpadded(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    """z = x + the sum of its tile, padding 0: only ever compiled under a planted wrong
    plan (its own kernel, so that no other test finds that compile in the caches)."""
    t = ct.load(x, (ct.bid(0),), z.shape, padding=0.0)
    z.store(t + ct.sum(t, axis=0, keepdims=True))


def test_a_wrong_skip_of_zero_padding_is_caught(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted plan that leaves a reduced load's padding unwritten: with padding 0 the
    sim's zero-reading registers would hide it; `CUTILE_PY_SIM_UNWRITTEN=ones` turns the
    last tile's sum into NaN, while the full tiles stay right."""
    import cutile_py.lower.plan as plan_module
    from cutile_py.ir import ops as o
    from cutile_py.ir.uses import walk

    def every_load(kernel: o.Kernel, uses: Any) -> frozenset[o.LoadOp]:
        return frozenset(op for op in walk(kernel.body) if isinstance(op, o.LoadOp))

    monkeypatch.setattr(plan_module, "unpadded_loads", every_load)
    monkeypatch.setenv("CUTILE_PY_SIM_UNWRITTEN", "ones")
    ct.set_backend("sim")
    x = rng.standard_normal(300).astype(np.float32)
    z, _ = sum_unpadded(ct.empty((300,)).partition((TILE,)), ct.from_numpy(x)).sync()
    got = z.unpartition().to_numpy()
    tiles = x[: 2 * TILE].reshape(2, TILE)
    want = tiles + tiles.sum(axis=1, dtype=np.float64, keepdims=True)
    np.testing.assert_allclose(got[: 2 * TILE], want.reshape(-1), atol=1e-4)
    assert np.isnan(got[2 * TILE :]).all()
