"""Triton's warp-specialized Hopper GEMM on the simulator: Triton 3.9 split the K loop of a
TMA + wgmma GEMM (`tl.range(..., warp_specialize=True)`) into a producer warp group issuing
`cp.async.bulk.tensor` loads and consumer warp groups running `wgmma`, which hand stages over
through "full" and "empty" mbarriers and sync on named barriers of 128 threads
(`triton_oracle/generate_hopper_ws.py`, no GPU). It runs against NumPy at ragged shapes with
the race checks on, under several schedules; a consumer that never releases its stage is
reported as a deadlock naming the barrier."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.sim.context import SimError
from tests.support.sim_harness import Sim
from tests.test_sim_hopper import _desc, f16_close, oracle

THREADS = 384  # .reqntid: a producer and two consumer warp groups


def ws_gemm(rng: np.random.Generator, m: int, n: int, k: int, ptx: str | None = None,
            **options: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    text, shared, blk, boxes = oracle("ws_matmul_sm90")
    sim = Sim()
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    pa, _ = sim.buffer(a)
    pb, _ = sim.buffer(b)
    pc, c = sim.buffer(np.full((m, n), np.nan, np.float16))
    assert [d["swizzle"] for d in boxes] == [3, 3, 3]  # CU_TENSOR_MAP_SWIZZLE_128B
    params = [
        *_desc(pa, m, k, boxes[0]["block"]),
        *_desc(pb, k, n, boxes[1]["block"]),
        *_desc(pc, m, n, boxes[2]["block"]),
        ("u32", m), ("u32", n), ("u32", k), ("u64", 0), ("u64", 0),
    ]  # fmt: skip
    grid = (-(-m // blk["BM"]), -(-n // blk["BN"]), 1)
    sim.launch(ptx or text, "ws_matmul_kernel", grid, (THREADS, 1, 1), params, shared=shared,
               **options)  # fmt: skip
    return a, b, c


def test_the_kernel_is_warp_specialized() -> None:
    text, *_ = oracle("ws_matmul_sm90")
    assert ".reqntid 384" in text and "setmaxnreg.dec.sync.aligned.u32" in text
    assert "bar.sync \t3, 128;" in text and "wgmma.mma_async" in text
    assert "cp.async.bulk.tensor.2d" in text


@pytest.mark.parametrize(("m", "n", "k"), [(64, 128, 64), (100, 200, 136), (128, 128, 320)])
def test_triton_warp_specialized_gemm(rng: np.random.Generator, m: int, n: int, k: int) -> None:
    a, b, c = ws_gemm(rng, m, n, k)
    f16_close(c, a, b)


def test_the_result_does_not_depend_on_the_schedule(rng: np.random.Generator) -> None:
    a, b, c = ws_gemm(rng, 128, 136, 192, schedules=3, max_batch_lanes=2 * THREADS)
    f16_close(c, a, b)


def test_a_consumer_that_never_releases_a_stage_is_a_deadlock(rng: np.random.Generator) -> None:
    text, *_ = oracle("ws_matmul_sm90")
    release = "@%p6 mbarrier.arrive.shared::cta.b64 _, [%r22], 128;"
    assert release in text
    with pytest.raises(SimError) as e:
        ws_gemm(rng, 64, 128, 64 * 6, text.replace(release, ""))
    msg = str(e.value)
    assert "kernel ws_matmul_kernel, PTX line" in msg
    assert "a deadlock: no thread of the batch can go on" in msg
    assert "on the mbarrier at shared address" in msg
