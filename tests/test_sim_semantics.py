"""PTX instruction semantics of the simulator, checked against exact references.

Integers against Python ints; float rounding against `fractions.Fraction` rounded by a reference
written here (independent of `fpcore`); f32 → f16 against NumPy; bf16/tf32 against bit-level
rounding; shfl/vote against a per-lane transcription of the ISA pseudo-code; mma against A @ B
in float64 with fragments laid out per NOTES-PTX.md. Instructions are built directly as AST
objects and run on a small fake ExecContext (registers as raw bits, all lanes active).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction
from typing import Any, NoReturn

import numpy as np
import pytest

from cutile_py.ptx.ast import Imm, Instruction, Neg, Operand, Reg, Sink, Vec
from cutile_py.sim.context import PTYPE_DTYPE, ExecContext, SimError
from cutile_py.sim.semantics import INSTRUCTIONS

# --- a fake execution context -----------------------------------------------------------------


class FakeCtx(ExecContext):
    """Registers are uint64 raw bits (zero-extended) or bool for predicates."""

    def __init__(self, n: int, mask: np.ndarray | None = None) -> None:
        self.n = n
        self.mask = np.ones(n, dtype=np.bool_) if mask is None else mask
        self.regs: dict[str, np.ndarray] = {}

    def set(self, name: str, values: np.ndarray) -> Reg:
        v = np.asarray(values)
        if v.dtype == np.bool_:
            self.regs[name] = v.copy()
        else:
            width = v.dtype.itemsize
            raw = v.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[width])
            self.regs[name] = raw.astype(np.uint64)
        return Reg(name)

    def get(self, name: str, ptype: str) -> np.ndarray:
        return self.read(Reg(name), ptype)

    def read(self, op: Operand, ptype: str) -> np.ndarray:
        dtype = PTYPE_DTYPE[ptype]
        if ptype == "pred":
            if isinstance(op, Imm):
                return np.full(self.n, bool(op.value))
            assert isinstance(op, Reg)
            return self.regs[op.name].astype(np.bool_)
        unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[dtype.itemsize]
        if isinstance(op, Imm):
            if isinstance(op.value, float):
                return np.full(self.n, op.value, dtype=dtype)
            raw = np.full(self.n, op.value & ((1 << (8 * dtype.itemsize)) - 1), dtype=np.uint64)
        else:
            assert isinstance(op, Reg), op
            raw = self.regs[op.name]
        return raw.astype(unsigned).view(dtype)

    def write(self, op: Operand, ptype: str, values: np.ndarray) -> None:
        if isinstance(op, Sink):
            return
        assert isinstance(op, Reg)
        v = np.asarray(values).astype(PTYPE_DTYPE[ptype])
        if ptype == "pred":
            new = v.astype(np.bool_)
            old = self.regs.get(op.name, np.zeros(self.n, np.bool_))
        else:
            unsigned = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[v.dtype.itemsize]
            new = v.view(unsigned).astype(np.uint64)
            old = self.regs.get(op.name, np.zeros(self.n, np.uint64))
        self.regs[op.name] = np.where(self.mask, new, old)

    def fail(self, message: str, lanes: np.ndarray | None = None) -> NoReturn:
        raise SimError(message)


def run(ctx: FakeCtx, spelled: str, *ops: Operand) -> None:
    """Execute `opcode.mod.mod` with `ops` on `ctx`."""
    opcode, *mods = spelled.split(".")
    instr = Instruction(1, f"{spelled} ...", opcode, tuple(mods), tuple(ops))
    ctx.instr = instr
    INSTRUCTIONS[opcode](instr)(ctx)


R = Reg

# --- exact references ---------------------------------------------------------------------------

FMT = {  # name: (precision, emin, emax, ebits, mbits)
    "f16": (11, -14, 15, 5, 10),
    "bf16": (8, -126, 127, 8, 7),
    "f32": (24, -126, 127, 8, 23),
    "f64": (53, -1022, 1023, 11, 52),
}


def ref_round(x: Fraction, fmt: str, mode: str) -> Fraction | float:
    """Round a rational to `fmt` in `mode`; ±inf as floats. Zero results come back as 0."""
    p, emin, emax, _, _ = FMT[fmt]
    if x == 0:
        return Fraction(0)
    neg, a = x < 0, abs(x)
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    unit = Fraction(2) ** (max(e, emin) - (p - 1))
    k = math.floor(a / unit)
    lo, hi = k * unit, (k + 1) * unit
    if lo == a or mode == "rz" or (mode == "rm" and not neg) or (mode == "rp" and neg):
        r = lo
    elif mode in ("rm", "rp"):
        r = hi
    elif mode == "rna":
        r = hi if a - lo >= hi - a else lo
    else:
        r = lo if (a - lo < hi - a or (a - lo == hi - a and k % 2 == 0)) else hi
    top = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if r > top:
        away = mode in ("rn", "rna") or (mode == "rm" and neg) or (mode == "rp" and not neg)
        return (-math.inf if neg else math.inf) if away else (-top if neg else top)
    return -r if neg else r


def decode(bits: int, fmt: str) -> float:
    """A float encoding → Python float (via the exact field formula, independent of fpcore)."""
    _, emin, _, eb, mb = FMT[fmt]
    sign = -1.0 if bits >> (eb + mb) & 1 else 1.0
    e, f = bits >> mb & ((1 << eb) - 1), bits & ((1 << mb) - 1)
    if e == (1 << eb) - 1:
        return sign * math.inf if f == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(f, emin - mb)
    return sign * math.ldexp(f | 1 << mb, e - FMT[fmt][2] - mb)


def check_float(
    got_bits: np.ndarray, exact: list[Fraction | float | None], fmt: str, mode: str, what: str
) -> None:
    """Compare encodings with reference results (None = NaN expected, skip when 'skip')."""
    for i, (g, x) in enumerate(zip(got_bits.tolist(), exact)):
        v = decode(int(g), fmt)
        if x is None:
            assert math.isnan(v), f"{what}[{i}]: expected NaN, got {v!r}"
            continue
        if isinstance(x, float):
            assert v == x, f"{what}[{i}]: expected {x}, got {v!r}"
            continue
        want = ref_round(x, fmt, mode)
        if isinstance(want, float):
            assert v == want, f"{what}[{i}]: exact {float(x)!r} → {want}, got {v!r}"
        else:
            assert math.isfinite(v) and Fraction(v) == want, (
                f"{what}[{i}]: exact {float(x)!r} → {float(want)!r}, got {v!r} ({mode})"
            )


def rand_f32_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """f32 encodings: random bits (NaN, inf, subnormals), moderate normals and special values."""
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    nice = rng.random(n) < 0.6
    vals = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(np.float32)
    bits = np.where(nice, vals.view(np.uint32), bits)
    sub = rng.random(n) < 0.08
    bits = np.where(sub, rng.integers(0, 2**23, n).astype(np.uint32) | (bits & 0x80000000), bits)
    specials = np.array(
        [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 1, 0x7F7FFFFF, 0x3F800000], np.uint32
    )
    bits[: len(specials)] = specials
    return bits.astype(np.uint32)


def fr(bits: int, fmt: str) -> Fraction | None:
    v = decode(bits, fmt)
    return None if math.isnan(v) or math.isinf(v) else Fraction(v)


# --- integer --------------------------------------------------------------------------------------

INT_TYPES = [f"{k}{w}" for k in "us" for w in (16, 32, 64)]


def wrap(x: int, t: str) -> int:
    w = int(t[1:])
    x &= (1 << w) - 1
    return x - (1 << w) if t[0] == "s" and x >> (w - 1) else x


def rand_ints(rng: np.random.Generator, t: str, n: int) -> np.ndarray:
    w = int(t[1:])
    dtype = PTYPE_DTYPE[t]
    raw = rng.integers(0, 2**63, n, dtype=np.int64).astype(np.uint64) * np.uint64(2) + rng.integers(
        0, 2, n
    ).astype(np.uint64)
    small = rng.integers(-3, 4, n).astype(np.int64).astype(np.uint64)
    raw = np.where(rng.random(n) < 0.25, small, raw)
    edge = [0, 1, (1 << w) - 1, 1 << (w - 1), (1 << (w - 1)) - 1]
    raw[: len(edge)] = edge
    return raw.astype({16: np.uint16, 32: np.uint32, 64: np.uint64}[w]).view(dtype)


@pytest.mark.parametrize("t", INT_TYPES)
def test_integer_arithmetic(rng: np.random.Generator, t: str) -> None:
    n, w = 256, int(t[1:])
    ctx = FakeCtx(n)
    a, b, c = (rand_ints(rng, t, n) for _ in range(3))
    b[7] = 0
    A, B, C = ctx.set("a", a), ctx.set("b", b), ctx.set("c", c)
    ia, ib, ic = ([int(v) for v in x] for x in (a, b, c))
    wt = f"{t[0]}{2 * w}"
    cases: dict[str, Callable[[int, int, int], int]] = {
        "add": lambda x, y, z: x + y,
        "sub": lambda x, y, z: x - y,
        "mul.lo": lambda x, y, z: x * y,
        "mul.hi": lambda x, y, z: (x * y) >> w,
        "mad.lo": lambda x, y, z: x * y + z,
        "mad.hi": lambda x, y, z: ((x * y) >> w) + z,
        "min": lambda x, y, z: min(x, y),
        "max": lambda x, y, z: max(x, y),
        "sad": lambda x, y, z: z + abs(x - y),
        "div": lambda x, y, z: (
            -1 if y == 0 else int(abs(x) // abs(y)) * (1 if (x < 0) == (y < 0) else -1)
        ),
        "rem": lambda x, y, z: (
            x if y == 0 else x - y * (int(abs(x) // abs(y)) * (1 if (x < 0) == (y < 0) else -1))
        ),
    }
    for name, f in cases.items():
        nsrc = 3 if name.startswith(("mad", "sad")) else 2
        run(ctx, f"{name}.{t}", R("d"), *(A, B, C)[:nsrc])
        got = [int(v) for v in ctx.get("d", t)]
        want = [wrap(f(x, y, z), t) for x, y, z in zip(ia, ib, ic)]
        assert got == want, f"{name}.{t}"
    if w < 64:
        run(ctx, f"mul.wide.{t}", R("d"), A, B)
        assert [int(v) for v in ctx.get("d", wt)] == [x * y for x, y in zip(ia, ib)]
        C2 = ctx.set("c2", rand_ints(rng, wt, n))
        c2 = [int(v) for v in ctx.get("c2", wt)]
        run(ctx, f"mad.wide.{t}", R("d"), A, B, C2)
        assert [int(v) for v in ctx.get("d", wt)] == [
            wrap(x * y + z, wt) for x, y, z in zip(ia, ib, c2)
        ]
    if t[0] == "s":
        unary: dict[str, Callable[[int], int]] = {"abs": abs, "neg": lambda x: -x}
        for name, f1 in unary.items():
            run(ctx, f"{name}.{t}", R("d"), A)
            assert [int(v) for v in ctx.get("d", t)] == [wrap(f1(x), t) for x in ia]


def sat(x: int) -> int:
    return max(-(2**31), min(2**31 - 1, x))


def s24(x: int) -> int:
    return ((x & 0xFFFFFF) ^ 0x800000) - 0x800000


def test_integer_saturation(rng: np.random.Generator) -> None:
    n = 256
    ctx = FakeCtx(n)
    a, b, c = (rand_ints(rng, "s32", n) for _ in range(3))
    A, B, C = ctx.set("a", a), ctx.set("b", b), ctx.set("c", c)
    ia, ib, ic = ([int(v) for v in x] for x in (a, b, c))
    binary: dict[str, Callable[[int, int], int]] = {
        "add.sat": lambda x, y: x + y,
        "sub.sat": lambda x, y: x - y,
    }
    for name, f in binary.items():
        run(ctx, f"{name}.s32", R("d"), A, B)
        assert [int(v) for v in ctx.get("d", "s32")] == [sat(f(x, y)) for x, y in zip(ia, ib)]
    run(ctx, "mad.hi.sat.s32", R("d"), A, B, C)
    assert [int(v) for v in ctx.get("d", "s32")] == [
        sat(((x * y) >> 32) + z) for x, y, z in zip(ia, ib, ic)
    ]
    run(ctx, "max.relu.s32", R("d"), A, B)
    assert [int(v) for v in ctx.get("d", "s32")] == [max(x, y, 0) for x, y in zip(ia, ib)]
    run(ctx, "mul24.lo.s32", R("d"), A, B)
    assert [int(v) for v in ctx.get("d", "s32")] == [
        wrap(s24(x) * s24(y), "s32") for x, y in zip(ia, ib)
    ]


@pytest.mark.parametrize("t", ["b32", "b64"])
def test_bit_operations(rng: np.random.Generator, t: str) -> None:
    n, w = 256, int(t[1:])
    ctx = FakeCtx(n)
    ut = f"u{w}"
    a, b = rand_ints(rng, ut, n), rand_ints(rng, ut, n)
    A, B = ctx.set("a", a), ctx.set("b", b)
    ia, ib = [int(v) for v in a], [int(v) for v in b]
    amt = rng.integers(0, 2 * w + 4, n).astype(np.uint32)
    S = ctx.set("s", amt)
    run(ctx, f"shl.{t}", R("d"), A, S)
    assert [int(v) for v in ctx.get("d", ut)] == [
        (x << min(s, w)) & ((1 << w) - 1) for x, s in zip(ia, amt.tolist())
    ]
    run(ctx, f"shr.u{w}", R("d"), A, S)
    assert [int(v) for v in ctx.get("d", ut)] == [x >> min(s, w) for x, s in zip(ia, amt.tolist())]
    run(ctx, f"shr.s{w}", R("d"), A, S)
    assert [int(v) for v in ctx.get("d", f"s{w}")] == [
        wrap(x, f"s{w}") >> min(s, w) for x, s in zip(ia, amt.tolist())
    ]
    run(ctx, f"popc.{t}", R("d"), A)
    assert [int(v) for v in ctx.get("d", "u32")] == [bin(x).count("1") for x in ia]
    run(ctx, f"clz.{t}", R("d"), A)
    assert [int(v) for v in ctx.get("d", "u32")] == [w - x.bit_length() for x in ia]
    run(ctx, f"brev.{t}", R("d"), A)
    assert [int(v) for v in ctx.get("d", ut)] == [int(f"{x:0{w}b}"[::-1], 2) for x in ia]
    run(ctx, f"bfind.s{w}", R("d"), A)
    want = []
    for x in ia:
        y = (~x & ((1 << w) - 1)) if x >> (w - 1) else x
        want.append(y.bit_length() - 1 if y else 0xFFFFFFFF)
    assert [int(v) for v in ctx.get("d", "u32")] == want
    pos, ln = (
        rng.integers(0, w + 8, n).astype(np.uint32),
        rng.integers(0, w + 8, n).astype(np.uint32),
    )
    P, L = ctx.set("pos", pos), ctx.set("len", ln)
    for k in "us":
        run(ctx, f"bfe.{k}{w}", R("d"), A, P, L)
        want = []
        for x, p_, l_ in zip(ia, pos.tolist(), ln.tolist()):
            msb = w - 1
            sbit = 0 if k == "u" or l_ == 0 else x >> min(p_ + l_ - 1, msb) & 1
            want.append(
                sum(
                    ((x >> (p_ + i) & 1) if (i < l_ and p_ + i <= msb) else sbit) << i
                    for i in range(w)
                )
            )
        assert [int(v) for v in ctx.get("d", ut)] == want, f"bfe.{k}{w}"
    run(ctx, f"bfi.{t}", R("d"), A, B, P, L)
    want = []
    for x, y, p_, l_ in zip(ia, ib, pos.tolist(), ln.tolist()):
        for i in range(l_):
            if p_ + i > w - 1:
                break
            y = (y & ~(1 << (p_ + i))) | ((x >> i & 1) << (p_ + i))
        want.append(y)
    assert [int(v) for v in ctx.get("d", ut)] == want


def test_logic_prmt_lop3_shf(rng: np.random.Generator) -> None:
    n = 128
    ctx = FakeCtx(n)
    a, b, c = (rand_ints(rng, "u32", n) for _ in range(3))
    A, B, C = ctx.set("a", a), ctx.set("b", b), ctx.set("c", c)
    ia, ib, ic = ([int(v) for v in x] for x in (a, b, c))
    for lut in [*rng.integers(0, 256, 6).tolist(), 0x80, 0xFE, 0x96]:
        run(ctx, "lop3.b32", R("d"), A, B, C, Imm(lut))
        want = []
        for x, y, z in zip(ia, ib, ic):
            want.append(
                sum(
                    (lut >> ((x >> i & 1) << 2 | (y >> i & 1) << 1 | (z >> i & 1)) & 1) << i
                    for i in range(32)
                )
            )
        assert [int(v) for v in ctx.get("d", "u32")] == want, f"lut {lut:#x}"
    sel = rng.integers(0, 2**16, n).astype(np.uint32)
    run(ctx, "prmt.b32", R("d"), A, B, ctx.set("sel", sel))
    want = []
    for x, y, s in zip(ia, ib, sel.tolist()):
        src, out = x | y << 32, 0
        for i in range(4):
            nib = s >> (4 * i) & 0xF
            byte = src >> (8 * (nib & 7)) & 0xFF
            out |= (0xFF if byte & 0x80 else 0) << (8 * i) if nib & 8 else byte << (8 * i)
        want.append(out)
    assert [int(v) for v in ctx.get("d", "u32")] == want
    ctx2 = FakeCtx(32)
    X, Y = (
        ctx2.set("x", np.full(32, 0x33221100, np.uint32)),
        ctx2.set("y", np.full(32, 0x77665544, np.uint32)),
    )
    for mode, ctl, expect in [
        ("f4e", 1, 0x44332211),
        ("b4e", 0, 0x55667700),
        ("rc8", 2, 0x22222222),
        ("ecl", 1, 0x33221111),
        ("ecr", 2, 0x22221100),
        ("rc16", 1, 0x33223322),
    ]:
        run(ctx2, f"prmt.b32.{mode}", R("d"), X, Y, Imm(ctl))
        assert int(ctx2.get("d", "u32")[0]) == expect, mode
    amt = rng.integers(0, 40, n).astype(np.uint32)
    run(ctx, "shf.l.clamp.b32", R("d"), A, B, ctx.set("n", amt))
    assert [int(v) for v in ctx.get("d", "u32")] == [
        ((y << 32 | x) << min(s, 32)) >> 32 & 0xFFFFFFFF for x, y, s in zip(ia, ib, amt.tolist())
    ]
    run(ctx, "shf.r.wrap.b32", R("d"), A, B, R("n"))
    assert [int(v) for v in ctx.get("d", "u32")] == [
        ((y << 32 | x) >> (s & 31)) & 0xFFFFFFFF for x, y, s in zip(ia, ib, amt.tolist())
    ]
    run(ctx, "cnot.b32", R("d"), ctx.set("z", np.where(a % 3 == 0, 0, a).astype(np.uint32)))
    assert [int(v) for v in ctx.get("d", "u32")] == [int(x % 3 == 0) for x in ia]
    p, q = ctx.set("p", rng.random(n) < 0.5), ctx.set("q", rng.random(n) < 0.5)
    run(ctx, "and.pred", R("r"), p, Neg(q))
    assert (ctx.get("r", "pred") == (ctx.get("p", "pred") & ~ctx.get("q", "pred"))).all()


# --- floating point -----------------------------------------------------------------------------

MODES = ["rn", "rz", "rm", "rp"]


@pytest.mark.parametrize("mode", MODES)
def test_f32_arithmetic_rounding(rng: np.random.Generator, mode: str) -> None:
    n = 1024
    ctx = FakeCtx(n)
    a, b, c = (rand_f32_bits(rng, n) for _ in range(3))
    with np.errstate(all="ignore"):
        prod = (
            a.view(np.float32).astype(np.float64) * b.view(np.float32).astype(np.float64)
        ).astype(np.float32)
    c[100:300] = (-prod[100:300]).view(np.uint32)  # cancellation in fma
    # a*b = 1 + 2**-11 + 2**-24 is an f32 midpoint; a tiny c decides the rounding, which a
    # double rounding (f64, then f32) gets wrong.
    mid = np.float32(1 + 2.0**-12).view(np.uint32)
    a[300:320], b[300:320] = mid, mid
    c[300:320] = np.float32(2.0**-80).view(np.uint32) | np.where(np.arange(20) % 2, 0x80000000, 0)
    A, B, C = (ctx.set(k, v.view(np.float32)) for k, v in (("a", a), ("b", b), ("c", c)))
    fa, fb, fc = ([fr(int(x), "f32") for x in v] for v in (a, b, c))
    va, vb, vc = ([decode(int(x), "f32") for x in v] for v in (a, b, c))

    def exact(
        f: Callable[..., Fraction], *xs: Fraction | None, floats: tuple[float, ...]
    ) -> Fraction | float | None:
        if any(x is None for x in xs):  # special operands: IEEE result is mode-independent
            with np.errstate(all="ignore"):
                r = float(f(*(np.float64(v) for v in floats)))
            return None if math.isnan(r) else r
        return f(*xs)

    ops: dict[str, tuple[Callable[..., Fraction], int]] = {
        "add": (lambda x, y: x + y, 2),
        "sub": (lambda x, y: x - y, 2),
        "mul": (lambda x, y: x * y, 2),
        "fma": (lambda x, y, z: x * y + z, 3),
        "div": (lambda x, y: x / y, 2),
    }
    for name, (f, nsrc) in ops.items():
        run(ctx, f"{name}.{mode}.f32", R("d"), *(A, B, C)[:nsrc])
        want = []
        for i in range(n):
            xs = (fa[i], fb[i], fc[i])[:nsrc]
            fl = (va[i], vb[i], vc[i])[:nsrc]
            if name == "div" and xs[1] == 0 and xs[0] is not None:
                want.append(exact(f, None, floats=fl))
            else:
                want.append(exact(f, *xs, floats=fl))
        check_float(ctx.get("d", "u32"), want, "f32", mode, f"{name}.{mode}")
    # exact zero signs (IEEE 754 §6.3): x + (-x) is -0 only under rm
    z = FakeCtx(32)
    run(
        z,
        f"add.{mode}.f32",
        R("d"),
        z.set("x", np.full(32, 1.5, np.float32)),
        z.set("y", np.full(32, -1.5, np.float32)),
    )
    assert np.signbit(z.get("d", "f32")).all() == (mode == "rm")


@pytest.mark.parametrize("mode", MODES)
def test_f32_sqrt_rcp_rounding(rng: np.random.Generator, mode: str) -> None:
    n = 512
    ctx = FakeCtx(n)
    a = rand_f32_bits(rng, n)
    A = ctx.set("a", a.view(np.float32))
    run(ctx, f"rcp.{mode}.f32", R("d"), A)
    want: list[Fraction | float | None] = []
    for x in a.tolist():
        v = decode(x, "f32")
        if math.isnan(v) or math.isinf(v) or v == 0:
            want.append(
                None if math.isnan(v) else (0.0 if math.isinf(v) else math.copysign(math.inf, v))
            )
        else:
            want.append(1 / Fraction(v))
    got = ctx.get("d", "u32")
    for i in range(n):  # zero results: check the sign separately
        if isinstance(want[i], float) and want[i] == 0:
            assert decode(int(got[i]), "f32") == 0
            want[i] = decode(int(got[i]), "f32")
    check_float(got, want, "f32", mode, "rcp")
    run(ctx, f"sqrt.{mode}.f32", R("d"), A)
    got = ctx.get("d", "u32")
    for x, g in zip(a.tolist(), got.tolist()):
        v, r = decode(x, "f32"), decode(int(g), "f32")
        if math.isnan(v) or v < 0:
            assert math.isnan(r)
        elif math.isinf(v) or v == 0:
            assert r == v
        else:  # r must be the mode's rounding of sqrt(v): bracket with its neighbours
            lo, hi = (
                float(np.nextafter(np.float32(r), np.float32(-1))),
                float(np.nextafter(np.float32(r), np.float32(math.inf))),
            )
            R2, V = Fraction(r) ** 2, Fraction(v)
            if mode in ("rz", "rm"):
                assert R2 <= V < Fraction(hi) ** 2
            elif mode == "rp":
                assert Fraction(lo) ** 2 < V <= R2
            else:
                assert (
                    ((Fraction(lo) + Fraction(r)) / 2) ** 2
                    <= V
                    <= ((Fraction(r) + Fraction(hi)) / 2) ** 2
                )


def test_f32_ftz_sat() -> None:
    ctx = FakeCtx(32)
    tiny = np.float32(1e-40)  # subnormal
    vals = np.array([tiny, -tiny, 2.0, -3.0, np.nan, 0.25, 1.5, -0.0] * 4, np.float32)
    A = ctx.set("a", vals)
    one = ctx.set("one", np.ones(32, np.float32))
    run(ctx, "mul.ftz.f32", R("d"), A, one)
    out = ctx.get("d", "f32")
    assert out[0] == 0 and not np.signbit(out[0]) and out[1] == 0 and np.signbit(out[1])
    run(ctx, "mul.f32", R("d"), A, one)
    assert ctx.get("d", "f32")[0] == tiny
    run(ctx, "add.sat.f32", R("d"), A, ctx.set("zero", np.zeros(32, np.float32)))
    out = ctx.get("d", "f32")
    assert list(out[:8]) == [tiny, 0.0, 1.0, 0.0, 0.0, 0.25, 1.0, 0.0] and not np.signbit(out).any()
    run(ctx, "fma.rn.ftz.sat.f32", R("d"), A, one, ctx.set("zero", np.zeros(32, np.float32)))
    assert ctx.get("d", "f32")[0] == 0


@pytest.mark.parametrize("mode", MODES)
def test_f64_rounding(rng: np.random.Generator, mode: str) -> None:
    n = 512
    ctx = FakeCtx(n)
    wild = rng.random(n) < 0.3
    vals = [
        np.where(
            wild,
            rng.integers(0, 2**64, n, dtype=np.uint64).view(np.float64),
            rng.standard_normal(n) * np.exp2(rng.integers(-40, 40, n)),
        )
        for _ in range(3)
    ]
    with np.errstate(all="ignore"):
        vals[2][:100] = -vals[0][:100] * vals[1][:100]
    A, B, C = (ctx.set(k, v) for k, v in zip("abc", vals))
    fs = [[Fraction(float(x)) if np.isfinite(x) else None for x in v] for v in vals]
    ops: dict[str, tuple[Callable[..., Fraction], int]] = {
        "add": (lambda x, y: x + y, 2),
        "mul": (lambda x, y: x * y, 2),
        "div": (lambda x, y: x / y, 2),
        "fma": (lambda x, y, z: x * y + z, 3),
    }
    for name, (f, nsrc) in ops.items():
        run(ctx, f"{name}.{mode}.f64", R("d"), *(A, B, C)[:nsrc])
        got = ctx.get("d", "u64")
        for i in range(n):
            xs = [fs[k][i] for k in range(nsrc)]
            if any(x is None for x in xs) or (name == "div" and xs[1] == 0):
                continue
            ex = f(*xs)
            v = decode(int(got[i]), "f64")
            want = ref_round(ex, "f64", mode)
            if isinstance(want, float):
                assert v == want, f"{name}.{mode}.f64[{i}]"
            else:
                assert Fraction(v) == want, (
                    f"{name}.{mode}.f64[{i}]: {float(ex)!r} → {float(want)!r}, got {v!r}"
                )
    run(ctx, f"sqrt.{mode}.f64", R("d"), ctx.set("s", np.abs(vals[0])))
    got = ctx.get("d", "f64")
    for x, r in zip(np.abs(vals[0]).tolist(), got.tolist()):
        if np.isfinite(x) and x > 0:
            lo, hi = (
                Fraction(float(np.nextafter(r, -1))),
                Fraction(float(np.nextafter(r, math.inf))),
            )
            X, G = Fraction(x), Fraction(r)
            ok = {
                "rz": G * G <= X < hi * hi,
                "rm": G * G <= X < hi * hi,
                "rp": lo * lo < X <= G * G,
            }
            assert ok.get(mode, ((lo + G) / 2) ** 2 <= X <= ((G + hi) / 2) ** 2)


@pytest.mark.parametrize("ftype", ["f16", "bf16", "f16x2", "bf16x2"])
def test_half_arithmetic(rng: np.random.Generator, ftype: str) -> None:
    n = 512
    ctx = FakeCtx(n)
    elem = ftype[:-2] if ftype.endswith("x2") else ftype
    k = 2 if ftype.endswith("x2") else 1
    width = 16 * k
    raw = [rng.integers(0, 2**width, n, dtype=np.uint64) for _ in range(3)]
    dt = np.uint32 if k == 2 else np.uint16
    A, B, C = (ctx.set(name, r.astype(dt)) for name, r in zip("abc", raw))
    cases: list[tuple[str, Callable[..., Any], int]] = [
        ("add.rn", lambda x, y: x + y, 2),
        ("mul", lambda x, y: x * y, 2),
        ("fma.rn", lambda x, y, z: x * y + z, 3),
        ("sub", lambda x, y: x - y, 2),
    ]
    for name, f, nsrc in cases:
        run(ctx, f"{name}.{ftype}", R("d"), *(A, B, C)[:nsrc])
        got = ctx.get("d", "u32" if k == 2 else "u16").astype(np.uint64)
        for h in range(k):
            want: list[Fraction | float | None] = []
            for i in range(n):
                xs = [int(r[i]) >> (16 * h) & 0xFFFF for r in raw[:nsrc]]
                fl = [decode(x, elem) for x in xs]
                if any(math.isnan(v) or math.isinf(v) for v in fl):
                    with np.errstate(all="ignore"):
                        r_ = float(f(*(np.float64(v) for v in fl)))
                    want.append(None if math.isnan(r_) else r_)
                else:
                    want.append(f(*(Fraction(v) for v in fl)))
            check_float(
                (got >> np.uint64(16 * h)) & np.uint64(0xFFFF), want, elem, "rn", f"{name}.{ftype}"
            )


def test_min_max_nan_rules() -> None:
    ctx = FakeCtx(32)
    nan = np.float32(np.nan)
    a = np.array([1.0, nan, nan, -0.0, 0.0, -2.0, 3.0, 1e-40] * 4, np.float32)
    b = np.array([2.0, 5.0, nan, 0.0, -0.0, nan, -4.0, 0.0] * 4, np.float32)
    A, B = ctx.set("a", a), ctx.set("b", b)
    run(ctx, "min.f32", R("d"), A, B)
    d = ctx.get("d", "f32")
    assert d[0] == 1 and d[1] == 5 and np.isnan(d[2]) and np.signbit(d[3]) and np.signbit(d[4])
    assert d[5] == -2 and d[6] == -4 and d[7] == 0
    run(ctx, "max.f32", R("d"), A, B)
    d = ctx.get("d", "f32")
    assert (
        d[0] == 2
        and d[1] == 5
        and not np.signbit(d[3])
        and not np.signbit(d[4])
        and d[7] == np.float32(1e-40)
    )
    run(ctx, "max.ftz.f32", R("d"), A, B)
    assert ctx.get("d", "f32")[7] == 0
    run(ctx, "min.NaN.f32", R("d"), A, B)
    d = ctx.get("d", "u32")
    assert d[1] == 0x7FFFFFFF and d[5] == 0x7FFFFFFF and ctx.get("d", "f32")[0] == 1
    run(ctx, "min.xorsign.abs.f32", R("d"), A, B)
    d = ctx.get("d", "f32")
    assert d[0] == 1 and d[6] == -3
    run(
        ctx,
        "max.f64",
        R("d"),
        ctx.set("x", a.astype(np.float64)),
        ctx.set("y", b.astype(np.float64)),
    )
    assert ctx.get("d", "f64")[1] == 5


def test_approx_functions(rng: np.random.Generator) -> None:
    n = 256
    ctx = FakeCtx(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    X = ctx.set("x", x)
    refs: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "ex2": np.exp2,
        "sin": np.sin,
        "cos": np.cos,
        "tanh": np.tanh,
    }
    for name, f in refs.items():
        run(ctx, f"{name}.approx.f32", R("d"), X)
        np.testing.assert_allclose(
            ctx.get("d", "f32"), f(x.astype(np.float64)), rtol=2e-6, atol=1e-6
        )
    p32 = np.abs(x) + np.float32(0.01)
    pos = ctx.set("p", p32)
    px = p32.astype(np.float64)
    more: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "lg2": np.log2,
        "rsqrt": lambda v: 1 / np.sqrt(v),
        "sqrt": np.sqrt,
        "rcp": lambda v: 1 / v,
    }
    for name, g in more.items():
        run(ctx, f"{name}.approx.ftz.f32", R("d"), pos)
        np.testing.assert_allclose(ctx.get("d", "f32"), g(px), rtol=2e-6)
    special = FakeCtx(32)
    S = special.set(
        "s", np.array([-np.inf, -1e-40, -0.0, 0.0, 1e-40, np.inf, np.nan, 1.0] * 4, np.float32)
    )
    expect = {
        "rcp": [-0.0, -np.inf, -np.inf, np.inf, np.inf, 0.0, np.nan, 1.0],
        "sqrt": [np.nan, -0.0, -0.0, 0.0, 0.0, np.inf, np.nan, 1.0],
        "rsqrt": [np.nan, -np.inf, -np.inf, np.inf, np.inf, 0.0, np.nan, 1.0],
        "lg2": [np.nan, -np.inf, -np.inf, -np.inf, -np.inf, np.inf, np.nan, 0.0],
        "ex2": [0.0, 1.0, 1.0, 1.0, 1.0, np.inf, np.nan, 2.0],
        "tanh": [-1.0, -1e-40, -0.0, 0.0, 1e-40, 1.0, np.nan, np.tanh(1.0)],
    }
    for name, e in expect.items():
        run(special, f"{name}.approx.f32", R("d"), S)
        got = special.get("d", "f32")[:8]
        want = np.array(e, np.float32)
        np.testing.assert_array_equal(got, want, err_msg=name)
        assert (np.signbit(got) == np.signbit(want)).all(), name
    # f16 forms: correctly rounded to f16
    h = np.float16(rng.standard_normal(n))
    run(ctx, "ex2.approx.f16", R("d"), ctx.set("h", h))
    np.testing.assert_array_equal(
        ctx.get("d", "f16"), np.exp2(h.astype(np.float64)).astype(np.float16)
    )


def test_div_approx_and_full(rng: np.random.Generator) -> None:
    n = 64
    ctx = FakeCtx(n)
    a = (rng.standard_normal(n) * 10).astype(np.float32)
    b = (rng.standard_normal(n) * 10).astype(np.float32)
    b[0], b[1], a[2], b[2] = 0.0, np.float32(2.0**127), np.inf, np.float32(2.0**127)
    A, B = ctx.set("a", a), ctx.set("b", b)
    for kind in ("approx", "full"):
        run(ctx, f"div.{kind}.f32", R("d"), A, B)
        got = ctx.get("d", "f32")
        np.testing.assert_allclose(got[3:], a[3:].astype(np.float64) / b[3:], rtol=3e-7)
        assert got[0] == np.copysign(np.inf, a[0])
    run(ctx, "div.approx.f32", R("d"), A, B)
    assert ctx.get("d", "f32")[1] == 0 and np.isnan(ctx.get("d", "f32")[2])


# --- conversions ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_cvt_f32_to_half(rng: np.random.Generator, mode: str) -> None:
    n = 2048
    ctx = FakeCtx(n)
    bits = rand_f32_bits(rng, n)
    bits[20:60] = (np.float32(rng.uniform(60000, 70000, 40))).view(np.uint32)  # f16 overflow region
    bits[60:120] = (np.float32(rng.uniform(-1, 1, 60) * 2.0**-20)).view(np.uint32)  # f16 subnormals
    A = ctx.set("a", bits.view(np.float32))
    run(ctx, f"cvt.{mode}.f16.f32", R("d"), A)
    got = ctx.get("d", "u16")
    if mode == "rn":
        with np.errstate(all="ignore"):
            want = bits.view(np.float32).astype(np.float16).view(np.uint16)
        nan = np.isnan(bits.view(np.float32))
        assert (got[~nan] == want[~nan]).all()
        assert (got[nan] == 0x7FFF).all()
    exact = [
        None
        if math.isnan(decode(int(x), "f32"))
        else (fr(int(x), "f32") if fr(int(x), "f32") is not None else decode(int(x), "f32"))
        for x in bits
    ]
    check_float(got, exact, "f16", mode, f"cvt.{mode}.f16.f32")
    run(ctx, f"cvt.{mode}.bf16.f32", R("d"), A)
    got = ctx.get("d", "u16")
    check_float(got, exact, "bf16", mode, f"cvt.{mode}.bf16.f32")
    if mode == "rn":  # the bit-level bf16 reference: add 0x7FFF + lsb, truncate
        u = bits.astype(np.uint64)
        ref = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        ok = ~np.isnan(bits.view(np.float32))
        assert (got[ok] == ref[ok]).all()


def test_cvt_packed_and_tf32(rng: np.random.Generator) -> None:
    n = 256
    ctx = FakeCtx(n)
    a, b = rand_f32_bits(rng, n), rand_f32_bits(rng, n)
    A, B = ctx.set("a", a.view(np.float32)), ctx.set("b", b.view(np.float32))
    run(ctx, "cvt.rn.f16x2.f32", R("d"), A, B)
    d = ctx.get("d", "u32").astype(np.uint32)
    run(ctx, "cvt.rn.f16.f32", R("ha"), A)
    run(ctx, "cvt.rn.f16.f32", R("hb"), B)
    assert ((d >> 16) == ctx.get("ha", "u16")).all() and (
        (d & 0xFFFF) == ctx.get("hb", "u16")
    ).all()
    run(ctx, "cvt.rn.bf16x2.f32", R("d"), A, B)
    d = ctx.get("d", "u32").astype(np.uint32)
    run(ctx, "cvt.rn.bf16.f32", R("ha"), A)
    assert ((d >> 16) == ctx.get("ha", "u16")).all()
    run(ctx, "cvt.rna.tf32.f32", R("d"), A)
    got = ctx.get("d", "u32")
    ref = ((a.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)  # ties away from zero
    ok = ~np.isnan(a.view(np.float32))
    assert (got[ok] == ref[ok]).all()


@pytest.mark.parametrize("mode", MODES)
def test_cvt_int_float(rng: np.random.Generator, mode: str) -> None:
    n = 512
    ctx = FakeCtx(n)
    for it in ("s32", "u32", "s64", "u64"):
        v = rand_ints(rng, it, n)
        V = ctx.set("v", v)
        for ft in ("f32", "f64", "f16"):
            run(ctx, f"cvt.{mode}.{ft}.{it}", R("d"), V)
            got = ctx.get("d", {"f32": "u32", "f64": "u64", "f16": "u16"}[ft])
            check_float(got, [Fraction(int(x)) for x in v], ft, mode, f"cvt.{mode}.{ft}.{it}")
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(0, 70, n)).astype(np.float64)
    x[:6] = [np.nan, np.inf, -np.inf, 2.5, -2.5, -0.5]
    X32 = ctx.set("x32", x.astype(np.float32))
    X64 = ctx.set("x64", x)
    irnd = {"rn": "rni", "rz": "rzi", "rm": "rmi", "rp": "rpi"}[mode]
    rounders: dict[str, Callable[[float], int]] = {
        "rni": round,
        "rzi": math.trunc,
        "rmi": math.floor,
        "rpi": math.ceil,
    }
    rfun = rounders[irnd]
    for src, vals in (("f32", x.astype(np.float32).astype(np.float64)), ("f64", x)):
        for it in ("s32", "u32", "s64", "u64", "s16", "u8"):
            run(ctx, f"cvt.{irnd}.{it}.{src}", R("d"), X32 if src == "f32" else X64)
            w = int(it[1:])
            lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if it[0] == "s" else (0, (1 << w) - 1)
            want = []
            for y in vals.tolist():
                if math.isnan(y):
                    want.append(wrap(1 << (w - 1), it) if (src == "f64" or w == 64) else 0)
                elif math.isinf(y):
                    want.append(hi if y > 0 else lo)
                else:
                    want.append(max(lo, min(hi, rfun(y))))
            assert [int(q) for q in ctx.get("d", it)] == want, f"cvt.{irnd}.{it}.{src}"


def test_cvt_int_to_int_and_float_widen(rng: np.random.Generator) -> None:
    n = 256
    ctx = FakeCtx(n)
    for src in ("s32", "u32", "s64", "s16"):
        v = rand_ints(rng, src, n)
        V = ctx.set("v", v)
        for dst in ("s8", "u8", "s16", "u16", "s32", "u32", "u64", "s64"):
            w = int(dst[1:])
            lo, hi = (-(1 << (w - 1)), (1 << (w - 1)) - 1) if dst[0] == "s" else (0, (1 << w) - 1)
            run(ctx, f"cvt.{dst}.{src}", R("d"), V)
            assert [int(q) for q in ctx.get("d", dst)] == [wrap(int(x), dst) for x in v]
            run(ctx, f"cvt.sat.{dst}.{src}", R("d"), V)
            assert [int(q) for q in ctx.get("d", dst)] == [max(lo, min(hi, int(x))) for x in v]
    h = rng.integers(0, 2**16, n).astype(np.uint16)
    run(ctx, "cvt.f32.f16", R("d"), ctx.set("h", h))
    got, want = ctx.get("d", "f32"), h.view(np.float16).astype(np.float32)
    assert ((got == want) | (np.isnan(got) & np.isnan(want))).all()
    run(ctx, "cvt.f32.bf16", R("d"), R("h"))
    want = (h.astype(np.uint32) << 16).view(np.float32)
    assert ((got := ctx.get("d", "f32")) == want)[~np.isnan(want)].all() and np.isnan(
        got[np.isnan(want)]
    ).all()
    f = np.array([1.5, 2.5, -0.5, 1e-40, -1e-40, 3.7, np.nan, -2.5] * 4, np.float32)
    F = FakeCtx(32)
    run(F, "cvt.rni.f32.f32", R("d"), F.set("f", f))
    np.testing.assert_array_equal(
        F.get("d", "f32")[:8], np.array([2, 2, -0.0, 0, -0.0, 4, np.nan, -2], np.float32)
    )
    run(F, "cvt.rmi.ftz.f32.f32", R("d"), R("f"))
    assert F.get("d", "f32")[4] == 0  # -subnormal flushed to -0 before rounding down
    run(F, "cvt.rmi.f32.f32", R("d"), R("f"))
    assert F.get("d", "f32")[4] == -1


# --- comparison, selection, moves ---------------------------------------------------------------


def test_setp_float_and_int(rng: np.random.Generator) -> None:
    n = 256
    ctx = FakeCtx(n)
    pool = np.array([np.nan, -np.inf, -1.0, -0.0, 0.0, 1e-40, 1.0, np.inf], np.float32)
    a, b = rng.choice(pool, n), rng.choice(pool, n)
    A, B = ctx.set("a", a), ctx.set("b", b)
    c = rng.random(n) < 0.5
    Cp = ctx.set("c", c)
    cmp: dict[str, Callable[[float, float], bool]] = {
        "eq": lambda x, y: x == y,
        "ne": lambda x, y: x != y and not (math.isnan(x) or math.isnan(y)),
        "lt": lambda x, y: x < y,
        "le": lambda x, y: x <= y,
        "gt": lambda x, y: x > y,
        "ge": lambda x, y: x >= y,
    }

    def unordered(f: Callable[[float, float], bool]) -> Callable[[float, float], bool]:
        return lambda x, y: math.isnan(x) or math.isnan(y) or f(x, y)

    for op, f in list(cmp.items()):
        cmp[op + "u"] = unordered(f)
    cmp["num"] = lambda x, y: not (math.isnan(x) or math.isnan(y))
    cmp["nan"] = lambda x, y: math.isnan(x) or math.isnan(y)
    for op, f in cmp.items():
        run(ctx, f"setp.{op}.f32", R("p"), R("q"), A, B)
        t = np.array([f(float(x), float(y)) for x, y in zip(a, b)])
        assert (ctx.get("p", "pred") == t).all() and (ctx.get("q", "pred") == ~t).all(), op
        run(ctx, f"setp.{op}.and.f32", Vec((R("p"), R("q"))), A, B, Neg(Cp))
        assert (ctx.get("p", "pred") == (t & ~c)).all() and (
            ctx.get("q", "pred") == (~t & ~c)
        ).all()
    run(ctx, "setp.ltu.ftz.f32", R("p"), A, B)
    t = np.array(
        [
            cmp["ltu"](
                0.0 if x == np.float32(1e-40) else float(x),
                0.0 if y == np.float32(1e-40) else float(y),
            )
            for x, y in zip(a, b)
        ]
    )
    assert (ctx.get("p", "pred") == t).all()
    for it in ("s32", "u32", "u64", "s16"):
        x, y = rand_ints(rng, it, n), rand_ints(rng, it, n)
        y[::3] = x[::3]
        X, Y = ctx.set("x", x), ctx.set("y", y)
        ops = {
            "eq": np.equal,
            "ne": np.not_equal,
            "lt": np.less,
            "le": np.less_equal,
            "gt": np.greater,
            "ge": np.greater_equal,
        }
        if it[0] == "u":
            ops |= {"lo": np.less, "ls": np.less_equal, "hi": np.greater, "hs": np.greater_equal}
        for op, g in ops.items():
            run(ctx, f"setp.{op}.xor.{it}", R("p"), X, Y, Cp)
            assert (ctx.get("p", "pred") == (g(x, y) ^ c)).all(), op
    h = rng.choice(pool, (2, n)).astype(np.float16)
    packed = h[0].view(np.uint16).astype(np.uint32) | (h[1].view(np.uint16).astype(np.uint32) << 16)
    zero = ctx.set("z", np.zeros(n, np.uint32))
    run(ctx, "setp.gt.f16x2", R("p"), R("q"), ctx.set("h", packed), zero)
    assert (ctx.get("p", "pred") == (h[0] > 0)).all() and (ctx.get("q", "pred") == (h[1] > 0)).all()
    run(ctx, "set.lt.u32.f32", R("d"), A, B)
    assert (ctx.get("d", "u32") == np.where(a < b, 0xFFFFFFFF, 0)).all()
    run(ctx, "set.lt.f32.f32", R("d"), A, B)
    assert (ctx.get("d", "f32") == np.where(a < b, 1.0, 0.0)).all()


def test_selp_slct_mov_copysign_testp(rng: np.random.Generator) -> None:
    n = 64
    ctx = FakeCtx(n)
    a, b = rand_f32_bits(rng, n), rand_f32_bits(rng, n)
    A, B = ctx.set("a", a.view(np.float32)), ctx.set("b", b.view(np.float32))
    c = rng.random(n) < 0.5
    run(ctx, "selp.f32", R("d"), A, B, ctx.set("c", c))
    assert (ctx.get("d", "u32") == np.where(c, a, b)).all()
    s = np.float32(rng.choice([-1.0, 0.0, -0.0, 2.0, np.nan, -1e-40], n))
    run(ctx, "slct.b32.f32", R("d"), A, B, ctx.set("s", s))
    assert (ctx.get("d", "u32") == np.where(s >= 0, a, b)).all()
    run(ctx, "slct.ftz.b32.f32", R("d"), A, B, R("s"))
    assert (ctx.get("d", "u32") == np.where((s >= 0) | (s == np.float32(-1e-40)), a, b)).all()
    lo, hi = (
        rng.integers(0, 2**16, n).astype(np.uint16),
        rng.integers(0, 2**16, n).astype(np.uint16),
    )
    run(ctx, "mov.b32", R("d"), Vec((ctx.set("lo", lo), ctx.set("hi", hi))))
    packed = lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)
    assert (ctx.get("d", "u32") == packed).all()
    run(ctx, "mov.b32", Vec((R("x"), R("y"))), R("d"))
    assert (ctx.get("x", "u16") == lo).all() and (ctx.get("y", "u16") == hi).all()
    w = rng.integers(0, 2**64, n, dtype=np.uint64)
    run(ctx, "mov.b64", Vec((R("l"), Sink())), ctx.set("w", w))
    assert (ctx.get("l", "u32") == (w & 0xFFFFFFFF)).all()
    run(ctx, "mov.b64", R("w2"), Vec((R("l"), ctx.set("h2", (w >> 32).astype(np.uint32)))))
    assert (ctx.get("w2", "u64") == w).all()
    run(ctx, "mov.f32", R("f"), Imm(1.5, 0x3FC00000))
    assert (ctx.get("f", "f32") == 1.5).all()
    run(ctx, "copysign.f32", R("d"), A, B)
    assert (ctx.get("d", "u32") == ((b & 0x7FFFFFFF) | (a & 0x80000000))).all()
    for op, f in {"finite": np.isfinite, "infinite": np.isinf, "notanumber": np.isnan}.items():
        run(ctx, f"testp.{op}.f32", R("p"), A)
        assert (ctx.get("p", "pred") == f(a.view(np.float32))).all()
    run(ctx, "testp.subnormal.f32", R("p"), A)
    av = a.view(np.float32)
    assert (ctx.get("p", "pred") == ((av != 0) & (np.abs(av) < np.finfo(np.float32).tiny))).all()


# --- warp level -----------------------------------------------------------------------------------


def shfl_reference(
    mode: str, vals: list[int], b: list[int], c: list[int], lane_base: int
) -> tuple[list[int], list[bool]]:
    out, preds = [], []
    for lane in range(32):
        i = lane_base + lane
        bval, cval, seg = b[i] & 31, c[i] & 31, (c[i] >> 8) & 31
        max_lane = (lane & seg) | (cval & ~seg & 31)
        min_lane = lane & seg
        if mode == "up":
            j = lane - bval
            p = j >= max_lane
        elif mode == "down":
            j = lane + bval
            p = j <= max_lane
        elif mode == "bfly":
            j = lane ^ bval
            p = j <= max_lane
        else:
            j = min_lane | (bval & ~seg & 31)
            p = j <= max_lane
        out.append(vals[lane_base + (j if p else lane)])
        preds.append(p)
    return out, preds


@pytest.mark.parametrize("mode", ["up", "down", "bfly", "idx"])
def test_shfl_sync(rng: np.random.Generator, mode: str) -> None:
    n = 128
    ctx = FakeCtx(n)
    v = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 40, n).astype(np.uint32)
    width = rng.choice([1, 2, 4, 8, 16, 32], n // 32).repeat(32)  # one sub-warp width per warp
    seg = (32 - width) & 31
    clamp = np.where(mode == "up", 0, width - 1) if rng.random() < 0.7 else rng.integers(0, 32, n)
    c = (seg << 8 | clamp).astype(np.uint32)
    V, Bo, Co = ctx.set("v", v), ctx.set("b", b), ctx.set("c", c)
    run(ctx, f"shfl.sync.{mode}.b32", R("d"), R("p"), V, Bo, Co, Imm(0xFFFFFFFF))
    got, gp = ctx.get("d", "u32"), ctx.get("p", "pred")
    for w in range(n // 32):
        ref, refp = shfl_reference(mode, v.tolist(), b.tolist(), c.tolist(), 32 * w)
        assert (
            got[32 * w : 32 * w + 32].tolist() == ref and gp[32 * w : 32 * w + 32].tolist() == refp
        )
    run(ctx, f"shfl.sync.{mode}.b32", Vec((R("d2"), Sink())), V, Bo, Co, Imm(0xFFFFFFFF))
    assert (ctx.get("d2", "u32") == got).all()
    # a thread sourcing an inactive lane is undefined in the ISA: the simulator reports it
    mask = np.ones(n, np.bool_)
    mask[1] = False
    bad = FakeCtx(n, mask)
    bad.set("v", v)
    with pytest.raises(SimError, match="inactive"):
        run(bad, "shfl.sync.idx.b32", R("d"), R("v"), Imm(1), Imm(0x1F), Imm(0xFFFFFFFF))
    with pytest.raises(SimError, match="membermask"):
        run(ctx, "shfl.sync.bfly.b32", R("d"), V, Imm(1), Imm(0x1F), Imm(0xFFFF))


def test_vote_activemask_redux(rng: np.random.Generator) -> None:
    n = 96
    mask = rng.random(n) < 0.8
    ctx = FakeCtx(n, mask)
    a = rng.random(n) < 0.5
    a[64:96] = True
    A = ctx.set("a", a)
    mm = np.full(n, 0xFFFFFFFF, np.uint32)
    M = ctx.set("mm", mm)
    run(ctx, "vote.sync.ballot.b32", R("d"), A, M)
    got = ctx.get("d", "u32")
    for w in range(3):
        want = sum(1 << i for i in range(32) if mask[32 * w + i] and a[32 * w + i])
        assert (got[32 * w : 32 * w + 32][mask[32 * w : 32 * w + 32]] == want).all()
    for mode in ("all", "any", "uni"):
        run(ctx, f"vote.sync.{mode}.pred", R("p"), Neg(A), M)
        got = ctx.get("p", "pred")
        for w in range(3):
            sel = ~a[32 * w : 32 * w + 32][mask[32 * w : 32 * w + 32]]
            expect = {"all": sel.all(), "any": sel.any(), "uni": sel.all() or not sel.any()}
            assert (got[32 * w : 32 * w + 32][mask[32 * w : 32 * w + 32]] == expect[mode]).all(), (
                mode
            )
    run(ctx, "activemask.b32", R("d"))
    got = ctx.get("d", "u32")
    assert got[mask][0] == sum(1 << i for i in range(32) if mask[i]) or not mask[:32].any()
    v = rng.integers(-1000, 1000, n).astype(np.int32)
    run(ctx, "redux.sync.add.s32", R("d"), ctx.set("v", v), M)
    got = ctx.get("d", "s32")
    for w in range(3):
        m_ = mask[32 * w : 32 * w + 32]
        assert (got[32 * w : 32 * w + 32][m_] == v[32 * w : 32 * w + 32][m_].sum()).all()


# --- mma ----------------------------------------------------------------------------------------


def _pack16(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.view(np.uint16).astype(np.uint32) | (hi.view(np.uint16).astype(np.uint32) << 16)


@pytest.mark.parametrize("atype", ["f16", "bf16", "tf32"])
def test_mma_fragments(rng: np.random.Generator, atype: str) -> None:
    """Fragments assembled per NOTES-PTX.md; D must equal A @ B + C."""
    nw = 2
    ctx = FakeCtx(32 * nw)
    k = 8 if atype == "tf32" else 16
    A = rng.standard_normal((nw, 16, k))
    B = rng.standard_normal((nw, k, 8))
    C = rng.standard_normal((nw, 16, 8)).astype(np.float32)
    if atype == "f16":
        A, B = A.astype(np.float16), B.astype(np.float16)
    elif atype == "bf16":  # exact bf16 values (f32 with 16 low bits cleared)
        A = (A.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
        B = (B.astype(np.float32).view(np.uint32) & 0xFFFF0000).view(np.float32)
    else:
        A = (A.astype(np.float32).view(np.uint32) & 0xFFFFE000).view(np.float32)
        B = (B.astype(np.float32).view(np.uint32) & 0xFFFFE000).view(np.float32)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3

    def h16(x: np.ndarray) -> np.ndarray:
        return (
            x if atype == "f16" else (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
        )

    a_regs, b_regs = [], []
    for r in range(4):
        if atype == "tf32":  # a0 (g,t) a1 (g+8,t) a2 (g,t+4) a3 (g+8,t+4)
            row, col = g + 8 * (r & 1), t + 4 * (r >> 1)
            a_regs.append(A[:, row, col].astype(np.float32).reshape(-1))
        else:  # a0 (g, 2t..) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
            row, col = g + 8 * (r & 1), 2 * t + 8 * (r >> 1)
            a_regs.append(
                _pack16(h16(A[:, row, col]).reshape(-1), h16(A[:, row, col + 1]).reshape(-1))
            )
    for r in range(2):
        if atype == "tf32":
            b_regs.append(B[:, t + 4 * r, g].astype(np.float32).reshape(-1))
        else:
            kk = 2 * t + 8 * r
            b_regs.append(_pack16(h16(B[:, kk, g]).reshape(-1), h16(B[:, kk + 1, g]).reshape(-1)))
    c_regs = [C[:, g + 8 * (r >> 1), 2 * t + (r & 1)].reshape(-1) for r in range(4)]
    va = Vec(tuple(ctx.set(f"a{i}", x) for i, x in enumerate(a_regs)))
    vb = Vec(tuple(ctx.set(f"b{i}", x) for i, x in enumerate(b_regs)))
    vc = Vec(tuple(ctx.set(f"c{i}", x) for i, x in enumerate(c_regs)))
    vd = Vec(tuple(R(f"d{i}") for i in range(4)))
    shape = "m16n8k8" if atype == "tf32" else "m16n8k16"
    run(ctx, f"mma.sync.aligned.{shape}.row.col.f32.{atype}.{atype}.f32", vd, va, vb, vc)
    want = A.astype(np.float64) @ B.astype(np.float64) + C.astype(np.float64)
    for r in range(4):
        got = ctx.get(f"d{r}", "f32").reshape(nw, 32)
        ref = want[:, g + 8 * (r >> 1), 2 * t + (r & 1)]
        np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    partial = FakeCtx(32 * nw, np.arange(32 * nw) != 3)
    partial.regs = ctx.regs
    with pytest.raises(SimError, match="all 32 lanes"):
        run(partial, f"mma.sync.aligned.{shape}.row.col.f32.{atype}.{atype}.f32", vd, va, vb, vc)


def test_unknown_modifiers_fail() -> None:
    ctx = FakeCtx(32)
    X = ctx.set("x", np.ones(32, np.float32))
    for spelled, ops in [
        ("add.cc.u32", (R("d"), X, X)),
        ("add.rn.foo.f32", (R("d"), X, X)),
        ("fma.f32", (R("d"), X, X, X)),
        ("cvt.f16.f32", (R("d"), X)),
        ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", (R("d"), X, X, X)),
    ]:
        with pytest.raises(SimError):
            run(ctx, spelled, *ops)


@pytest.mark.parametrize("mode", MODES)
def test_cvt_f64_narrowing(rng: np.random.Generator, mode: str) -> None:
    n = 1024
    ctx = FakeCtx(n)
    x = rng.standard_normal(n) * np.exp2(rng.integers(-160, 135, n).astype(np.float64))
    x[:64] = rng.uniform(-1, 1, 64) * 2.0 ** rng.choice([-126, -149, -14, -24, 16, 128], 64)
    x[64:70] = [65519.999, 65520.0, -65520.0, 2.0**-25, 2.0**-150, -(2.0**-150) * 3]
    X = ctx.set("x", x)
    for ft, reg in (("f32", "u32"), ("f16", "u16"), ("bf16", "u16")):
        run(ctx, f"cvt.{mode}.{ft}.f64", R("d"), X)
        check_float(ctx.get("d", reg), [Fraction(v) for v in x.tolist()], ft, mode, f"cvt.{ft}")


def test_cvt_saturation_modes() -> None:
    ctx = FakeCtx(32)
    x = np.array([-2.0, -0.0, 0.5, 1.5, np.nan, np.inf, -np.inf, 1e6] * 4, np.float32)
    X = ctx.set("x", x)
    run(ctx, "cvt.sat.f32.f32", R("d"), X)
    np.testing.assert_array_equal(ctx.get("d", "f32")[:8], [0, 0, 0.5, 1, 0, 1, 0, 1])
    assert not np.signbit(ctx.get("d", "f32")).any()
    run(ctx, "cvt.rn.relu.f16.f32", R("h"), X)
    h = ctx.get("h", "u16")[:8]
    assert h[0] == 0 and h[1] == 0 and h[4] == 0x7FFF and h[6] == 0
    run(ctx, "cvt.rn.satfinite.f16.f32", R("h"), X)
    h = ctx.get("h", "f16")[:8]
    assert h[5] == 65504 and h[6] == -65504 and h[7] == 65504 and np.isnan(h[4])
    run(ctx, "cvt.rn.f16.f32", R("h"), X)
    assert np.isinf(ctx.get("h", "f16")[7])
    with pytest.raises(SimError):
        run(ctx, "cvt.rn.f32.u8.s8", R("d"), X)


def test_half_ftz_sat_minmax() -> None:
    ctx = FakeCtx(32)
    tiny = np.float16(2.0**-20)  # f16 subnormal
    a = np.array([tiny, -tiny, 0.75, 3.0, np.nan, -1.0, 0.0, -0.0] * 4, np.float16)
    b = np.array([1.0, 1.0, 0.5, 1.0, 1.0, np.nan, -0.0, 0.0] * 4, np.float16)
    A, B = ctx.set("a", a), ctx.set("b", b)
    run(ctx, "mul.ftz.f16", R("d"), A, B)
    d = ctx.get("d", "f16")
    assert d[0] == 0 and np.signbit(d[1]) and d[2] == 0.375
    run(ctx, "add.sat.f16", R("d"), A, B)
    d = ctx.get("d", "u16")[:8]
    assert list(d[2:5]) == [0x3C00, 0x3C00, 0]  # 1.25 → 1.0, 4 → 1.0, NaN → +0
    run(ctx, "max.f16", R("d"), A, B)
    d = ctx.get("d", "f16")
    assert d[4] == 1 and d[5] == -1 and not np.signbit(d[6]) and not np.signbit(d[7])
    run(ctx, "min.NaN.f16", R("d"), A, B)
    assert ctx.get("d", "u16")[4] == 0x7FFF and ctx.get("d", "u16")[5] == 0x7FFF
    packed = ctx.set("p", np.full(32, 0xBC00_3C00, np.uint32))  # {lo = 1.0, hi = -1.0}
    run(ctx, "neg.bf16x2", R("d"), packed)
    assert ctx.get("d", "u32")[0] == 0x3C00_BC00
    run(
        ctx,
        "fma.rn.relu.f16x2",
        R("d"),
        packed,
        ctx.set("one", np.full(32, 0x3C00_3C00, np.uint32)),
        ctx.set("z", np.zeros(32, np.uint32)),
    )
    assert ctx.get("d", "u32")[0] == 0x0000_3C00


def test_match_redux_and_packed_int_minmax(rng: np.random.Generator) -> None:
    n = 64
    ctx = FakeCtx(n)
    v = rng.integers(0, 3, n).astype(np.uint32)
    V, M = ctx.set("v", v), ctx.set("m", np.full(n, 0xFFFFFFFF, np.uint32))
    run(ctx, "match.any.sync.b32", R("d"), V, M)
    got = ctx.get("d", "u32")
    for i in range(n):
        w = i // 32 * 32
        want = sum(1 << j for j in range(32) if v[w + j] == v[i])
        assert got[i] == want
    run(ctx, "match.all.sync.b32", Vec((R("d"), R("p"))), V, M)
    assert (ctx.get("d", "u32") == 0).all() and not ctx.get("p", "pred").any()
    same = ctx.set("s", np.full(n, 7, np.uint32))
    run(ctx, "match.all.sync.b32", Vec((R("d"), R("p"))), same, M)
    assert (ctx.get("d", "u32") == 0xFFFFFFFF).all() and ctx.get("p", "pred").all()
    s = rng.integers(-(2**31), 2**31, n).astype(np.int32)
    S = ctx.set("x", s)
    for op, f in (("min", np.min), ("max", np.max)):
        run(ctx, f"redux.sync.{op}.s32", R("d"), S, M)
        got = ctx.get("d", "s32")
        assert got[0] == f(s[:32]) and got[40] == f(s[32:])
    run(ctx, "redux.sync.xor.b32", R("d"), S, M)
    assert ctx.get("d", "u32")[0] == np.bitwise_xor.reduce(s[:32].view(np.uint32))
    h = rng.integers(0, 2**32, (2, n), dtype=np.uint64).astype(np.uint32)
    run(ctx, "max.relu.s16x2", R("d"), ctx.set("a", h[0]), ctx.set("b", h[1]))
    got = ctx.get("d", "u32")
    for half in (0, 1):
        x = (h[0] >> (16 * half) & 0xFFFF).astype(np.uint16).view(np.int16)
        y = (h[1] >> (16 * half) & 0xFFFF).astype(np.uint16).view(np.int16)
        want = np.maximum(np.maximum(x, y), 0).view(np.uint16)
        assert ((got >> (16 * half) & 0xFFFF) == want).all()


def test_mma_f16_accumulator_and_k8(rng: np.random.Generator) -> None:
    """m16n8k8 f16 inputs with f16 C/D: C/D f16x2 d0 = (g, 2t..2t+1), d1 = (g+8, ...)."""
    ctx = FakeCtx(32)
    A = rng.standard_normal((16, 8)).astype(np.float16)
    B = rng.standard_normal((8, 8)).astype(np.float16)
    C = rng.standard_normal((16, 8)).astype(np.float16)
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    a = [_pack16(A[g + 8 * r, 2 * t], A[g + 8 * r, 2 * t + 1]) for r in range(2)]
    b = [_pack16(B[2 * t, g], B[2 * t + 1, g])]
    c = [_pack16(C[g + 8 * r, 2 * t], C[g + 8 * r, 2 * t + 1]) for r in range(2)]
    va = Vec(tuple(ctx.set(f"a{i}", x) for i, x in enumerate(a)))
    vb = Vec(tuple(ctx.set(f"b{i}", x) for i, x in enumerate(b)))
    vc = Vec(tuple(ctx.set(f"c{i}", x) for i, x in enumerate(c)))
    vd = Vec((R("d0"), R("d1")))
    run(ctx, "mma.sync.aligned.m16n8k8.row.col.f16.f16.f16.f16", vd, va, vb, vc)
    want = A.astype(np.float64) @ B.astype(np.float64) + C
    for r in range(2):
        d = ctx.get(f"d{r}", "u32")
        lo = (d & 0xFFFF).astype(np.uint16).view(np.float16)
        hi = (d >> 16).astype(np.uint16).view(np.float16)
        np.testing.assert_allclose(lo, want[g + 8 * r, 2 * t], rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(hi, want[g + 8 * r, 2 * t + 1], rtol=2e-3, atol=2e-3)


def test_f64_approx_upper_word() -> None:
    ctx = FakeCtx(32)
    x = np.array([3.0, -0.5, 0.0, np.inf, np.nan, 1e-310, 7.25, 1.0] * 4)
    run(ctx, "rcp.approx.ftz.f64", R("d"), ctx.set("x", x))
    d = ctx.get("d", "u64")
    assert (d & 0xFFFFFFFF == 0).all()
    got = ctx.get("d", "f64")
    np.testing.assert_allclose(got[[0, 1, 6, 7]], 1 / x[[0, 1, 6, 7]], rtol=2e-6)
    assert got[2] == np.inf and got[3] == 0 and d[4] == 0x7FFFFFFF00000000 and got[5] == np.inf


@pytest.mark.parametrize("shape", ["m8n8k4", "m16n8k8"])
def test_mma_f64(rng: np.random.Generator, shape: str) -> None:
    """f64 fragments: m8n8k4 a0 (g, t), b0 (k=t, n=g), d0/d1 (g, 2t+i); m16n8k8 as tf32."""
    ctx = FakeCtx(32)
    m, k = (8, 4) if shape == "m8n8k4" else (16, 8)
    A, B, C = rng.standard_normal((m, k)), rng.standard_normal((k, 8)), rng.standard_normal((m, 8))
    lane = np.arange(32)
    g, t = lane >> 2, lane & 3
    if shape == "m8n8k4":
        a, b = [A[g, t]], [B[t, g]]
        cpos = [(g, 2 * t + r) for r in range(2)]
    else:
        a = [A[g + 8 * (r & 1), t + 4 * (r >> 1)] for r in range(4)]
        b = [B[t + 4 * r, g] for r in range(2)]
        cpos = [(g + 8 * (r >> 1), 2 * t + (r & 1)) for r in range(4)]
    va = Vec(tuple(ctx.set(f"a{i}", x) for i, x in enumerate(a)))
    vb = Vec(tuple(ctx.set(f"b{i}", x) for i, x in enumerate(b)))
    vc = Vec(tuple(ctx.set(f"c{i}", C[p]) for i, p in enumerate(cpos)))
    vd = Vec(tuple(R(f"d{i}") for i in range(len(cpos))))
    run(ctx, f"mma.sync.aligned.{shape}.row.col.f64.f64.f64.f64", vd, va, vb, vc)
    want = A @ B + C
    for i, p in enumerate(cpos):
        np.testing.assert_allclose(ctx.get(f"d{i}", "f64"), want[p], rtol=1e-12, atol=1e-12)


def test_shfl_and_vote_with_random_membermasks(rng: np.random.Generator) -> None:
    """Only the lanes of each warp's random membermask execute; sources stay inside it."""
    nw = 4
    n = 32 * nw
    members = rng.integers(1, 2**32, nw, dtype=np.uint64)
    lane = np.arange(n) % 32
    mm = np.repeat(members, 32)
    mask = ((mm >> lane.astype(np.uint64)) & np.uint64(1)) == 1
    ctx = FakeCtx(n, mask)
    v = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    src = np.array(
        [
            rng.choice(np.flatnonzero((mm[i] >> np.arange(32, dtype=np.uint64)) & 1))
            for i in range(n)
        ]
    )
    M = ctx.set("mm", mm.astype(np.uint32))
    run(
        ctx,
        "shfl.sync.idx.b32",
        Vec((R("d"), R("p"))),
        ctx.set("v", v),
        ctx.set("b", src.astype(np.uint32)),
        Imm(0x1F),
        M,
    )
    want = v[np.arange(n) - lane + src]
    assert (ctx.get("d", "u32")[mask] == want[mask]).all() and ctx.get("p", "pred")[mask].all()
    a = rng.random(n) < 0.7
    run(ctx, "vote.sync.ballot.b32", R("d"), ctx.set("a", a), M)
    got = ctx.get("d", "u32")
    for w in range(nw):
        sl = slice(32 * w, 32 * w + 32)
        want_w = sum(1 << i for i in range(32) if mask[sl][i] and a[sl][i])
        assert (got[sl][mask[sl]] == want_w).all()
        run(ctx, "vote.sync.any.pred", R("q"), R("a"), M)
        assert (ctx.get("q", "pred")[sl][mask[sl]] == bool(want_w)).all()


