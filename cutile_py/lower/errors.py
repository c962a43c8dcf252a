"""The lowering's one error type."""

from __future__ import annotations

from cutile_py.ir import ops as o


class LoweringError(Exception):
    """The IR uses something this back end cannot lower (a compiler limitation), or a
    configuration that cannot run (too much shared memory); `span` is the source of the op
    being lowered, filled in by `Emitter.op` where the raiser did not know it."""

    def __init__(self, message: str, span: o.Span | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.span = span
