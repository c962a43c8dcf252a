"""Compile the sm_90a CUDA C oracles (`warp_specialized.cu`, `wgmma_layouts.cu`) to PTX with
nvcc, each into the `.ptx` of its name (committed).

Dev-only: nvcc is no dependency of cutile_py; the simulator tests read the committed PTX.

    python tests/nvcc_oracle/generate_sm90.py [path/to/nvcc]

Each PTX starts with a comment naming the nvcc release and the command that made it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ARCH = "sm_90a"  # setmaxnreg and wgmma need the architecture-specific target
SOURCES = ("warp_specialized.cu", "wgmma_layouts.cu")


def main() -> None:
    nvcc = sys.argv[1] if len(sys.argv) > 1 else "nvcc"
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    release = next(line for line in version.stdout.splitlines() if "release" in line).strip()
    for name in SOURCES:
        src = HERE / name
        out = src.with_suffix(".ptx")
        subprocess.run([nvcc, "-ptx", f"-arch={ARCH}", "-o", str(out), str(src)], check=True)
        head = f"// nvcc: {release}\n// made by: nvcc -ptx -arch={ARCH} {name} (generate_sm90.py)\n"
        out.write_text(head + out.read_text())


if __name__ == "__main__":
    main()
