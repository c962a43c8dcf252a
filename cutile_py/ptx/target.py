"""Compilation targets: the SM architecture, what it can do (capability flags every lowering
pass reads instead of guessing the architecture) and the PTX ISA versions its features need."""

from __future__ import annotations

from dataclasses import dataclass

#: The lowest `.version` that `.target sm_X` is accepted with (NOTES-PTX.md).
MIN_PTX_FOR_SM: dict[int, tuple[int, int]] = {
    80: (7, 0),
    86: (7, 1),
    87: (7, 4),
    88: (9, 0),
    89: (7, 8),
    90: (7, 8),
    100: (8, 6),
    101: (8, 6),
    103: (8, 8),
    110: (9, 0),
    120: (8, 7),
    121: (8, 8),
}
#: Shared memory one block may use with the opt-in (cuFuncSetAttribute
#: MAX_DYNAMIC_SHARED_SIZE_BYTES), from the CUDA C++ Programming Guide's "Technical
#: Specifications per Compute Capability" table: 163 KB (8.0), 99 KB (8.6, 8.9, 12.0), 227 KB
#: (9.0, 10.0). That is the SM's largest carveout less the 1 KB CUDA reserves per block; the
#: Ampere Tuning Guide (Unified Shared Memory/L1/Texture Cache) gives the carveouts: up to
#: 164 KB per SM on A100 and 100 KB on compute capability 8.6. 8.7 (Orin) has A100's 163 KB.
#: A device's own figure (its MAX_SHARED_MEMORY_PER_BLOCK_OPTIN attribute) wins over this
#: table: the cuda backend puts it in its `Target`.
MAX_SHARED_OPTIN: dict[int, int] = {
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    88: 99 * 1024,  # no published figure: the smaller of its neighbours' (the device's wins)
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    120: 99 * 1024,
}
#: Static shared memory (`.shared` arrays of fixed size) is capped at 48 KB on every target;
#: beyond it only dynamic shared memory (`.extern .shared`) can reach the opt-in maximum.
MAX_STATIC_SHARED = 48 * 1024
#: 32-bit registers: at most 255 per thread (PTX ISA, "Maximum number of registers"), and 64 K
#: per block on every SM from 8.0 to 12.0 (CUDA C++ Programming Guide, Technical
#: Specifications per Compute Capability).
MAX_REGISTERS_PER_THREAD = 255
MAX_REGISTERS_PER_BLOCK = 64 * 1024
MAX_THREADS_PER_BLOCK = 1024
#: The lowest `.version` for an instruction family, where it is higher than 7.0.
MIN_PTX_FOR_FEATURE: dict[str, tuple[int, int]] = {
    "cvt.f32.bf16": (7, 1),  # widening bf16 with cvt (narrowing is 7.0)
    "wgmma": (8, 0),  # with `.target sm_90a`, which needs 8.0 (NOTES-PTX.md)
    "tma": (8, 0),  # cp.async.bulk.tensor, mbarrier expect_tx / try_wait, fence.proxy.async
}
#: Features that exist only on an architecture's arch-specific variant (`.target sm_90a`):
#: a module using one is emitted for that variant, whose code runs on that exact
#: architecture only (ptxas refuses `wgmma` on plain sm_90).
ARCH_SPECIFIC_FEATURES = frozenset({"wgmma"})


