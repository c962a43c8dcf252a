"""Driver calls the harness needs beyond `cutile_py.runtime.cuda_driver`: device attributes,
device-to-device copies, foreign stream handles (PyTorch's, CuPy's) and raw launches on them.

Imported only on the cuda backend; `cuda.bindings` ships no types, so they stop here.
"""

from __future__ import annotations

import shutil
import subprocess
from typing import Any

from cutile_py.runtime import cuda_driver as cu


def _drv() -> Any:
    # The bindings cutile_py's own driver calls go through, so that a stand-in put there
    # (paper_repro.null_driver, the tests' fake drivers) takes these calls too.
    return cu._cu()


def _check(call: str, result: Any) -> Any:
    if int(result[0]) != 0:
        raise cu.CudaDriverError(call, int(result[0]))
    rest = result[1:]
    return None if not rest else rest[0]


def attribute(name: str, ordinal: int = 0) -> int:
    """`cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_<name>)` of device `ordinal`."""
    d = _drv()
    dev = _check("cuDeviceGet", d.cuDeviceGet(ordinal))
    attr = getattr(d.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
    return int(_check("cuDeviceGetAttribute", d.cuDeviceGetAttribute(attr, dev)))


def total_memory(ordinal: int = 0) -> int:
    d = _drv()
    dev = _check("cuDeviceGet", d.cuDeviceGet(ordinal))
    return int(_check("cuDeviceTotalMem", d.cuDeviceTotalMem(dev)))


def stream_from_handle(handle: int) -> cu.Stream:
    """A driver stream object for a raw `CUstream` value (0: the legacy default stream)."""
    return cu.Stream(_drv().CUstream(handle))


def memcpy_dtod(dst: int, src: int, nbytes: int, stream: cu.Stream) -> None:
    _check("cuMemcpyDtoDAsync", _drv().cuMemcpyDtoDAsync(dst, src, nbytes, stream.raw))


def nvidia_smi() -> str:
    """What nvidia-smi says about the GPU (read only; clocks are never changed here)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return "nvidia-smi: not found"
    query = (
        "name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,"
        "power.limit,pstate,temperature.gpu"
    )
    try:
        out = subprocess.run(
            [exe, f"--query-gpu={query}", "--format=csv"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"nvidia-smi failed: {e}"
    return (out.stdout or out.stderr).strip()
