"""The machine, as found: backend, GPU, driver, clocks (read only), L2, peers' versions."""

from __future__ import annotations

import platform
import sys

import numpy as np

import cutile_py as ct
from paper_repro import peers
from paper_repro.core import Value


def describe(backend: str) -> dict[str, Value]:
    info: dict[str, Value] = {
        "backend": backend,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "cutile_py": ct.__version__,
        "cpu": platform.processor() or platform.machine(),
        "l2_bytes": 0,
    }
    if backend == "cuda":
        from cutile_py.runtime import cuda_driver as cu
        from paper_repro import cudrv

        try:
            info["gpu"] = cu.device_name()
            major, minor = cu.compute_capability()
            info["compute_capability"] = f"{major}.{minor}"
            info["driver_cuda_version"] = cu.driver_version()
            info["l2_bytes"] = cudrv.attribute("L2_CACHE_SIZE")
            info["sms"] = cudrv.attribute("MULTIPROCESSOR_COUNT")
            info["sm_clock_khz"] = cudrv.attribute("CLOCK_RATE")
            mem_khz = info["mem_clock_khz"] = cudrv.attribute("MEMORY_CLOCK_RATE")
            bus = info["mem_bus_bits"] = cudrv.attribute("GLOBAL_MEMORY_BUS_WIDTH")
            info["memory_bytes"] = cudrv.total_memory()
            # Double data rate: two transfers per memory clock.
            peak = 2 * mem_khz * 1e3 * bus / 8 / 1e9
            info["dram_peak_gbps_from_attributes"] = round(peak, 1)
        except Exception as e:  # a description must never stop the run
            info["device_error"] = f"{type(e).__name__}: {e}"
        info["nvidia_smi"] = cudrv.nvidia_smi()
    else:
        info["gpu"] = f"none ({backend}: kernels run on the CPU; times are not GPU measurements)"
    for name in ("torch", "cupy", "triton"):
        info[name] = peers.version(name)
    try:
        import cuda.bindings

        info["cuda_bindings"] = str(cuda.bindings.__version__)
    except Exception:
        info["cuda_bindings"] = "missing"
    return info
