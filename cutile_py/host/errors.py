"""Host-side errors and warnings: ownership violations, device faults, performance."""

from __future__ import annotations


class BorrowError(Exception):
    """A tensor was used while another owner (a pending op, a partition) holds it."""


class MovedError(BorrowError):
    """A tensor or partition was used after `.partition()` / `.unpartition()` consumed it."""


class AliasError(BorrowError):
    """One launch received the same memory twice, at least once as `Mut`."""


class LaunchError(RuntimeError):
    """The device failed while running a kernel."""


class PerformanceWarning(UserWarning):
    """Compiled code that will run slowly: a kernel whose registers spill to local memory
    (ptxas's count, through nvJitLink), once per compiled specialization."""
