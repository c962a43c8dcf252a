"""`ct.RawKernel`: hand-written PTX on sim (vs NumPy), argument conversion and ownership, and
a GPU differential test (the same PTX on cuda and on sim, bit for bit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ptx.parser import PtxParseError
from tests.support.sim_harness import SAXPY

DATA = Path(__file__).parent / "data" / "ptx"


@pytest.fixture
def sim() -> None:
    ct.set_backend("sim")


def test_saxpy_on_sim_matches_numpy(sim: None, rng: np.random.Generator) -> None:
    n = 5000
    x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    a = float(rng.uniform(-2, 2))
    out, tx, ty = ct.full((n,), np.nan), ct.from_numpy(x), ct.from_numpy(y)
    k = ct.RawKernel(SAXPY, "saxpy")
    op = k(out, tx, ty, a, n, grid=-(-n // 256), block=256)
    with pytest.raises(ct.BorrowError, match="raw kernel saxpy"):
        out.to_numpy()  # held exclusively until the op completes
    with pytest.raises(ct.BorrowError):
        tx.to_numpy()  # inputs too: RawKernel cannot know which are read-only
    result = op.sync()
    assert result[0] is out and result[3] == a and result[4] == n
    want = (np.float64(np.float32(a)) * x + y).astype(np.float32)  # fma: one rounding
    np.testing.assert_array_equal(out.to_numpy(), want)


def test_the_same_tensor_twice_is_allowed(sim: None, rng: np.random.Generator) -> None:
    """No aliasing checks apply to raw kernels: y = 2*y + y in place."""
    y = rng.standard_normal(300).astype(np.float32)
    t = ct.from_numpy(y)
    ct.RawKernel(SAXPY, "saxpy")(t, t, t, 2.0, 300, grid=(2, 1, 1), block=(256,)).sync()
    np.testing.assert_array_equal(t.to_numpy(), np.float32(2) * y + y)


def test_nvcc_ptx_through_raw_kernel(sim: None, rng: np.random.Generator) -> None:
    x = rng.standard_normal(512).astype(np.float32)
    out = ct.zeros((2,))
    k = ct.RawKernel((DATA / "parser_sample.ptx").read_text(), "block_sum")
    k(ct.from_numpy(x), out, 512, grid=2, block=256).sync()
    rows = x.reshape(2, 256)
    # A sum near zero loses its relative precision: bound the error by the magnitudes summed.
    atol = 1e-6 * float(np.abs(rows).sum(axis=1).max())
    np.testing.assert_allclose(out.to_numpy(), rows.sum(axis=1), rtol=1e-5, atol=atol)


def test_argument_conversion_errors(sim: None) -> None:
    k = ct.RawKernel(SAXPY, "saxpy")
    t = ct.zeros((4,))
    with pytest.raises(TypeError, match="takes 5 arguments"):
        k(t, t, grid=1, block=32)
    with pytest.raises(TypeError, match=r"parameter 'n' \(.u32\): expected an int"):
        k(t, t, t, 1.0, 2.5, grid=1, block=32)
    with pytest.raises(ValueError, match=r"parameter 'n' \(.u32\): -1 is out of range"):
        k(t, t, t, 1.0, -1, grid=1, block=32)
    with pytest.raises(TypeError, match=r"declare \.u64"):
        k(t, t, t, 1.0, t, grid=1, block=32)
    with pytest.raises(TypeError, match="unpartition"):
        k(ct.zeros((4,)).partition((2,)), t, t, 1.0, 4, grid=1, block=32)
    with pytest.raises(ValueError, match="grid must be"):
        k(t, t, t, 1.0, 4, grid=0, block=32)
    with pytest.raises(ValueError, match=r"no \.entry 'nope'"):
        ct.RawKernel(SAXPY, "nope")
    with pytest.raises(PtxParseError, match="PTX line 4"):
        ct.RawKernel(SAXPY.replace(".address_size 64", ".address_size 64\n%%%"), "saxpy")
    moved = ct.zeros((4,))
    moved.partition((2,))
    with pytest.raises(ct.MovedError, match="parameter 'out'"):
        k(moved, t, t, 1.0, 4, grid=1, block=32)
    t.to_numpy()  # nothing was left held by the failed calls


def test_sim_fault_is_a_launch_error_with_the_simulator_message(sim: None) -> None:
    out, x = ct.zeros((100,)), ct.zeros((100,))
    op = ct.RawKernel(SAXPY, "saxpy")(out, x, x, 1.0, 130, grid=1, block=256)
    with pytest.raises(ct.LaunchError) as e:
        op.sync()
    msg = str(e.value)
    assert msg.startswith("kernel saxpy failed on the device: kernel saxpy, PTX line ")
    assert "ld.global.nc.f32 %f2, [%rd5];" in msg and "block (0, 0, 0) thread (100, 0, 0)" in msg
    assert "out-of-bounds load" in msg
    out.to_numpy()  # the failed op handed its tensors back


def test_interpret_backend_does_not_run_ptx() -> None:
    ct.set_backend("interpret")
    t = ct.zeros((4,))
    op = ct.RawKernel(SAXPY, "saxpy")(t, t, t, 1.0, 4, grid=1, block=32)
    with pytest.raises(ct.LaunchError, match="does not run PTX"):
        op.sync()


INT_HASH = """.version 7.0
.target sm_80
.address_size 64
.visible .entry mix(.param .u64 out, .param .u64 src, .param .u64 fout, .param .u32 n)
{
    .reg .b32 %r<12>;
    .reg .f32 %f<6>;
    .reg .b64 %rd<9>;
    .reg .pred %p1;
    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [src];
    ld.param.u64 %rd8, [fout];
    ld.param.u32 %r11, [n];
    mov.u32 %r1, %tid.x;
    mov.u32 %r2, %ctaid.x;
    mad.lo.u32 %r3, %r2, 256, %r1;
    setp.ge.u32 %p1, %r3, %r11;
    @%p1 ret;
    mul.wide.u32 %rd3, %r3, 4;
    add.u64 %rd4, %rd2, %rd3;
    ld.global.u32 %r4, [%rd4];
    mul.lo.u32 %r5, %r4, -1640531535;
    shf.l.wrap.b32 %r6, %r5, %r5, 13;
    xor.b32 %r7, %r6, %r3;
    mul.hi.u32 %r8, %r7, 0x85EBCA6B;
    prmt.b32 %r9, %r7, %r8, 0x5140;
    popc.b32 %r10, %r9;
    add.u32 %r10, %r10, %r9;
    add.u64 %rd5, %rd1, %rd3;
    st.global.u32 [%rd5], %r10;
    cvt.rn.f32.u32 %f1, %r4;
    mul.rn.f32 %f2, %f1, 0f3F9E3779;
    add.rn.f32 %f3, %f2, 0fC2F6E979;
    div.rn.f32 %f4, %f3, 0f40490FDB;
    sqrt.rn.f32 %f5, %f4;
    add.u64 %rd6, %rd8, %rd3;
    st.global.f32 [%rd6], %f5;
    ret;
}
"""


def test_integer_and_rounded_f32_kernel_on_sim_matches_numpy(
    sim: None, rng: np.random.Generator
) -> None:
    n = 3000
    src = rng.integers(0, 2**32, n, dtype=np.uint32)
    out, fout = ct.zeros((n,), ct.i32), ct.zeros((n,))
    ct.RawKernel(INT_HASH, "mix")(
        out, ct.from_numpy(src.view(np.int32)), fout, n, grid=-(-n // 256), block=256
    ).sync()
    i = np.arange(n, dtype=np.uint32)
    with np.errstate(over="ignore"):
        r5 = src * np.uint32(2654435761)  # -1640531535 as u32
        r6 = (r5 << np.uint32(13)) | (r5 >> np.uint32(19))
        r7 = r6 ^ i
        r8 = ((r7.astype(np.uint64) * 0x85EBCA6B) >> 32).astype(np.uint32)
        # prmt 0x5140: bytes (a0, b0, a1, b1) from low to high
        r9 = (
            (r7 & 0xFF)
            | ((r8 & 0xFF) << 8)
            | (((r7 >> 8) & 0xFF) << 16)
            | (((r8 >> 8) & 0xFF) << 24)
        )
        popc = np.array([bin(int(v)).count("1") for v in r9], dtype=np.uint32)
        want = (popc + r9).view(np.int32)
        c = np.array([0x3F9E3779, 0xC2F6E979, 0x40490FDB], dtype=np.uint32).view(np.float32)
        fwant = np.sqrt((src.astype(np.float32) * c[0] + c[1]) / c[2])
    np.testing.assert_array_equal(out.to_numpy(), want)
    np.testing.assert_array_equal(fout.to_numpy(), fwant)


@pytest.mark.gpu
def test_same_ptx_on_cuda_and_sim_bit_for_bit(rng: np.random.Generator) -> None:
    """Integer work and correctly rounded f32 (.rn add/mul/div/sqrt) agree exactly."""
    n = 10_000
    src = rng.integers(0, 2**32, n, dtype=np.uint32).view(np.int32)
    start = rng.integers(-5, 300, n).astype(np.int32)
    mix = ct.RawKernel(INT_HASH, "mix")
    collatz = ct.RawKernel((DATA / "parser_sample.ptx").read_text(), "collatz")
    results: dict[str, list[np.ndarray]] = {}
    for backend in ("cuda", "sim"):
        ct.set_backend(backend)
        out, fout, steps = ct.zeros((n,), ct.i32), ct.zeros((n,)), ct.full((n,), 7, ct.i32)
        mix(out, ct.from_numpy(src), fout, n, grid=-(-n // 256), block=256).sync()
        collatz(ct.from_numpy(start), steps, n, grid=-(-n // 128), block=128).sync()
        results[backend] = [out.to_numpy(), fout.to_numpy().view(np.uint32), steps.to_numpy()]
    for got_cuda, got_sim in zip(results["cuda"], results["sim"]):
        np.testing.assert_array_equal(got_cuda, got_sim)
