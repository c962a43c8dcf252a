"""The simulator as the active backend for a test, on a chosen target, race checks on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from cutile_py.ptx.target import Target
from cutile_py.runtime import select
from cutile_py.runtime.sim_backend import SimBackend
from cutile_py.sim.executor import Options

#: Meanwhile backends may be replaced; afterwards the ones before are back.
backends_restored = select.restored


def activate_sim(target: Target, **options: Any) -> SimBackend:
    """A simulator of `target` with race checks on (and `options`), made the active backend
    (until `backends_restored` ends, or the next `ct.set_backend`)."""
    backend = SimBackend(target, Options(race_check=True, **options))
    select.install("sim", backend)
    return backend


@contextlib.contextmanager
def active_sim(target: Target, **options: Any) -> Iterator[SimBackend]:
    """`activate_sim` for the duration of the block."""
    with backends_restored():
        yield activate_sim(target, **options)
