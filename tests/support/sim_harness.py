"""Running hand-written PTX on the simulator from tests: buffers, parameters, one call."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from cutile_py.ptx.parser import parse
from cutile_py.sim.executor import Options, Stats, run
from cutile_py.sim.memory import GlobalMemory
from cutile_py.sim.program import Program

HEAD = ".version 7.0\n.target sm_80\n.address_size 64\n"

#: A complete module: out[i] = a * x[i] + y[i] for i < n (one fma, so exact on any backend).
SAXPY = """.version 7.0
.target sm_80
.address_size 64
.visible .entry saxpy(.param .u64 out, .param .u64 x, .param .u64 y, .param .f32 a,
                      .param .u32 n)
{
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<8>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [x];
    ld.param.u64 %rd3, [y];
    ld.param.f32 %f1, [a];
    ld.param.u32 %r5, [n];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mad.lo.u32 %r4, %r2, %r3, %r1;
    setp.ge.u32 %p1, %r4, %r5;
    @%p1 ret;
    mul.wide.u32 %rd4, %r4, 4;
    add.u64 %rd5, %rd2, %rd4;
    add.u64 %rd6, %rd3, %rd4;
    add.u64 %rd7, %rd1, %rd4;
    ld.global.nc.f32 %f2, [%rd5];
    ld.global.nc.f32 %f3, [%rd6];
    fma.rn.f32 %f4, %f1, %f2, %f3;
    st.global.f32 [%rd7], %f4;
    ret;
}
"""


@dataclass
class Sim:
    """A global memory with NumPy-backed buffers, and launches on it."""

    memory: GlobalMemory = field(default_factory=GlobalMemory)
    keep: list[np.ndarray] = field(default_factory=list)

    def buffer(self, array: np.ndarray) -> tuple[int, np.ndarray]:
        """A 256-byte aligned copy of `array` registered as an allocation: (address, view)."""
        a = np.ascontiguousarray(array)
        raw = np.zeros(a.nbytes + 256, dtype=np.uint8)
        start = (-raw.ctypes.data) % 256
        data = raw[start : start + a.nbytes]
        data[:] = a.reshape(-1).view(np.uint8)
        address = self.memory.register(data)
        self.keep.append(raw)
        return address, data.view(a.dtype).reshape(a.shape)

    def program(self, ptx: str, entry: str) -> Program:
        text = ptx if ptx.lstrip().startswith(".version") else HEAD + ptx
        return Program(parse(text), entry, self.memory)

    def launch(
        self,
        ptx: str,
        entry: str,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        params: list[tuple[str, int | float]],
        shared: int = 0,
        **options: object,
    ) -> Stats:
        opts = Options(**options)  # type: ignore[arg-type]
        return run(self.program(ptx, entry), self.memory, grid, block, shared, params, opts)


def line_of(ptx: str, fragment: str) -> int:
    """The 1-based line (of HEAD + ptx) holding `fragment`."""
    lines = (HEAD + ptx).splitlines()
    return next(i for i, ln in enumerate(lines, 1) if fragment in ln)
