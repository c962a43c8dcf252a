"""`CompileError`: a kernel the compiler cannot accept, located in the user's source."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SourceLocation:
    file: str
    line: int  # 1-based, in the file
    col: int  # 1-based
    text: str  # the source line
    #: 1-based column just past the offending expression on this line (None: unknown).
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"

    def render(self, function: str, note: str = "") -> str:
        """Python's traceback form: `File "f.py", line 3, col 5, in fn`, the source line, and
        carets under the expression."""
        stripped = self.text.rstrip()
        code = stripped.lstrip()
        lead = len(stripped) - len(code)
        start = min(max(self.col - 1 - lead, 0), max(len(code) - 1, 0))
        end = len(code) if self.end_col is None else min(self.end_col - 1 - lead, len(code))
        carets = "^" * max(end - start, 1)
        where = f"in {function}" if function else "in the kernel"
        head = f'File "{self.file}", line {self.line}, col {self.col}, {where}{note}'
        if not code:
            return head
        return f"{head}\n    {code}\n    {' ' * start}{carets}"


@dataclass(frozen=True)
class CallSite:
    """Where an inlined `@ct.function` helper was called: in `caller`, at `where`."""

    helper: str
    caller: str
    where: SourceLocation


class CompileError(Exception):
    """The kernel uses Python the compiler does not support, or misuses a tile operation.

    `str()` reads like Python's own SyntaxError: `File "k.py", line 12, col 5, in kernel`, the
    offending line with carets under the expression, then the message. An error inside inlined
    `@ct.function` helpers lists each call site first, outermost first, as a traceback does.
    """

    def __init__(self, message: str, where: SourceLocation | None = None, kernel: str = "") -> None:
        self.message = message
        self.where = where
        #: The function (kernel or helper) whose source holds `where`.
        self.kernel = kernel
        #: The call sites of the inlined helpers the error passed through, innermost first.
        self.called_from: list[CallSite] = []
        super().__init__(self._render())

    def through_helper(
        self, helper: str, call_site: SourceLocation, caller: str = ""
    ) -> CompileError:
        """Record that the error arose inside `helper`, inlined at `call_site` in `caller`."""
        self.called_from.append(CallSite(helper, caller, call_site))
        self.args = (self._render(),)
        return self

    def __str__(self) -> str:
        return self._render()

    def _render(self) -> str:
        if self.where is None:
            return f"in kernel {self.kernel}: {self.message}" if self.kernel else self.message
        frames = []
        for site in reversed(self.called_from):  # outermost call first
            frames.append(site.where.render(site.caller))
        note = ""
        if self.called_from:
            inner = self.called_from[0]
            note = f" (called from {inner.caller or 'the kernel'}, line {inner.where.line})"
        frames.append(self.where.render(self.kernel, note))
        return "\n".join(frames) + "\n" + self.message


# Tracebacks name the class as users spell it (`cutile_py.CompileError`).
CompileError.__module__ = "cutile_py"
