"""wgmma overlap on TMA rings (sm_90a): one wgmma group left in flight per K step
(`wgmma.wait_group 1`), accumulating in place, the stage it reads refilled only after it
retires (`plan_wgmma.in_flight`, `emit_tma`). Read in the plan, PTX and SASS; run on the
simulator as an sm_90 device against NumPy at ragged shapes, races checked; a refill over a
running wgmma is reported by the simulator."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f16, f32
from cutile_py.host.launch import ParamReader
from cutile_py.ir.dtypes import round_to
from cutile_py.ptx.target import Target
from cutile_py.runtime import select
from cutile_py.runtime.backend import LaunchFailure, ParamValue
from cutile_py.runtime.nvjitlink import assemble, nvjitlink_available
from cutile_py.runtime.sass import SassUnavailable, disassemble
from cutile_py_kernels.gemm import _gemm_kernel
from paper_repro.kloop_sass_sm90 import k_loop

if TYPE_CHECKING:
    ConstInt = int
else:
    ConstInt = ct.Constant[int]
BM = TypeVar("BM")
BN = TypeVar("BN")
SM90 = Target(90)
DT = {"f16": ct.f16, "bf16": ct.bf16}


def _operand(rng: np.random.Generator, shape: tuple[int, ...], name: str) -> Any:
    x = round_to(rng.standard_normal(shape).astype(np.float32), DT[name])
    return x.astype(np.float64), ct.from_numpy(x, DT[name])


def _spec(tile: tuple[int, int], k: int = 1024) -> tuple[Any, ...]:
    return (
        ct.PartitionSpec((1024, 1024), tile, f32),
        ct.TensorSpec((1024, k), f16),
        ct.TensorSpec((k, 1024), f16),
    )


def _loop(ptx: str) -> tuple[str, str]:
    """The K loop's PTX (from its label to its back branch) and what follows it."""
    m = re.search(r"\n(\$\w*loop\w*):\n(.*?)\tbra\.uni \1;\n(.*)", ptx, re.S)
    assert m is not None
    return m.group(2), m.group(3)


def test_one_wgmma_group_stays_in_flight() -> None:
    """128 x 256 x 64, 3 stages: per K step the stage is awaited, the wgmmas of 4 k16 steps
    issued into the carried accumulators (no copy of them), `wait_group 1`, then a barrier
    and the refill of the stage the previous wgmma read; `wait_group 0` after the loop."""
    kernel = _gemm_kernel(f16, f32, False, False, 3)
    compiled = kernel.compile(*_spec((128, 256)), 64, target=SM90)
    assert compiled.lowered is not None and compiled.lowered.plan is not None
    (pipe,) = compiled.lowered.plan.pipelines.values()
    assert pipe.kind == "tma" and pipe.in_flight == 1
    body, after = _loop(compiled.lowered.ptx)
    order = [
        "mbarrier.try_wait.parity",
        "wgmma.fence",
        "wgmma.mma_async",
        "wgmma.commit_group",
        "wgmma.wait_group.sync.aligned 1;",
        "bar.sync",
        "mbarrier.arrive.expect_tx",
        "cp.async.bulk.tensor",
    ]
    at = [body.find(x) for x in order]
    assert -1 not in at and at == sorted(at), dict(zip(order, at))
    assert "wgmma.wait_group.sync.aligned 0" not in body
    assert body.count("bar.sync") == 1
    # In place: the loop moves no f32 (the accumulators are not copied or yielded by movs).
    assert "mov.f32" not in body and "mov.b32" not in body.split("wgmma.fence")[1]
    assert after.find("wgmma.wait_group.sync.aligned 0") < after.find("cp.async.bulk.tensor")
    if not nvjitlink_available():
        pytest.skip("the nvJitLink library cannot be loaded")
    report = assemble(compiled.lowered.ptx, SM90)
    assert report.spill_free
    assert "serializ" not in report.info_log  # ptxas kept the wgmma asynchronous
    try:
        loop = k_loop(disassemble(report.cubin))
    except SassUnavailable as e:
        pytest.skip(str(e))
    assert "WARPGROUP.DEPBAR.LE gsb0, 0x1" in loop
    assert sum(t.startswith("HGMMA") for t in loop) == 4


