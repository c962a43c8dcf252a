"""The simulator against PTX that nobody here wrote.

Every kernel in `tests/sim_oracle/*.cu` was compiled to PTX by nvcc (`regenerate.sh`; the PTX is
committed, so these tests need no nvcc). Each test launches that PTX with `ct.RawKernel` on the
`sim` backend on fresh random inputs (the seed is printed) and compares every output element
with a NumPy reference written from the meaning of the CUDA C: bit-exact for integer and
correctly rounded float work, within the documented error for approximate intrinsics, and for
`mma.sync` against float64 `A @ B + C` with the operands rounded to the input precision first.

Planted faults (an out-of-bounds store, a shared-memory race, a misaligned vector load, ...) must
raise `ct.LaunchError` naming the kernel, the PTX line, a block and a thread.

`@pytest.mark.gpu` tests run the same PTX on `cuda` and on `sim`: bit-identical where the work
is exact, and both within the reference's tolerance everywhere.
"""

from __future__ import annotations

import functools
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import cutile_py as ct

ORACLE = Path(__file__).parent / "sim_oracle"

Arg = np.ndarray | int | float
Outputs = list[np.ndarray]
Check = Callable[[Outputs], None]

I32_MIN, I32_MAX = -(2**31), 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
M32, M64 = 2**32 - 1, 2**64 - 1


# ---------------------------------------------------------------------------------------------
# Launching


@cache
def ptx_text(stem: str) -> str:
    return (ORACLE / f"{stem}.ptx").read_text()


@dataclass
class Setup:
    """One launch: arguments (arrays are uploaded fresh for every launch), shape, and checks."""

    args: list[Arg]
    grid: int | tuple[int, ...]
    block: int | tuple[int, ...]
    #: Compares the arrays after the launch (every array argument, in order) with NumPy.
    check: Check
    shared_mem: int = 0
    #: Maps the arrays to a form that is identical on every correct run (sorted atomic tickets,
    #: ...) for the differential test; None: the arrays themselves.
    canon: Callable[[Outputs], Outputs] | None = None


def dim3(d: int | tuple[int, ...]) -> tuple[int, int, int]:
    t = (d, 1, 1) if isinstance(d, int) else (*d, 1, 1)
    return (t[0], t[1], t[2])


def launch(stem: str, kernel: str, setup: Setup, backend: str = "sim") -> Outputs:
    """Run `kernel` of `sim_oracle/<stem>.ptx` on `backend`; returns every array argument."""
    ct.set_backend(backend)
    args = [ct.from_numpy(a) if isinstance(a, np.ndarray) else a for a in setup.args]
    op = ct.RawKernel(ptx_text(stem), kernel)(
        *args, grid=dim3(setup.grid), block=dim3(setup.block), shared_mem=setup.shared_mem
    )
    result = op.sync()
    return [r.to_numpy() for r in result if isinstance(r, ct.Tensor)]


# ---------------------------------------------------------------------------------------------
# Comparison helpers


