"""The K loop of the library GEMM's candidates in SASS: `python -m paper_repro.kloop_sass
[--sm 80] [--triton-python PATH] [--out FILE]`.

Each f16 candidate is compiled for sm_80 (no GPU needed: nvJitLink, then nvdisasm), and the
loop holding the most HMMA instructions is counted along its shortest path (one steady-state
trip; copies checked at a tensor's edge branch off it), per warp and per K step (a trip of
ours holds one copy of the body per stage: its counts are divided by the K steps it makes,
its HMMA over those of one step, BM x BN x BK / (16 x 8 x 16) / warps): registers per
thread, HMMA, LDSM (ldmatrix), LDGSTS
(cp.async), integer instructions (address arithmetic, predicates and loop control; uniform
ones included), all instructions, the MMA share (HMMA over all), and per LDGSTS the integer
instructions of the loop that compute its addresses (global and shared: the instructions
its address registers depend on within the loop, carried values included) and its bounds
predicates. Triton's GEMM (`paper_repro.peers.triton_gemm`, compiled by the Python of
--triton-python or $CUTILE_PY_TRITON_PYTHON, else this one if it has Triton) is counted the
same way.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cutile_py as ct
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import assemble
from cutile_py.runtime.sass import SassUnavailable, disassemble
from cutile_py_kernels.gemm import _gemm_kernel
from paper_repro.kernels_sass import triton_python

#: (BM, BN, BK, stages, warps): the default off-GPU config (warps 0: the compiler's 8), and
#: the tuner's larger tiles with 64x64 warp tiles (and 128x128 with 64x32 ones).
CANDIDATES = [
    (64, 64, 32, 3, 0),
    (128, 128, 32, 4, 8),
    (128, 128, 32, 4, 4),
    (128, 128, 64, 3, 4),
    (128, 256, 32, 3, 8),
    (128, 256, 64, 3, 8),
]
#: Triton's config beside them: the largest tile, 3 stages, 8 warps.
TRITON = (128, 256, 64, 3, 8)
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", re.IGNORECASE)
_BRA = re.compile(r"^(?:@!?U?P\w+\s+)?BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", re.IGNORECASE)
#: Integer and predicate ALU opcodes (addresses, bounds, loop control).
_SCALAR = ("IADD3", "IMAD", "LEA", "SHF", "LOP3", "ISETP", "SEL", "IABS", "PLOP3", "MOV", "SHL")
_INTEGER = _SCALAR + tuple("U" + op for op in _SCALAR)
_REG = re.compile(r"\b(U?R)(\d+)(\.64)?\b")
_PRED = re.compile(r"\b(U?P)(\d)\b")


@dataclass(frozen=True)
class Loop:
    registers: int
    hmma: int
    ldsm: int
    ldgsts: int
    integer: int
    total: int
    address: int  # integer instructions computing LDGSTS addresses
    bounds: int  # and their predicates
    steps: int = 1  # K steps per trip (the counts above are per trip)
    ready: float = 0.0  # HMMA per barrier that need no fragment loaded after it

    @property
    def mma_share(self) -> float:
        return self.hmma / self.total if self.total else 0.0


def count(ptx: str, target: Target, step_hmma: int = 0) -> Loop:
    """The K loop of `ptx` assembled for `target`, counted; `step_hmma`: the HMMA of one
    K step per warp (0: a trip is one step)."""
    report = assemble(ptx, target)
    body = k_loop(disassemble(report.cubin))

    def n(*ops: str) -> int:
        return sum(1 for t in body if _opcode(t).startswith(ops))

    address, bounds = copy_slices(body)
    return Loop(
        report.registers, n("HMMA"), n("LDSM"), n("LDGSTS"), n(*_INTEGER), len(body),
        address, bounds, max(1, round(n("HMMA") / step_hmma)) if step_hmma else 1,
        ready_after_barrier(body),
    )  # fmt: skip


_LDSM_COUNT = re.compile(r"^LDSM\.\S*?\.(\d)\b")


def ready_after_barrier(body: list[str]) -> float:
    """Per BAR of the loop (around it), the HMMA after it that the tensor cores can run
    before one reads a fragment loaded (LDSM) after the barrier: the work that hides the
    shared-memory latency of the first loads of a stage. 0 where every fragment is
    loaded after the barrier that lets its stage be read."""
    bars = [i for i, t in enumerate(body) if _opcode(t).startswith("BAR")]
    counts = []
    for i in bars:
        fresh: set[int] = set()
        ready = 0
        for j in range(1, len(body)):
            text = _strip(body[(i + j) % len(body)])
            op = text.split()[0]
            if op.startswith("BAR"):
                break
            regs = [int(r) for r in re.findall(r"\bR(\d+)\b", text)]
            if op.startswith("LDSM") and regs:
                m = _LDSM_COUNT.match(text)
                fresh |= set(range(regs[0], regs[0] + (int(m.group(1)) if m else 1)))
            elif op.startswith("HMMA"):
                a, b = regs[1], regs[2]  # A: 4 registers, B: 2 (m16n8k16 and m16n8k8)
                if fresh & {*range(a, a + 4), *range(b, b + 2)}:
                    break
                ready += 1
        counts.append(ready)
    return sum(counts) / len(counts) if counts else 0.0


def copy_slices(body: list[str]) -> tuple[int, int]:
    """Integer instructions of one iteration that the LDGSTS addresses depend on, and those
    their predicates depend on (through registers and predicates, around the loop too)."""

    def regs(text: str) -> set[str]:
        out = set()
        for kind, num, wide in _REG.findall(text):
            out.add(kind + num)
            if wide:
                out.add(_next(kind + num))
        return out | {k + v for k, v in _PRED.findall(text)}

    def operands(text: str) -> tuple[str, list[str]]:
        """(opcode, operands) of an instruction without its guard."""
        parts = _strip(text).split(None, 1)
        return parts[0], (parts[1].split(",") if len(parts) > 1 else [])

    def written(text: str) -> int:
        """How many leading operands are results: a predicate second operand is one too
        (a carry out, ISETP's and PLOP3's second predicate)."""
        ops = operands(text)[1]
        return 2 if len(ops) > 1 and re.fullmatch(r"\s*U?P(\d|T)\s*", ops[1]) else 1

    def dests(text: str) -> set[str]:
        op, ops = operands(text)
        d: set[str] = set()
        for x in ops[: written(text)]:
            d |= regs(x)
        if ".WIDE" in op:
            d |= {_next(r) for r in d if "R" in r}
        return d

    def sources(text: str) -> set[str]:
        uses: set[str] = set()
        for x in operands(text)[1][written(text) :]:
            uses |= regs(x)
        if text.startswith("@"):
            uses |= regs(text.split()[0])
        return uses - {"RZ", "URZ", "PT", "UPT"}

    n = len(body)

    def slice_of(seeds: set[tuple[str, int]]) -> int:
        """Instructions that define, for each (register, position) in `seeds`, the value read
        there (the nearest definition before it, around the loop), and so on backwards."""
        marked: set[int] = set()
        work, seen = list(seeds), set()
        while work:
            reg, pos = work.pop()
            if (reg, pos) in seen:
                continue
            seen.add((reg, pos))
            for step in range(1, n + 1):
                j = (pos - step) % n
                text = body[j]
                if reg not in dests(text):
                    continue
                if _opcode(text).startswith(_INTEGER):
                    marked.add(j)
                    work += [(r, j) for r in sources(text)]
                if not text.startswith("@"):  # a guarded definition may not happen
                    break
        return len(marked)

    address: set[tuple[str, int]] = set()
    bounds: set[tuple[str, int]] = set()
    for i, text in enumerate(body):
        if _opcode(text).startswith("LDGSTS"):
            for operand in re.findall(r"\[([^\]]*)\]", text):
                address |= {(r, i) for r in regs(operand) - {"RZ", "URZ"}}
            tail = re.sub(r"\[[^\]]*\]", "", _strip(text))
            preds = {p for p in regs(tail) if "P" in p}
            if text.startswith("@"):
                preds |= regs(text.split()[0])
            bounds |= {(p, i) for p in preds - {"PT", "UPT"}}
    return slice_of(address), slice_of(bounds)


def _next(reg: str) -> str:
    """The register after `reg` (the upper half of a 64-bit pair)."""
    m = re.fullmatch(r"(U?R)(\d+)", reg)
    assert m is not None, reg
    return m.group(1) + str(int(m.group(2)) + 1)


def _strip(text: str) -> str:
    """The instruction without its guard predicate."""
    return text.split(None, 1)[1] if text.startswith("@") else text


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


def measure(bm: int, bn: int, bk: int, stages: int, target: Target, warps: int = 0) -> Loop:
    kernel = _gemm_kernel(ct.f16, ct.f32, False, False, stages, warps or None)
    m = n = k = 512
    a, b = ct.empty((m, k), ct.f16), ct.empty((k, n), ct.f16)
    c = ct.empty((m, n), ct.f32).partition((bm, bn))
    return count(kernel.ptx(c, a, b, bk, target=target), target, _step_hmma(bm, bn, bk, warps))


def _step_hmma(bm: int, bn: int, bk: int, warps: int) -> int:
    """HMMA (m16n8k16) per warp and K step; warps 0: the compiler's 8."""
    return bm * bn * bk // (16 * 8 * 16) // (warps or 8)


