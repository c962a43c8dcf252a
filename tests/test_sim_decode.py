"""Instructions are decoded once, at load: a form the simulator lacks is rejected when the
kernel is loaded (also in a branch no thread takes), naming the kernel and the PTX line, and no
modifier is parsed again while the kernel runs."""

from __future__ import annotations

import re

import numpy as np
import pytest

from cutile_py.sim.context import SimError
from cutile_py.sim.executor import run
from cutile_py.sim.semantics import _common
from tests.support.sim_harness import SAXPY, Sim

#: `out[i] = x[i] + 1`, with `BAD` in a branch that only runs when n == 0 (never here).
UNTAKEN = """
.visible .entry untaken(.param .u64 out, .param .u32 n)
{
    .reg .b32 %r<4>;
    .reg .b64 %rd<4>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [n];
    mov.u32 %r2, %tid.x;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra NEVER;
    add.u32 %r3, %r2, 1;
    mul.wide.u32 %rd2, %r2, 4;
    add.u64 %rd3, %rd1, %rd2;
    st.global.u32 [%rd3], %r3;
    ret;
NEVER:
    BAD
    ret;
}
"""

#: Forms of known opcodes whose modifiers or operands the semantics reject.
BAD_FORMS = [
    ("add.cc.u32 %r3, %r2, 1;", r"\.cc"),
    ("mul.wide.u64 %rd2, %rd1, %rd1;", r"\.wide is defined for 16- and 32-bit types only"),
    ("cvt.rni.s32.s32 %r3, %r2;", "integer-to-integer conversions take no rounding"),
    ("setp.num.u32 %p1, %r2, %r1;", r"\.num is a floating-point comparison"),
    ("ex2.approx.ftz.f16 %r3, %r2;", r"\.ftz is not defined for ex2"),
    ("lop3.b32 %r3, %r2, %r2, %r2, %r1;", "immLut must be an integer immediate"),
    ("shfl.up.b32 %r3, %r2, 1, 0, -1;", r"only the \.sync form"),
    ("add.u32 %r3, %r2;", "expected 3 operands, got 2"),
    ("frobnicate.b32 %r3, %r2;", "does not implement `frobnicate`"),
]


def _untaken(bad: str) -> str:
    return UNTAKEN.replace("BAD", bad)


def test_the_kernel_runs_where_the_untaken_branch_is_supported() -> None:
    sim = Sim()
    addr, out = sim.buffer(np.zeros(64, dtype=np.uint32))
    sim.launch(_untaken("add.u32 %r3, %r2, 2;"), "untaken", (1, 1, 1), (64, 1, 1),
               [("u64", addr), ("u32", 64)])  # fmt: skip
    np.testing.assert_array_equal(out, np.arange(64, dtype=np.uint32) + 1)


@pytest.mark.parametrize(("bad", "why"), BAD_FORMS)
def test_an_unsupported_form_in_an_untaken_branch_is_rejected_at_load(bad: str, why: str) -> None:
    ptx = _untaken(bad)
    line = 1 + next(i for i, text in enumerate(ptx.splitlines()) if text.strip() == bad)
    sim = Sim()
    with pytest.raises(SimError) as info:
        sim.program(ptx, "untaken")
    message = str(info.value)
    # The harness prepends a 3-line header to hand-written PTX.
    assert message.startswith(f"kernel untaken, PTX line {line + 3} `{bad}`: "), message
    assert re.search(why, message), message


def test_no_modifier_is_parsed_while_a_kernel_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed = []
    real = _common.Mods.__init__

    def counting(self: _common.Mods, instr: object) -> None:
        parsed.append(instr)
        real(self, instr)  # type: ignore[arg-type]

    monkeypatch.setattr(_common.Mods, "__init__", counting)
    sim = Sim()
    program = sim.program(SAXPY, "saxpy")
    at_load = len(parsed)
    assert at_load > 0
    rng = np.random.default_rng()
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    out_addr, out = sim.buffer(np.zeros(n, dtype=np.float32))
    x_addr, _ = sim.buffer(x)
    y_addr, _ = sim.buffer(y)
    params: list[tuple[str, int | float]] = [
        ("u64", out_addr), ("u64", x_addr), ("u64", y_addr), ("f32", 2.0), ("u32", n)
    ]  # fmt: skip
    run(program, sim.memory, (4, 1, 1), (256, 1, 1), 0, params)
    np.testing.assert_array_equal(out, np.float32(2.0) * x + y)  # 2x is exact: fma == mul, add
    assert len(parsed) == at_load