# --- the decode-time fast paths (native-width integer forms, f32 round-to-nearest) -------------


@pytest.mark.parametrize("t", ["b16", "b32", "b64", "u16", "s16", "u32", "s32", "u64", "s64"])
def test_shifts_by_immediates(rng: np.random.Generator, t: str) -> None:
    n, w = 64, int(t[1:])
    ctx = FakeCtx(n)
    a = rand_ints(rng, f"u{w}", n)
    A = ctx.set("a", a)
    for amount in sorted({0, 1, w // 2, w - 1, int(rng.integers(0, w))}):
        if t[0] == "b":
            run(ctx, f"shl.{t}", R("d"), A, Imm(amount))
            want = [(int(x) << amount) & ((1 << w) - 1) for x in a]
            assert [int(v) for v in ctx.get("d", f"u{w}")] == want
        run(ctx, f"shr.{t}", R("d"), A, Imm(amount))
        if t[0] == "s":
            got = [int(v) for v in ctx.get("d", t)]
            assert got == [wrap(int(x), t) >> amount for x in a]
        else:
            assert [int(v) for v in ctx.get("d", f"u{w}")] == [int(x) >> amount for x in a]


@pytest.mark.parametrize("t", ["u16", "s16", "u32", "s32", "u64", "s64"])
def test_wrapping_add_sub_mul_lo_mad_lo(rng: np.random.Generator, t: str) -> None:
    n, w = 64, int(t[1:])
    ctx = FakeCtx(n)
    a, b, c = (rand_ints(rng, f"u{w}", n) for _ in range(3))
    A, B, C = ctx.set("a", a), ctx.set("b", b), ctx.set("c", c)
    k = int(rng.integers(0, 1 << (w - 1)))
    cases: list[tuple[str, tuple[Operand, ...], Callable[[int, int, int], int]]] = [
        ("add", (A, B), lambda x, y, z: x + y),
        ("sub", (A, B), lambda x, y, z: x - y),
        ("add", (A, Imm(k)), lambda x, y, z: x + k),
        ("sub", (Imm(k), B), lambda x, y, z: k - y),
        ("mul.lo", (A, B), lambda x, y, z: wrap(x, t) * wrap(y, t)),
        ("mad.lo", (A, B, C), lambda x, y, z: wrap(x, t) * wrap(y, t) + z),
        ("mul.lo", (A, Imm(k)), lambda x, y, z: wrap(x, t) * k),
    ]
    for op, srcs, ref in cases:
        run(ctx, f"{op}.{t}", R("d"), *srcs)
        want = [wrap(ref(int(x), int(y), int(z)), t) for x, y, z in zip(a, b, c)]
        assert [int(v) for v in ctx.get("d", t)] == want, op


@pytest.mark.parametrize("mods", ["", ".ftz", ".sat", ".ftz.sat"])
def test_f32_add_sub_mul_rn(rng: np.random.Generator, mods: str) -> None:
    n = 512
    ctx = FakeCtx(n)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-140, 5, n)).astype(np.float32)
    y = (rng.standard_normal(n) * 2.0 ** rng.integers(-140, 5, n)).astype(np.float32)
    x[:4] = [np.nan, np.inf, -0.0, 3e38]
    y[:4] = [1.0, -np.inf, 0.0, 3e38]
    X, Y = ctx.set("x", x), ctx.set("y", y)
    ftz, sat = "ftz" in mods, "sat" in mods
    tiny = np.float32(2.0**-126)

    def flush(v: np.ndarray) -> np.ndarray:
        return np.where(np.abs(v) < tiny, np.copysign(np.float32(0), v), v) if ftz else v

    for op, fn in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply)):
        run(ctx, f"{op}.rn{mods}.f32", R("d"), X, Y)
        with np.errstate(all="ignore"):
            want = flush(fn(flush(x), flush(y)).astype(np.float32))
            if sat:
                want = np.where(np.isnan(want), np.float32(0), np.clip(want, 0, 1))
                want = np.where(want == 0, np.float32(0), want)  # -0.0 clamps to +0.0
        got = ctx.get("d", "f32")
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all(), op
        assert (got.view(np.uint32)[nan] == 0x7FFFFFFF).all(), op  # the canonical NaN
        np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])
