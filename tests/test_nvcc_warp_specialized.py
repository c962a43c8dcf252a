"""A warp-specialized producer/consumer pipeline that nobody here wrote the PTX of: nvcc 13.0
compiled `tests/nvcc_oracle/warp_specialized.cu` for sm_90a (mbarrier rings fed by bulk
copies, named barriers per consumer warp group and across both, setmaxnreg). It runs on the
simulator against NumPy with the race checks on, under several schedules and batchings."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from cutile_py.ptx.ast import Module
from cutile_py.ptx.parser import parse
from cutile_py.sim.context import SimError
from cutile_py.sim.executor import Options, run
from cutile_py.sim.program import Program
from tests.support.sim_harness import Sim

PTX = Path(__file__).parent / "nvcc_oracle" / "warp_specialized.ptx"
TILE = 256


@cache
def module() -> Module:
    return parse(PTX.read_text())


def _launch(ptx: Module, grid: int, ntiles: int, seed: int, **options: object) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((grid, ntiles, TILE)).astype(np.float32)
    w = rng.standard_normal(ntiles).astype(np.float32)
    sim = Sim()
    xa, _ = sim.buffer(x)
    wa, _ = sim.buffer(w)
    oa, out = sim.buffer(np.full((grid, TILE), np.nan, np.float32))
    program = Program(ptx, "ws_pipeline", sim.memory)
    params: list[tuple[str, int | float]] = [("u64", xa), ("u64", wa), ("u64", oa),
                                             ("s32", ntiles)]  # fmt: skip
    run(program, sim.memory, (grid, 1, 1), (384, 1, 1), 0, params, Options(**options))  # type: ignore[arg-type]
    acc = np.zeros((grid, TILE), np.float64)
    for t in range(ntiles):
        acc += x[:, t].astype(np.float64) * float(w[t])
    want = acc + acc[:, ::-1]
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    return out


def test_the_ptx_is_nvccs() -> None:
    text = PTX.read_text()
    assert text.startswith("// nvcc: Cuda compilation tools, release")
    for needle in ("mbarrier.try_wait.parity", "mbarrier.arrive.expect_tx", "cp.async.bulk",
                   "bar.sync %r", "setmaxnreg.dec"):  # fmt: skip
        assert needle in text


@pytest.mark.parametrize(("grid", "ntiles"), [(1, 1), (2, 3), (3, 7)])
def test_the_pipeline_matches_numpy(grid: int, ntiles: int) -> None:
    _launch(module(), grid, ntiles, seed=grid * 10 + ntiles)


@pytest.mark.parametrize("lanes", [384, 1 << 16])
def test_under_several_schedules_the_output_is_the_same(lanes: int) -> None:
    """Each schedule orders blocks, the groups of threads that run while others wait, and the
    warps at stores: one output for all of them."""
    _launch(module(), 3, 5, seed=5, schedules=4, max_batch_lanes=lanes)


def test_a_consumer_that_does_not_release_its_stage_deadlocks() -> None:
    """Planted bug: the consumers never arrive on "empty", so the producer waits forever for
    the stage to come back after the ring's three tiles, and the consumers for the fourth."""
    text = PTX.read_text().replace("mbarrier.arrive.shared::cta.b64 _,", "// dropped:")
    with pytest.raises(SimError) as e:
        _launch(parse(text), 1, 5, seed=1)
    msg = str(e.value)
    assert "kernel ws_pipeline, PTX line" in msg and "mbarrier.try_wait.parity" in msg
    assert "a deadlock: no thread of the batch can go on" in msg
    assert "for its phase of parity" in msg and "of blocks (0, 0, 0)" in msg


def test_a_missing_named_barrier_is_a_race() -> None:
    """Planted bug: without named barrier 1 a consumer reads red[255 - c], which a thread of
    another warp writes with nothing ordering the two."""
    text = PTX.read_text()
    last = text.rindex("bar.sync %r")
    end = text.index("\n", last)
    broken = text[:last] + "// dropped" + text[end:]
    with pytest.raises(SimError, match="race"):
        _launch(parse(broken), 1, 2, seed=2)
