"""Host tensor maps: one backend call (`Backend.tensor_map`), two encodings: the simulator's
(`sim.tensor_map.encode_tiled`) on sim, `cuTensorMapEncodeTiled` on cuda (checked here over
the null driver, which records the call), both held to the rules cuda.h documents."""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cutile_py.runtime.sim_backend import SimBackend
from cutile_py.sim.tensor_map import decode

F16, F32, BF16 = 6, 7, 9  # CUtensorMapDataType
SWIZZLE_128B = 3


@pytest.fixture
def null_cuda() -> Iterator[Any]:
    """The real cuda backend over a driver whose calls return at once (and are recorded)."""
    pytest.importorskip("cuda.bindings")
    from cutile_py.runtime import cuda_driver as cu
    from cutile_py.runtime import select
    from paper_repro.experiments.host import null_cuda as make
    from paper_repro.null_driver import NullDriver

    with make(check_arguments=True):
        driver = cu._cu()
        assert isinstance(driver, NullDriver)
        yield driver, select._instances["cuda"]


def test_sim_tensor_map_is_the_simulators_encoding(rng: np.random.Generator) -> None:
    sim = SimBackend()
    rows, cols = (int(x) for x in rng.integers(1, 5000, 2))
    cols = cols * 8  # 16-byte rows of f16
    address = int(rng.integers(1, 1 << 30)) * 16
    raw = sim.tensor_map(F16, address, (cols, rows), (cols * 2,), (64, 128), SWIZZLE_128B)
    assert len(raw) == 128
    m = decode(raw)
    assert (m.address, m.dims, m.strides, m.box) == (address, (cols, rows), (2, cols * 2),
                                                     (64, 128))  # fmt: skip
    assert (m.swizzle, m.esize, m.nan_fill) == (128, 2, False)


def test_cuda_tensor_map_calls_the_driver_with_its_arguments(null_cuda: Any) -> None:
    driver, backend = null_cuda
    from cuda.bindings import driver as real

    raw = backend.tensor_map(BF16, 0x7F0000000100, (96, 1000, 3), (192, 192000), (32, 64, 1), 2)
    assert len(raw) == 128  # the driver's opaque map, as a kernel parameter's bytes
    (args,) = driver.tensor_maps
    dtype, rank, address, dims, strides, box, elem, interleave, swz, l2, oob = args
    assert dtype == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    assert (rank, address) == (3, 0x7F0000000100)
    assert (list(dims), list(strides), list(box), list(elem)) == (
        [96, 1000, 3], [192, 192000], [32, 64, 1], [1, 1, 1]
    )  # fmt: skip
    assert interleave == real.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE
    assert swz == real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_64B
    assert l2 == real.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE
    assert oob == real.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE


BROKEN = [
    # (arguments after dtype: address, dims, strides, box, swizzle), the words of the error
    ((0x1008, (64, 64), (128,), (64, 64), 3), "globalAddress 0x1008 is not 16-byte aligned"),
    ((0x1000, (60, 64), (120,), (64, 64), 0), r"globalStrides\[0\] = 120 is not a positive"),
    ((0x1000, (64, 64), (1 << 40,), (64, 64), 0), r"globalStrides\[0\] = 1099511627776"),
    ((0x1000, (512, 512), (1024,), (64, 257), 0), r"boxDim\[1\] = 257 is not in 1..256"),
    ((0x1000, (64, 64), (128,), (4, 64), 0), r"boxDim\[0\] \* 2 bytes \(float16\) = 8"),
    ((0x1000, (128, 64), (256,), (128, 64), 3), "256 exceeds the 128-byte swizzle span"),
    ((0x1000, (64, 64), (128,), (32, 64), 2 + 0), None),  # fine: 64 bytes in a 64-byte span
    ((0x1000, (8,) * 6, (16,) * 5, (8,) * 6, 0), "tensorRank 6"),
]


@pytest.mark.parametrize(("args", "error"), BROKEN)
def test_both_encodings_hold_the_drivers_rules(
    null_cuda: Any, args: tuple[Any, ...], error: str | None
) -> None:
    """The documented rules (16-byte aligned address, strides multiples of 16 below 2**40,
    boxes of 1..256, inner box bytes a multiple of 16 within the swizzle span, rank <= 5)
    are errors naming the argument on both backends; the driver is not called with them."""
    driver, backend = null_cuda
    for b in (SimBackend(), backend):
        if error is None:
            assert len(b.tensor_map(F16, *args)) == 128
        else:
            with pytest.raises(ValueError, match=error):
                b.tensor_map(F16, *args)
    assert len(driver.tensor_maps) == (1 if error is None else 0)


def test_param_block_passes_a_tensor_map_by_value() -> None:
    """A `.param .align 64 .b8 [128]` gets a 128-byte slot; the driver reads each parameter
    through its pointer, so the bytes must lie there and the next slot after them."""
    from cutile_py.runtime import cuda_driver as cu

    block = cu.ParamBlock(["u64", cu.TENSOR_MAP_PTYPE, "u32", cu.TENSOR_MAP_PTYPE, "f32"])
    rng = np.random.default_rng()
    maps = [rng.integers(0, 256, 128, dtype=np.uint8).tobytes() for _ in range(2)]
    block.pack([0x1234_5678_9ABC, maps[0], 77, maps[1], 1.5])
    pointers = (ctypes.c_void_p * 5).from_address(block.address)
    at = [int(p) for p in pointers]
    assert [b - a for a, b in itertools.pairwise(at)] == [8, 128, 8, 128]
    assert ctypes.string_at(at[1], 128) == maps[0]
    assert ctypes.string_at(at[3], 128) == maps[1]
    assert ctypes.c_uint64.from_address(at[0]).value == 0x1234_5678_9ABC
    assert ctypes.c_uint32.from_address(at[2]).value == 77
    assert ctypes.c_float.from_address(at[4]).value == 1.5
    with pytest.raises(ValueError, match="parameter 1: a tensor map takes 128 bytes"):
        block.pack([1, b"short", 77, maps[1], 1.5])
