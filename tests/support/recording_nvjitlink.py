"""The real nvJitLink behind a recorder, for tests of how `assemble` drives it."""

from __future__ import annotations

import importlib

#: What nvJitLink 13 logs for a compile it serves from its cache: its summary alone.
CACHED_LOG = (
    "info    : 0 bytes gmem\n"
    "info    : Function properties for 'vadd':\n"
    "info    : used 10 registers, used 1 barriers, 0 stack, 0 bytes smem, "
    "380 bytes cmem[0], 0 bytes lmem"
)


class RecordingNvJitLink:
    """The real nvJitLink, recording the options of each `create`; `refuse` names options
    it rejects (as an nvJitLink that does not know them), and `info_log` replaces the info
    log it returns (as a compile served from nvJitLink's cache logs)."""

    def __init__(self, refuse: tuple[str, ...] = (), info_log: str | None = None) -> None:
        self.real = importlib.import_module("cuda.bindings.nvjitlink")
        self.refuse, self.info_log = refuse, info_log
        self.created: list[list[str]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def create(self, n: int, options: list[str]) -> int:
        self.created.append(list(options))
        if any(o in self.refuse for o in options):
            raise self.real.nvJitLinkError(self.real.Result.ERROR_UNRECOGNIZED_OPTION)
        return int(self.real.create(n, options))

    def get_info_log_size(self, handle: int) -> int:
        if self.info_log is None:
            return int(self.real.get_info_log_size(handle))
        return len(self.info_log) + 1

    def get_info_log(self, handle: int, buf: bytearray) -> None:
        if self.info_log is None:
            self.real.get_info_log(handle, buf)
        else:
            buf[:] = self.info_log.encode() + b"\x00"
