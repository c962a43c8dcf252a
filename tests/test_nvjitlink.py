"""nvJitLink assembly: cubins and resource reports from hand-written PTX, and ptxas's errors."""

from __future__ import annotations

import pytest

from cutile_py.ptx.target import Target
from cutile_py.runtime import nvjitlink
from cutile_py.runtime.nvjitlink import (
    NO_CACHE,
    PtxAssemblyError,
    assemble,
    nvjitlink_available,
    parse_info_log,
)
from tests.support.recording_nvjitlink import CACHED_LOG, RecordingNvJitLink

if not nvjitlink_available():
    pytest.skip("the nvJitLink library cannot be loaded", allow_module_level=True)


def vector_add_ptx(target: Target, extra: str = "") -> str:
    """c[i] = a[i] + b[i] for i < n; `extra` is spliced in after the addition."""
    major, minor = target.ptx_version()
    return f"""\
.version {major}.{minor}
.target {target.name}
.address_size 64

.visible .entry vadd(
    .param .u64 pa,
    .param .u64 pb,
    .param .u64 pc,
    .param .u32 pn
)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .b64 %rd<11>;
    .reg .f32 %f<4>;

    ld.param.u64 %rd1, [pa];
    ld.param.u64 %rd2, [pb];
    ld.param.u64 %rd3, [pc];
    ld.param.u32 %r1, [pn];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    mul.wide.u32 %rd4, %r5, 4;
    cvta.to.global.u64 %rd5, %rd1;
    cvta.to.global.u64 %rd6, %rd2;
    cvta.to.global.u64 %rd7, %rd3;
    add.s64 %rd8, %rd5, %rd4;
    add.s64 %rd9, %rd6, %rd4;
    add.s64 %rd10, %rd7, %rd4;
    ld.global.f32 %f1, [%rd8];
    ld.global.f32 %f2, [%rd9];
    add.f32 %f3, %f1, %f2;
{extra}    st.global.f32 [%rd10], %f3;
DONE:
    ret;
}}
"""


@pytest.mark.parametrize("sm", [80, 90])
def test_vector_add_assembles(sm: int) -> None:
    report = assemble(vector_add_ptx(Target(sm)), Target(sm))
    assert len(report.cubin) > 0
    assert report.cubin[:4] == b"\x7fELF"
    assert report.registers > 0
    assert report.spill_stores == 0
    assert report.spill_loads == 0
    assert report.shared_bytes == 0
    assert f"sm_{sm}" in report.info_log


def test_without_verbose_the_report_is_empty() -> None:
    report = assemble(vector_add_ptx(Target(80)), Target(80), verbose=False)
    assert len(report.cubin) > 0
    assert report.registers == 0


def test_error_names_the_line() -> None:
    bad = "    frobnicate.f32 %f3, %f3;\n"
    ptx = vector_add_ptx(Target(80), extra=bad)
    line = ptx.splitlines().index(bad.rstrip("\n")) + 1
    with pytest.raises(PtxAssemblyError) as info:
        assemble(ptx, Target(80))
    assert f"line {line}" in info.value.log
    assert "frobnicate" in info.value.log
    assert info.value.log in str(info.value)


def test_ptx_for_a_newer_target_is_refused() -> None:
    with pytest.raises(PtxAssemblyError) as info:
        assemble(vector_add_ptx(Target(90)), Target(80))
    assert ".target" in info.value.log
    assert "sm_80" in str(info.value)


def test_shared_memory_and_several_functions() -> None:
    ptx = """\
.version 7.8
.target sm_90
.address_size 64

.visible .entry small(.param .u64 p)
{
    ret;
}

.visible .entry big(.param .u64 p)
{
    .shared .align 4 .b8 smem[3072];
    .reg .b32 %r<3>;
    .reg .b64 %rd<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, %tid.x;
    shl.b32 %r2, %r1, 2;
    st.shared.u32 [smem], %r1;
    bar.sync 0;
    ld.shared.u32 %r1, [smem+8];
    st.global.u32 [%rd1], %r1;
    ret;
}
"""
    report = assemble(ptx, Target(90))
    # The kernel's own 3 KiB, not nvJitLink's figure that adds the system's reserved 1 KiB.
    assert report.shared_bytes == 3072
    assert report.registers > 0


