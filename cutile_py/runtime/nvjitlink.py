"""PTX to cubin with nvJitLink (no GPU or driver needed), with ptxas's resource report.

The untyped `cuda.bindings.nvjitlink` stays inside this module; callers see typed functions.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

from cutile_py.ptx.target import Target


class PtxAssemblyError(RuntimeError):
    """nvJitLink refused the PTX; `.log` holds ptxas's line-numbered messages."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(f"{message}\n{log}" if log else message)
        self.log = log


#: The PTX instruction that moves registers between warp groups (warp specialization). ptxas
#: compiling for linking, as nvJitLink does, ignores it (warning C7504) and fits the whole
#: kernel in its launch registers, so nvJitLink's spill figures for such PTX are not those of
#: the driver JIT's whole-program compile, which moves the registers (and spills none where
#: the consumers' larger share suffices).
REGISTER_MOVES = "setmaxnreg."


def moves_registers(ptx: str) -> bool:
    """Whether `ptx` moves registers between warp groups (see REGISTER_MOVES)."""
    return REGISTER_MOVES in ptx


@dataclass(frozen=True)
class AssemblyReport:
    """A cubin and what ptxas said about it (maxima over the module's functions); `cubin` is
    empty where the driver's JIT compiled the PTX (its cubin stays in the driver).
    `spills_logged`: whether the log holds ptxas's spill figures; where it does not (a
    compile served from a cache, or no `-verbose`), the spill fields read 0 and mean
    nothing."""

    cubin: bytes
    info_log: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    spills_logged: bool = True

    @property
    def spill_free(self) -> bool:
        """Whether ptxas logged its spill figures and both are 0."""
        return self.spills_logged and self.spill_stores == 0 and self.spill_loads == 0


_REGISTERS = re.compile(r"\bused\s+(\d+)\s+registers\b", re.IGNORECASE)
_SPILL_STORES = re.compile(r"\b(\d+)\s+bytes\s+spill\s+stores\b", re.IGNORECASE)
_SPILL_LOADS = re.compile(r"\b(\d+)\s+bytes\s+spill\s+loads\b", re.IGNORECASE)
_SHARED = re.compile(r"\b(\d+)\s+bytes\s+smem\b", re.IGNORECASE)
#: nvJitLink's option to compile afresh: with its cache (which it may share with the driver's
#: JIT cache where a driver is installed), a second compile of the same PTX logs only
#: nvJitLink's own summary, which names no spills (NVIDIA/cuda-python issue 950).
NO_CACHE = "-no-cache"
_TARGET = re.compile(r"^\s*\.target\s+([A-Za-z0-9_]+)", re.MULTILINE)


def _max_match(pattern: re.Pattern[str], lines: list[str]) -> int:
    return max((int(m.group(1)) for line in lines for m in pattern.finditer(line)), default=0)


def parse_info_log(info_log: str) -> tuple[int, int, int, int]:
    """(registers, spill stores, spill loads, shared bytes) from a `-verbose` info log."""
    lines = info_log.splitlines()
    # nvJitLink appends its own per-function summary ("info    : ...") after ptxas's, and on
    # sm_90+ that summary counts the 1 KiB the system reserves in shared memory; ptxas's lines
    # give the kernel's own. (ptxas's spill line is a continuation: "ptxas         ." through
    # nvJitLink, indented where ptxas prints it itself.)
    ptxas = [line for line in lines if not line.lstrip().startswith("info")]
    chosen = ptxas or lines
    return (
        _max_match(_REGISTERS, chosen),
        _max_match(_SPILL_STORES, chosen),
        _max_match(_SPILL_LOADS, chosen),
        _max_match(_SHARED, chosen),
    )


def logs_spills(info_log: str) -> bool:
    """Whether `info_log` holds ptxas's spill figures (a cached compile's summary does not)."""
    return _SPILL_STORES.search(info_log) is not None


def report_from_log(info_log: str, cubin: bytes = b"") -> AssemblyReport | None:
    """The report in a verbose ptxas info log (the driver JIT's), or None where the log
    names no register count or no spills: a compile served from a JIT cache logs at most a
    summary of registers and memory, which does not say what ptxas spilled."""
    registers, spill_stores, spill_loads, shared_bytes = parse_info_log(info_log)
    if not registers or not logs_spills(info_log):
        return None
    return AssemblyReport(cubin, info_log, registers, spill_stores, spill_loads, shared_bytes)


def _arch_option(ptx: str, target: Target) -> str:
    # Arch-specific PTX (`.target sm_90a`) can only be compiled for exactly that variant.
    m = _TARGET.search(ptx)
    if m is not None and m.group(1) in (f"{target.name}a", f"{target.name}f"):
        return m.group(1)
    return target.name


def _load() -> Any:
    # Imported by name: cuda-python ships no type information (see cuda_driver._cu).
    nvjitlink: Any = importlib.import_module("cuda.bindings.nvjitlink")
    nvjitlink.version()  # loads the shared library, which the import alone does not
    return nvjitlink


def nvjitlink_available() -> bool:
    """Whether the nvJitLink library can be loaded here."""
    try:
        _load()
    except Exception:
        return False
    return True


def _read_log(lib: Any, handle: int, which: str) -> str:
    try:
        size = int(getattr(lib, f"get_{which}_log_size")(handle))
        if size <= 0:
            return ""
        buf = bytearray(size)
        getattr(lib, f"get_{which}_log")(handle, buf)
    except Exception:
        return ""
    return bytes(buf).rstrip(b"\x00").decode("utf-8", errors="replace").strip()


def _create(lib: Any, options: list[str]) -> int:
    """An nvJitLink handle for `options`; NO_CACHE is left out where this nvJitLink does not
    know it (a verbose compile asks for it: its log, not a cached cubin, is the report)."""
    try:
        return int(lib.create(len(options), options))
    except lib.nvJitLinkError as e:
        if NO_CACHE in options:
            return _create(lib, [o for o in options if o != NO_CACHE])
        raise PtxAssemblyError(f"nvJitLink rejected the options {options}: {e}", "") from e


def assemble(
    ptx: str, target: Target, *, verbose: bool = True, lineinfo: bool = False
) -> AssemblyReport:
    """Compile `ptx` to a cubin for `target`; raise PtxAssemblyError with ptxas's log.
    `lineinfo` keeps the PTX's `.loc` lines in the cubin (for a disassembly that names them)."""
    lib = _load()
    arch = _arch_option(ptx, target)
    options = (
        [f"-arch={arch}"] + (["-verbose"] if verbose else []) + (["-lineinfo"] if lineinfo else [])
    )
    handle = _create(lib, [*options, NO_CACHE] if verbose else options)
    try:
        data = ptx.encode()
        try:
            lib.add_data(handle, lib.InputType.PTX, data, len(data), "kernel.ptx")
            lib.complete(handle)
        except lib.nvJitLinkError as e:
            log = _read_log(lib, handle, "error")
            raise PtxAssemblyError(f"PTX assembly for {arch} failed ({e})", log) from e
        info_log = _read_log(lib, handle, "info")
        cubin = bytearray(int(lib.get_linked_cubin_size(handle)))
        lib.get_linked_cubin(handle, cubin)
    finally:
        lib.destroy(handle)
    registers, spill_stores, spill_loads, shared_bytes = parse_info_log(info_log)
    return AssemblyReport(
        cubin=bytes(cubin),
        info_log=info_log,
        registers=registers,
        spill_stores=spill_stores,
        spill_loads=spill_loads,
        shared_bytes=shared_bytes,
        spills_logged=logs_spills(info_log),
    )
