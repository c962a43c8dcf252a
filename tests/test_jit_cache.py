"""The in-memory JIT cache: keyed by source and specialization; a changed kernel recompiles."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import numpy as np

import cutile_py as ct
from tests.support import elementwise_kernels as K

B = TypeVar("B")

KERNEL_SOURCE = """
from typing import TypeVar
import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")


@ct.kernel
def scaled(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) * {factor})
"""


def load_module(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_scaled(module: ModuleType, x: np.ndarray) -> np.ndarray:
    (z, _) = module.scaled(ct.zeros(x.shape).partition(16), ct.from_numpy(x)).sync()
    return z.unpartition().to_numpy()  # type: ignore[no-any-return]


def test_second_launch_does_not_recompile() -> None:
    args = lambda: (ct.zeros(100).partition(32), ct.ones(100), ct.ones(100))  # noqa: E731
    K.add(*args()).sync()
    before = ct.cache_info()
    K.add(*args()).sync()
    K.add.ptx(ct.PartitionSpec((100,), (32,)), ct.TensorSpec((100,)), ct.TensorSpec((100,)))
    after_ptx = ct.cache_info()
    K.add.ptx(ct.PartitionSpec((100,), (32,)), ct.TensorSpec((100,)), ct.TensorSpec((100,)))
    after = ct.cache_info()
    assert after_ptx.misses <= before.misses + 1  # PTX for a new target may compile once
    assert after.misses == after_ptx.misses
    assert after.hits > before.hits


def test_new_tile_shape_or_constant_compiles_a_new_variant() -> None:
    K.add(ct.zeros(100).partition(32), ct.ones(100), ct.ones(100)).sync()
    before = ct.cache_info().misses
    K.add(ct.zeros(100).partition(64), ct.ones(100), ct.ones(100)).sync()
    assert ct.cache_info().misses == before + 1


def test_changed_source_recompiles(tmp_path: Path, rng: np.random.Generator) -> None:
    x = rng.standard_normal(50).astype(np.float32)
    path = tmp_path / "user_kernels.py"
    path.write_text(KERNEL_SOURCE.format(factor="2.0"))
    first = load_module(path, "user_kernels_v1")
    np.testing.assert_array_equal(run_scaled(first, x), x * np.float32(2))
    misses = ct.cache_info().misses
    run_scaled(first, x)
    assert ct.cache_info().misses == misses

    path.write_text(KERNEL_SOURCE.format(factor="3.0"))
    second = load_module(path, "user_kernels_v2")
    np.testing.assert_array_equal(run_scaled(second, x), x * np.float32(3))
    assert ct.cache_info().misses == misses + 1


def test_ir_printer_is_deterministic_and_readable() -> None:
    args = (
        ct.PartitionSpec((200, 130), (64, 48)),
        ct.TensorSpec((200, 130)),
        ct.TensorSpec((200, 130)),
    )
    text = K.scale_add_2d.ir(*args)
    assert text == K.scale_add_2d.ir(*args)
    assert text.startswith("kernel scale_add_2d(@0: partition<f32; 64, 48; align 2> z,")
    assert "load[param=1 shape=(64, 48) padding=0]" in text
    assert "unary[exp]" in text and "binary[max]" in text


SCALE = 2.0


@ct.kernel
def scaled_by_global(z: ct.Mut[ct.Tensor[ct.f32, B]]) -> None:
    z.store(ct.full(z.shape, SCALE, ct.f32))


def make_filler(value: float) -> ct.Kernel:
    @ct.kernel
    def fill(z: ct.Mut[ct.Tensor[ct.f32, B]]) -> None:
        z.store(ct.full(z.shape, value, ct.f32))

    return fill


def test_changed_global_or_closure_value_recompiles() -> None:
    global SCALE

    def run(k: ct.Kernel) -> np.ndarray:
        return k(ct.zeros(4).partition(4)).sync()[0].unpartition().to_numpy()  # type: ignore[no-any-return]

    np.testing.assert_array_equal(run(scaled_by_global), 2.0)
    SCALE = 3.0
    try:
        np.testing.assert_array_equal(run(scaled_by_global), 3.0)
    finally:
        SCALE = 2.0
    np.testing.assert_array_equal(run(make_filler(2.0)), 2.0)
    np.testing.assert_array_equal(run(make_filler(5.0)), 5.0)
