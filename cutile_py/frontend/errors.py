"""`CompileError`: a kernel the compiler cannot accept, located in the user's source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int  # 1-based, in the file
    col: int  # 1-based
    text: str  # the source line

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


class CompileError(Exception):
    """The kernel uses Python the compiler does not support, or misuses a tile operation.

    `str()` gives `file:line:col: message`, the offending line and a caret under the column,
    then `in <helper>` lines for inlined helpers it passed through.
    """

    def __init__(self, message: str, where: SourceLocation | None = None, kernel: str = "") -> None:
        self.message = message
        self.where = where
        self.kernel = kernel
        #: Call sites of the inlined helpers the error passed through, innermost first.
        self.called_from: list[tuple[str, SourceLocation]] = []
        super().__init__(self._render())

    def through_helper(self, helper: str, call_site: SourceLocation) -> CompileError:
        """Record that the error arose inside `helper`, inlined at `call_site`."""
        self.called_from.append((helper, call_site))
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:
        return self._render()

    def _render(self) -> str:
        if self.where is None:
            return f"in kernel {self.kernel}: {self.message}" if self.kernel else self.message
        w = self.where
        stripped = w.text.rstrip()
        lead = len(stripped) - len(stripped.lstrip())
        caret = " " * (max(w.col - 1 - lead, 0) + 4) + "^"
        chain = "".join(f"\n  in {h}(), called at {site}" for h, site in self.called_from)
        return f"{w}: {self.message}\n    {stripped.lstrip()}\n{caret}{chain}"
