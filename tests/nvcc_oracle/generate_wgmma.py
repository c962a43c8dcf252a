"""Compile `wgmma_layouts.cu` to PTX for sm_90a with nvcc, into `wgmma_layouts.ptx`
(committed).

Dev-only: nvcc is no dependency of cutile_py; the simulator tests read the committed PTX.

    python tests/nvcc_oracle/generate_wgmma.py [path/to/nvcc]

The PTX starts with a comment naming the nvcc release and the command that made it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ARCH = "sm_90a"  # wgmma needs the architecture-specific target


def main() -> None:
    nvcc = sys.argv[1] if len(sys.argv) > 1 else "nvcc"
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    release = next(line for line in version.stdout.splitlines() if "release" in line).strip()
    out = HERE / "wgmma_layouts.ptx"
    src = HERE / "wgmma_layouts.cu"
    subprocess.run([nvcc, "-ptx", f"-arch={ARCH}", "-o", str(out), str(src)], check=True)
    head = (
        f"// nvcc: {release}\n"
        f"// made by: nvcc -ptx -arch={ARCH} wgmma_layouts.cu (generate_wgmma.py)\n"
    )
    out.write_text(head + out.read_text())


if __name__ == "__main__":
    main()
