"""A completion that stays in flight for a while: an in-flight window on the CPU backends, whose
launches otherwise finish before returning."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

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


async def until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Let the event loop run until `condition()` holds: on sim and interpret an awaited launch
    executes in a worker thread, so its start is not one loop turn away."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.001)
