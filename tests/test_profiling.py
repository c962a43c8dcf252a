"""`ct.profiling`: device name, cache directory and launch timing, on the CPU backends."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cutile_py as ct
from cutile_py_kernels.elementwise import TILE, add_kernel


def test_device_name_is_the_backend_off_gpu() -> None:
    assert ct.profiling.device_name() == ct.backend() == "sim"


def test_cache_dir_follows_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "c"))
    assert ct.profiling.cache_dir() == tmp_path / "c"


def test_time_ms_runs_fresh_ops(rng: np.random.Generator) -> None:
    n = TILE + int(rng.integers(1, TILE))
    x = ct.from_numpy(rng.standard_normal(n).astype(np.float32))
    outs: list[ct.Tensor] = []  # type: ignore[type-arg]

    def launch() -> ct.OpLike:
        z = ct.zeros(n)
        outs.append(z)
        op: ct.OpLike = add_kernel(z.partition(TILE), x, x)
        return op

    times = ct.profiling.time_ms(launch, repeats=3)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert len(outs) == 4  # one warm-up, then one fresh op per timed run
