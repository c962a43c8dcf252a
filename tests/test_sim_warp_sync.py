"""`bar.warp.sync` and the shared-memory race check: it orders the lanes of one warp (a lane
may then write a word another lane of its warp read, or read one it wrote), not two warps."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.sim.context import SimError
from tests.support.sim_harness import Sim

#: Lane t reads (FIRST: or writes) sh[t], SYNC, then writes (SECOND: or reads) sh[(t + 1) % 32]
#: of its warp's 32 words; out[t] = the word it read.
SWAP = """
.visible .entry swap(.param .u64 out)
{
    .shared .align 4 .b32 sh[64];
    .reg .b32 %r<10>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    and.b32 %r2, %r1, 32;
    add.u32 %r3, %r1, 1;
    and.b32 %r3, %r3, 31;
    add.u32 %r3, %r3, %r2;
    shl.b32 %r4, %r1, 2;
    shl.b32 %r5, %r3, 2;
    mov.u32 %r6, sh;
    add.u32 %r7, %r6, %r4;
    add.u32 %r8, %r6, %r5;
    add.u32 %r9, %r1, 500;
    FIRST
    SYNC
    SECOND
    mul.wide.u32 %rd2, %r1, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r9;
    ret;
}
"""
READ_OWN = "ld.shared.u32 %r9, [%r7];"
WRITE_NEXT = "st.shared.u32 [%r8], %r1;"
WRITE_OWN = "st.shared.u32 [%r7], %r1;"
READ_NEXT = "ld.shared.u32 %r9, [%r8];"


def _launch(first: str, second: str, sync: str) -> np.ndarray:
    ptx = SWAP.replace("FIRST", first).replace("SECOND", second).replace("SYNC", sync)
    sim = Sim()
    addr, out = sim.buffer(np.zeros(64, dtype=np.uint32))
    sim.launch(ptx, "swap", (1, 1, 1), (64, 1, 1), [("u64", addr)])
    return out


@pytest.mark.parametrize("sync", ["bar.warp.sync -1;", "bar.sync 0;"])
def test_a_warp_sync_orders_a_read_before_another_lanes_write(sync: str) -> None:
    out = _launch(READ_OWN, WRITE_NEXT, sync)
    np.testing.assert_array_equal(out, np.zeros(64))  # read before any write


@pytest.mark.parametrize("sync", ["bar.warp.sync -1;", "bar.sync 0;"])
def test_a_warp_sync_orders_a_write_before_another_lanes_read(sync: str) -> None:
    out = _launch(WRITE_OWN, READ_NEXT, sync)
    t = np.arange(64)
    np.testing.assert_array_equal(out, (t + 1) % 32 + (t & 32))


@pytest.mark.parametrize(("first", "second"), [(READ_OWN, WRITE_NEXT), (WRITE_OWN, READ_NEXT)])
def test_without_a_sync_the_lanes_race(first: str, second: str) -> None:
    with pytest.raises(SimError, match="shared-memory race"):
        _launch(first, second, "")
