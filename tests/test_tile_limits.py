"""How large a tile may be: what one block can hold (its registers and the most shared memory
of any target). A larger tile is a CompileError at the expression that makes it, at once on
every backend; the largest allowed tiles compile and compute NumPy's result; and layout
planning answers its questions in time independent of the tile's element count."""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f16, f32, ir
from cutile_py.frontend.limits import MAX_TILE_BYTES, max_tile_elements
from cutile_py.lower.layout import plan_layouts

B = TypeVar("B")
ARGS = (ct.PartitionSpec((64,), (32,)), ct.TensorSpec((64,)))
#: 64K 32-bit registers (256 KiB) and sm_90's 227 KB of shared memory, in f32 elements.
F32_LIMIT = (256 * 1024 + 227 * 1024) // 4


def line_of(fn: Any, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


@ct.kernel
def k_huge_constant(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.zeros((2147483647,), f32)
    z.store(ct.load_tile_like(x, z) + ct.sum(t))


def _launch(backend: str) -> None:
    ct.set_backend(backend)
    k_huge_constant(ct.zeros(64).partition(32), ct.zeros(64))


ENTRY_POINTS: dict[str, Callable[[], Any]] = {
    ".ptx": lambda: k_huge_constant.ptx(*ARGS),
    ".ir": lambda: k_huge_constant.ir(*ARGS),
    "launch on sim": lambda: _launch("sim"),
    "launch on interpret": lambda: _launch("interpret"),
}


@pytest.fixture
def restore_backend() -> Iterator[None]:
    yield
    ct.set_backend("sim")


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_tile_larger_than_a_block_is_refused_at_once(entry: str, restore_backend: None) -> None:
    start = time.perf_counter()
    with pytest.raises(ct.CompileError) as info:
        ENTRY_POINTS[entry]()
    assert time.perf_counter() - start < 1.0
    err = info.value
    assert err.message == (
        f"a tile of 2147483647 elements (8 GiB of f32) is larger than one block can hold: at "
        f"most {F32_LIMIT} f32 elements (483 KiB: the 256 KiB of a block's 64K 32-bit "
        "registers and the 227 KiB of shared memory of the largest GPU); split the work into "
        "smaller tiles, over more blocks or a loop"
    )
    assert err.where is not None
    assert err.where.line == line_of(k_huge_constant.fn, "ct.zeros((2147483647,)")
    assert err.where.text[err.where.col - 1 :].startswith("ct.zeros(")


def test_the_limit_counts_bytes() -> None:
    assert max_tile_elements(f32) == F32_LIMIT == MAX_TILE_BYTES // 4
    assert max_tile_elements(f16) == 2 * F32_LIMIT


@ct.kernel
def k_scale_and_max(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t * 2.0 + ct.max(t))


@pytest.mark.parametrize("backend", ["sim", "interpret"])
def test_the_largest_allowed_tile_compiles_and_computes(
    backend: str, rng: np.random.Generator, restore_backend: None
) -> None:
    ct.set_backend(backend)
    n = F32_LIMIT
    x = rng.standard_normal(n).astype(np.float32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z, _ = k_scale_and_max(ct.zeros(n).partition(n), ct.from_numpy(x)).sync()
    # A tile this large spills registers; on sim, nvJitLink's assembly may say so (once).
    for w in caught:
        assert issubclass(w.category, ct.PerformanceWarning), w
        assert "kernel k_scale_and_max spills registers on sm_80" in str(w.message)
    np.testing.assert_array_equal(z.unpartition().to_numpy(), x * np.float32(2) + x.max())


@pytest.mark.parametrize(
    "dtype,shape",
    [(f32, (F32_LIMIT + 1,)), (f32, (2, F32_LIMIT // 2 + 1)), (f16, (2 * F32_LIMIT + 1,))],
)
def test_one_element_more_is_refused(dtype: Any, shape: tuple[int, ...]) -> None:
    @ct.kernel
    def k(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) + ct.sum(ct.full(shape, 1.0, dtype)).astype(f32))

    with pytest.raises(ct.CompileError, match=f"a tile of {np.prod(shape)} elements"):
        k.ptx(*ARGS)
    ok = (shape[0] - 1,) if len(shape) == 1 else (shape[0], shape[1] - 1)

    @ct.kernel
    def k_ok(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
        z.store(ct.load_tile_like(x, z) + ct.sum(ct.full(ok, 1.0, dtype)).astype(f32))

    assert ".entry" in k_ok.ptx(*ARGS)


def test_layout_planning_does_not_walk_the_elements() -> None:
    """Planning a tile far beyond the limit (built as IR, past the frontend) and asking its
    layout how many registers a thread holds and which one holds an element take as long as
    for a small tile."""
    n = 2147483647
    b = ir.Builder()
    params: tuple[ir.Param, ...] = (ir.TensorParam("z", ir.f32, 1, True, (1,), 1),)
    big = b.broadcast(b.constant(1.0, ir.f32), (n,))
    total = b.reduce("sum", big, 0)
    b.store(0, [b.grid("bid", 0)], total)
    kernel = ir.Kernel("huge", params, (None,), b.region)
    start = time.perf_counter()
    plan = plan_layouts(kernel, ct.Target(80))
    lay = plan.of(big)
    per_thread = -(-n // plan.threads)
    assert lay.count() == per_thread
    for k in range(0, per_thread, per_thread // 16):
        assert lay.index({0: k * plan.threads}) == k
    assert time.perf_counter() - start < 1.0