def bits(a: np.ndarray) -> np.ndarray:
    """The raw bits of `a` as unsigned integers of the same width."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def u32(values: Sequence[int] | np.ndarray) -> np.ndarray:
    """Python ints (any sign) as 32-bit patterns, stored as int32 (the tensor dtype)."""
    return (np.asarray(values, dtype=object) & M32).astype(np.uint32).view(np.int32)


def u64(values: Sequence[int] | np.ndarray) -> np.ndarray:
    return (np.asarray(values, dtype=object) & M64).astype(np.uint64).view(np.int64)


def describe(index: int, inputs: dict[str, np.ndarray]) -> str:
    parts = []
    for name, arr in inputs.items():
        v = arr.reshape(-1)[index]
        if arr.dtype.kind == "f":
            parts.append(f"{name}={v!r} ({int(bits(arr).reshape(-1)[index]):#x})")
        else:
            parts.append(f"{name}={int(v)}")
    return ", ".join(parts)


def expect_bits(
    got: np.ndarray,
    want: np.ndarray,
    what: str,
    inputs: dict[str, np.ndarray] | None = None,
    ignore: np.ndarray | None = None,
) -> None:
    """Bit-identical, element by element; `ignore` masks elements out of the comparison."""
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(np.asarray(want).astype(got.dtype))
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = bits(got) != bits(want)
    if ignore is not None:
        bad &= ~ignore
    if not bad.any():
        return
    idx = np.flatnonzero(bad)
    lines = [f"{what}: {idx.size} of {bad.size} elements differ; first ones:"]
    for i in idx[:6]:
        g, w = got.reshape(-1)[i], want.reshape(-1)[i]
        gb, wb = int(bits(got).reshape(-1)[i]), int(bits(want).reshape(-1)[i])
        line = f"  [{i}] got {g!r} ({gb:#x}), want {w!r} ({wb:#x})"
        if inputs:
            line += f"  <- {describe(int(i), inputs)}"
        lines.append(line)
    raise AssertionError("\n".join(lines))


def expect_nan_where(got: np.ndarray, where: np.ndarray, what: str, kind: str) -> None:
    """Elements at `where` are NaN (any payload) in the format `kind` (f16, bf16, f32 bits)."""
    b = bits(got).astype(np.uint64)
    exp_mask, man_mask = {
        "f16": (0x7C00, 0x3FF),
        "bf16": (0x7F80, 0x7F),
        "f32": (0x7F800000, 0x7FFFFF),
    }[kind]
    is_nan = ((b & exp_mask) == exp_mask) & ((b & man_mask) != 0)
    missing = where & ~is_nan
    assert not missing.any(), f"{what}: NaN input did not give NaN at {np.flatnonzero(missing)[:6]}"


def expect_rows(
    got: np.ndarray,
    want: np.ndarray,
    names: Sequence[str],
    inputs: dict[str, np.ndarray],
    ignore: dict[str, np.ndarray] | None = None,
) -> None:
    """Row k of `got` (one operation per row) equals row k of `want`, bit for bit."""
    n = want.shape[-1]
    got = got.reshape(len(names), n)
    failures = []
    for k, name in enumerate(names):
        try:
            expect_bits(got[k], want[k], name, inputs, None if ignore is None else ignore.get(name))
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, "\n".join(failures)


def f32_ulp(x: np.ndarray) -> np.ndarray:
    """The spacing of float32 at |x| (x in float64)."""
    spacing: np.ndarray = np.spacing(np.abs(x).astype(np.float32)).astype(np.float64)
    return spacing


def expect_close(
    got: np.ndarray,
    ref: np.ndarray,
    what: str,
    inputs: dict[str, np.ndarray],
    *,
    atol: float | np.ndarray = 0.0,
    rtol: float = 0.0,
    ulps: float = 0.0,
) -> None:
    """|got - ref| <= atol + rtol |ref| + ulps * ulp_f32(ref), with `ref` in float64."""
    g = got.astype(np.float64).reshape(-1)
    r = np.asarray(ref, dtype=np.float64).reshape(-1)
    assert g.shape == r.shape, f"{what}: {g.size} results for {r.size} references"
    err = np.abs(g - r)
    tol = np.broadcast_to(atol, np.shape(ref)).reshape(-1) + rtol * np.abs(r) + ulps * f32_ulp(r)
    bad = ~(err <= tol)
    if not bad.any():
        return
    idx = np.flatnonzero(bad)
    idx = idx[np.argsort(-(err[idx] / np.maximum(tol[idx], 1e-300)))]
    ulp = f32_ulp(r)
    lines = [f"{what}: {bad.sum()} of {bad.size} elements outside tolerance; worst ones:"]
    for i in idx[:6]:
        lines.append(
            f"  [{i}] got {g[i]!r}, want {r[i]!r} (err {err[i]:.3g} = {err[i] / ulp[i]:.3g} ulp,"
            f" tolerance {tol[i]:.3g})  <- {describe(int(i), inputs)}"
        )
    raise AssertionError("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# Exact rounding of rationals to binary floating point

FORMATS = {"f32": (23, -126, 127), "f16": (10, -14, 15), "bf16": (7, -126, 127)}


def round_frac(v: Fraction, mode: str, fmt: str = "f32") -> float:
    """`v` rounded to `fmt` in `mode` (rn, rz, rd, ru, rna), subnormals and overflow included.

    An exact zero comes back as +0.0 (the caller applies IEEE's sign rules)."""
    man, emin, emax = FORMATS[fmt]
    if v == 0:
        return 0.0
    neg = v < 0
    m = -v if neg else v
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    e = max(e, emin)
    ulp = Fraction(2) ** (e - man)
    q = m / ulp
    n = q.numerator // q.denominator
    rem = q - n
    if rem:
        if mode == "rn":
            up = rem > Fraction(1, 2) or (rem == Fraction(1, 2) and n % 2 == 1)
        elif mode == "rna":
            up = rem >= Fraction(1, 2)
        elif mode == "rz":
            up = False
        elif mode == "ru":
            up = not neg
        elif mode == "rd":
            up = neg
        else:
            raise ValueError(mode)
        n += int(up)
    r = n * ulp
    largest = (2 - Fraction(2) ** -man) * Fraction(2) ** emax
    if r > largest:
        to_inf = mode in ("rn", "rna") or (mode == "ru" and not neg) or (mode == "rd" and neg)
        res = math.inf if to_inf else float(largest)
    else:
        res = float(r)
    return -res if neg else res


def f32_from_frac(v: Fraction, mode: str, zero_sign: float = 1.0) -> float:
    r = round_frac(v, mode)
    if v == 0:
        r = math.copysign(0.0, zero_sign)
    return float(np.float32(r))


def sqrt_f32(x: float, mode: str) -> float:
    """The f32 square root of the f32 value `x` >= 0, exactly rounded in `mode`."""
    if x == 0:
        return x
    fx = Fraction(x)
    c = np.float32(math.sqrt(x))
    if Fraction(float(c)) ** 2 == fx:
        return float(c)
    if Fraction(float(c)) ** 2 < fx:
        lo, hi = c, np.float32(np.nextafter(c, np.float32(np.inf)))
    else:
        lo, hi = np.float32(np.nextafter(c, np.float32(0))), c
    assert Fraction(float(lo)) ** 2 < fx < Fraction(float(hi)) ** 2
    if mode in ("rz", "rd"):
        return float(lo)
    if mode == "ru":
        return float(hi)
    mid = (Fraction(float(lo)) + Fraction(float(hi))) / 2
    return float(hi if mid * mid < fx else lo)


def f16_bits(value: float) -> int:
    return int(np.array(value, dtype=np.float16).view(np.uint16))


def bf16_bits(value: float) -> int:
    """Bits of a value that is exactly a bf16 (or +-inf)."""
    return int(np.array(value, dtype=np.float32).view(np.uint32)) >> 16


def bf16_round_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, round to nearest even (finite inputs)."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)


def tf32_rna_bits(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 on finite inputs: nearest, ties away from zero, low 13 bits cleared."""
    b = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((b + 0x1000) & 0xFFFFE000).astype(np.uint32)


def wrap(v: int, width: int = 32) -> int:
    """Two's-complement wrap of a Python int to a signed `width`-bit value."""
    v &= (1 << width) - 1
    return v - (1 << width) if v >> (width - 1) else v


def tdiv(a: int, b: int) -> int:
    """C division: truncates toward zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


# ---------------------------------------------------------------------------------------------
# Random inputs


def mixed_i32(rng: np.random.Generator, n: int) -> np.ndarray:
    """Full-range, small and special int32 values, shuffled."""
    specials = np.array(
        [0, 1, -1, 2, -2, I32_MIN, I32_MAX, I32_MIN + 1, 255, 256, -256], dtype=np.int64
    )
    full = rng.integers(I32_MIN, I32_MAX, n, endpoint=True)
    small = rng.integers(-40, 40, n, endpoint=True)
    pick = rng.integers(0, 3, n)
    out = np.where(pick == 0, full, np.where(pick == 1, small, rng.choice(specials, n)))
    return out.astype(np.int32)


def mixed_i64(rng: np.random.Generator, n: int) -> np.ndarray:
    specials = np.array(
        [0, 1, -1, I64_MIN, I64_MAX, I32_MIN, I32_MAX, 2**32, -(2**32)], dtype=np.int64
    )
    full = rng.integers(I64_MIN, I64_MAX, n, endpoint=True, dtype=np.int64)
    small = rng.integers(-40, 40, n, endpoint=True, dtype=np.int64)
    mid = rng.integers(-(2**40), 2**40, n, dtype=np.int64)
    pick = rng.integers(0, 4, n)
    out = np.where(
        pick == 0,
        full,
        np.where(pick == 1, small, np.where(pick == 2, mid, rng.choice(specials, n))),
    )
    return out.astype(np.int64)


def wide_f32(rng: np.random.Generator, n: int, lo: int, hi: int) -> np.ndarray:
    """Normal values scaled by 2**k, k uniform in [lo, hi]; random signs."""
    return (rng.standard_normal(n) * np.exp2(rng.integers(lo, hi, n, endpoint=True))).astype(
        np.float32
    )


def eighths(rng: np.random.Generator, n: int, k: int = 1000) -> np.ndarray:
    """Multiples of 1/8: their sums in f32 are exact in any order (for modest n)."""
    return (rng.integers(-k, k, n, endpoint=True) / 8).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    id: str
    stem: str
    kernel: str
    make: Callable[[np.random.Generator], Setup]
    #: Bit-identical on cuda and sim (else: both within the reference's tolerance).
    exact: bool = True
    marks: list[pytest.MarkDecorator] = field(default_factory=list)


CASES: list[Case] = []


def case(
    stem: str, kernel: str, id: str | None = None, exact: bool = True
) -> Callable[[Callable[[np.random.Generator], Setup]], Callable[[np.random.Generator], Setup]]:
    def register(
        make: Callable[[np.random.Generator], Setup],
    ) -> Callable[[np.random.Generator], Setup]:
        CASES.append(Case(id or kernel, stem, kernel, make, exact))
        return make

    return register


# --- warp shuffles ----------------------------------------------------------------------------


def shfl_ref(vals: np.ndarray, mode: str, b: np.ndarray | int, width: int) -> np.ndarray:
    """shfl.sync as the PTX ISA defines it, with CUDA's clamp operand for `width`."""
    c = (32 - width) << 8
    if mode != "up":
        c |= 0x1F
    w = vals.reshape(-1, 32)
    lane = np.arange(32)[None, :]
    bval = (
        np.broadcast_to(np.asarray(b, dtype=np.int64).reshape(-1, 32) if np.ndim(b) else b, w.shape)
        & 0x1F
    )
    cval, seg = c & 0x1F, (c >> 8) & 0x1F
    max_lane = (lane & seg) | (cval & ~seg & 0x1F)
    min_lane = lane & seg
    if mode == "up":
        j = lane - bval
        ok = j >= max_lane
    elif mode == "down":
        j = lane + bval
        ok = j <= max_lane
    elif mode == "bfly":
        j = lane ^ bval
        ok = j <= max_lane
    else:
        j = min_lane | (bval & ~seg & 0x1F)
        ok = j <= max_lane
    j = np.where(ok, j, np.broadcast_to(lane, w.shape))
    return np.take_along_axis(w, j, axis=1).reshape(vals.shape)


def make_shfl(mode: str, width: int) -> Callable[[np.random.Generator], Setup]:
    kernel = SHFL_KERNELS[mode]
    total = 256

    def make(rng: np.random.Generator) -> Setup:
        out = np.full(total, -7, dtype=np.int32)
        if mode == "idx":
            x = mixed_i32(rng, total)
            src = rng.integers(-40, 80, total).astype(np.int32)
            args: list[Arg] = [x, src, out, width]
            b: np.ndarray | int = src.astype(np.int64)
            outpos = 2
        elif mode == "up":
            x = rng.standard_normal(total).astype(np.float32)
            out = out.view(np.float32)
            b = int(rng.integers(0, 32))
            args = [x, out, b, width]
            outpos = 1
        elif mode == "down":
            x = mixed_i32(rng, total)
            b = int(rng.integers(0, 32))
            args = [x, out, b, width]
            outpos = 1
        else:
            x = rng.standard_normal(total).astype(np.float32)
            out = out.view(np.float32)
            b = int(rng.integers(0, 32))
            args = [x, out, b, width]
            outpos = 1
        want = shfl_ref(x, mode, b, width)

        def check(o: Outputs) -> None:
            expect_bits(
                o[outpos], want, f"{kernel} width={width} b={b}", {"lane_in": np.arange(total) % 32}
            )

        return Setup(args, grid=2, block=128, check=check)

    return make


SHFL_KERNELS = {"idx": "shfl_idx", "up": "shfl_up", "down": "shfl_down", "bfly": "shfl_xor"}
for _w in (4, 8, 16, 32):
    for _m, _k in SHFL_KERNELS.items():
        case("warp_shuffle", _k, id=f"{_k}_width{_w}")(make_shfl(_m, _w))


@case("warp_shuffle", "shfl_idx_w8")
def _shfl_idx_w8(rng: np.random.Generator) -> Setup:
    x = rng.standard_normal(128).astype(np.float32)
    src = rng.integers(0, 32, 128).astype(np.int32)
    want = shfl_ref(x, "idx", src.astype(np.int64), 8)
    return Setup(
        [x, src, np.zeros(128, np.float32)],
        grid=1,
        block=128,
        check=lambda o: expect_bits(o[2], want, "shfl_idx_w8", {"src": src}),
    )


@case("warp_shuffle", "shfl_xor_i64")
def _shfl_xor_i64(rng: np.random.Generator) -> Setup:
    x = mixed_i64(rng, 128)
    mask, width = int(rng.integers(1, 16)), 16
    want = shfl_ref(x, "bfly", mask, width)
    return Setup(
        [x, np.zeros(128, np.int64), mask, width],
        grid=2,
        block=64,
        check=lambda o: expect_bits(o[1], want, f"shfl_xor_i64 mask={mask}"),
    )


@case("warp_reduce", "warp_reduce")
def _warp_reduce(rng: np.random.Generator) -> Setup:
    total = 256
    n = int(rng.integers(200, 250))
    x = rng.standard_normal(total).astype(np.float32)
    y = mixed_i32(rng, total)
    i = np.arange(total)
    v = np.where(i < n, x, np.float32(0)).reshape(-1, 32)
    for off in (16, 8, 4, 2, 1):
        v = v + v[:, np.arange(32) ^ off]
    m = np.where(i < n, y, I32_MIN).reshape(-1, 32)
    for off in (16, 8, 4, 2, 1):
        j = np.arange(32) + off
        m = np.maximum(m, m[:, np.where(j < 32, j, np.arange(32))])

    def check(o: Outputs) -> None:
        expect_bits(o[2], v.reshape(-1), "butterfly f32 sum")
        expect_bits(o[3], m.reshape(-1), "shuffle-down i32 max")

    return Setup(
        [x, y, np.zeros(total, np.float32), np.zeros(total, np.int32), n],
        grid=2,
        block=128,
        check=check,
    )


@case("warp_vote", "warp_vote")
def _warp_vote(rng: np.random.Generator) -> Setup:
    total = 128
    x = rng.integers(-100, 100, total, endpoint=True).astype(np.int32)
    w = x.reshape(-1, 32)
    w[0] = np.maximum(w[0], -90)  # all() true in warp 0
    w[1, 5] = -95  # all() false in warp 1
    w[2, 17] = 7  # any() true in warp 2
    w[3][w[3] == 7] = 8  # any() false in warp 3
    lane_bit = (1 << np.arange(32, dtype=np.int64))[None, :]
    ballot = ((w > 0) * lane_bit).sum(axis=1)
    anyv = (w == 7).any(axis=1).astype(np.int64)
    allv = (w >= -90).all(axis=1).astype(np.int64)
    popc = (w & 1).astype(bool).sum(axis=1)
    rows = [np.repeat(r, 32) for r in (ballot, anyv, allv, popc)]
    want = u32(np.stack(rows).astype(object))
    names = ["ballot(v>0)", "any(v==7)", "all(v>=-90)", "popc(ballot(v&1))"]
    return Setup(
        [x, np.zeros(4 * total, np.int32)],
        grid=2,
        block=64,
        check=lambda o: expect_rows(o[1], want, names, {"x": x}),
    )


@case("warp_vote", "warp_match")
def _warp_match(rng: np.random.Generator) -> Setup:
    total = 128
    x = rng.integers(-2000, 2000, total).astype(np.int32)
    w = x.reshape(-1, 32)
    w[0] = 256 * 3 + rng.integers(0, 256, 32)  # v >> 8 is the same on every lane of warp 0
    w[2] = -256 * 5 + rng.integers(0, 256, 32)
    lane_bit = (1 << np.arange(32, dtype=np.int64))[None, :]
    key = w & 3
    match_any = ((key[:, :, None] == key[:, None, :]) * lane_bit[:, None, :]).sum(axis=2)
    same = (w >> 8 == (w >> 8)[:, :1]).all(axis=1)
    rows = [
        match_any.reshape(-1),
        np.repeat(np.where(same, M32, 0), 32),
        np.repeat(same.astype(np.int64), 32),
    ]
    want = u32(np.stack(rows).astype(object))
    names = ["match_any(v&3)", "match_all(v>>8)", "match_all predicate"]
    return Setup(
        [x, np.zeros(3 * total, np.int32)],
        grid=2,
        block=64,
        check=lambda o: expect_rows(o[1], want, names, {"x": x}),
    )


@case("warp_vote", "warp_redux")
def _warp_redux(rng: np.random.Generator) -> Setup:
    total = 128
    x = mixed_i32(rng, total)
    w = x.astype(np.int64).reshape(-1, 32)
    uw = w & M32
    red = [
        [wrap(int(r.sum())) for r in w],
        w.min(axis=1).tolist(),
        w.max(axis=1).tolist(),
        uw.min(axis=1).tolist(),
        uw.max(axis=1).tolist(),
        [functools.reduce(operator.and_, r.tolist()) for r in uw],
        [functools.reduce(operator.or_, r.tolist()) for r in uw],
        [functools.reduce(operator.xor, r.tolist()) for r in uw],
    ]
    want = u32(np.repeat(np.array(red, dtype=object), 32, axis=1))
    names = ["add.s32", "min.s32", "max.s32", "min.u32", "max.u32", "and", "or", "xor"]
    return Setup(
        [x, np.zeros(8 * total, np.int32)],
        grid=2,
        block=64,
        check=lambda o: expect_rows(o[1], want, names, {"x": x}),
    )


# --- shared-memory block reductions ----------------------------------------------------------


@case("block_reduce", "block_reduce_sum")
def _block_reduce_sum(rng: np.random.Generator) -> Setup:
    bs = 256
    n = int(rng.integers(3 * 2 * bs + 1, 4 * 2 * bs))
    grid = -(-n // (2 * bs))
    x = rng.standard_normal(n).astype(np.float32)
    xp = np.zeros(grid * 2 * bs, np.float32)
    xp[:n] = x
    blocks = xp.reshape(grid, 2, bs)
    i = np.arange(grid)[:, None] * 2 * bs + np.arange(bs)[None, :]
    v = np.where(i + bs < n, blocks[:, 0] + blocks[:, 1], blocks[:, 0])
    s = bs // 2
    while s > 0:
        v[:, :s] = v[:, :s] + v[:, s : 2 * s]
        s //= 2
    want = v[:, 0].copy()
    return Setup(
        [x, np.full(grid, np.nan, np.float32), n],
        grid=grid,
        block=bs,
        check=lambda o: expect_bits(o[1], want, "per-block tree sum"),
    )


@case("block_reduce", "block_reduce_minmax")
def _block_reduce_minmax(rng: np.random.Generator) -> Setup:
    bs = 256
    n = int(rng.integers(2 * bs + 1, 3 * bs))
    grid = -(-n // bs)
    x = mixed_i32(rng, n)
    want = np.array(
        [[x[b * bs : (b + 1) * bs].min(), x[b * bs : (b + 1) * bs].max()] for b in range(grid)]
    )
    return Setup(
        [x, np.zeros(2 * grid, np.int32), n],
        grid=grid,
        block=bs,
        check=lambda o: expect_bits(o[1], want.reshape(-1), "per-block (min, max)"),
    )


@case("block_reduce", "block_reduce_dyn")
def _block_reduce_dyn(rng: np.random.Generator) -> Setup:
    bs = 64
    n = int(rng.integers(3 * bs + 1, 4 * bs))
    grid = -(-n // bs)
    x = mixed_i64(rng, n)
    want = u64([sum(int(v) for v in x[b * bs : (b + 1) * bs]) for b in range(grid)])
    return Setup(
        [x, np.zeros(grid, np.int64), n],
        grid=grid,
        block=bs,
        shared_mem=bs * 8,
        check=lambda o: expect_bits(o[1], want, "per-block i64 sum (dynamic shared memory)"),
    )


# --- tensor cores ----------------------------------------------------------------------------


def mma_check(d: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray, what: str) -> None:
    """D = A @ B + C within f32-accumulation error (A, B already in the input precision)."""
    ref = a @ b + c
    scale = np.abs(a) @ np.abs(b) + np.abs(c)
    expect_close(
        d.reshape(ref.shape),
        ref,
        what,
        {
            "row": np.repeat(np.arange(ref.shape[0]), ref.shape[1]),
            "col": np.tile(np.arange(ref.shape[1]), ref.shape[0]),
        },
        atol=2.0**-16 * scale,
    )


def make_mma16(dtype: str) -> Callable[[np.random.Generator], Setup]:
    def make(rng: np.random.Generator) -> Setup:
        m, n, k = 32, 16, 32
        if dtype == "f16":
            a16 = rng.standard_normal((m, k)).astype(np.float16)
            b16 = rng.standard_normal((k, n)).astype(np.float16)
            abits, bbits = a16.view(np.uint16), b16.view(np.uint16)
            a64, b64 = a16.astype(np.float64), b16.astype(np.float64)
        else:
            abits = bf16_round_bits(rng.standard_normal((m, k)).astype(np.float32) * 3)
            bbits = bf16_round_bits(rng.standard_normal((k, n)).astype(np.float32))
            a64 = (abits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
            b64 = (bbits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
        c = rng.standard_normal((m, n)).astype(np.float32)
        args: list[Arg] = [
            abits.reshape(-1).view(np.int32),
            bbits.reshape(-1).view(np.int32),
            c.reshape(-1),
            np.full(m * n, np.nan, np.float32),
            m,
            n,
            k,
        ]
        return Setup(
            args,
            grid=(n // 8, m // 16),
            block=32,
            check=lambda o: mma_check(
                o[3], a64, b64, c.astype(np.float64), f"mma m16n8k16 {dtype}"
            ),
        )

    return make


case("mma_m16n8k16", "mma_f16_m16n8k16", exact=False)(make_mma16("f16"))
case("mma_m16n8k16", "mma_bf16_m16n8k16", exact=False)(make_mma16("bf16"))


@case("mma_trans", "mma_f16_kmajor", exact=False)
def _mma_trans(rng: np.random.Generator) -> Setup:
    """ldmatrix.x4.trans for A given (K, M) and for two n tiles of B given (K, N)."""
    m, n, k = 32, 32, 48
    at = rng.standard_normal((k, m)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = rng.standard_normal((m, n)).astype(np.float32)
    args: list[Arg] = [
        at.view(np.uint16).reshape(-1).view(np.int32),
        b.view(np.uint16).reshape(-1).view(np.int32),
        c.reshape(-1),
        np.full(m * n, np.nan, np.float32),
        m,
        n,
        k,
    ]
    a64, b64 = at.T.astype(np.float64), b.astype(np.float64)
    return Setup(
        args,
        grid=(n // 16, m // 16),
        block=32,
        check=lambda o: mma_check(o[3], a64, b64, c.astype(np.float64), "ldmatrix.x4.trans"),
    )


@case("mma_tf32", "mma_tf32_m16n8k8", exact=False)
def _mma_tf32(rng: np.random.Generator) -> Setup:
    m, n, k = 32, 16, 16
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = rng.standard_normal((m, n)).astype(np.float32)
    ar, br = tf32_rna_bits(a), tf32_rna_bits(b)
    a64, b64 = ar.view(np.float32).astype(np.float64), br.view(np.float32).astype(np.float64)

    def check(o: Outputs) -> None:
        expect_bits(
            o[4],
            ar.reshape(-1).view(np.int32),
            "cvt.rna.tf32.f32 of A (via ldmatrix fragments)",
            {"a": a.reshape(-1)},
        )
        mma_check(o[3], a64, b64, c.astype(np.float64), "mma m16n8k8 tf32")

    args: list[Arg] = [
        a.reshape(-1),
        b.reshape(-1),
        c.reshape(-1),
        np.full(m * n, np.nan, np.float32),
        np.zeros(m * k, np.int32),
        m,
        n,
        k,
    ]
    return Setup(args, grid=(n // 8, m // 16), block=32, check=check)


# --- cp.async --------------------------------------------------------------------------------


@case("cp_async", "cp_async_scale")
def _cp_async(rng: np.random.Generator) -> Setup:
    tile = 256
    n = int(rng.integers(700, 1100))
    ntiles = -(-n // tile)
    x = rng.standard_normal(n).astype(np.float32)
    scale = np.float32(rng.uniform(-3, 3))
    xp = np.zeros(ntiles * tile, np.float32)
    xp[:n] = x
    want = scale * xp  # past n: scale * 0 from the zero fill
    return Setup(
        [x, np.full(ntiles * tile, 777.0, np.float32), n, float(scale)],
        grid=2,
        block=64,
        check=lambda o: expect_bits(
            o[1],
            want,
            f"y = {scale} * x (n={n}, zero-filled to {ntiles * tile})",
            {"i": np.arange(ntiles * tile)},
        ),
    )


@case("cp_async", "cp_async_small")
def _cp_async_small(rng: np.random.Generator) -> Setup:
    t, grid = 64, 2
    x = rng.standard_normal(grid * 4 * t).astype(np.float32)
    xb = x.reshape(grid, 4 * t)
    u = t - 1 - np.arange(t)
    first = xb[:, 2 * u]
    second = xb[:, 2 * t + 2 * u] + xb[:, 2 * t + 2 * u + 1]
    want = np.concatenate([first, second], axis=1).reshape(-1)
    return Setup(
        [x, np.full(grid * 2 * t, 777.0, np.float32)],
        grid=grid,
        block=t,
        shared_mem=16 * t,
        check=lambda o: expect_bits(o[1], want, "cp.async.ca 4 and 8 bytes"),
    )


# --- atomics ---------------------------------------------------------------------------------


@case("atomics", "atomic_ticket")
def _atomic_ticket(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(500, 700))

    def check(o: Outputs) -> None:
        expect_bits(o[0], np.array([n], np.int32), "final counter")
        expect_bits(
            np.sort(o[1]), np.arange(n, dtype=np.int32), "sorted tickets (atomicAdd old values)"
        )

    return Setup(
        [np.zeros(1, np.int32), np.full(n, -1, np.int32), n],
        grid=3,
        block=256,
        check=check,
        canon=lambda o: [o[0], np.sort(o[1])],
    )


@case("atomics", "atomic_sum")
def _atomic_sum(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(500, 700))
    xi = mixed_i32(rng, n)
    xf = eighths(rng, n)
    xl = mixed_i64(rng, n)
    i0, f0, l0 = int(rng.integers(I32_MIN, I32_MAX)), eighths(rng, 1), mixed_i64(rng, 1)
    want_i = wrap(i0 + sum(int(v) for v in xi))
    want_f = np.float32(float(f0[0]) + float(xf.astype(np.float64).sum()))
    want_l = u64([int(l0[0]) + sum(int(v) for v in xl)])

    def check(o: Outputs) -> None:
        expect_bits(o[3], np.array([want_i], np.int32), "atomicAdd int sum")
        expect_bits(o[4], np.array([want_f], np.float32), "atomicAdd float sum (exact values)")
        expect_bits(o[5], want_l, "atomicAdd u64 sum")

    return Setup([xi, xf, xl, np.array([i0], np.int32), f0, l0, n], grid=3, block=256, check=check)


@case("atomics", "red_ops")
def _red_ops(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(500, 700))
    xi = mixed_i32(rng, n)
    xf = eighths(rng, n)
    xl = mixed_i64(rng, n)
    o0 = mixed_i32(rng, 3)
    o0[2] = rng.integers(0, 100)
    f0, l0 = eighths(rng, 1), mixed_i64(rng, 1)
    xs = [int(v) for v in xi]
    want_o = np.array(
        [wrap(int(o0[0]) + sum(xs)), min(int(o0[1]), *xs), int(o0[2]) + sum(v & 1 for v in xs)],
        np.int32,
    )
    want_f = np.float32(float(f0[0]) + float(xf.astype(np.float64).sum()))
    want_l = u64([max(int(v) & M64 for v in (*xl, l0[0]))])

    def check(o: Outputs) -> None:
        expect_rows(
            o[3].reshape(3, 1),
            want_o.reshape(3, 1),
            ["red.global.add.u32", "red.global.min.s32", "red.shared.add.u32 (merged)"],
            {},
        )
        expect_bits(o[4], np.array([want_f], np.float32), "red.global.add.f32 (exact values)")
        expect_bits(o[5], want_l, "red.global.max.u64")

    return Setup([xi, xf, xl, o0, f0, l0, n], grid=3, block=256, check=check)


@case("atomics", "atomic_minmax_bits")
def _atomic_minmax_bits(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(500, 700))
    x = mixed_i32(rng, n)
    init = mixed_i32(rng, 7)
    init[6] = -1
    xs = [int(v) for v in x]
    ux = [v & M32 for v in xs]
    i0 = [int(v) for v in init]
    orv, xorv, andv = i0[4] & M32, i0[5] & M32, i0[6] & M32
    for v in xs:
        orv |= 1 << (v & 31)
        xorv ^= v & M32
        andv &= ~(1 << ((v >> 5) & 31)) & M32
    want = u32(
        [
            max(i0[0], *xs),
            min(i0[1], *xs),
            max(i0[2] & M32, *ux),
            min(i0[3] & M32, *ux),
            orv,
            xorv,
            andv,
        ]
    )
    names = ["max.s32", "min.s32", "max.u32", "min.u32", "or", "xor", "and"]
    return Setup(
        [x, init, n],
        grid=3,
        block=256,
        check=lambda o: expect_rows(o[1].reshape(7, 1), want.reshape(7, 1), names, {}),
    )


@case("atomics", "atomic_cas_loops")
def _atomic_cas_loops(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(200, 300))
    xf = wide_f32(rng, n, -10, 10)
    xl = mixed_i64(rng, n)
    f0 = wide_f32(rng, 1, -10, 10)
    l0 = mixed_i64(rng, 1)
    want_f = np.array([max(float(f0[0]), float(xf.max()))], np.float32)
    want_l = u64([int(l0[0]) + sum(int(v) for v in xl)])

    def check(o: Outputs) -> None:
        expect_bits(o[2], want_f, "float max via atomicCAS loop")
        expect_bits(o[3], want_l, "i64 sum via 64-bit atomicCAS loop")

    return Setup([xf, xl, f0, l0, n], grid=2, block=160, check=check)


@case("atomics", "atomic_inc_exch")
def _atomic_inc_exch(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(400, 500))
    limit = int(rng.integers(10, 100))
    c0 = int(rng.integers(0, limit + 1))
    x = (rng.permutation(10 * n)[:n] - 5 * n).astype(np.int32)
    s0 = int(rng.integers(10 * n, 20 * n))
    want_inc = np.sort(np.array([(c0 + k) % (limit + 1) for k in range(n)], np.int64)).astype(
        np.uint32
    )
    want_all = np.sort(np.concatenate([x, [s0]]).astype(np.int32))

    def check(o: Outputs) -> None:
        expect_bits(
            o[1], u32([(c0 + n) % (limit + 1)]), f"atomicInc counter (limit {limit}, start {c0})"
        )
        expect_bits(np.sort(o[3].view(np.uint32)), want_inc, "sorted atomicInc old values")
        expect_bits(
            np.sort(np.concatenate([o[4], o[2]])), want_all, "atomicExch old values + final slot"
        )

    return Setup(
        [
            x,
            u32([c0]),
            np.array([s0], np.int32),
            np.zeros(n, np.int32),
            np.zeros(n, np.int32),
            limit,
            n,
        ],
        grid=2,
        block=256,
        check=check,
        canon=lambda o: [o[1], np.sort(o[3]), np.sort(np.concatenate([o[4], o[2]]))],
    )


@case("atomics", "shared_histogram")
def _shared_histogram(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(2000, 3000))
    x = mixed_i32(rng, n)
    w = eighths(rng, n, 200)
    h0 = rng.integers(0, 50, 64).astype(np.int32)
    wh0 = eighths(rng, 64)
    binsel = x.astype(np.int64) & 63
    want_h = h0 + np.bincount(binsel, minlength=64).astype(np.int32)
    want_w = (
        wh0.astype(np.float64) + np.bincount(binsel, weights=w.astype(np.float64), minlength=64)
    ).astype(np.float32)

    def check(o: Outputs) -> None:
        expect_bits(o[2], want_h, "histogram counts (shared atom.add.u32)")
        expect_bits(o[3], want_w, "histogram weights (shared atom.add.f32, exact values)")

    return Setup([x, w, h0, wh0, n], grid=3, block=128, check=check)


# --- divergence ------------------------------------------------------------------------------


def divergent_ref(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    out, steps = [], []
    for i, v in enumerate(int(t) for t in x):
        if v < 0:
            out.append(-v * 3)
            steps.append(-1)
            continue
        r = v * 7 + 1 if (i % block) & 1 else v ^ 0x5A5A
        c, s = v, 0
        while c > 1 and s < 300:
            c = (3 * c + 1) & M32 if c & 1 else c >> 1
            s += 1
        acc = 0
        for j in range(v & 31):
            if j % 3 == 2:
                continue
            acc += j * r
            if acc > 100000:
                break
        acc = [acc + 1, acc - 7, acc * 3, acc ^ 0xFF, ~acc][v % 5]
        out.append(wrap(r + acc))
        steps.append(s)
    return np.array(out, np.int32), np.array(steps, np.int32)


@case("divergence", "divergent")
def _divergent(rng: np.random.Generator) -> Setup:
    block = 128
    n = int(rng.integers(4 * block + 1, 5 * block))
    x = rng.integers(-1000, 5000, n).astype(np.int32)
    want_out, want_steps = divergent_ref(x, block)

    def check(o: Outputs) -> None:
        expect_bits(o[1], want_out, "divergent: out", {"x": x, "tid": np.arange(n) % block})
        expect_bits(o[2], want_steps, "divergent: Collatz steps", {"x": x})

    return Setup(
        [x, np.zeros(n, np.int32), np.zeros(n, np.int32), n], grid=5, block=block, check=check
    )


@case("divergence", "divergent_shared")
def _divergent_shared(rng: np.random.Generator) -> Setup:
    block, grid = 128, 3
    x = rng.integers(-10000, 10000, block * grid).astype(np.int32)
    w = []
    for i, v in enumerate(int(t) for t in x):
        if (i % block) % 3 == 0:
            w.append(v * 2)
        elif v & 1:
            w.append(sum(k ^ v for k in range(v & 15)))
        else:
            w.append(-v)
    wa = np.array(w, np.int64).reshape(grid, block)
    want = (wa[:, (np.arange(block) + 37) % block] - wa).reshape(-1).astype(np.int32)
    return Setup(
        [x, np.zeros(block * grid, np.int32)],
        grid=grid,
        block=block,
        check=lambda o: expect_bits(o[1], want, "divergent_shared", {"x": x}),
    )


@case("divergence", "divergent_warp")
def _divergent_warp(rng: np.random.Generator) -> Setup:
    total = 128
    x = rng.integers(-1000, 1000, total).astype(np.int32)
    w = x.astype(np.int64).reshape(-1, 32)
    lane = np.arange(32)
    low = lane < 16
    lane_bit = 1 << lane.astype(np.int64)
    active = np.where(low, 0x0000FFFF, 0xFFFF0000)
    down = np.where(lane + 3 <= 31, lane + 3, lane)
    shuffled = np.where(low, w[:, lane ^ 1], w[:, down])
    ballot_low = ((w > 0) & low) @ lane_bit
    ballot_high = ((w < 0) & ~low) @ lane_bit
    ballot = np.where(low[None, :], ballot_low[:, None], ballot_high[:, None])
    rows = [np.tile(active, w.shape[0]), shuffled.reshape(-1), ballot.reshape(-1)]
    want = u32(np.stack(rows).astype(object))
    names = ["__activemask", "shfl (xor 1 | down 3 width 16)", "ballot"]
    return Setup(
        [x, np.zeros(3 * total, np.int32)],
        grid=2,
        block=64,
        check=lambda o: expect_rows(o[1], want, names, {"x": x}),
    )


# --- integer corner cases --------------------------------------------------------------------


def popc(v: int) -> int:
    return bin(v).count("1")


def brev(v: int, width: int) -> int:
    return int(format(v, f"0{width}b")[::-1], 2)


def ffs(v: int) -> int:
    return (v & -v).bit_length()


def sext(v: int, width: int) -> int:
    return wrap(v, width)


def prmt(a: int, b: int, c: int) -> int:
    src = (b << 32) | a
    d = 0
    for k in range(4):
        sel = (c >> (4 * k)) & 0xF
        byte = (src >> (8 * (sel & 7))) & 0xFF
        if sel & 8:
            byte = 0xFF if byte & 0x80 else 0
        d |= byte << (8 * k)
    return d


def bfe(a: int, pos: int, length: int, signed: bool) -> int:
    msb = 31
    sbit = (a >> min(pos + length - 1, msb)) & 1 if signed and length else 0
    d = 0
    for i in range(32):
        bit = (a >> (pos + i)) & 1 if i < length and pos + i <= msb else sbit
        d |= bit << i
    return d


def bfi(a: int, b: int, pos: int, length: int) -> int:
    f = b
    for i in range(length):
        if pos + i > 31:
            break
        f = (f & ~(1 << (pos + i))) | (((a >> i) & 1) << (pos + i))
    return f & M32


INT32_OPS = [
    "div",
    "rem",
    "udiv",
    "urem",
    "shr.s (y&31)",
    "shr.u (y&31)",
    "shl (y&31)",
    "popc",
    "clz",
    "brev",
    "byte_perm",
    "ffs",
    "mulhi",
    "umulhi",
    "mul24",
    "umul24",
    "hadd",
    "rhadd",
    "uhadd",
    "funnelshift_l",
    "funnelshift_lc",
    "funnelshift_r",
    "funnelshift_rc",
    "min",
    "max",
    "umin",
    "abs",
    "(x>>7)&0x1ff",
    "insert",
    "(s8)x",
    "(s16)x",
    "(u16)x",
    "x*y+(x^y)",
    "sad",
    "prmt raw",
    "bfe.u32",
    "bfe.s32",
    "mul24.lo.s32",
    "mul24.hi.s32",
    "shl.b32 0..63",
    "shr.u32 0..63",
    "shr.s32 0..63",
    "bfi.b32",
]


def int32_ref(x: int, y: int) -> list[int]:
    ux, uy = x & M32, y & M32
    q = tdiv(x, y)
    sh = uy >> 8
    fs = (uy << 32) | ux
    s = sh & 31
    sc = min(sh, 32)
    pos, ln = uy & 63, (uy >> 8) & 63
    return [
        q,
        x - q * y,
        ux // uy,
        ux % uy,
        x >> (y & 31),
        ux >> (uy & 31),
        ux << (uy & 31),
        popc(ux),
        32 - ux.bit_length(),
        brev(ux, 32),
        prmt(ux, uy, (uy >> 16) & 0x7777),
        ffs(ux),
        (x * y) >> 32,
        (ux * uy) >> 32,
        sext(x, 24) * sext(y, 24),
        (ux & 0xFFFFFF) * (uy & 0xFFFFFF),
        (x + y) >> 1,
        (x + y + 1) >> 1,
        (ux + uy) >> 1,
        (fs << s) >> 32,
        (fs << sc) >> 32,
        fs >> s,
        fs >> sc,
        min(x, y),
        max(x, y),
        min(ux, uy),
        abs(x),
        (ux >> 7) & 0x1FF,
        (ux & ~0x3F0) | ((uy & 0x3F) << 4),
        sext(x, 8),
        sext(x, 16),
        x & 0xFFFF,
        x * y + (x ^ y),
        abs(x - y) + (ux >> 4),
        prmt(ux, uy, uy >> 12),
        bfe(ux, pos, ln, False),
        bfe(ux, pos, ln, True),
        sext(ux, 24) * sext(uy, 24),
        (sext(ux, 24) * sext(uy, 24)) >> 16,
        ux << pos if pos < 32 else 0,
        ux >> pos,
        x >> min(pos, 31),
        bfi(uy >> 16, ux, pos, ln),
    ]


def nonzero_divisors(
    rng: np.random.Generator, a: np.ndarray, b: np.ndarray, minval: int
) -> np.ndarray:
    b = np.where(b == 0, rng.integers(1, 9, b.size).astype(b.dtype), b)
    return np.where((a == minval) & (b == -1), np.ones_like(b), b)


@case("intops", "int32_ops")
def _int32_ops(rng: np.random.Generator) -> Setup:
    n = 320
    a = mixed_i32(rng, n)
    b = nonzero_divisors(rng, a, mixed_i32(rng, n), I32_MIN)
    rows = list(zip(*(int32_ref(int(x), int(y)) for x, y in zip(a, b))))
    want = u32(np.array(rows, dtype=object))
    return Setup(
        [a, b, np.zeros(len(INT32_OPS) * n, np.int32), n],
        grid=3,
        block=128,
        check=lambda o: expect_rows(o[2], want, INT32_OPS, {"a": a, "b": b}),
    )


INT64_OPS = [
    "div",
    "rem",
    "udiv",
    "urem",
    "mul",
    "mul64hi",
    "umul64hi",
    "shr.s (y&63)",
    "shr.u (y&63)",
    "shl (y&63)",
    "popcll",
    "clzll",
    "brevll",
    "ffsll",
    "mul.wide.s32",
    "mul.wide.u32",
    "x<y",
    "ux<uy",
]


def int64_ref(x: int, y: int) -> list[int]:
    ux, uy = x & M64, y & M64
    q = tdiv(x, y)
    x32, y32 = wrap(x), wrap(y)
    return [
        q,
        x - q * y,
        ux // uy,
        ux % uy,
        x * y,
        (x * y) >> 64,
        (ux * uy) >> 64,
        x >> (y & 63),
        ux >> (uy & 63),
        ux << (uy & 63),
        popc(ux),
        64 - ux.bit_length(),
        brev(ux, 64),
        ffs(ux),
        x32 * y32,
        (x32 & M32) * (y32 & M32),
        int(x < y),
        int(ux < uy),
    ]


@case("intops", "int64_ops")
def _int64_ops(rng: np.random.Generator) -> Setup:
    n = 256
    a = mixed_i64(rng, n)
    b = nonzero_divisors(rng, a, mixed_i64(rng, n), I64_MIN)
    rows = list(zip(*(int64_ref(int(x), int(y)) for x, y in zip(a, b))))
    want = u64(np.array(rows, dtype=object))
    return Setup(
        [a, b, np.zeros(len(INT64_OPS) * n, np.int64), n],
        grid=2,
        block=128,
        check=lambda o: expect_rows(o[2], want, INT64_OPS, {"a": a, "b": b}),
    )


# --- conversions and rounding ----------------------------------------------------------------


def narrow_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values around the f16 and bf16 ranges, exact ties of both, and the special values."""
    wide = wide_f32(rng, n, -28, 18)
    h = rng.integers(0, 0x7BFF, n).astype(np.uint16)  # finite f16, below the largest
    lo, hi = h.view(np.float16).astype(np.float64), (h + 1).view(np.float16).astype(np.float64)
    f16_ties = ((lo + hi) / 2).astype(np.float32)
    bb = rng.integers(0, 0x7F7F, n).astype(np.uint32)
    bf_lo, bf_hi = (bb << 16).view(np.float32), ((bb + 1) << 16).view(np.float32)
    bf_ties = ((bf_lo.astype(np.float64) + bf_hi.astype(np.float64)) / 2).astype(np.float32)
    pick = rng.integers(0, 3, n)
    vals = np.where(pick == 0, wide, np.where(pick == 1, f16_ties, bf_ties))
    vals = np.where(rng.integers(0, 2, n) == 1, -vals, vals).astype(np.float32)
    specials = np.array(
        [
            0.0,
            -0.0,
            np.inf,
            -np.inf,
            np.nan,
            65504.0,
            65519.99,
            65520.0,
            -65520.0,
            3.4028235e38,
            2.0**-24,
            2.0**-25,
            3 * 2.0**-26,
            2.0**-149,
            -(2.0**-149),
            1.0e-40,
            2.0**-14,
            0.1,
        ],
        dtype=np.float32,
    )
    vals[: specials.size] = specials
    return vals


@case("conversions", "cvt_narrow")
def _cvt_narrow(rng: np.random.Generator) -> Setup:
    n = 384
    x = narrow_inputs(rng, n)
    nan = np.isnan(x)
    rows: list[list[int]] = [[] for _ in range(6)]
    for v in (float(t) for t in x):
        if math.isnan(v):
            for r in rows:
                r.append(0)
            continue
        if math.isinf(v):
            h = {m: v for m in ("rn", "rz")}
            bf = dict(h)
        else:
            fv = Fraction(v)
            h = {m: math.copysign(round_frac(fv, m, "f16"), v) for m in ("rn", "rz")}
            bf = {m: math.copysign(round_frac(fv, m, "bf16"), v) for m in ("rn", "rz")}
        rows[0].append(f16_bits(h["rn"]))
        rows[1].append(f16_bits(h["rz"]))
        rows[2].append(bf16_bits(bf["rn"]))
        rows[3].append(bf16_bits(bf["rz"]))
        rows[4].append(int(np.array(h["rn"], np.float32).view(np.uint32)))
        rows[5].append(int(np.array(bf["rn"], np.float32).view(np.uint32)))
    want = u32(np.array(rows, dtype=object))
    names = [
        "f32->f16 rn",
        "f32->f16 rz",
        "f32->bf16 rn",
        "f32->bf16 rz",
        "f16 rn -> f32",
        "bf16 rn -> f32",
    ]

    def check(o: Outputs) -> None:
        got = o[1].reshape(6, n)
        expect_rows(got, want, names, {"x": x}, ignore=dict.fromkeys(names, nan))
        for k, kind in enumerate(["f16", "f16", "bf16", "bf16", "f32", "f32"]):
            expect_nan_where(got[k], nan, names[k], kind)

    return Setup([x, np.zeros(6 * n, np.int32), n], grid=3, block=128, check=check)


def f2i(v: float, mode: str, lo: int, hi: int) -> int:
    if math.isnan(v):
        return 0
    if math.isinf(v):
        return hi if v > 0 else lo
    rounding: dict[str, Callable[[float], int]] = {
        "rn": round,
        "rz": math.trunc,
        "rd": math.floor,
        "ru": math.ceil,
    }
    return min(max(rounding[mode](v), lo), hi)


@case("conversions", "cvt_float_to_int")
def _cvt_float_to_int(rng: np.random.Generator) -> Setup:
    n = 384
    x = wide_f32(rng, n, -3, 66)
    halves = (rng.integers(-50, 50, n) + 0.5).astype(np.float32)
    x = np.where(rng.integers(0, 3, n) == 0, halves, x).astype(np.float32)
    specials = np.array(
        [
            np.nan,
            -np.nan,
            np.inf,
            -np.inf,
            0.0,
            -0.0,
            2.0**31,
            -(2.0**31),
            2147483520.0,
            -2147483904.0,
            2.0**32,
            4294967040.0,
            2.0**63,
            -(2.0**63),
            2.0**64,
            -0.5,
            0.5,
            1.5,
            2.5,
            -2.5,
            -0.75,
            -1.0,
        ],
        dtype=np.float32,
    )
    x[: specials.size] = specials
    xs = [float(v) for v in x]
    want32 = u32(
        np.array(
            [
                [f2i(v, "rn", I32_MIN, I32_MAX) for v in xs],
                [f2i(v, "rz", I32_MIN, I32_MAX) for v in xs],
                [f2i(v, "rd", I32_MIN, I32_MAX) for v in xs],
                [f2i(v, "ru", I32_MIN, I32_MAX) for v in xs],
                [f2i(v, "rn", 0, M32) for v in xs],
                [f2i(v, "rz", 0, M32) for v in xs],
            ],
            dtype=object,
        )
    )
    want64 = u64(
        np.array(
            [
                [f2i(v, "rn", I64_MIN, I64_MAX) for v in xs],
                [f2i(v, "rz", I64_MIN, I64_MAX) for v in xs],
                [f2i(v, "rz", 0, M64) for v in xs],
            ],
            dtype=object,
        )
    )
    names32 = ["f2i rn", "f2i rz", "f2i rd", "f2i ru", "f2u rn", "f2u rz"]
    names64 = ["f2ll rn", "f2ll rz", "f2ull rz"]
    # NaN -> 64-bit integer is not pinned down by the documentation; the GPU test compares it.
    nan = np.isnan(x)

    def check(o: Outputs) -> None:
        expect_rows(o[1], want32, names32, {"x": x})
        expect_rows(o[2], want64, names64, {"x": x}, ignore=dict.fromkeys(names64, nan))

    return Setup(
        [x, np.zeros(6 * n, np.int32), np.zeros(3 * n, np.int64), n], grid=3, block=128, check=check
    )


@case("conversions", "cvt_int_to_float")
def _cvt_int_to_float(rng: np.random.Generator) -> Setup:
    n = 384
    a = mixed_i32(rng, n)
    b = mixed_i64(rng, n)
    # 64-bit values with exactly 25 significant bits above a tie, and ties to even.
    big = (rng.integers(2**24, 2**25, n).astype(np.int64) << rng.integers(1, 38, n)) | 1
    b = np.where(rng.integers(0, 3, n) == 0, big * np.where(rng.integers(0, 2, n) == 1, -1, 1), b)
    a = np.where(
        rng.integers(0, 3, n) == 0, (rng.integers(2**24, 2**25, n) << rng.integers(0, 7, n)) + 0, a
    )
    a = a.astype(np.int32)
    rows = []
    for mode, src, unsigned in [
        ("rn", a, False),
        ("rz", a, False),
        ("rd", a, False),
        ("ru", a, False),
        ("rn", a, True),
        ("rz", a, True),
        ("rn", b, False),
        ("rz", b, False),
        ("ru", b, False),
        ("rd", b, True),
    ]:
        mask = M64 if src.dtype == np.int64 else M32
        vals = [int(v) & mask if unsigned else int(v) for v in src]
        rows.append([f32_from_frac(Fraction(v), mode) for v in vals])
    want = np.array(rows, dtype=np.float32)
    names = [
        "i2f rn",
        "i2f rz",
        "i2f rd",
        "i2f ru",
        "u2f rn",
        "u2f rz",
        "ll2f rn",
        "ll2f rz",
        "ll2f ru",
        "ull2f rd",
    ]
    return Setup(
        [a, b, np.zeros(10 * n, np.float32), n],
        grid=3,
        block=128,
        check=lambda o: expect_rows(o[2], want, names, {"a": a, "b": b}),
    )


@case("conversions", "f32_rounding")
def _f32_rounding(rng: np.random.Generator) -> Setup:
    n = 256
    a = wide_f32(rng, n, -20, 20)
    b = wide_f32(rng, n, -20, 20)
    c = wide_f32(rng, n, -20, 20)
    pick = rng.integers(0, 8, n)
    c = np.where(pick < 2, -(a * b), c)  # cancellation: fma keeps a*b's rounding error
    a = np.where(pick == 2, a * np.float32(2.0**-60), a)  # subnormal products and quotients
    b = np.where(pick == 2, b * np.float32(2.0**-60), b)
    a = np.where(pick == 3, a * np.float32(2.0**100), a)  # overflow
    b = np.where(pick == 3, b * np.float32(2.0**30), b)
    a, b, c = (t.astype(np.float32) for t in (a, b, c))
    b[b == 0] = 1.0
    rows: list[list[float]] = [[] for _ in range(14)]
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
        fx, fy, fz = Fraction(x), Fraction(y), Fraction(z)
        fma = fx * fy + fz
        for k, mode in enumerate(("rn", "rz", "rd", "ru")):
            rows[k].append(f32_from_frac(fma, mode, -1.0 if mode == "rd" else 1.0))
        rows[4].append(f32_from_frac(fx + fz, "rz"))
        rows[5].append(f32_from_frac(fx * fy, "ru", x * y))
        rows[6].append(f32_from_frac(fx / fy, "rn", x / y))
        rows[7].append(f32_from_frac(fx / fy, "rz", x / y))
        rows[8].append(f32_from_frac(fx / fy, "rn", x / y))
        rows[9].append(sqrt_f32(abs(y), "rn"))
        rows[10].append(sqrt_f32(abs(y), "rd"))
        rows[11].append(sqrt_f32(abs(z), "rn"))
        rows[12].append(f32_from_frac(1 / fy, "rn"))
        rows[13].append(f32_from_frac(1 / fy, "ru"))
    want = np.array(rows, dtype=np.float32)
    names = [
        "fma rn",
        "fma rz",
        "fma rd",
        "fma ru",
        "add rz",
        "mul ru",
        "div rn",
        "div rz",
        "x / y",
        "sqrt rn",
        "sqrt rd",
        "sqrtf",
        "rcp rn",
        "rcp ru",
    ]
    return Setup(
        [a, b, c, np.zeros(14 * n, np.float32), n],
        grid=2,
        block=128,
        check=lambda o: expect_rows(o[3], want, names, {"a": a, "b": b, "c": c}),
    )


def f16_round(v: np.ndarray) -> np.ndarray:
    """float64 values (exact results of f16 operations) rounded to f16 bits, nearest even."""
    with np.errstate(over="ignore"):
        return v.astype(np.float16).view(np.uint16).astype(np.int64)


def half_inputs(rng: np.random.Generator, n: int) -> np.ndarray:
    with np.errstate(over="ignore"):
        return wide_f32(rng, 2 * n, -7, 6).astype(np.float16)


@case("half_math", "half_math")
def _half_math(rng: np.random.Generator) -> Setup:
    n = 256
    a, b, c = (half_inputs(rng, n) for _ in range(3))
    x, y, z = (t.astype(np.float64).reshape(n, 2) for t in (a, b, c))
    lo, hi = 0, 1

    def pair(v: np.ndarray) -> np.ndarray:
        r = f16_round(v)
        packed: np.ndarray = r[:, 0] | (r[:, 1] << 16)
        return packed

    rows = [
        f16_round(x[:, lo] + y[:, lo]),
        f16_round(x[:, lo] * y[:, lo]),
        f16_round(x[:, lo] * y[:, lo] + z[:, lo]),
        f16_round(x[:, hi] - y[:, hi]),
        pair(x + y),
        pair(x * y),
        pair(x * y + z),
        f16_round(np.maximum(x[:, lo], y[:, hi])),
        c.view(np.uint16).reshape(n, 2)[:, lo].astype(np.int64) ^ 0x8000,
        (x[:, lo] < y[:, lo]).astype(np.int64),
    ]
    want = u32(np.stack(rows).astype(object))
    names = ["add.f16", "mul.f16", "fma.rn.f16", "sub.f16 (high)", "add.f16x2", "mul.f16x2",
             "fma.rn.f16x2", "max.f16", "neg.f16", "setp.lt.f16"]  # fmt: skip
    inputs = {"a": a.reshape(n, 2)[:, 0], "b": b.reshape(n, 2)[:, 0], "c": c.reshape(n, 2)[:, 0]}
    return Setup(
        [a.view(np.int32), b.view(np.int32), c.view(np.int32), np.zeros(10 * n, np.int32), n],
        grid=2,
        block=128,
        check=lambda o: expect_rows(o[3], want, names, inputs),
    )


@case("half_math", "bf16_math")
def _bf16_math(rng: np.random.Generator) -> Setup:
    n = 256
    a, b, c = (bf16_round_bits(wide_f32(rng, 2 * n, -7, 6)) for _ in range(3))
    x, y, z = (
        (t.astype(np.uint32) << 16).view(np.float32).astype(np.float64).reshape(n, 2)
        for t in (a, b, c)
    )

    def bf(v: float) -> int:
        return bf16_bits(math.copysign(round_frac(Fraction(v), "rn", "bf16"), v))

    fma = [[bf(float(p)) for p in col] for col in (x * y + z).T]
    fma_pair = [lo | (hi << 16) for lo, hi in zip(*fma)]
    mx = [bf(float(v)) for v in np.maximum(x[:, 0], y[:, 1])]
    want = u32(np.array([fma_pair, fma[0], mx], dtype=object))
    names = ["fma.rn.bf16x2", "fma.rn.bf16", "max.bf16"]
    inputs = {"a": a.reshape(n, 2)[:, 0], "b": b.reshape(n, 2)[:, 0], "c": c.reshape(n, 2)[:, 0]}
    return Setup(
        [a.view(np.int32), b.view(np.int32), c.view(np.int32), np.zeros(3 * n, np.int32), n],
        grid=2,
        block=128,
        check=lambda o: expect_rows(o[3], want, names, inputs),
    )


# --- approximate math ------------------------------------------------------------------------


@dataclass(frozen=True)
class Approx:
    name: str
    ref: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (x, y) in float64
    atol: float = 0.0
    rtol: float = 0.0
    ulps: float = 0.0


def mul32(x: np.ndarray, k: float) -> np.ndarray:
    """float32(x * k) as the kernel computes it, in float64."""
    product: np.ndarray = (x.astype(np.float32) * np.float32(k)).astype(np.float64)
    return product


FAST_MATH = [
    # CUDA: __expf max ulp error 2 + floor(|1.173 x|); x in [-10, 10].
    Approx("__expf", lambda x, y: np.exp(x), ulps=2 + 1.173 * 10 + 1),
    # __logf: |err| <= 2^-21.41 in [0.5, 2], else 3 ulp.
    Approx("__logf", lambda x, y: np.log(np.abs(y)), atol=2.0**-21.41, ulps=3),
    # tanh.approx.f32: max relative error 2^-10.987.
    Approx("tanh.approx", lambda x, y: np.tanh(x), rtol=2.0**-10.987, ulps=1),
    # __fdividef: 2 ulp for |y| in [2^-126, 2^126].
    Approx("__fdividef", lambda x, y: x / y, ulps=2 + 0.5),
    # sin.approx.f32, cos.approx.f32: |err| <= 2^-20.5 on [-2pi, 2pi] (PTX ISA 9.1, "sin",
    # "cos"), plus the f32 result's rounding. CUDA's __cosf page says 2^-21.41 on [-pi, pi],
    # which the instruction does not keep: an H200 returned cos(1.6877) 3.71e-7 off.
    Approx("__sinf", lambda x, y: np.sin(mul32(x, 0.3)), atol=2.0**-20.5, ulps=1),
    Approx("__cosf", lambda x, y: np.cos(mul32(x, 0.3)), atol=2.0**-20.5, ulps=1),
    # rsqrtf (rsqrt.approx.f32): 2 ulp.
    Approx("rsqrtf", lambda x, y: 1 / np.sqrt(np.abs(y)), ulps=2 + 0.5),
    # ex2.approx.f32: relative error 2^-22 (about 2 ulp).
    Approx("ex2.approx", lambda x, y: np.exp2(x), rtol=2.0**-22, ulps=1),
    # lg2.approx.f32: absolute error 2^-22.6 on the mantissa's logarithm.
    Approx("lg2.approx", lambda x, y: np.log2(np.abs(y)), atol=2.0**-22, ulps=1),
    # rcp.approx.f32: 1 ulp.
    Approx("rcp.approx", lambda x, y: 1 / y, ulps=1 + 0.5),
    # sqrt.approx.f32: relative error 2^-23.
    Approx("sqrt.approx", lambda x, y: np.sqrt(np.abs(y)), rtol=2.0**-23, ulps=1),
    # __saturatef (cvt.sat.f32.f32) is exact.
    Approx("__saturatef", lambda x, y: np.clip(mul32(x, 0.1), 0.0, 1.0)),
]


def approx_inputs(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.uniform(-10, 10, n).astype(np.float32)
    y = (np.exp(rng.uniform(np.log(0.01), np.log(100), n)) * rng.choice([-1.0, 1.0], n)).astype(
        np.float32
    )
    return x, y


def make_approx(
    funcs: Sequence[Approx], y_positive: bool
) -> Callable[[np.random.Generator], Setup]:
    def make(rng: np.random.Generator) -> Setup:
        n = 256
        x, y = approx_inputs(rng, n)
        if y_positive:
            y = np.abs(y)
        x64, y64 = x.astype(np.float64), y.astype(np.float64)

        def check(o: Outputs) -> None:
            got = o[2].reshape(len(funcs), n)
            failures = []
            for k, f in enumerate(funcs):
                try:
                    expect_close(
                        got[k],
                        f.ref(x64, y64),
                        f.name,
                        {"x": x, "y": y},
                        atol=f.atol,
                        rtol=f.rtol,
                        ulps=f.ulps,
                    )
                except AssertionError as e:
                    failures.append(str(e))
            assert not failures, "\n".join(failures)

        return Setup(
            [x, y, np.zeros(len(funcs) * n, np.float32), n], grid=2, block=128, check=check
        )

    return make


case("fastmath", "fast_math", exact=False)(make_approx(FAST_MATH, y_positive=False))

_erf = np.vectorize(math.erf)

LIBM = [  # CUDA's documented maximum ulp errors (single precision), plus half an ulp of slack.
    Approx("expf", lambda x, y: np.exp(x), ulps=2.5),
    Approx("logf", lambda x, y: np.log(y), ulps=1.5),
    Approx("tanhf", lambda x, y: np.tanh(x), ulps=2.5),
    Approx("sinf", lambda x, y: np.sin(x), ulps=2.5),
    Approx("cosf", lambda x, y: np.cos(x), ulps=2.5),
    Approx("exp2f", lambda x, y: np.exp2(x), ulps=2.5),
    Approx("log2f", lambda x, y: np.log2(y), ulps=1.5),
    Approx("erff", lambda x, y: _erf(mul32(x, 0.3)), ulps=2.5),
    Approx("expm1f", lambda x, y: np.expm1(mul32(x, 0.1)), ulps=1.5),
    Approx("log1pf", lambda x, y: np.log1p(y), ulps=1.5),
    Approx(
        "atan2f",
        lambda x, y: np.arctan2(x, (y.astype(np.float32) - np.float32(50)).astype(np.float64)),
        ulps=3.5,
    ),
    Approx("powf", lambda x, y: np.power(y, mul32(x, 0.5)), ulps=4.5),
    Approx("rsqrtf", lambda x, y: 1 / np.sqrt(y), ulps=2.5),
    Approx("sigmoid", lambda x, y: 1 / (1 + np.exp(-x)), ulps=4),
    Approx("sinf(1e5 x)", lambda x, y: np.sin(mul32(x, 1.0e5)), ulps=2.5),
    Approx("cosf(3e6 x)", lambda x, y: np.cos(mul32(x, 3.0e6)), ulps=2.5),
]

case("libm", "libm", exact=False)(make_approx(LIBM, y_positive=True))


# --- the control launches of the fault kernels (they must run clean) --------------------------


@case("fault_oob", "oob_store", id="oob_store_in_bounds")
def _oob_store_ok(rng: np.random.Generator) -> Setup:
    n = int(rng.integers(90, 120))
    want = (2.0 * np.arange(n + 1)).astype(np.float32)
    return Setup(
        [np.zeros(n + 1, np.float32), n],
        grid=1,
        block=128,
        check=lambda o: expect_bits(o[0], want, "oob_store with room for y[n]"),
    )


@case("fault_oob", "oob_shared", id="oob_shared_in_bounds")
def _oob_shared_ok(rng: np.random.Generator) -> Setup:
    x = rng.standard_normal(64).astype(np.float32)
    return Setup(
        [x, np.zeros(64, np.float32), 0],
        grid=1,
        block=64,
        check=lambda o: expect_bits(o[1], x, "oob_shared with shift 0"),
    )


@case("fault_race", "race_fixed")
def _race_fixed(rng: np.random.Generator) -> Setup:
    x = rng.standard_normal(256).astype(np.float32)
    want = x.reshape(2, 128)[:, (np.arange(128) + 64) % 128].reshape(-1)
    return Setup(
        [x, np.zeros(256, np.float32)],
        grid=2,
        block=128,
        check=lambda o: expect_bits(o[1], want, "race_fixed"),
    )


@case("fault_misaligned", "misaligned_v4", id="aligned_v4")
def _aligned_v4(rng: np.random.Generator) -> Setup:
    x = rng.standard_normal(4 * 64 + 4).astype(np.float32)
    v = x[4:].reshape(64, 4)
    want = (v[:, 0] + v[:, 1]) + (v[:, 2] + v[:, 3])
    return Setup(
        [x, np.zeros(64, np.float32), 4],
        grid=1,
        block=64,
        check=lambda o: expect_bits(o[1], want, "misaligned_v4 with off=4 (aligned)"),
    )


# ---------------------------------------------------------------------------------------------
# Tests


def _params() -> list[object]:
    return [pytest.param(c, id=c.id, marks=c.marks) for c in CASES]


@pytest.mark.parametrize("case", _params())
def test_sim_matches_numpy(case: Case, rng: np.random.Generator) -> None:
    setup = case.make(rng)
    outputs = launch(case.stem, case.kernel, setup, "sim")
    setup.check(outputs)


@pytest.mark.gpu
@pytest.mark.parametrize("case", _params())
def test_cuda_and_sim_agree(case: Case, rng: np.random.Generator) -> None:
    """The same PTX on the GPU and in the simulator; the GPU also validates the references."""
    setup = case.make(rng)
    gpu = launch(case.stem, case.kernel, setup, "cuda")
    sim = launch(case.stem, case.kernel, setup, "sim")
    setup.check(gpu)
    setup.check(sim)
    if case.exact:
        canon = setup.canon or (lambda o: o)
        for k, (g, s) in enumerate(zip(canon(gpu), canon(sim))):
            expect_bits(s, g, f"{case.kernel}: array {k}, sim vs cuda")


# --- planted faults --------------------------------------------------------------------------


def ptx_lines(stem: str, kernel: str, opcode: str) -> list[int]:
    """1-based line numbers of the instructions of `kernel` whose opcode starts with `opcode`."""
    lines = ptx_text(stem).splitlines()
    start = next(i for i, t in enumerate(lines) if re.search(rf"\.entry\s+{kernel}\s*\(", t))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "}")
    pat = re.compile(rf"^\s*(@!?%\w+\s+)?{re.escape(opcode)}")
    found = [i + 1 for i in range(start, end) if pat.match(lines[i])]
    assert found, f"no {opcode} in {kernel}"
    return found


@dataclass(frozen=True)
class Fault:
    """A simulator fault report, taken apart: which kernel, PTX line, block and thread, and the
    diagnosis (the text after the thread, which names neither the kernel nor the instruction,
    so a check of it cannot be satisfied by either)."""

    kernel: str
    line: int
    block: tuple[int, int, int]
    thread: tuple[int, int, int]
    diagnosis: str


FAULT = re.compile(
    r"kernel (?P<kernel>\w+), PTX line (?P<line>\d+) `[^`]*`: "
    r"block \((?P<block>\d+, \d+, \d+)\) thread \((?P<thread>\d+, \d+, \d+)\): "
    r"(?P<diagnosis>.*)$",
    re.S,
)


def _triple(text: str) -> tuple[int, int, int]:
    x, y, z = (int(v) for v in text.split(","))
    return x, y, z


def expect_fault(stem: str, kernel: str, setup: Setup, opcode: str, diagnosis: str) -> Fault:
    """Launch a planted fault on sim: it must raise `ct.LaunchError` whose report names `kernel`,
    the PTX line of one of its `opcode` instructions, a block and thread inside the launch, and
    a diagnosis matching `diagnosis` (a regular expression anchored at its start)."""
    with pytest.raises(ct.LaunchError) as info:
        launch(stem, kernel, setup, "sim")
    msg = str(info.value)
    print(msg)
    m = FAULT.search(msg)
    assert m is not None, f"the error is not a located fault report: {msg}"
    fault = Fault(
        m["kernel"], int(m["line"]), _triple(m["block"]), _triple(m["thread"]), m["diagnosis"]
    )
    assert fault.kernel == kernel, msg
    assert fault.line in ptx_lines(stem, kernel, opcode), f"not a line of {opcode}: {msg}"
    grid = (setup.grid,) if isinstance(setup.grid, int) else setup.grid
    block = (setup.block,) if isinstance(setup.block, int) else setup.block
    assert all(b < g for b, g in zip(fault.block, grid)), msg
    assert all(t < n for t, n in zip(fault.thread, block)), msg
    assert fault.block[len(grid) :] == (0,) * (3 - len(grid)), msg
    assert fault.thread[len(block) :] == (0,) * (3 - len(block)), msg
    assert re.match(diagnosis, fault.diagnosis), f"wrong diagnosis, want {diagnosis!r}: {msg}"
    return fault


def test_fault_out_of_bounds_store(rng: np.random.Generator) -> None:
    n = int(rng.integers(90, 120))  # y[n] lies past the allocation, inside its 256-byte granule
    setup = Setup([np.zeros(n, np.float32), n], grid=1, block=128, check=lambda o: None)
    fault = expect_fault(
        "fault_oob", "oob_store", setup, "st.global", r"out-of-bounds store of 4 bytes at 0x"
    )
    assert fault.thread == (n, 0, 0) and fault.block == (0, 0, 0)  # only thread n is past it
    assert f"the end of the {4 * n}-byte allocation" in fault.diagnosis


def test_fault_out_of_bounds_store_at_granule_end() -> None:
    n = 64  # y[n] is the first byte past a 256-byte allocation
    setup = Setup([np.zeros(n, np.float32), n], grid=1, block=128, check=lambda o: None)
    fault = expect_fault(
        "fault_oob", "oob_store", setup, "st.global", r"out-of-bounds store of 4 bytes at 0x"
    )
    assert fault.thread == (n, 0, 0)
    assert "0 bytes past the end of the 256-byte allocation" in fault.diagnosis


def test_fault_out_of_bounds_shared(rng: np.random.Generator) -> None:
    shift = int(rng.integers(1, 32))  # threads t >= 64 - shift read past sh[64]
    setup = Setup(
        [rng.standard_normal(64).astype(np.float32), np.zeros(64, np.float32), shift],
        grid=1,
        block=64,
        check=lambda o: None,
    )
    fault = expect_fault(
        "fault_oob", "oob_shared", setup, "ld.shared", r"out-of-bounds shared load of 4 bytes"
    )
    t = fault.thread[0]
    assert t >= 64 - shift, f"thread {t} reads sh[{t + shift}], inside the array"
    assert f"at shared address {4 * (t + shift):#x}" in fault.diagnosis


def test_fault_missing_syncthreads_is_a_race(rng: np.random.Generator) -> None:
    setup = Setup(
        [rng.standard_normal(256).astype(np.float32), np.zeros(256, np.float32)],
        grid=2,
        block=128,
        check=lambda o: None,
    )
    fault = expect_fault(
        "fault_race", "race_missing_sync", setup, "ld.shared", r"shared-memory race: "
    )
    t = fault.thread[0]
    writer = (t + 64) % 128  # thread t reads sh[(t + 64) % 128], which `writer` wrote
    assert re.match(
        rf"shared-memory race: this thread reads shared memory that thread \({writer}, 0, 0\) "
        rf"wrote at shared address {4 * writer:#x} with no barrier",
        fault.diagnosis,
    ), fault.diagnosis


def test_fault_misaligned_vector_load(rng: np.random.Generator) -> None:
    off = int(rng.integers(1, 4))  # x + off is 4-byte aligned, never 16-byte aligned
    setup = Setup(
        [rng.standard_normal(4 * 64 + 4).astype(np.float32), np.zeros(64, np.float32), off],
        grid=1,
        block=64,
        check=lambda o: None,
    )
    fault = expect_fault(
        "fault_misaligned",
        "misaligned_v4",
        setup,
        "ld.global",
        r"misaligned global load: address 0x[0-9a-f]+ is not a multiple of 16",
    )
    address = re.search(r"address (0x[0-9a-f]+)", fault.diagnosis)
    assert address is not None and int(address[1], 16) % 16 == 4 * off


def test_fault_partial_barrier(rng: np.random.Generator) -> None:
    setup = Setup(
        [rng.standard_normal(128).astype(np.float32), np.zeros(128, np.float32)],
        grid=1,
        block=128,
        check=lambda o: None,
    )
    fault = expect_fault(
        "fault_barrier",
        "partial_barrier",
        setup,
        "bar.sync",
        r"bar reached by only 32 of the 128 live threads of the block; "
        r"thread \((\d+), 0, 0\) did not arrive",
    )
    assert fault.thread[0] < 32  # the report is at a thread that did arrive
    missing = re.search(r"thread \((\d+), 0, 0\) did not", fault.diagnosis)
    assert missing is not None and 32 <= int(missing[1]) < 128
