"""wgmma's layouts checked against PTX that nobody here wrote: nvcc 13.0 compiled
`tests/nvcc_oracle/wgmma_layouts.cu` (CUDA C with inline wgmma, its shared-memory layouts,
descriptors and fragment indexing written from the PTX ISA text) for sm_90a. Each kernel
computes a 64 x 32 x 32 product through m64n32k16 (f16, bf16) or m64n32k8 (tf32) wgmmas
with the operands in one of the ISA's canonical layouts (K- or MN-major A and B; no swizzle,
32- or 64-byte swizzle; A in shared memory or registers); the wg2_neg_ kernels run two
warpgroups of a block with imm-scale-a = -1. The accumulators start at 1000, which the first
wgmma's scale-d = 0 discards. The simulator runs each against NumPy's float64 product."""

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
    "wg_k_none_tf32",
    "wg_k_sw32_tf32",
    "wg_k_sw64_tf32",
    "wg_mn_none_f16",
    "wg_mn_sw32_f16",
    "wg_mn_sw64_f16",
    "wg_mn_sw64_bf16",
    "wg_amn_none_f16",
    "wg_amn_sw32_f16",
    "wg_amn_sw64_bf16",
    "wg_reg_k_sw32_f16",
    "wg_reg_mn_sw64_bf16",
    "wg_reg_mn_none_f16",
    "wg2_neg_k_sw64_f16",
    "wg2_neg_k_sw32_tf32",
    "wg2_neg_reg_mn_sw32_bf16",
]


@cache
def module() -> Module:
    return parse(PTX.read_text())


