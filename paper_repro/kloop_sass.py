"""The K loop of the library GEMM's candidates in SASS: `python -m paper_repro.kloop_sass`.

Each f16 candidate is compiled for sm_80 (no GPU needed: nvJitLink, then nvdisasm), and the
loop holding the most HMMA instructions is counted, per warp (the SASS every thread of a warp
runs once per K step): registers per thread, HMMA,
LDSM (ldmatrix), LDGSTS (cp.async), integer instructions (address arithmetic, predicates and
loop control), all instructions, and the MMA share (HMMA over all instructions of the loop).
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

#: (BM, BN, BK, stages): the default off-GPU config and the tuner's larger tiles.
CANDIDATES = [(64, 64, 32, 3), (128, 128, 32, 4), (128, 128, 64, 3), (128, 256, 32, 3)]
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", re.IGNORECASE)
_BRA = re.compile(r"^(?:@!?U?P\w+\s+)?BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", re.IGNORECASE)
#: Integer and predicate ALU opcodes (addresses, bounds, loop control).
_INTEGER = ("IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "SEL", "IABS", "PLOP3", "MOV", "SHL")


@dataclass(frozen=True)
class Loop:
    registers: int
    hmma: int
    ldsm: int
    ldgsts: int
    integer: int
    total: int

    @property
    def mma_share(self) -> float:
        return self.hmma / self.total if self.total else 0.0


def k_loop(sass: str) -> list[str]:
    """The instructions one iteration of the K loop runs: of the backward-branch loops, the
    one with the most HMMA, along its shortest path from top to back edge (the steady state:
    copies checked at a tensor's edge are a branch that only edge tiles take)."""
    code = [(int(m.group(1), 16), " ".join(m.group(2).split())) for m in _LINE.finditer(sass)]
    labels = {
        m.group(1): int(m.group(2), 16)
        for m in re.finditer(r"(\.L_x_\d+):\s*\n.*?/\*([0-9a-f]{4,})\*/", sass)
    }
    best: list[str] = []
    for addr, text in code:
        target = _branch_target(text, labels)
        if target is None or target >= addr:
            continue
        body = _shortest_path([(a, t) for a, t in code if target <= a <= addr], labels)
        if sum("HMMA" in t for t in body) > sum("HMMA" in t for t in best):
            best = body
    return best


def _branch_target(text: str, labels: dict[str, int]) -> int | None:
    m = _BRA.match(text)
    if m is None:
        return None
    if m.group(1) is not None:
        return int(m.group(1), 16)
    name = re.search(r"\.L_x_\d+", text)
    return labels.get(name.group(0)) if name is not None else None


def _shortest_path(body: list[tuple[int, str]], labels: dict[str, int]) -> list[str]:
    """The fewest instructions from the first of `body` to its last (the back edge),
    following forward branches inside it (taken or not where conditional)."""
    at = {a: i for i, (a, _) in enumerate(body)}
    last = len(body) - 1
    best: list[list[str]] = [[] for _ in body]
    best[last] = [body[last][1]]
    for i in range(last - 1, -1, -1):
        text = body[i][1]
        target = _branch_target(text, labels)
        options = []
        if target is not None and target in at and at[target] > i:
            options.append(best[at[target]])
            if text.startswith("@"):
                options.append(best[i + 1])
        else:
            options.append(best[i + 1])
        best[i] = [text, *min(options, key=len)]
    return best[0]


def measure(bm: int, bn: int, bk: int, stages: int, target: Target) -> Loop:
    kernel = _gemm_kernel(ct.f16, ct.f32, False, False, stages)
    m = n = k = 512
    a, b = ct.empty((m, k), ct.f16), ct.empty((k, n), ct.f16)
    c = ct.empty((m, n), ct.f32).partition((bm, bn))
    ptx: str = kernel.ptx(c, a, b, bk, target=target)
    report = assemble(ptx, target)
    body = k_loop(disassemble(report.cubin))

    def count(*ops: str) -> int:
        return sum(1 for t in body if _opcode(t).startswith(ops))

    return Loop(
        report.registers,
        count("HMMA"),
        count("LDSM"),
        count("LDGSTS"),
        count(*_INTEGER),
        len(body),
    )


def _opcode(text: str) -> str:
    parts = text.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sm", type=int, default=80)
    args = parser.parse_args(argv)
    ct.set_backend("sim")
    target = Target(args.sm)
    print(f"f16 GEMM K loop per warp, sm_{args.sm} SASS")
    print("| BMxBNxBK, stages | regs | HMMA | LDSM | LDGSTS | integer | all | MMA share |")
    print("|---|---|---|---|---|---|---|---|")
    for bm, bn, bk, stages in CANDIDATES:
        try:
            r = measure(bm, bn, bk, stages, target)
        except SassUnavailable as e:
            print(f"no SASS: {e}")
            return 1
        print(
            f"| {bm}x{bn}x{bk}, {stages} | {r.registers} | {r.hmma} | {r.ldsm} | {r.ldgsts} | "
            f"{r.integer} | {r.total} | {100 * r.mma_share:.0f}% |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
