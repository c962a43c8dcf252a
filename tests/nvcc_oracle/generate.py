"""Compile `kernels.cu` to PTX for sm_80 with nvcc, into `kernels.ptx` (committed).

Dev-only: nvcc is no dependency of cutile_py; the simulator tests read the committed PTX.

    python tests/nvcc_oracle/generate.py [path/to/nvcc]

The PTX starts with a comment naming the nvcc release and the command that made it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ARCH = "sm_80"


def main() -> None:
    nvcc = sys.argv[1] if len(sys.argv) > 1 else "nvcc"
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True)
    release = next(line for line in version.stdout.splitlines() if "release" in line).strip()
    out = HERE / "kernels.ptx"
    cmd = [nvcc, "-ptx", f"-arch={ARCH}", "-o", str(out), str(HERE / "kernels.cu")]
    subprocess.run(cmd, check=True)
    head = f"// nvcc: {release}\n// made by: nvcc -ptx -arch={ARCH} kernels.cu (generate.py)\n"
    out.write_text(head + out.read_text())


if __name__ == "__main__":
    main()
