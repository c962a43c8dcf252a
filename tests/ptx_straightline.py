"""Test-only NumPy evaluator for straight-line PTX (the subset `cutile_py.lower.emit_math` emits).

A stand-in until the project's PTX simulator exists: it runs one instruction sequence over
whole arrays (one lane per element), with PTX ISA semantics for the IEEE operations and the
`.approx` instructions modelled as the exact function rounded to f32 (optionally perturbed by
a few ulp, to check that the surrounding code tolerates the documented hardware error).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import numpy as np
import numpy.typing as npt

Bits = npt.NDArray[np.uint32]
Preds = npt.NDArray[np.bool_]
F32 = npt.NDArray[np.float32]

_LINE = re.compile(r"^(?:@(?P<neg>!?)(?P<pred>%\w+)\s+)?(?P<op>[\w.]+)\s*(?P<args>.*?)\s*;$")
_F32_IMM = re.compile(r"^0[fF]([0-9a-fA-F]{8})$")
_SIGN = np.uint32(0x80000000)
_ABS = np.uint32(0x7FFFFFFF)


class UnsupportedInstruction(ValueError):
    """The evaluator does not model this instruction (or it is not straight-line code)."""


def f32_bits(x: npt.ArrayLike) -> Bits:
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32)).view(np.uint32)


def as_f32(bits: Bits) -> F32:
    return bits.view(np.float32)


def _flush(x: F32) -> F32:
    """Subnormals to sign-preserving zero (`.ftz`)."""
    tiny = (np.abs(x) < np.float32(2.0**-126)) & (x != 0)
    if not tiny.any():
        return x
    return as_f32(np.where(tiny, f32_bits(x) & _SIGN, f32_bits(x)).astype(np.uint32))


def _to_f32(x: npt.NDArray[np.float64]) -> F32:
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(np.float32)


def fma_f32(a: F32, b: F32, c: F32) -> F32:
    """a*b + c rounded once to f32 (round to nearest even), via float64 round-to-odd.

    a*b is exact in float64; the sum is rounded to odd (exact TwoSum error decides the
    sticky bit), and rounding a 53-bit round-to-odd value to 24 bits is correct rounding.
    """
    with np.errstate(all="ignore"):
        p = a.astype(np.float64) * b.astype(np.float64)
        c64 = c.astype(np.float64)
        s = p + c64
        bp = s - c64
        err = (p - bp) + (c64 - (s - bp))
        sbits = s.view(np.uint64)
        fix = np.isfinite(s) & (err != 0) & ((sbits & np.uint64(1)) == 0)
        toward = np.where(err > 0, np.inf, -np.inf)
        s = np.where(fix, np.nextafter(s, toward), s)
        return s.astype(np.float32)


def _perturb(y: F32, ulps: int, rng: np.random.Generator) -> F32:
    if ulps == 0:
        return y
    bits = f32_bits(y).astype(np.int64)
    finite_nonzero = np.isfinite(y) & (y != 0)
    delta = rng.integers(-ulps, ulps + 1, size=y.shape)
    moved = np.where(finite_nonzero, bits + delta, bits)
    # Stay within the same sign and finite range.
    same_sign = (moved >> 31) == (bits >> 31)
    moved = np.where(same_sign, moved, bits)
    out = as_f32((moved & 0xFFFFFFFF).astype(np.uint32))
    return np.where(np.isfinite(out), out, y).astype(np.float32)


_APPROX: dict[str, Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]] = {
    "ex2": np.exp2,
    "lg2": np.log2,
    "tanh": np.tanh,
    "rcp": lambda v: 1.0 / v,
    "rsqrt": lambda v: 1.0 / np.sqrt(v),
    "sqrt": np.sqrt,
}

_FCMP: dict[str, Callable[[F32, F32], Preds]] = {
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: (a != b) & ~np.isnan(a) & ~np.isnan(b),
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "equ": lambda a, b: (a == b) | np.isnan(a) | np.isnan(b),
    "neu": lambda a, b: a != b,
    "ltu": lambda a, b: ~(a >= b),
    "leu": lambda a, b: ~(a > b),
    "gtu": lambda a, b: ~(a <= b),
    "geu": lambda a, b: ~(a < b),
    "num": lambda a, b: ~np.isnan(a) & ~np.isnan(b),
    "nan": lambda a, b: np.isnan(a) | np.isnan(b),
}

_ICMP: dict[str, Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], Preds]] = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "lo": np.less,
    "ls": np.less_equal,
    "hi": np.greater,
    "hs": np.greater_equal,
}


class StraightLine:
    """Registers: 32-bit ones hold raw bits (uint32), predicates hold bools."""

    def __init__(self, n: int, *, approx_ulps: int = 0, seed: int = 0) -> None:
        self.n = n
        self.regs: dict[str, Bits | Preds] = {}
        self.approx_ulps = approx_ulps
        self.rng = np.random.default_rng(seed)

    # -- operands ---------------------------------------------------------------------------
    def bits(self, text: str) -> Bits:
        text = text.strip()
        if text.startswith("%"):
            v = self.regs[text]
            if v.dtype != np.uint32:
                raise UnsupportedInstruction(f"{text} is a predicate")
            return v  # type: ignore[return-value]
        m = _F32_IMM.match(text)
        if m:
            return np.full(self.n, int(m.group(1), 16), dtype=np.uint32)
        return np.full(self.n, int(text, 0) & 0xFFFFFFFF, dtype=np.uint32)

    def f(self, text: str) -> F32:
        return as_f32(self.bits(text))

    def s(self, text: str) -> npt.NDArray[np.int64]:
        return self.bits(text).view(np.int32).astype(np.int64)

    def u(self, text: str) -> npt.NDArray[np.int64]:
        return self.bits(text).astype(np.int64)

    def pred(self, text: str) -> Preds:
        text = text.strip()
        neg = text.startswith("!")
        v = self.regs[text.lstrip("!")]
        if v.dtype != np.bool_:
            raise UnsupportedInstruction(f"{text} is not a predicate")
        return ~v if neg else v  # type: ignore[return-value]

    # -- execution --------------------------------------------------------------------------
    def run(self, lines: Iterable[str]) -> None:
        for raw in lines:
            line = raw.strip()
            if not line or line.startswith("//"):
                continue
            m = _LINE.match(line)
            if m is None:
                raise UnsupportedInstruction(f"cannot parse {line!r}")
            args = [a.strip() for a in m.group("args").split(",")] if m.group("args") else []
            dst, value = self._execute(m.group("op"), args)
            if m.group("pred"):
                guard = self.pred(("!" if m.group("neg") else "") + m.group("pred"))
                old = self.regs.get(dst, np.zeros(self.n, dtype=value.dtype))
                value = np.where(guard, value, old)
            self.regs[dst] = value

    def _approx(self, y: F32) -> F32:
        return _perturb(y, self.approx_ulps, self.rng)

    def _execute(self, opcode: str, args: list[str]) -> tuple[str, Bits | Preds]:
        parts = opcode.split(".")
        base, mods, typ = parts[0], set(parts[1:-1]), parts[-1]
        dst = args[0]
        ftz = "ftz" in mods
        with np.errstate(all="ignore"):
            if typ == "f32" and base not in ("setp", "selp", "testp", "cvt", "mov"):
                return dst, f32_bits(self._float_op(base, mods, args[1:], ftz))
            if base == "mov":
                return dst, self.bits(args[1]).copy()
            if base == "selp":
                return dst, np.where(self.pred(args[3]), self.bits(args[1]), self.bits(args[2]))
            if base == "setp":
                return dst, self._setp(parts[1], parts[2:-1], typ, args)
            if base == "testp":
                return dst, self._testp(parts[1], self.f(args[1]))
            if base == "cvt":
                return dst, self._cvt(parts[1:], args[1])
            if typ in ("b32", "s32", "u32"):
                return dst, self._int_op(base, mods, typ, args[1:])
        raise UnsupportedInstruction(opcode)

    def _float_op(self, base: str, mods: set[str], srcs: list[str], ftz: bool) -> F32:
        xs = [self.f(a) for a in srcs]
        if ftz:
            xs = [_flush(x) for x in xs]
        out: F32
        if base == "add":
            out = xs[0] + xs[1]
        elif base == "sub":
            out = xs[0] - xs[1]
        elif base == "mul":
            out = xs[0] * xs[1]
        elif base == "fma":
            out = fma_f32(xs[0], xs[1], xs[2])
        elif base == "div" and "rn" in mods:
            out = xs[0] / xs[1]
        elif base == "div" and "approx" in mods:
            out = self._approx(_to_f32(xs[0].astype(np.float64) / xs[1].astype(np.float64)))
        elif base == "sqrt" and "rn" in mods:
            out = np.sqrt(xs[0])
        elif base in _APPROX and "approx" in mods:
            out = self._approx(_to_f32(_APPROX[base](xs[0].astype(np.float64))))
        elif base == "abs":
            return as_f32(f32_bits(xs[0]) & _ABS)
        elif base == "neg":
            return as_f32(f32_bits(xs[0]) ^ _SIGN)
        elif base == "copysign":
            sign = f32_bits(xs[0]) & _SIGN
            return as_f32((f32_bits(xs[1]) & _ABS) | sign)
        elif base in ("min", "max"):
            a, b = xs
            pick_a = (a < b) if base == "min" else (a > b)
            out = np.where(np.isnan(b) | pick_a, a, b)
            # Signed zeros: min(-0, +0) = -0, max(-0, +0) = +0.
            both_zero = (a == 0) & (b == 0)
            ab, bb = f32_bits(a), f32_bits(b)
            zbits = (ab | bb) if base == "min" else (ab & bb)
            out = np.where(both_zero, as_f32(zbits), out)
            if "NaN" in mods:  # sm_80 `.NaN`: canonical NaN if either input is NaN
                out = np.where(np.isnan(a) | np.isnan(b), as_f32(np.uint32(0x7FFFFFFF)), out)
        else:
            raise UnsupportedInstruction(f"{base}.{'.'.join(sorted(mods))}.f32")
        out = np.asarray(out, dtype=np.float32)
        return _flush(out) if ftz else out

    def _int_op(self, base: str, mods: set[str], typ: str, srcs: list[str]) -> Bits:
        signed = typ == "s32"
        v = [self.s(a) if signed else self.u(a) for a in srcs]
        if base == "add":
            r = v[0] + v[1]
        elif base == "sub":
            r = v[0] - v[1]
        elif base == "mad" and "lo" in mods:
            r = v[0] * v[1] + v[2]
        elif base == "mul" and "lo" in mods:
            r = v[0] * v[1]
        elif base == "and":
            r = v[0] & v[1]
        elif base == "or":
            r = v[0] | v[1]
        elif base == "xor":
            r = v[0] ^ v[1]
        elif base == "not":
            r = ~v[0]
        elif base == "shl":
            sh = np.minimum(self.u(srcs[1]), 32)
            r = np.where(sh >= 32, 0, self.u(srcs[0]) << np.minimum(sh, 31))
        elif base == "shr":
            sh = np.minimum(self.u(srcs[1]), 32)
            if signed:
                r = self.s(srcs[0]) >> np.minimum(sh, 31)
            else:
                r = np.where(sh >= 32, 0, self.u(srcs[0]) >> np.minimum(sh, 31))
        else:
            raise UnsupportedInstruction(f"{base}.{typ}")
        return (r & 0xFFFFFFFF).astype(np.uint32)

    def _setp(self, cmp: str, boolop: list[str], typ: str, args: list[str]) -> Preds:
        if "|" in args[0]:
            raise UnsupportedInstruction("setp with two destinations")
        if typ == "f32":
            r = _FCMP[cmp](self.f(args[1]), self.f(args[2]))
        else:
            get = self.s if typ == "s32" else self.u
            r = _ICMP[cmp](get(args[1]), get(args[2]))
        if boolop:
            c = self.pred(args[3])
            r = {"and": r & c, "or": r | c, "xor": r ^ c}[boolop[0]]
        return np.asarray(r, dtype=np.bool_)

    @staticmethod
    def _testp(op: str, x: F32) -> Preds:
        a = np.abs(x)
        tests = {
            "finite": np.isfinite(x),
            "infinite": np.isinf(x),
            "number": ~np.isnan(x),
            "notanumber": np.isnan(x),
            "normal": np.isfinite(x) & (a >= np.float32(2.0**-126)),
            "subnormal": (a < np.float32(2.0**-126)) & (x != 0),
        }
        return np.asarray(tests[op], dtype=np.bool_)

    def _cvt(self, parts: list[str], src: str) -> Bits:
        rnd = next(
            (p for p in parts if p in ("rn", "rz", "rm", "rp", "rni", "rzi", "rmi", "rpi")), ""
        )
        dtype, stype = parts[-2], parts[-1]
        if dtype == "f32" and stype == "f32":
            x = self.f(src)
            if "ftz" in parts:
                x = _flush(x)
            fn = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[rnd]
            return f32_bits(fn(x))
        if dtype == "f32" and stype in ("s32", "u32"):
            if rnd != "rn":
                raise UnsupportedInstruction(f"cvt.{rnd}.f32.{stype}")
            v = self.s(src) if stype == "s32" else self.u(src)
            return f32_bits(_to_f32(v.astype(np.float64)))  # |v| < 2^53: one rounding
        if dtype in ("s32", "u32") and stype == "f32":
            x = self.f(src).astype(np.float64)
            fn = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}[rnd]
            lo, hi = (-(2.0**31), 2.0**31 - 1) if dtype == "s32" else (0.0, 2.0**32 - 1)
            r = np.clip(np.nan_to_num(fn(x), nan=0.0), lo, hi).astype(np.int64)
            return (r & 0xFFFFFFFF).astype(np.uint32)
        raise UnsupportedInstruction(f"cvt {parts}")


def evaluate(
    lines: Iterable[str],
    inputs: Mapping[str, npt.ArrayLike],
    output: str,
    *,
    approx_ulps: int = 0,
    seed: int = 0,
) -> F32:
    """Run `lines` with f32 `inputs` bound to register names; return register `output`."""
    arrays = {name: np.ravel(np.asarray(v, dtype=np.float32)) for name, v in inputs.items()}
    n = len(next(iter(arrays.values())))
    machine = StraightLine(n, approx_ulps=approx_ulps, seed=seed)
    for name, v in arrays.items():
        machine.regs[name] = f32_bits(v).copy()
    machine.run(lines)
    return as_f32(machine.bits(output)).copy()


def ulp_distance(got: npt.ArrayLike, want: npt.ArrayLike) -> npt.NDArray[np.int64]:
    """|ordered(got) - ordered(want)| on the sign-magnitude-to-integer map (+0 == -0)."""

    def ordered(x: npt.ArrayLike) -> npt.NDArray[np.int64]:
        b = f32_bits(x).astype(np.int64)
        mag = b & 0x7FFFFFFF
        return np.where(b >> 31 == 1, -mag, mag)

    return np.abs(ordered(got) - ordered(want))
