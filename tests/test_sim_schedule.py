"""Schedules chosen by a seed (`CUTILE_PY_SIM_SCHEDULE`) and the mode that runs a launch under
several and reports an output that differs (`CUTILE_PY_SIM_SCHEDULES`) (issue 18)."""

from __future__ import annotations

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.sim.context import SimError
from tests.support.sim_harness import HEAD, SAXPY, Sim

#: claim(out, counter): every thread takes a ticket with one atomic add and writes its global
#: thread index to out[ticket]: a work queue whose order is the order the atomics serialize in.
CLAIM = (
    HEAD
    + """
.visible .entry claim(.param .u64 out, .param .u64 counter)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [counter];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    atom.global.add.u32 %r5, [%rd2], 1;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd4, %rd1, %rd3;
    st.global.u32 [%rd4], %r4;
    ret;
}
"""
)
GRID, BLOCK = 4, 64


def claim(seed: str | None, monkeypatch: pytest.MonkeyPatch) -> np.ndarray:
    if seed is None:
        monkeypatch.delenv("CUTILE_PY_SIM_SCHEDULE", raising=False)
    else:
        monkeypatch.setenv("CUTILE_PY_SIM_SCHEDULE", seed)
    out = ct.full((GRID * BLOCK,), -1, ct.i32)
    counter = ct.zeros((1,), ct.i32)
    out, counter = ct.RawKernel(CLAIM, "claim")(out, counter, grid=GRID, block=BLOCK).sync()
    assert counter.to_numpy()[0] == GRID * BLOCK
    got = out.to_numpy()
    # Whatever the order, every thread got exactly one ticket.
    np.testing.assert_array_equal(np.sort(got), np.arange(GRID * BLOCK))
    return got


def test_atomic_work_claiming_follows_the_seed(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    np.testing.assert_array_equal(claim(None, monkeypatch), np.arange(GRID * BLOCK))
    seeds = [int(s) for s in rng.choice(10**6, size=4, replace=False)]
    outs = {s: claim(str(s), monkeypatch) for s in seeds}
    for s in seeds:  # per seed deterministic
        np.testing.assert_array_equal(claim(str(s), monkeypatch), outs[s])
    # The seed decides: 8 warps give 8! orders, and warp 0 goes first under 1/8 of them.
    assert len({o.tobytes() for o in outs.values()}) > 1
    assert any(not np.array_equal(o, np.arange(GRID * BLOCK)) for o in outs.values())
    # A warp's lanes keep lane order: each run of 32 tickets is one warp's, ascending.
    for o in outs.values():
        warps = o.reshape(-1, 32)
        np.testing.assert_array_equal(warps, warps[:, :1] + np.arange(32))


def test_several_schedules_report_an_output_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTILE_PY_SIM_SCHEDULES", "6")
    out = ct.full((GRID * BLOCK,), -1, ct.i32)
    counter = ct.zeros((1,), ct.i32)
    with pytest.raises(ct.LaunchError) as e:
        ct.RawKernel(CLAIM, "claim")(out, counter, grid=GRID, block=BLOCK).sync()
    msg = str(e.value)
    assert "kernel claim: the result depends on the schedule: byte " in msg
    assert f"of the {GRID * BLOCK * 4}-byte allocation at " in msg
    assert "under the default order and " in msg and "under CUTILE_PY_SIM_SCHEDULE=" in msg


def test_several_schedules_of_a_deterministic_kernel_agree(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUTILE_PY_SIM_SCHEDULES", "5")
    n = int(rng.integers(1, 2000))
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    out = ct.full((n,), np.nan, ct.f32)
    out, *_ = ct.RawKernel(SAXPY, "saxpy")(
        out, ct.from_numpy(x), ct.from_numpy(y), 2.5, n, grid=-(-n // 128), block=128
    ).sync()
    want = 2.5 * x.astype(np.float64) + y  # one fma: the exact value, rounded once
    np.testing.assert_allclose(out.to_numpy(), want, rtol=1e-6, atol=1e-7)


#: last(out): every block stores its %ctaid.x to out[0] and to out[1 + %ctaid.x].
LAST = """
.visible .entry last(.param .u64 out)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %ctaid.x;
    st.global.u32 [%rd1], %r1;
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3+4], %r1;
    ret;
}
"""


def test_block_order_follows_the_seed(rng: np.random.Generator) -> None:
    """One block per batch, the race check off: the block that runs last leaves its index in
    out[0]; every block still sees its own %ctaid."""
    grid = 16
    last = {}
    for seed in [None, *(int(s) for s in rng.choice(10**6, size=3, replace=False))]:
        sim = Sim()
        addr, out = sim.buffer(np.full(grid + 1, 99, dtype=np.uint32))
        opts = {"schedule": seed, "race_check": False, "max_batch_lanes": 32}
        sim.launch(LAST, "last", (grid, 1, 1), (32, 1, 1), [("u64", addr)], **opts)
        np.testing.assert_array_equal(out[1:], np.arange(grid))
        last[seed] = int(out[0])
        sim.launch(LAST, "last", (grid, 1, 1), (32, 1, 1), [("u64", addr)], **opts)
        assert int(out[0]) == last[seed]  # per seed deterministic
    assert last[None] == grid - 1
    assert len(set(last.values())) > 1  # 3 seeds all ending on block 15: (1/16)**3


def test_schedule_must_be_an_integer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTILE_PY_SIM_SCHEDULE", "fast")
    sim = Sim()
    addr, _ = sim.buffer(np.zeros(17, dtype=np.uint32))
    with pytest.raises(SimError, match=r"CUTILE_PY_SIM_SCHEDULE='fast' is not an integer"):
        sim.launch(LAST, "last", (16, 1, 1), (32, 1, 1), [("u64", addr)])
