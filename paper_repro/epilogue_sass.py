"""The library GEMM's epilogue on sm_90a in SASS, with and without the TMA store:
`python -m paper_repro.epilogue_sass`.

Each config is lowered twice from the same IR: as planned (`plan_store`: the accumulator's
fragments staged by stmatrix / st.shared and stored by `cp.async.bulk.tensor`) and with no
TMA store planned (the accumulator converted to a blocked layout through shared memory and
stored by each thread, as before); both are assembled for sm_90a (nvJitLink, then
nvdisasm; no GPU). The epilogue is every instruction after the K loop's last wgmma wait
(`WARPGROUP.DEPBAR.LE gsb0, 0x0`), counted statically: all of them, shared stores (STS,
STSM), shared loads (LDS), global stores (STG), TMA stores (UTMASTG), barriers (BAR) and
integer instructions (addresses, predicates), with the registers per thread and spills.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any
from unittest import mock

import cutile_py as ct
from cutile_py.lower import plan as plan_module
from cutile_py.lower.pipeline import lower_kernel
from cutile_py.lower.plan_store import no_stores
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import assemble
from cutile_py.runtime.sass import SassUnavailable, disassemble, instructions
from cutile_py_kernels.gemm import _gemm_kernel
from paper_repro.kloop_sass_sm90 import _INTEGER, opcode

#: (output dtype, BM, BN, BK, stages, warp-specialized): the sm_90 tuner's tiles.
CONFIGS = [
    (ct.bf16, 128, 128, 64, 3, False),
    (ct.bf16, 128, 256, 64, 3, False),
    (ct.bf16, 256, 128, 64, 4, True),
    (ct.f32, 128, 128, 64, 3, False),
    (ct.f32, 128, 256, 64, 3, False),
]
COLUMNS = ("STS", "STSM", "LDS", "STG", "UTMASTG", "BAR")


@dataclass(frozen=True)
class Epilogue:
    registers: int
    spills: int | None  # None: not in nvJitLink's log
    counts: dict[str, int]
    integer: int
    total: int


def epilogue(sass: str) -> list[str]:
    """The instructions after the last `WARPGROUP.DEPBAR.LE gsb0, 0x0` (the K loop's
    accumulators final), to the end of the kernel."""
    ops = [i for i in instructions(sass) if i.split()]
    last = max(k for k, i in enumerate(ops) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in i)
    return ops[last + 1 :]


def measure(odt: type[ct.DType], bm: int, bn: int, bk: int, stages: int, ws: bool,
            tma_store: bool) -> Epilogue:  # fmt: skip
    target = Target(90)
    kernel = _gemm_kernel(ct.bf16, odt, False, False, stages, None, 8, ws)
    spec = (
        ct.PartitionSpec((4096, 4096), (bm, bn), odt),
        ct.TensorSpec((4096, 4096), ct.bf16),
        ct.TensorSpec((4096, 4096), ct.bf16),
    )
    ir = kernel.compile(*spec, bk, target=target).ir
    if tma_store:
        lowered = lower_kernel(ir, target)
    else:
        with mock.patch.object(plan_module, "plan_stores", lambda *_: no_stores()):
            lowered = lower_kernel(ir, target)
    report = assemble(lowered.ptx, target)
    ops = [opcode(t) for t in epilogue(disassemble(report.cubin))]
    counts = {c: sum(op == c or op.startswith(c + ".") for op in ops) for c in COLUMNS}
    integer = sum(op.startswith(_INTEGER) for op in ops)
    spills = report.spill_loads + report.spill_stores if report.spills_logged else None
    return Epilogue(report.registers, spills, counts, integer, len(ops))


def main(argv: Any = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    print("bf16 GEMM epilogue (static, after the last wgmma wait), sm_90a SASS")
    print(f"| out, BMxBNxBK, stages | store | regs | spills | {' | '.join(COLUMNS)} "
          "| integer | all |")  # fmt: skip
    print("|---" * (len(COLUMNS) + 6) + "|")
    for odt, bm, bn, bk, stages, ws in CONFIGS:
        for tma in (False, True):
            try:
                e = measure(odt, bm, bn, bk, stages, ws, tma)
            except SassUnavailable as err:
                print(f"no SASS: {err}")
                return 1
            cells = " | ".join(str(e.counts[c]) for c in COLUMNS)
            name = f"{odt.name}, {bm}x{bn}x{bk}, {stages}{', WS' if ws else ''}"
            spills = "n/a" if e.spills is None else e.spills
            print(
                f"| {name} | {'tma' if tma else 'plain'} | {e.registers} | {spills} | {cells} "
                f"| {e.integer} | {e.total} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