def test_arch_specific_ptx_uses_the_variant() -> None:
    ptx = vector_add_ptx(Target(90)).replace(".target sm_90", ".target sm_90a")
    ptx = ptx.replace(".version 7.8", ".version 8.0")
    report = assemble(ptx, Target(90))
    assert "sm_90a" in report.info_log


def test_parse_info_log_takes_maxima_of_ptxas_lines() -> None:
    log = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'a' for 'sm_80'
ptxas info    : Function properties for a
ptxas         .     0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 512 bytes smem, 360 bytes cmem[0]
ptxas info    : Compiling entry function 'b' for 'sm_80'
ptxas info    : Function properties for b
ptxas         .     0 bytes stack frame, 16 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, used 0 barriers, 360 bytes cmem[0]
info    : Function properties for 'a':
info    : used 99 registers, used 1 barriers, 0 stack, 9999 bytes smem, 360 bytes cmem[0]
"""
    assert parse_info_log(log) == (40, 16, 4, 512)
    # ptxas printing for itself (and the driver's JIT, verbose) indents the spill line.
    assert parse_info_log(log.replace("ptxas         .", "   ")) == (40, 16, 4, 512)
    assert parse_info_log("") == (0, 0, 0, 0)
    # Without ptxas lines the linker's summary is all there is.
    assert parse_info_log("info    : used 7 registers, 0 bytes smem") == (7, 0, 0, 0)


def test_a_verbose_compile_asks_nvjitlink_not_to_serve_it_from_its_cache(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a driver is installed nvJitLink may answer a second compile of the same PTX
    from its cache and log only its own summary, which names no spills (NVIDIA/cuda-python
    issue 950): the report's log must come from ptxas."""
    lib = RecordingNvJitLink()
    monkeypatch.setattr(nvjitlink, "_load", lambda: lib)
    report = assemble(vector_add_ptx(Target(90)), Target(90))
    assert lib.created == [["-arch=sm_90", "-verbose", NO_CACHE]]
    assert report.spills_logged and report.spill_free and report.registers > 0
    # Not verbose: no log, so nothing to keep from the cache.
    assert not assemble(vector_add_ptx(Target(90)), Target(90), verbose=False).spills_logged
    assert lib.created[-1] == ["-arch=sm_90"]


def test_an_nvjitlink_without_the_option_still_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    lib = RecordingNvJitLink(refuse=(NO_CACHE,))
    monkeypatch.setattr(nvjitlink, "_load", lambda: lib)
    report = assemble(vector_add_ptx(Target(80)), Target(80))
    assert lib.created == [["-arch=sm_80", "-verbose", NO_CACHE], ["-arch=sm_80", "-verbose"]]
    assert report.cubin[:4] == b"\x7fELF" and report.spill_free
    # An option it refuses for itself is still an error, naming the options.
    lib = RecordingNvJitLink(refuse=("-verbose",))
    monkeypatch.setattr(nvjitlink, "_load", lambda: lib)
    with pytest.raises(PtxAssemblyError, match="rejected the options"):
        assemble(vector_add_ptx(Target(80)), Target(80))


def test_a_log_without_spill_figures_is_not_a_report_of_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lib = RecordingNvJitLink(info_log=CACHED_LOG)
    monkeypatch.setattr(nvjitlink, "_load", lambda: lib)
    report = assemble(vector_add_ptx(Target(80)), Target(80))
    assert report.registers == 10  # the summary's
    assert not report.spills_logged and not report.spill_free