@pytest.mark.parametrize(
    ("tiles", "stages", "name"),
    [((64, 64, 32), 2, "f16"), ((128, 128, 64), 3, "bf16"), ((64, 128, 16), 4, "f16")],
)
def test_overlapped_gemm_matches_numpy(
    tiles: tuple[int, int, int], stages: int, name: str, rng: np.random.Generator
) -> None:
    """Rings of 2, 3 and 4 stages (the refilled stage the one read last), one and two
    warpgroups, ragged M, N and K, race checks on (the default)."""
    ct.set_backend("sim", target="sm_90")
    bm, bn, bk = tiles
    kernel = _gemm_kernel(DT[name], f32, False, False, stages)
    m, n, k = bm + 40, bn + 16, 5 * bk + 8
    a, ta = _operand(rng, (m, k), name)
    b, tb = _operand(rng, (k, n), name)
    out = ct.full((m, n), np.nan).partition((bm, bn))
    assert "wgmma.wait_group.sync.aligned 1;" in kernel.ptx(out, ta, tb, bk)
    res, *_ = kernel(out, ta, tb, bk).sync()
    want = a @ b
    got = res.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@ct.kernel(stages=3)
def gemm_decay(
    c: Mut[Tensor[f32, BM, BN]], a: Tensor[f16, Dyn, Dyn], b: Tensor[f16, Dyn, Dyn], BK: ConstInt
) -> None:
    """acc = acc / 2 + a_k @ b_k: the accumulator is scaled between the wgmmas."""
    acc: ct.Tile = ct.zeros((c.shape[0], c.shape[1]), f32)
    for kk in range(ct.cdiv(a.shape[1], BK)):
        ta = ct.load(a, (ct.bid(0), kk), (c.shape[0], BK))
        tb = ct.load(b, (kk, ct.bid(1)), (BK, c.shape[1]))
        acc = ct.mma(ta, tb, acc * 0.5)
    c.store(acc)


def test_no_overlap_where_the_accumulator_is_touched(rng: np.random.Generator) -> None:
    """An accumulator that another op reads between wgmmas cannot be in flight: wait_group
    0, as before, and the result is right."""
    ct.set_backend("sim", target="sm_90")
    m, n, k = 70, 72, 104
    a, ta = _operand(rng, (m, k), "f16")
    b, tb = _operand(rng, (k, n), "f16")
    out = ct.full((m, n), np.nan).partition((64, 64))
    ptx = gemm_decay.ptx(out, ta, tb, 32)
    assert "wgmma.mma_async" in ptx and "wgmma.wait_group.sync.aligned 1;" not in ptx
    res, *_ = gemm_decay(out, ta, tb, 32).sync()
    want = np.zeros((m, n))
    for k0 in range(0, k, 32):
        want = want / 2 + a[:, k0 : k0 + 32] @ b[k0 : k0 + 32]
    got = res.unpartition().to_numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_a_refill_over_a_running_wgmma_is_reported(rng: np.random.Generator) -> None:
    """The generated PTX with two groups left in flight (`wait_group 2`): the stage refilled
    is still read by the previous iteration's wgmma. The simulator's lazy copies would give
    the right numbers; it reports the overwrite instead."""
    ct.set_backend("sim", target="sm_90")
    sim = select.active_backend()
    kernel = _gemm_kernel(f16, f32, False, False, 3)
    _, ta = _operand(rng, (128, 256), "f16")
    _, tb = _operand(rng, (256, 128), "f16")
    c = ct.zeros((128, 128), f32).partition((64, 64))
    lowered = kernel.compile(c, ta, tb, 32, target=SM90).lowered
    broken = lowered.ptx.replace(
        "wgmma.wait_group.sync.aligned 1;", "wgmma.wait_group.sync.aligned 2;"
    )
    assert broken != lowered.ptx
    reader = ParamReader(lowered)
    values = [ParamValue(t, v) for t, v in zip(reader.ptypes, reader([c, ta, tb, 32], sim))]
    block = (lowered.block_threads, 1, 1)
    for ptx in (lowered.ptx, broken):
        launch = sim.launch(sim.load_kernel(ptx, lowered.entry), (2, 2, 1), block,
                            lowered.dynamic_shared, values)  # fmt: skip
        if ptx is lowered.ptx:
            launch.wait()
            continue
        with pytest.raises(LaunchFailure, match="overwrites an operand of a wgmma still in flight"):
            launch.wait()
