"""Shared fixtures: the CPU backend by default, GPU tests skipped where no GPU is found."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.runtime.cuda_driver import driver_available


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if driver_available():
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU and driver found")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def hermetic_disk_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The disk JIT cache of the whole run lives in a fresh temporary directory, never the
    user's cache (subprocesses inherit it through the environment); the user's simulator step
    limit is cleared."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path_factory.mktemp("jit_cache")))
        mp.delenv("CUTILE_PY_CACHE_MAX_BYTES", raising=False)
        # A user's step limit for the simulator must not change what the tests see.
        mp.delenv("CUTILE_PY_SIM_MAX_STEPS", raising=False)
        yield


@pytest.fixture(autouse=True)
def cpu_backend() -> Iterator[None]:
    """Tests run on sim (the compiled PTX on the CPU, the CPU default) unless they ask for
    another backend."""
    ct.set_backend("sim")
    yield
    ct.set_backend("sim")


@pytest.fixture
def rng() -> np.random.Generator:
    """Fresh random inputs every run (the seed is printed on failure by pytest's -ra output)."""
    seed = int(np.random.SeedSequence().entropy % (2**32))  # type: ignore[operator]
    print(f"rng seed {seed}")
    return np.random.default_rng(seed)