def triton(python: str, config: tuple[int, ...], target: Target) -> Loop:
    """Triton's GEMM for `config` (BM, BN, BK, stages, warps), compiled by `python`."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    args = [python, "-m", "paper_repro.peers.triton_gemm", *map(str, config)]
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"Triton's compilation failed:\n{done.stderr[-2000:]}")
    bm, bn, bk, _, warps = config
    return count(done.stdout, target, _step_hmma(bm, bn, bk, warps))


def _opcode(text: str) -> str:
    parts = text.split()
    return parts[1] if parts[0].startswith("@") else parts[0]


def _row(name: str, r: Loop) -> str:
    per = max(r.ldgsts, 1)

    def step(x: int) -> str:
        """`x` per K step: an integer where exact."""
        return str(x // r.steps) if x % r.steps == 0 else f"{x / r.steps:.1f}"

    return (
        f"| {name} | {r.registers} | {step(r.hmma)} | {step(r.ldsm)} | {step(r.ldgsts)} | "
        f"{step(r.integer)} | {step(r.total)} | {100 * r.mma_share:.0f}% | "
        f"{r.address / per:.2f} | {r.bounds / per:.2f} | {r.ready:.0f} |"
    )


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sm", type=int, default=80)
    parser.add_argument("--triton-python", help="a Python that can import triton")
    parser.add_argument("--out", help="also write the table to this file")
    args = parser.parse_args(argv)
    ct.set_backend("sim")
    target = Target(args.sm)
    python = triton_python(args.triton_python)
    lines = [
        f"f16 GEMM K loop per warp, sm_{args.sm} SASS (one steady-state K step)",
        "",
        "| BMxBNxBK, stages, warps | regs | HMMA | LDSM | LDGSTS | integer | all | MMA share "
        "| address int / LDGSTS | bounds int / LDGSTS | HMMA ready after BAR |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    try:
        for bm, bn, bk, stages, warps in CANDIDATES:
            r = measure(bm, bn, bk, stages, target, warps)
            lines.append(_row(f"ours {bm}x{bn}x{bk}, {stages}, {warps or 'default (8)'}", r))
        if python is not None:
            bm, bn, bk, stages, warps = TRITON
            r = triton(python, TRITON, target)
            lines.append(_row(f"Triton {bm}x{bn}x{bk}, {stages}, {warps}", r))
    except SassUnavailable as e:
        print(f"no SASS: {e}")
        return 1
    lines += [
        "",
        "Bounds int / LDGSTS: the predicates the copies read. Ours make a tile's copies"
        " unchecked where the thread's farthest copy lies inside the tensor (one check per"
        " tile and iteration, for a branch to the checked copies: in the integer column,"
        " not here).",
        "",
        "HMMA ready after BAR: per barrier of the loop, the HMMA after it that read no"
        " fragment loaded after it (what the tensor cores run while the first ldmatrix of"
        " the stage the barrier released land). Ours load the fragments of k step ks + 1"
        " before the mmas of step ks, and the next stage's first step after the barrier,"
        " before the last step's mmas (`PipelinePlan.ahead`).",
        "",
        "Ours hold one copy of the loop body per stage (each reads and refills fixed stages:"
        " their offsets are immediates, nothing wraps around the ring); the counts are one"
        " trip's divided by its K steps.",
        "",
        _versions(python),
    ]
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


def _versions(python: str | None) -> str:
    """The machine and the tools that made the table."""
    import importlib

    major, minor = importlib.import_module("cuda.bindings.nvjitlink").version()
    peer = "Triton: not installed (give --triton-python)"
    if python is not None:
        done = subprocess.run(
            [python, "-c", "import triton; print(triton.__version__)"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        peer = f"Triton {done.stdout.strip()} ({python})"
    return (
        f"Machine: {platform.machine()} {platform.system()}, Python {platform.python_version()};"
        f" nvJitLink {major}.{minor} + nvdisasm; {peer}; no GPU (compiled only)."
    )


if __name__ == "__main__":
    raise SystemExit(main())
