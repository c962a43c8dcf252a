"""The K loop of the library GEMM's sm_90 (wgmma) candidates in SASS:
`python -m paper_repro.kloop_sass_sm90`.

Each f16 candidate is compiled for sm_90a (nvJitLink, then nvdisasm; no GPU), and the
backward-branch loop holding the most HGMMA (the K loop) is counted statically, every
instruction between its top and its back edge once (the block that thread 0 runs to issue
the TMA boxes included, and the barrier-wait retry): registers per thread, HGMMA, UTMALDG
(TMA boxes), LDGSTS (cp.async), SYNCS (mbarrier arrive / wait), WARPGROUP (wgmma arrive and
wait), integer instructions (address arithmetic, predicates and loop control, uniform ones
included), all, and the wgmma groups left in flight per iteration (the N of the loop's
`WARPGROUP.DEPBAR.LE gsb0, N`).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from typing import Any

import cutile_py as ct
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import assemble
from cutile_py.runtime.sass import SassUnavailable, disassemble
from cutile_py_kernels.gemm import _gemm_kernel

#: (BM, BN, BK, stages): the default config and the sm_90 tuner's tiles.
CANDIDATES = [
    (64, 64, 32, 3),
    (128, 128, 32, 4),
    (128, 128, 64, 3),
    (128, 256, 32, 3),
    (128, 256, 64, 3),
    (256, 128, 64, 3),
]
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", re.IGNORECASE)
_BRA = re.compile(r"^(?:@!?U?P\w+\s+)?BRA(?:\.\S+)*\s+(?:0x([0-9a-f]+)|`\((\.L_x_\d+)\))")
_SCALAR = ("IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "SEL", "IABS", "PLOP3", "MOV", "SHL")
_INTEGER = _SCALAR + tuple("U" + op for op in _SCALAR)
COLUMNS = ("HGMMA", "UTMALDG", "LDGSTS", "SYNCS", "WARPGROUP")
_DEPBAR = re.compile(r"WARPGROUP\.DEPBAR\.LE gsb0, (0x[0-9a-f]+)")


@dataclass(frozen=True)
class Loop:
    registers: int
    counts: dict[str, int]
    integer: int
    total: int
    in_flight: int


def opcode(text: str) -> str:
    parts = text.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def k_loop(sass: str) -> list[str]:
    """The instructions of the backward-branch loop with the most HGMMA (the smallest one
    of those, so not a loop around the K loop)."""
    code = [(int(m.group(1), 16), " ".join(m.group(2).split())) for m in _LINE.finditer(sass)]
    labels = {
        m.group(1): int(m.group(2), 16)
        for m in re.finditer(r"(\.L_x_\d+):\s*\n.*?/\*([0-9a-f]{4,})\*/", sass)
    }
    best: list[str] = []
    for addr, text in code:
        m = _BRA.match(text)
        if m is None:
            continue
        target = int(m.group(1), 16) if m.group(1) else labels.get(m.group(2) or "", addr)
        if target >= addr:
            continue
        body = [t for a, t in code if target <= a <= addr]
        have, had = (sum(opcode(t).startswith("HGMMA") for t in x) for x in (body, best))
        if have > had or (have == had and have and len(body) < len(best)):
            best = body
    return best


def measure(bm: int, bn: int, bk: int, stages: int) -> Loop:
    target = Target(90)
    kernel = _gemm_kernel(ct.f16, ct.f32, False, False, stages)
    m = n = k = 512
    a, b = ct.empty((m, k), ct.f16), ct.empty((k, n), ct.f16)
    c = ct.empty((m, n), ct.f32).partition((bm, bn))
    report = assemble(kernel.ptx(c, a, b, bk, target=target), target)
    body = k_loop(disassemble(report.cubin))
    ops = [opcode(t) for t in body]
    counts = {name: sum(op.startswith(name) for op in ops) for name in COLUMNS}
    waits = [int(hit.group(1), 16) for t in body if (hit := _DEPBAR.search(t))]
    integer = sum(op.startswith(_INTEGER) for op in ops)
    return Loop(report.registers, counts, integer, len(ops), min(waits, default=0))


def main(argv: Any = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    ct.set_backend("sim", target="sm_90")
    print("f16 GEMM K loop (static, one copy of each instruction), sm_90a SASS")
    print(f"| BMxBNxBK, stages | regs | {' | '.join(COLUMNS)} | integer | all | in flight |")
    print("|---" * (len(COLUMNS) + 5) + "|")
    for bm, bn, bk, stages in CANDIDATES:
        try:
            r = measure(bm, bn, bk, stages)
        except SassUnavailable as e:
            print(f"no SASS: {e}")
            return 1
        cells = " | ".join(str(r.counts[c]) for c in COLUMNS)
        print(
            f"| {bm}x{bn}x{bk}, {stages} | {r.registers} | {cells} | {r.integer} | {r.total} "
            f"| {r.in_flight} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
