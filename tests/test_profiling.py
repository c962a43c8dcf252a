"""`ct.profiling`: device name, cache directory and launch timing, on the CPU backends."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def test_time_ms_queued_reuses_outputs_only_once_their_op_is_done(
    rng: np.random.Generator,
) -> None:
    """Launches are taken in turn; each output is launched on again only after the op that
    last wrote it is done (an output lent to a running op cannot be lent again), at most
    one op per output in flight; every run really computes."""
    n = TILE + int(rng.integers(1, TILE))
    xs = rng.standard_normal(n).astype(np.float32)
    x = ct.from_numpy(xs)
    outs = [ct.zeros(n).partition(TILE) for _ in range(3)]
    built: list[int] = []
    ops: dict[int, Any] = {}

    def make(k: int) -> Callable[[], ct.OpLike]:
        def launch() -> ct.OpLike:
            prev = ops.get(k)
            assert prev is None or prev[1], f"output {k} launched on while its op runs"
            op = add_kernel(outs[k], x, x)
            entry = [op, False]
            ops[k] = entry
            built.append(k)

            class Tracked:
                def sync(self) -> Any:
                    got = op.sync()
                    entry[1] = True
                    outs[k] = got[0]  # the partition comes back with the result
                    return got

            return Tracked()  # type: ignore[return-value]

        return launch

    ms = ct.profiling.time_ms_queued([make(0), make(1), make(2)], runs=7)
    assert ms > 0
    assert built == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0]  # one warm-up each, then 7 in turn
    assert all(done for _, done in ops.values())
    for p in outs:
        np.testing.assert_array_equal(p.unpartition().to_numpy(), xs + xs)
    with pytest.raises(ValueError, match="runs >= 1"):
        ct.profiling.time_ms_queued([make(0)], runs=0)
