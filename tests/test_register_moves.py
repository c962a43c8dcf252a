"""Warp-specialized kernels move registers between warp groups (`setmaxnreg`). ptxas compiling
for linking, as nvJitLink does, ignores that and fits the whole kernel in its launch registers,
where the consumers may spill; the driver's JIT compiles the kernel whole and spills nothing.
So on cuda the spill check reads the driver JIT's own log, and where only nvJitLink can be
asked (sim, `kernel.report`) no spill figure or warning is made from its compile."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

import cutile_py as ct
from cutile_py.ptx.target import Target
from cutile_py.runtime import nvjitlink
from cutile_py_kernels import autotune
from cutile_py_kernels.gemm import config_kernel

SM90 = Target(90)
#: The whole-program compile's verbose log, as ptxas 13.0 -arch=sm_90a -v printed it for the
#: kernel below (no spills; nvJitLink's compile of the same PTX: 136 bytes each way).
DRIVER_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_kernel' for 'sm_90a'
ptxas info    : Function properties for gemm_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 3 barriers"""


def _ws_gemm() -> tuple[Any, tuple[Any, ...]]:
    """A persistent warp-specialized config with an f32 output whose rows (301 columns) are
    not 16-byte aligned: plain stores, which nvJitLink's 168-register compile spills."""
    cfg = autotune.GemmConfig(128, 256, 64, 3, 0, 8, 1, 1)
    m, n, k = 128, 301, 64
    args = (
        ct.PartitionSpec((m, n), (cfg.bm, cfg.bn), ct.f32),
        ct.TensorSpec((m, k), ct.bf16),
        ct.TensorSpec((n, k), ct.bf16),
        cfg.bk,
    )
    return config_kernel(cfg, ct.bf16, ct.f32, True, False), args


def test_a_driver_log_reads_as_a_report() -> None:
    report = nvjitlink.report_from_log(DRIVER_LOG)
    assert report is not None and report.cubin == b""
    assert (report.registers, report.spill_stores, report.spill_loads) == (168, 0, 0)
    spilled = DRIVER_LOG.replace("0 bytes spill stores, 0", "24 bytes spill stores, 16")
    report = nvjitlink.report_from_log(spilled)
    assert report is not None and (report.spill_stores, report.spill_loads) == (24, 16)
    assert nvjitlink.report_from_log("") is None  # a log naming no registers says nothing


def test_a_cached_compiles_summary_claims_no_spills() -> None:
    """A compile served from a JIT cache logs no ptxas lines (NVIDIA/cuda-python issue 950:
    nvJitLink's second compile of the same PTX logged only its own `info` lines), at most a
    summary like nvJitLink's: registers but no spill figures. Its report is None (nothing
    known), not one of no spills. (The summary below is nvJitLink 13's format.)"""
    cached = (
        "info    : 0 bytes gmem\n"
        "info    : Function properties for 'gemm_kernel':\n"
        "info    : used 168 registers, used 3 barriers, 0 stack, 1024 bytes smem, "
        "536 bytes cmem[0], 0 bytes lmem"
    )
    assert nvjitlink.parse_info_log(cached)[0] == 168
    assert nvjitlink.report_from_log(cached) is None


@pytest.fixture
def ws_ptx() -> tuple[Any, Any]:
    if not nvjitlink.nvjitlink_available():
        pytest.skip("no nvJitLink library")
    kernel, args = _ws_gemm()
    compiled = kernel.compile(*args, target=SM90)
    ptx = compiled.lowered.ptx
    assert nvjitlink.moves_registers(ptx)
    linked = nvjitlink.assemble(ptx, SM90)
    assert linked.spill_stores > 0  # what the spill check must not go by
    return kernel, compiled


def test_on_cuda_the_spill_check_reads_the_driver_jits_log(
    ws_ptx: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime import cuda_driver as cu
    from cutile_py.runtime.cuda_backend import CudaBackend
    from tests.support.fake_driver import FakeDriver

    class AskedDriver(FakeDriver):
        """Records whether the JIT was asked for a verbose log."""

        def __init__(self) -> None:
            super().__init__()
            self.verbose: list[object] = []

        def cuModuleLoadDataEx(
            self, image: bytes, n: int, keys: list[object], values: list[object]
        ) -> tuple[object, ...]:
            self.verbose.append(values[keys.index(self.real.CUjit_option.CU_JIT_LOG_VERBOSE)])
            return super().cuModuleLoadDataEx(image, n, keys, values)

    driver = AskedDriver()
    driver.jit_log = DRIVER_LOG
    monkeypatch.setattr(cu, "_cu", lambda: driver)
    _, compiled = ws_ptx
    backend = CudaBackend()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ct.PerformanceWarning)
        loaded = compiled.load(backend)
    assert driver.verbose == [1]
    report = loaded.assembly()
    assert report is not None
    assert (report.registers, report.spill_stores, report.spill_loads) == (168, 0, 0)


def test_where_only_nvjitlink_can_say_no_spills_are_claimed(ws_ptx: tuple[Any, Any]) -> None:
    """The sim's spill check and `kernel.report` leave the spills out (with the reason) and
    warn nothing; registers (the launch's allocation) stay."""
    kernel, compiled = ws_ptx
    _, args = _ws_gemm()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ct.PerformanceWarning)
        assert compiled.check_spills() is None
        report = kernel.report(*args, target=SM90)
    assert report.spill_store_bytes is None and report.spill_load_bytes is None
    assert "setmaxnreg" in (report.why("spill_store_bytes") or "")
    assert report.registers == 168
    assert "n/a (setmaxnreg" in str(report)


@pytest.mark.gpu
def test_on_a_gpu_the_driver_jits_log_reports_the_warp_specialized_kernel() -> None:
    """The driver's verbose JIT log names the kernel's registers (the launch's allocation,
    at most 65536 / 384 threads) and no spills: the kernel's report on the device."""
    from cutile_py.runtime import select

    with select.restored():
        ct.set_backend("cuda")
        _check_on(select.active_backend())


def _check_on(backend: Any) -> None:
    kernel, args = _ws_gemm()
    compiled = kernel.compile(*args, target=backend.target)
    assert nvjitlink.moves_registers(compiled.lowered.ptx)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ct.PerformanceWarning)
        loaded = compiled.load(backend)
    report = loaded.assembly()
    assert report is not None, (
        "the driver's JIT log named no registers or spills (a compile from its JIT cache?)"
    )
    assert 0 < report.registers <= 65536 // 384
    assert (report.spill_stores, report.spill_loads) == (0, 0), report.info_log
