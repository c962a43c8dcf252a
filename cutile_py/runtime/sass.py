"""SASS of a cubin, through nvdisasm (or cuobjdump, which runs nvdisasm) where installed: the
dev extras ship them (pip nvidia-cuda-nvdisasm, nvidia-cuda-cuobjdump)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


class SassUnavailable(RuntimeError):
    """No disassembler here, or it failed; the message says which and how to install one."""


_INSTALL = "install the dev extras (pip nvidia-cuda-nvdisasm nvidia-cuda-cuobjdump)"
#: `/*0040*/    @!P0 EXIT ;` : an address comment, then the instruction up to its `;`.
_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*?)\s*;", re.IGNORECASE)


def find_tool(name: str) -> Path | None:
    """`name` (nvdisasm or cuobjdump) on PATH, or in an installed nvidia/*/bin wheel folder."""
    found = shutil.which(name)
    if found:
        return Path(found)
    for site in map(Path, sys.path):
        for cand in sorted(site.glob(f"nvidia/*/bin/{name}")):
            if cand.is_file():
                return cand
    return None


def disassemble(cubin: bytes, *, line_info: bool = False) -> str:
    """The SASS text of `cubin`; SassUnavailable if no disassembler is installed or it fails.
    `line_info`: nvdisasm's notes of each instruction's source line (see `located`)."""
    nvdisasm = find_tool("nvdisasm")
    cuobjdump = find_tool("cuobjdump")
    if nvdisasm is None:
        raise SassUnavailable(f"nvdisasm not found ({_INSTALL})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        if line_info:
            cmd, run_env = [str(nvdisasm), "-g", "-c", str(path)], None
        elif cuobjdump is not None:
            # cuobjdump runs the nvdisasm it finds on PATH.
            env = {
                **os.environ,
                "PATH": f"{nvdisasm.parent}{os.pathsep}{os.environ.get('PATH', '')}",
            }
            cmd, run_env = [str(cuobjdump), "-sass", str(path)], env
        else:
            cmd, run_env = [str(nvdisasm), "-c", str(path)], None
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=run_env, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise SassUnavailable(f"{Path(cmd[0]).name} failed: {e}") from e
    if done.returncode != 0:
        raise SassUnavailable(
            f"{Path(cmd[0]).name} exited with {done.returncode}: {done.stderr.strip()[:500]}"
        )
    return done.stdout


def instructions(sass: str) -> list[str]:
    """The instructions of a SASS listing, less the padding after the code: NOPs, and the
    branch to itself that ends every kernel."""
    return [text for text, _ in located(sass)]


#: nvdisasm -g's note of the source line of the instructions that follow it.
_SOURCE = re.compile(r'//##\s*File\s+"[^"]*",\s*line\s+(\d+)')
_FUNCTION = re.compile(r"^\s*\.(text|section)\b")


def located(sass: str) -> list[tuple[str, int | None]]:
    """Each instruction of a listing (as `instructions`) with the source line nvdisasm's
    line info gives it (`.loc` of a `-lineinfo` cubin), or None: code that no line owns,
    such as the slow-path subroutines ptxas adds."""
    out: list[tuple[str, int | None]] = []
    line: int | None = None
    for raw in sass.splitlines():
        if _FUNCTION.match(raw):
            line = None  # a new function or section: its code starts without a line
            continue
        src = _SOURCE.search(raw)
        if src:
            line = int(src.group(1))
            continue
        ins = _instruction(raw)
        if ins is not None:
            out.append((ins[1], line))
    return out


def addressed(sass: str) -> list[tuple[int, str]]:
    """Each instruction of a listing (as `instructions`) with its address."""
    return [ins for raw in sass.splitlines() if (ins := _instruction(raw)) is not None]


def _instruction(raw: str) -> tuple[int, str] | None:
    """The address and text of the instruction on listing line `raw`; None for other lines
    and for padding (a NOP, or the branch to itself that ends every kernel)."""
    m = _LINE.search(raw)
    if m is None:
        return None
    addr, text = int(m.group(1), 16), " ".join(m.group(2).split())
    if text == "NOP" or text == f"BRA 0x{addr:x}":
        return None
    return addr, text


def with_line_info(ptx: str, file: str = "kernel.ptx") -> str:
    """`ptx` with a `.loc` naming each instruction's own line (1-based, in `ptx`), so that a
    `-lineinfo` cubin ties every SASS instruction to the PTX line it came from."""
    out: list[str] = []
    body = False
    for number, text in enumerate(ptx.splitlines(), 1):
        s = text.strip()
        if s == "{":
            body = True
        elif body and s and not s.startswith((".", "//", "{", "}", "$")) and not s.endswith(":"):
            out.append(f"\t.loc 1 {number} 0")
        out.append(text)
        if s.startswith(".address_size"):
            out.append(f'.file 1 "{file}"')
    return "\n".join(out) + "\n"
