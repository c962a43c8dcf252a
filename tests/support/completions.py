"""A completion that stays in flight for a while: an in-flight window on the CPU backends, whose
launches otherwise finish before returning."""

from __future__ import annotations

from cutile_py.runtime.backend import Completion


class SlowCompletion(Completion):
    """Done only after `polls` calls of `done()`: an in-flight window on the CPU backends."""

    def __init__(self, inner: Completion, polls: int) -> None:
        self.inner = inner
        self.left = polls
        self.polls = 0

    def done(self) -> bool:
        self.polls += 1
        self.left -= 1
        return self.left <= 0

    def wait(self) -> None:
        while not self.done():
            pass
        self.inner.wait()
