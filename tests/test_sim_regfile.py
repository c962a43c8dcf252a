"""Registers live in a list indexed by slot: every declared register operand is resolved to its
slot once, at load; special registers stay computed; values, partial (guarded) writes, moves
and reads of never-written registers are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from cutile_py.ptx.ast import Addr, Neg, Operand, Reg, Vec
from cutile_py.sim.regfile import Slot
from tests.support.sim_harness import Sim

#: Even lanes: out = 3 * x + tid; odd lanes: out = x + %r6 + tid, %r6 never written (zero).
KERNEL = """
.visible .entry regs(.param .u64 out, .param .u64 inp)
{
    .reg .b32 %r<8>;
    .reg .b64 %rd<6>;
    .reg .pred %p<3>;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [inp];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd3, %r1, 4;
    add.u64 %rd4, %rd2, %rd3;
    ld.global.u32 %r2, [%rd4];
    and.b32 %r3, %r1, 1;
    setp.eq.u32 %p1, %r3, 0;
    mov.u32 %r4, %r2;
    @%p1 mul.lo.u32 %r4, %r2, 3;
    @!%p1 add.u32 %r4, %r4, %r6;
    add.u32 %r5, %r4, %r1;
    add.u64 %rd5, %rd1, %rd3;
    st.global.u32 [%rd5], %r5;
    ret;
}
"""


def _regs(op: Operand) -> list[Reg]:
    if isinstance(op, Reg):
        return [op]
    if isinstance(op, Vec):
        return [r for x in op.items for r in _regs(x)]
    if isinstance(op, Addr) and isinstance(op.base, Reg):
        return [op.base]
    if isinstance(op, Neg):
        return [op.reg]
    return []


def test_declared_registers_are_slots_and_special_registers_are_not() -> None:
    prog = Sim().program(KERNEL, "regs")
    order = list(prog.regs)
    seen = set()
    for st in prog.steps:
        for r in (x for op in st.instr.operands for x in _regs(op)):
            if r.name.startswith("%tid"):
                assert type(r) is Reg
            else:
                assert isinstance(r, Slot) and r.slot == order.index(r.name), r
                seen.add(r.name)
        if st.instr.guard is not None:
            assert st.guard == order.index(st.instr.guard.name)
    assert {"%r1", "%r6", "%rd5", "%p1"} <= seen


def _run_regs() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """KERNEL's `regs` over 96 threads on random words: the inputs, the outputs, the thread
    indices."""
    x = np.random.default_rng().integers(0, 2**32, size=96, dtype=np.uint32)
    sim = Sim()
    a_out, out = sim.buffer(np.zeros(96, dtype=np.uint32))
    a_in, _ = sim.buffer(x)
    sim.launch(KERNEL, "regs", (1, 1, 1), (96, 1, 1), [("u64", a_out), ("u64", a_in)])
    return x, out, np.arange(96, dtype=np.uint32)


def test_guarded_writes_moves_and_unwritten_reads_match_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CUTILE_PY_SIM_UNWRITTEN", raising=False)  # the default: zeros
    x, out, tid = _run_regs()
    want = np.where(tid % 2 == 0, x * np.uint32(3), x) + tid
    np.testing.assert_array_equal(out, want)


def test_unwritten_registers_can_read_as_every_bit_set(monkeypatch: pytest.MonkeyPatch) -> None:
    """`CUTILE_PY_SIM_UNWRITTEN=ones`: the odd lanes' never-written %r6 reads as 2^32 - 1
    (x - 1 + tid), where by default it reads as 0 (the test above): code that only works on
    a zero it never wrote shows up."""
    monkeypatch.setenv("CUTILE_PY_SIM_UNWRITTEN", "ones")
    x, out, tid = _run_regs()
    want = np.where(tid % 2 == 0, x * np.uint32(3), x + np.uint32(0xFFFFFFFF)) + tid
    np.testing.assert_array_equal(out, want)