def _bits(x: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Bit patterns of `x` as the kernel's input type, and the values they hold in float64.
    tf32 inputs are f32 patterns with the 13 low mantissa bits already zero, so that
    truncating and rounding readings of tf32 agree."""
    if kind == "f16":
        h = x.astype(np.float16)
        return h.view(np.uint16), h.astype(np.float64)
    if kind == "tf32":
        t = x.astype(np.float32).view(np.uint32) & np.uint32(0xFFFFE000)
        return t, t.view(np.float32).astype(np.float64)
    u = x.astype(np.float32).view(np.uint32)
    top = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)  # round to nearest even
    back = (top.astype(np.uint32) << 16).view(np.float32)
    return top, back.astype(np.float64)


def _launch(ptx: Module, kernel: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    kind = kernel.rsplit("_", 1)[1]
    groups = 2 if kernel.startswith("wg2_") else 1  # warpgroups, 64 rows of D each
    a_bits, a = _bits(rng.standard_normal((groups * M, K)), kind)
    b_bits, b = _bits(rng.standard_normal((K, N)), kind)
    sim = Sim()
    aa, _ = sim.buffer(a_bits)
    ba, _ = sim.buffer(b_bits)
    da, d = sim.buffer(np.full((groups * M, N), np.nan, np.float32))
    program = Program(ptx, kernel, sim.memory)
    params: list[tuple[str, int | float]] = [("u64", aa), ("u64", ba), ("u64", da)]
    run(program, sim.memory, (1, 1, 1), (128 * groups, 1, 1), 0, params, Options())
    sign = -1.0 if "_neg_" in kernel else 1.0  # imm-scale-a = -1
    return d.copy(), sign * (a @ b)


def test_the_ptx_is_nvccs() -> None:
    text = PTX.read_text()
    assert text.startswith("// nvcc: Cuda compilation tools, release")
    for name in KERNELS:
        assert f".entry {name}(" in text
    for needle in ("wgmma.fence.sync.aligned", "wgmma.commit_group.sync.aligned",
                   "wgmma.wait_group.sync.aligned 0", "m64n32k16.f32.f16.f16",
                   "m64n32k16.f32.bf16.bf16", "m64n32k8.f32.tf32.tf32",
                   "fence.proxy.async.shared::cta"):  # fmt: skip
        assert needle in text


@pytest.mark.parametrize("kernel", KERNELS)
def test_each_layout_matches_numpy(kernel: str) -> None:
    for seed in (1, 2):
        got, want = _launch(module(), kernel, seed=seed * 100 + KERNELS.index(kernel))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=kernel)


def _with_descriptor_xor(kernel: str, operand: str, mask: int) -> Module:
    """The PTX with `kernel`'s descriptor of `operand` ("a" or "b") XORed with `mask` just
    before each wgmma (inside the inline-asm scope, so only the instruction sees it)."""
    text = PTX.read_text()
    start = text.index(f".entry {kernel}(")
    end = text.index("\n}\n", start)

    def xor(m: re.Match[str]) -> str:
        reg = m.group(2)
        return f"xor.b64 {reg}, {reg}, {mask};\n\t{m.group(1)}"

    desc = r"(%rd\d+), %rd\d+" if operand == "a" else r"(%rd\d+)"
    pattern = rf"(wgmma\.mma_async[^\n]*?, {desc}, p, [^\n]*)"
    body, count = re.subn(pattern, xor, text[start:end])
    assert count >= 2
    return parse(text[:start] + body + text[end:])


SWIZZLE_64_TO_NONE = 2 << 62
SWIZZLE_32_TO_NONE = 3 << 62
#: LBO 512 <-> SBO 128 of B's MN-major no-swizzle layout: (32 ^ 8) in both 14-bit fields
SWAP_MN_STRIDES = (32 ^ 8) << 16 | (32 ^ 8) << 32
#: the same for A (64 rows): LBO 1024 <-> SBO 128
SWAP_A_MN_STRIDES = (64 ^ 8) << 16 | (64 ^ 8) << 32


@pytest.mark.parametrize(
    ("kernel", "operand", "mask"),
    [("wg_k_sw64_f16", "b", SWIZZLE_64_TO_NONE), ("wg_reg_k_sw32_f16", "b", SWIZZLE_32_TO_NONE),
     ("wg_mn_sw64_f16", "b", SWIZZLE_64_TO_NONE), ("wg_k_sw64_tf32", "a", SWIZZLE_64_TO_NONE),
     ("wg_amn_sw32_f16", "a", SWIZZLE_32_TO_NONE),
     ("wg_mn_none_f16", "b", SWAP_MN_STRIDES), ("wg_reg_mn_none_f16", "b", SWAP_MN_STRIDES),
     ("wg_amn_none_f16", "a", SWAP_A_MN_STRIDES)],
)  # fmt: skip
def test_a_wrong_descriptor_gives_a_wrong_product(kernel: str, operand: str, mask: int) -> None:
    """Planted bugs: the swizzle mode dropped, or the MN-major strides exchanged. The operand
    is then read in another order (a wrong product) or past the block's shared memory."""
    try:
        got, want = _launch(_with_descriptor_xor(kernel, operand, mask), kernel, seed=7)
    except SimError as e:
        assert "out-of-bounds shared wgmma operand read" in str(e)
        assert f"kernel {kernel}" in str(e)
    else:
        assert np.abs(got - want).max() > 1.0


def _with_kernel_text(kernel: str, old: str, new: str) -> Module:
    """The PTX with `old` replaced by `new` in `kernel`'s body only."""
    text = PTX.read_text()
    start = text.index(f".entry {kernel}(")
    end = text.index("\n}\n", start)
    assert old in text[start:end]
    return parse(text[:start] + text[start:end].replace(old, new) + text[end:])


def test_scale_d_true_keeps_the_initial_accumulator() -> None:
    """Planted bug: scale-d forced to true (step >= 0 unsigned), so the accumulators' initial
    1000 is added in."""
    kernel = "wg_k_sw32_f16"
    ptx = _with_kernel_text(kernel, "setp.ne.b32 p,", "setp.ge.u32 p,")
    got, want = _launch(ptx, kernel, seed=3)
    np.testing.assert_allclose(got, want + 1000.0, rtol=1e-5, atol=1e-3)


def test_imm_scale_a_one_does_not_negate() -> None:
    """Planted bug: imm-scale-a 1 in a kernel written for -1."""
    kernel = "wg2_neg_k_sw64_f16"
    got, want = _launch(_with_kernel_text(kernel, "p, -1, 1,", "p, 1, 1,"), kernel, seed=4)
    np.testing.assert_allclose(got, -want, rtol=1e-5, atol=1e-4)
