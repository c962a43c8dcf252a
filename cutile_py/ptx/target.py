"""Compilation targets: the SM architecture and the PTX ISA versions its features need."""

from __future__ import annotations

from dataclasses import dataclass

#: The lowest `.version` that `.target sm_X` is accepted with (NOTES-PTX.md).
MIN_PTX_FOR_SM: dict[int, tuple[int, int]] = {
    80: (7, 0),
    86: (7, 1),
    89: (7, 8),
    90: (7, 8),
    100: (8, 6),
    120: (8, 7),
}
#: The lowest `.version` for an instruction family, where it is higher than 7.0.
MIN_PTX_FOR_FEATURE: dict[str, tuple[int, int]] = {
    "cvt.f32.bf16": (7, 1),  # widening bf16 with cvt (narrowing is 7.0)
}


@dataclass(frozen=True)
class Target:
    """An SM architecture, e.g. `Target(80)` for sm_80 (A100) or `Target(90)` for sm_90 (H100)."""

    sm: int

    def __post_init__(self) -> None:
        if self.sm < 80:
            raise ValueError(f"sm_{self.sm} is not supported: cutile_py targets sm_80 and newer")

    @property
    def name(self) -> str:
        return f"sm_{self.sm}"

    def ptx_version(self, features: frozenset[str] = frozenset()) -> tuple[int, int]:
        """The lowest PTX ISA version that this target and `features` allow."""
        base = MIN_PTX_FOR_SM[max(sm for sm in MIN_PTX_FOR_SM if sm <= self.sm)]
        for f in features:
            base = max(base, MIN_PTX_FOR_FEATURE.get(f, (7, 0)))
        return base