@dataclass(frozen=True)
class Target:
    """An SM architecture, e.g. `Target(80)` for sm_80 (A100) or `Target(90)` for sm_90 (H100).

    `arch_specific` (default True) lets a kernel that needs the architecture's own
    instructions (wgmma on sm_90) be emitted for its arch-specific variant (`.target sm_90a`),
    as Triton does for compute capability 9.0; such PTX runs on that exact architecture only.
    `Target(90, arch_specific=False)` keeps every module portable plain sm_90 (no wgmma)."""

    sm: int
    #: The device's opt-in shared memory per block in bytes, where a device was asked; None:
    #: the table's figure for `sm`.
    shared_optin: int | None = None
    arch_specific: bool = True

    def __post_init__(self) -> None:
        if self.sm < 80:
            raise ValueError(f"sm_{self.sm} is not supported: cutile_py targets sm_80 and newer")
        if self.shared_optin is not None and self.shared_optin < 48 * 1024:
            raise ValueError(
                f"{self.name}: an opt-in shared memory limit of {self.shared_optin} bytes is "
                "below the 48 KiB every target has"
            )

    @property
    def name(self) -> str:
        return f"sm_{self.sm}"

    @property
    def max_shared_bytes(self) -> int:
        """The most shared memory one block may use (with the opt-in above 48 KB)."""
        if self.shared_optin is not None:
            return self.shared_optin
        return MAX_SHARED_OPTIN[max(sm for sm in MAX_SHARED_OPTIN if sm <= self.sm)]

    # -- capability flags ------------------------------------------------------------------
    @property
    def mma_sync(self) -> bool:
        """Warp-level `mma.sync` m16n8k16 (f16, bf16) and m16n8k8 (tf32): sm_80 and newer."""
        return self.sm >= 80

    @property
    def cp_async(self) -> bool:
        """`cp.async` global → shared copies with commit groups: sm_80 and newer."""
        return self.sm >= 80

    @property
    def wgmma(self) -> bool:
        """Warpgroup `wgmma.mma_async`: sm_90 with `arch_specific` (emitted as sm_90a; later
        architectures' arch-specific variants have no wgmma)."""
        return self.sm == 90 and self.arch_specific

    @property
    def tma(self) -> bool:
        """Tensor-memory-accelerator copies (`cp.async.bulk.tensor`, mbarriers): sm_90 and
        newer."""
        return self.sm >= 90

    @property
    def max_registers_per_thread(self) -> int:
        return MAX_REGISTERS_PER_THREAD

    @property
    def max_registers_per_block(self) -> int:
        return MAX_REGISTERS_PER_BLOCK

    @property
    def max_threads_per_block(self) -> int:
        return MAX_THREADS_PER_BLOCK

    def describe(self) -> str:
        """The target and its flags on one line (what a lowering plan prints)."""
        flags = [f for f in ("mma_sync", "cp_async", "wgmma", "tma") if getattr(self, f)]
        return (
            f"{self.name} [{' '.join(flags)}] shared {self.max_shared_bytes} B, "
            f"registers {self.max_registers_per_thread}/thread "
            f"{self.max_registers_per_block}/block"
        )

    def ptx_target(self, features: frozenset[str] = frozenset()) -> str:
        """The `.target` of a module using `features`: the arch-specific variant (sm_90a)
        where one of them needs it, else the plain architecture."""
        if features & ARCH_SPECIFIC_FEATURES:
            if not self.arch_specific:
                raise ValueError(f"{self.name} without arch_specific cannot use {features}")
            return f"{self.name}a"
        return self.name

    def ptx_version(self, features: frozenset[str] = frozenset()) -> tuple[int, int]:
        """The lowest PTX ISA version that this target and `features` allow."""
        base = MIN_PTX_FOR_SM[max(sm for sm in MIN_PTX_FOR_SM if sm <= self.sm)]
        for f in features:
            base = max(base, MIN_PTX_FOR_FEATURE.get(f, (7, 0)))
        return base


def parse_target(text: str | int, what: str = "target") -> Target:
    """The Target that `text` names: 'sm_90', 'sm_90a' (its arch-specific variant, which
    Target(90) may already emit), '90' or 90. Unknown names raise a ValueError naming `what`."""
    name = str(text).strip()
    digits = name.removeprefix("sm_").removesuffix("a")
    if not digits.isdigit() or int(digits) not in MIN_PTX_FOR_SM:
        known = ", ".join(f"sm_{sm}" for sm in sorted(MIN_PTX_FOR_SM))
        raise ValueError(f"{what}: {text!r} is not a known target; name one of {known} or sm_90a")
    return Target(int(digits))


@dataclass(frozen=True)
class SmLimits:
    """What one SM holds at once, for occupancy: the CUDA C++ Programming Guide's "Technical
    Specifications per Compute Capability" table (registers are allocated per warp in units
    of 256, across 4 sub-partitions; shared memory in units of 128 bytes, with 1 KB reserved
    per block)."""

    max_warps: int
    max_blocks: int
    registers: int = 64 * 1024
    shared_bytes: int = 228 * 1024
    register_unit: int = 256
    sub_partitions: int = 4
    shared_unit: int = 128
    reserved_shared_per_block: int = 1024


SM_LIMITS: dict[int, SmLimits] = {
    80: SmLimits(max_warps=64, max_blocks=32, shared_bytes=164 * 1024),
    86: SmLimits(max_warps=48, max_blocks=16, shared_bytes=100 * 1024),
    89: SmLimits(max_warps=48, max_blocks=24, shared_bytes=100 * 1024),
    90: SmLimits(max_warps=64, max_blocks=32, shared_bytes=228 * 1024),
    100: SmLimits(max_warps=64, max_blocks=32, shared_bytes=228 * 1024),
    120: SmLimits(max_warps=48, max_blocks=32, shared_bytes=100 * 1024),
}


def sm_limits(target: Target) -> SmLimits:
    """The per-SM limits of `target` (those of the nearest listed architecture below it)."""
    return SM_LIMITS[max(sm for sm in SM_LIMITS if sm <= target.sm)]
