"""SASS instructions per element of the memory-bound library kernels, ours beside Triton's.

`python -m paper_repro.kernels_sass [--triton-python PATH] [--out FILE] [--only TEXT]`

Evidence from the compilers, not GPU timings: every kernel is compiled for sm_90 and assembled
by nvJitLink (registers, spills, SASS by nvdisasm). Ours is counted by `kernel.report`: each
SASS instruction as often as warps ran its PTX line on the simulator (a sample of blocks at the
shape given). Triton's kernels (`paper_repro.peers.triton_sass`, compiled by Triton with no GPU,
in the Python named by --triton-python or $CUTILE_PY_TRITON_PYTHON, else this one if it has
Triton) are straight-line code: their SASS count times the threads of a program is the work of
one program. The bandwidth column is an estimate from an issue-rate model (`estimate`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cutile_py as ct
from cutile_py import PartitionSpec, TensorSpec, bf16, f32
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import assemble
from cutile_py.runtime.sass import addressed, disassemble, find_tool, instructions
from cutile_py_kernels import activations, elementwise, layout, norms
from cutile_py_kernels._common import RowPlan, row_launch

softmax_mod = importlib.import_module("cutile_py_kernels.softmax")  # not the function
rope_mod = importlib.import_module("cutile_py_kernels.rope")
gemv_mod = importlib.import_module("cutile_py_kernels.gemv")

TARGET = "sm_90"
#: Elements of the element-wise cases: their cost per element does not depend on n.
FLAT = 1 << 22
ROWS = 4096
#: Causal softmax: 16 matrices of CAUSAL_S x CAUSAL_S.
CAUSAL_S = 1024
#: (tokens, heads, head_dim) of the rope case, (M, K) of the gemv case.
ROPE = (4096, 32, 128)
GEMV = (4096, 4096)


@dataclass(frozen=True)
class Gpu:
    """What the estimate needs of a GPU: SMs, the clock it sustains under load, and the
    device-to-device copy bandwidth it reaches (about 90% of the datasheet's)."""

    name: str
    sms: int
    clock_ghz: float
    copy_tb_s: float


GPUS = (Gpu("H100", 132, 1.755, 3.0), Gpu("H200", 132, 1.755, 4.3))
#: Warp instructions issued per scheduler per clock in practice (4 schedulers per SM, at most
#: one each; dependencies and memory stalls take the rest).
ISSUE_EFFICIENCY = 0.8


#: Issue 19's budget: at most this many times Triton's SASS instructions per element, and
#: this many times the ideal bytes.
INSTR_BUDGET = 1.15
BYTES_BUDGET = 1.05


def estimate(gpu: Gpu, instr_per_elem: float, bytes_per_elem: float) -> float:
    """Fraction of copy bandwidth: the time to move the bytes at copy bandwidth over the
    larger of that and the time to issue the instructions (lanes of 32-thread warps, 4
    schedulers per SM at `ISSUE_EFFICIENCY`)."""
    mem = bytes_per_elem / (gpu.copy_tb_s * 1e12)
    issue = instr_per_elem / (gpu.sms * 4 * 32 * gpu.clock_ghz * 1e9 * ISSUE_EFFICIENCY)
    return mem / max(mem, issue)


@dataclass(frozen=True)
class Row:
    name: str
    instr: float | None
    registers: int | None
    spills: int | None
    bytes_ratio: float | None
    bytes_per_elem: float | None
    triton: float | None = None


@dataclass(frozen=True)
class Case:
    """A library kernel at one shape: how to build its launch, and the fewest bytes per
    element it can move (each input read once, the output written once; causal softmax
    reads only the unmasked half)."""

    name: str
    build: Callable[[], tuple[Any, tuple[Any, ...]]]
    ideal_bytes: float


def _rows(
    family: Callable[[type[ct.DType], int], tuple[Any, ...]],
    first: int,
    dt: type[ct.DType],
    r: int,
    n: int,
    outs: int,
    extra: tuple[Any, ...],
    per: Callable[[RowPlan], int] | None = None,
) -> tuple[Any, tuple[Any, ...]]:
    """The row kernel the library's host function launches for (r, n) (`row_launch`, as
    `norms` calls it), and its arguments."""
    x = TensorSpec((r, n), dt)
    launch = row_launch(family, first, x, norms.ONE_PASS_CAP, per)
    parts = tuple(PartitionSpec((r, n), launch.tile, dt) for _ in range(outs))
    return launch.kernel, (*parts, x, *extra, *launch.extra)


def _flat(kernel: Any, *args: Any) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    return lambda: (kernel, args)


def _row(
    family: Callable[[type[ct.DType], int], tuple[Any, ...]],
    first: int,
    dt: type[ct.DType],
    r: int,
    n: int,
    *extra: Any,
    outs: int = 1,
    per: Callable[[RowPlan], int] | None = None,
) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    return lambda: _rows(family, first, dt, r, n, outs, extra, per)


def _softmax(
    dt: type[ct.DType], r: int, n: int, causal: bool
) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    def build() -> tuple[Any, tuple[Any, ...]]:
        kernel, tile, tail = softmax_mod.softmax_launch(dt, r, n, causal)
        return kernel, (PartitionSpec((r, n), tile, dt), TensorSpec((r, n), dt), *tail)

    return build


def _argmax(dt: type[ct.DType], r: int, n: int) -> Callable[[], tuple[Any, tuple[Any, ...]]]:
    """The argmax kernel the library's host function launches for (r, n), and its arguments."""

    def build() -> tuple[Any, tuple[Any, ...]]:
        kernel, rows, width = softmax_mod.argmax_launch(dt, r, n)
        out = PartitionSpec((r, 1), (rows, 1), ct.i32)
        return kernel, (out, TensorSpec((r, n), dt), width)

    return build


def cases() -> list[Case]:
    f = TensorSpec((FLAT,), f32)
    z = PartitionSpec((FLAT,), (elementwise.TILE,), f32)
    out = [
        Case("add f32", _flat(elementwise.add_kernel, z, f, f), 12),
        Case("saxpy f32", _flat(elementwise.saxpy_kernel, z, 2.0, f, f), 12),
    ]
    for dt in (f32, bf16):
        size = dt.itemsize()
        x = TensorSpec((FLAT,), dt)
        zd = PartitionSpec((FLAT,), (activations._tile(dt),), dt)
        z4 = PartitionSpec((FLAT,), (activations.SILU_TILE,), dt)
        silu, gelu = activations._silu_mul_kernel(dt), activations._gelu_kernel(dt)
        out.append(Case(f"silu_mul {dt.name}", _flat(silu, z4, x, x), 3 * size))
        out.append(Case(f"gelu {dt.name}", _flat(gelu, zd, x), 2 * size))
        rms, ln = norms._rms_kernels, norms._layer_norm_kernels
        for h in (1536, 2048, 4096):
            build = _row(rms, 0, dt, ROWS, h, TensorSpec((h,), dt), 1.0 / h, 1e-6)
            out.append(Case(f"rms_norm {dt.name} {ROWS}x{h}", build, 2 * size))
        for h in (1536, 2048, 4096):
            w = TensorSpec((h,), dt)
            build = _row(rms, 2, dt, ROWS, h, TensorSpec((ROWS, h), dt), w, 1.0 / h, 1e-6,
                         outs=2)  # fmt: skip
            out.append(Case(f"add_rms_norm {dt.name} {ROWS}x{h}", build, 4 * size))
            build = _row(ln, 0, dt, ROWS, h, w, w, h, 1.0 / h, 1e-5,
                         per=norms.layer_norm_per_thread)  # fmt: skip
            out.append(Case(f"layer_norm {dt.name} {ROWS}x{h}", build, 2 * size))
        square = (ROWS, ROWS)
        tr = layout._transpose_kernel(dt)
        t_tile = (layout.transpose_tile(dt), layout.transpose_tile(dt))
        build = _flat(tr, PartitionSpec(square, t_tile, dt), TensorSpec(square, dt))
        out.append(Case(f"transpose {dt.name} {ROWS}x{ROWS}", build, 2 * size))
        emb, e_width = layout.embedding_launch(dt, ROWS, ROWS)
        e_tile = (1, e_width)
        build = _flat(emb, PartitionSpec(square, e_tile, dt), TensorSpec(square, dt),
                      TensorSpec((ROWS,), ct.i32))  # fmt: skip
        # Each output row read once from the table and written once, plus its id.
        out.append(Case(f"embedding {dt.name} {ROWS}x{ROWS}", build, 2 * size + 4 / ROWS))
        for n in (1024, 32768):
            build = _argmax(dt, ROWS, n)
            out.append(Case(f"argmax {dt.name} {ROWS}x{n}", build, size + 4 / n))
        for n in (1024, 32768):
            build = _softmax(dt, ROWS, n, False)
            out.append(Case(f"softmax {dt.name} {ROWS}x{n}", build, 2 * size))
        t, heads, d = ROPE
        tile = rope_mod.rope_tile(heads, d)
        build = _flat(rope_mod.rope_kernel, PartitionSpec(ROPE, tile, dt), TensorSpec(ROPE, dt),
                      TensorSpec((t,), ct.i32), TensorSpec((d // 2,), f32),
                      TensorSpec((d // 2,), f32), 0, t - 1)  # fmt: skip
        # x read and y written once, and each token's position.
        out.append(Case(f"rope {dt.name} {t}x{heads}x{d}", build, 2 * size + 4 / (heads * d)))
        m, k = GEMV
        bm, bk = gemv_mod.gemv_tile(m, k)
        build = _flat(gemv_mod._gemv_kernel(dt), PartitionSpec((m,), (bm,), dt),
                      TensorSpec(GEMV, dt), TensorSpec((k,), dt), bk)  # fmt: skip
        # a read once; x read and y written once.
        out.append(Case(f"gemv {dt.name} {m}x{k}", build, size * (1 + 1 / m + 1 / k)))
        build = _softmax(dt, 16 * CAUSAL_S, CAUSAL_S, True)
        causal_read = (CAUSAL_S + 1) / (2 * CAUSAL_S)
        name = f"causal softmax {dt.name} 16x{CAUSAL_S}x{CAUSAL_S}"
        out.append(Case(name, build, size * (1 + causal_read)))
    return out


def dram_bytes(r: Any) -> int:
    """The report's bytes moved, less the re-reads of arguments under 1/64 of the largest
    (a weight vector read by every block stays in L2): those count once."""
    largest = max((a.nbytes for a in r.arguments), default=0)
    return sum(a.read + a.written if a.nbytes * 64 >= largest else a.ideal for a in r.arguments)


def ours(case: Case) -> Row:
    kernel, args = case.build()
    r = kernel.report(*args, target=TARGET)
    per_elem = dram_bytes(r) / (r.elements or 1)
    return Row(case.name, r.sass_per_element, r.registers, r.spill_store_bytes,
               per_elem / case.ideal_bytes, per_elem)  # fmt: skip


def triton_python(given: str | None) -> str | None:
    """The Python that has Triton: --triton-python, $CUTILE_PY_TRITON_PYTHON, else this one
    if it can import triton; None if none."""
    chosen = given or os.environ.get("CUTILE_PY_TRITON_PYTHON")
    if chosen:
        return chosen
    return sys.executable if importlib.util.find_spec("triton") is not None else None


def tool_versions(python: str | None) -> str:
    """nvJitLink's, nvdisasm's and (given its Python) Triton's versions, for the header."""
    nvjitlink: Any = importlib.import_module("cuda.bindings.nvjitlink")
    major, minor = nvjitlink.version()
    out = [f"nvJitLink {major}.{minor}"]
    nvdisasm = find_tool("nvdisasm")
    if nvdisasm is not None:
        done = subprocess.run([str(nvdisasm), "--version"], capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        release = [w for w in done.stdout.split() if w.startswith("V")]
        out.append(f"nvdisasm {release[-1][1:] if release else 'unknown'}")
    if python is not None:
        code = "import triton; print(triton.__version__)"
        done = subprocess.run([python, "-c", code], capture_output=True, text=True,
                              timeout=300, check=False)  # fmt: skip
        out.append(f"Triton {done.stdout.strip() or 'unknown'}")
    return ", ".join(out)


def theirs(python: str) -> dict[str, float]:
    """Triton's SASS instructions per element per case, by name."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([python, "-m", "paper_repro.peers.triton_sass"], capture_output=True,
                          text=True, env=env, timeout=1200, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"Triton's compilation failed:\n{done.stderr[-2000:]}")
    out: dict[str, float] = {}
    for line in done.stdout.splitlines():
        case = json.loads(line)
        sass = disassemble(assemble(case["ptx"], Target(90), verbose=False).cubin)
        count = len(instructions(sass))
        trips = int(case.get("trips", 1))
        if trips > 1:
            count += (trips - 1) * loop_instructions(sass)
        out[case["name"]] = count * case["threads"] * case["programs"] / case["elements"]
    return out


_BRANCH = re.compile(r"\bBRA\s+0x([0-9a-f]+)", re.IGNORECASE)


def loop_instructions(sass: str) -> int:
    """The instructions of the one loop of a listing: from the target of its backward branch
    to the branch. A case that runs a loop `trips` times executes them `trips - 1` times more
    than the listing holds (its other code runs once)."""
    code = addressed(sass)
    loops = []
    for addr, text in code:
        b = _BRANCH.search(text)
        if b and int(b.group(1), 16) < addr:
            loops.append((int(b.group(1), 16), addr))
    if len(loops) != 1:
        raise RuntimeError(f"expected one loop in the listing, found {len(loops)}")
    start, end = loops[0]
    return sum(1 for addr, _ in code if start <= addr <= end)


def _f(v: float | int | None, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def over_budget(r: Row) -> list[str]:
    """What of issue 19's budget row `r` exceeds: "instructions" (over `INSTR_BUDGET` times
    Triton's, where Triton's count is known) and "bytes" (over `BYTES_BUDGET` times the
    ideal); "unmeasured" where ours has no count."""
    out = []
    if r.instr is None or r.bytes_ratio is None:
        out.append("unmeasured")
    if r.instr is not None and r.triton and r.instr > INSTR_BUDGET * r.triton:
        out.append("instructions")
    if r.bytes_ratio is not None and r.bytes_ratio > BYTES_BUDGET:
        out.append("bytes")
    return out


def table(rows: list[Row]) -> list[str]:
    head = ["kernel", "instr/elem ours", "Triton", "ours/Triton", "registers", "spill B",
            "bytes/ideal", *(f"est. % copy BW {g.name}" for g in GPUS), "budget"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        ratio = r.instr / r.triton if r.instr is not None and r.triton else None
        est = [
            "n/a" if r.instr is None or r.bytes_per_elem is None
            else f"{100 * estimate(g, r.instr, r.bytes_per_elem):.0f}"
            for g in GPUS
        ]  # fmt: skip
        cells = [
            r.name,
            _f(r.instr, ".1f"),
            _f(r.triton, ".1f"),
            _f(ratio, ".2f"),
            _f(r.registers, "d"),
            _f(r.spills, "d"),
            _f(r.bytes_ratio, ".2f"),
            *est,
            "OVER: " + ", ".join(over) if (over := over_budget(r)) else "ok",
        ]
        lines.append("| " + " | ".join(cells) + " |")  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m paper_repro.kernels_sass", description=__doc__)
    p.add_argument("--triton-python", help="a Python that can import triton")
    p.add_argument("--out", type=Path, help="also write the table (markdown) here")
    p.add_argument("--only", default="", help="cases whose name contains this text")
    args = p.parse_args(argv)
    ct.set_backend("sim")
    python = triton_python(args.triton_python)
    peer: dict[str, float] = {}
    peer_note = "Triton: not installed (give --triton-python)"
    if python is not None:
        peer = theirs(python)
        peer_note = f"Triton: compiled by {python}"
    rows = []
    for case in cases():
        if args.only in case.name:
            row = ours(case)
            rows.append(Row(**{**row.__dict__, "triton": peer.get(case.name)}))
            print(table(rows)[-1], flush=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = [
        f"# SASS instructions per element, {TARGET} (SASS-count evidence, not GPU timings)",
        "",
        f"{stamp}; {platform.node()} ({platform.machine()}, no GPU); {peer_note}; "
        f"{tool_versions(python)}. "
        f"Element-wise cases over {FLAT} elements (their cost per element does not depend on "
        "n). bytes/ideal: global bytes moved on the sim (re-reads of a small weight vector, "
        "which stay in L2, counted once) over each input read once and the output written "
        "once (causal: the unmasked half read). The % of copy bandwidth is an estimate: those "
        "bytes at "
        + ", ".join(f"{g.name} {g.copy_tb_s} TB/s" for g in GPUS)
        + f" against the SASS issued by 132 SMs x 4 schedulers at {GPUS[0].clock_ghz} GHz and "
        f"{ISSUE_EFFICIENCY:.0%} issue efficiency. budget: at most {INSTR_BUDGET}x Triton's "
        f"instructions per element and {BYTES_BUDGET}x the ideal bytes (issue 19).",
        "",
        *table(rows),
    ]
    over = [r.name for r in rows if over_budget(r)]
    text += ["", f"Over budget: {', '.join(over)}." if over else "Every row is within budget."]
    print("\n".join(text))
    if args.out is not None:
        args.out.write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
