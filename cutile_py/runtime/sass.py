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


def disassemble(cubin: bytes) -> str:
    """The SASS text of `cubin`; SassUnavailable if no disassembler is installed or it fails."""
    nvdisasm = find_tool("nvdisasm")
    cuobjdump = find_tool("cuobjdump")
    if nvdisasm is None:
        raise SassUnavailable(f"nvdisasm not found ({_INSTALL})")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(cubin)
        if cuobjdump is not None:
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
    out: list[str] = []
    for m in _LINE.finditer(sass):
        text = " ".join(m.group(2).split())
        if text == "NOP" or text == f"BRA 0x{int(m.group(1), 16):x}":
            continue
        out.append(text)
    return out
