"""wgmma's layouts checked against PTX that nobody here wrote: nvcc 13.0 compiled
`tests/nvcc_oracle/wgmma_layouts.cu` (CUDA C with inline wgmma, its shared-memory layouts,
descriptors and fragment indexing written from the PTX ISA text) for sm_90a. Each kernel
computes a 64 x 32 x 32 product through two m64n32k16 wgmmas with the operands in one of the
ISA's canonical layouts (K- or MN-major B; no swizzle, 32- or 64-byte swizzle; A in shared
memory or registers; f16 or bf16); the simulator runs it against NumPy's float64 product."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from cutile_py.ptx.ast import Module
from cutile_py.ptx.parser import parse
from cutile_py.sim.context import SimError
from cutile_py.sim.executor import Options, run
from cutile_py.sim.program import Program
from tests.support.sim_harness import Sim

PTX = Path(__file__).parent / "nvcc_oracle" / "wgmma_layouts.ptx"
M, N, K = 64, 32, 32
KERNELS = [
    "wg_k_none_f16",
    "wg_k_sw32_f16",
    "wg_k_sw64_f16",
    "wg_k_sw64_bf16",
    "wg_mn_none_f16",
    "wg_mn_sw32_f16",
    "wg_mn_sw64_f16",
    "wg_mn_sw64_bf16",
    "wg_reg_k_sw32_f16",
    "wg_reg_mn_sw64_bf16",
    "wg_reg_mn_none_f16",
]


@cache
def module() -> Module:
    return parse(PTX.read_text())


def _bits(x: np.ndarray, bf16: bool) -> tuple[np.ndarray, np.ndarray]:
    """16-bit patterns of `x` rounded to f16 or bf16, and the rounded values in float64."""
    if not bf16:
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    u = x.astype(np.float32).view(np.uint32)
    top = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    back = (top.astype(np.uint32) << 16).view(np.float32)
    return top, back.astype(np.float64)


def _launch(ptx: Module, kernel: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    bf16 = kernel.endswith("bf16")
    a_bits, a = _bits(rng.standard_normal((M, K)), bf16)
    b_bits, b = _bits(rng.standard_normal((K, N)), bf16)
    sim = Sim()
    aa, _ = sim.buffer(a_bits)
    ba, _ = sim.buffer(b_bits)
    da, d = sim.buffer(np.full((M, N), np.nan, np.float32))
    program = Program(ptx, kernel, sim.memory)
    params: list[tuple[str, int | float]] = [("u64", aa), ("u64", ba), ("u64", da)]
    run(program, sim.memory, (1, 1, 1), (128, 1, 1), 0, params, Options())
    return d.copy(), a @ b


def test_the_ptx_is_nvccs() -> None:
    text = PTX.read_text()
    assert text.startswith("// nvcc: Cuda compilation tools, release")
    for name in KERNELS:
        assert f".entry {name}(" in text
    for needle in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                   "wgmma.wait_group.sync.aligned 0", "m64n32k16.f32.f16.f16",
                   "m64n32k16.f32.bf16.bf16", "fence.proxy.async.shared::cta"):  # fmt: skip
        assert needle in text


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_layout_matches_numpy(kernel: str) -> None:
    for seed in (1, 2):
        got, want = _launch(module(), kernel, seed=seed * 100 + KERNELS.index(kernel))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=kernel)


def _with_b_descriptor_xor(kernel: str, mask: int) -> Module:
    """The PTX with `kernel`'s B descriptor XORed with `mask` just before each wgmma (inside
    the inline-asm scope, so only the instruction sees the change)."""
    text = PTX.read_text()
    start = text.index(f".entry {kernel}(")
    end = text.index("\n}\n", start)

    def xor(m: re.Match[str]) -> str:
        reg = m.group(2)
        return f"xor.b64 {reg}, {reg}, {mask};\n\t{m.group(1)}"

    pattern = r"(wgmma\.mma_async[^\n]*?, (%rd\d+), p, [^\n]*)"
    body, count = re.subn(pattern, xor, text[start:end])
    assert count == 2
    return parse(text[:start] + body + text[end:])


SWIZZLE_64_TO_NONE = 2 << 62
SWIZZLE_32_TO_NONE = 3 << 62
#: LBO 512 <-> SBO 128 of the MN-major no-swizzle layout: (32 ^ 8) in both 14-bit fields
SWAP_MN_STRIDES = (32 ^ 8) << 16 | (32 ^ 8) << 32


@pytest.mark.parametrize(
    ("kernel", "mask"),
    [("wg_k_sw64_f16", SWIZZLE_64_TO_NONE), ("wg_reg_k_sw32_f16", SWIZZLE_32_TO_NONE),
     ("wg_mn_sw64_f16", SWIZZLE_64_TO_NONE),
     ("wg_mn_none_f16", SWAP_MN_STRIDES), ("wg_reg_mn_none_f16", SWAP_MN_STRIDES)],
)  # fmt: skip
def test_a_wrong_descriptor_gives_a_wrong_product(kernel: str, mask: int) -> None:
    """Planted bugs: the swizzle mode dropped, or the MN-major strides exchanged. B is then
    read in another order (a wrong product) or past the block's shared memory (reported)."""
    try:
        got, want = _launch(_with_b_descriptor_xor(kernel, mask), kernel, seed=7)
    except SimError as e:
        assert "out-of-bounds shared wgmma operand read" in str(e)
        assert f"kernel {kernel}" in str(e)
    else:
        assert np.abs(got - want).max() > 1.0
