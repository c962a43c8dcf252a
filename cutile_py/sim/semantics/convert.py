"""cvt (PTX ISA §9.7.9.21): every combination of f16/bf16/tf32/f32/f64 and s8..s64/u8..u64.

Float results are bit exact in every rounding mode (exact value, or an f64 rounded to odd, then
`fpcore.round_f64`). Float → int rounds with .rni/.rzi/.rmi/.rpi, saturates to the destination
range and maps NaN to 0, or to 1 << (width-1) when the source is .f64 or the destination is
64-bit (per the ISA). Sub-register destinations are written with their own type; extending them
to the register width (sign for .s, zero otherwise) is the register file's job.
"""

from __future__ import annotations

import numpy as np

from cutile_py.ptx.ast import Instruction, Operand
from cutile_py.sim.context import ExecContext
from cutile_py.sim.semantics import f64ops
from cutile_py.sim.semantics._common import (
    FLOAT_TYPES,
    INT_TYPES,
    ROUND_FLOAT,
    ROUND_INT,
    SINT,
    UINT,
    WIDTH,
    Mods,
    Run,
    is_signed,
    operands,
    read_typed_bits,
    write_bits,
)
from cutile_py.sim.semantics.floating import relu_bits
from cutile_py.sim.semantics.fpcore import (
    BF16,
    F16,
    F32,
    F64,
    FORMATS,
    TF32,
    FloatFormat,
    decode,
    flush_bits,
    round_f64,
    round_to_odd,
    saturate,
    two_sum,
)

CVT_INT = frozenset(t for t in INT_TYPES if not t.startswith("b"))
CVT_FLOAT = frozenset({"f16", "bf16", "f32", "f64"})
ALL_TYPES = CVT_INT | FLOAT_TYPES

_INTEGRAL = {"rni": np.rint, "rzi": np.trunc, "rmi": np.floor, "rpi": np.ceil}


def cvt(instr: Instruction) -> Run:
    m = Mods(instr)
    dtype, atype = m.types(ALL_TYPES, 2)
    rnd = m.one_of((*ROUND_FLOAT, "rna", *ROUND_INT), "rounding")
    ftz = m.flag("ftz")
    sat = m.flag("sat")
    relu = m.flag("relu")
    satfinite = m.flag("satfinite")
    m.finish()
    if ftz and "f32" not in (dtype, atype):
        m.fail(".ftz applies only when a source or destination is .f32")
    if (relu or satfinite) and dtype not in ("f16", "bf16", "f16x2", "bf16x2", "tf32"):
        m.fail(".relu/.satfinite need an f16/bf16/tf32 destination")
    if dtype in ("f16x2", "bf16x2", "tf32"):
        return _to_packed(instr, m, dtype, atype, rnd, relu, satfinite)
    if dtype not in CVT_FLOAT | CVT_INT or atype not in CVT_FLOAT | CVT_INT:
        m.fail(f"cvt.{dtype}.{atype} is not supported")
    d, a_op = operands(instr, 2)
    if atype in CVT_INT and dtype in CVT_INT:
        if rnd is not None:
            m.fail("integer-to-integer conversions take no rounding modifier")

        if not sat:
            # Extension by the source's signedness, or truncation: a NumPy integer cast.
            dw = WIDTH[dtype]
            via = (SINT if is_signed(atype) else UINT)[dw]
            out = (SINT if is_signed(dtype) else UINT)[dw]

            def run_cast(ctx: ExecContext) -> None:
                ctx.write(d, dtype, ctx.read(a_op, atype).astype(via).view(out))

            return run_cast

        def run_int(ctx: ExecContext) -> None:
            _int_to_int(ctx, d, a_op, dtype, atype, sat)

        return run_int
    if atype in CVT_FLOAT and dtype in CVT_INT:
        if rnd not in ROUND_INT:
            m.fail("float-to-integer conversions need .rni, .rzi, .rmi or .rpi")

        def run_to_int(ctx: ExecContext) -> None:
            x = _float_in(ctx, a_op, atype, ftz)
            ctx.write(d, dtype, _float_to_int(x, dtype, atype, str(rnd)))

        return run_to_int
    if sat and dtype == "bf16":
        m.fail(".sat is not defined for a .bf16 destination")
    dfmt = FORMATS[dtype]
    if atype in CVT_INT:
        if rnd not in ROUND_FLOAT:
            m.fail("integer-to-float conversions need .rn, .rz, .rm or .rp")
    else:
        afmt = FORMATS[atype]
        if rnd in ROUND_INT:
            if afmt.nbits != dfmt.nbits:
                m.fail("integer rounding of a float needs the same source and destination size")
        else:
            narrowing = afmt.prec > dfmt.prec or afmt.ebits > dfmt.ebits
            if narrowing and rnd not in ROUND_FLOAT:
                m.fail(f"cvt.{dtype}.{atype} needs .rn, .rz, .rm or .rp")
            if rnd == "rna":
                m.fail(".rna is defined for the .tf32 destination only")

    def run(ctx: ExecContext) -> None:
        if atype in CVT_INT:
            bits = _int_to_float(read_typed_bits(ctx, a_op, atype), atype, dfmt, str(rnd), sat)
        else:
            x = _float_in(ctx, a_op, atype, ftz)
            if rnd in ROUND_INT:
                with np.errstate(all="ignore"):
                    x = _INTEGRAL[str(rnd)](x)
                bits = _float_out(x, dfmt, "rn", sat)
            else:
                bits = _float_out(x, dfmt, rnd or "rn", sat)
                if dfmt is F64:  # widening to f64 keeps a NaN's payload (quieted)
                    bits = np.where(np.isnan(x), _nan_to_f64(ctx, a_op, afmt), bits)
        if ftz and dfmt is F32:
            bits = flush_bits(bits, F32)
        if relu:
            bits = relu_bits(bits, dfmt)
        if satfinite:
            bits = _satfinite(bits, dfmt)
        write_bits(ctx, d, dfmt.nbits, bits)

    return run


def _float_in(ctx: ExecContext, op: Operand, atype: str, ftz: bool) -> np.ndarray:
    fmt = FORMATS[atype]
    bits = read_typed_bits(ctx, op, atype)
    if ftz and fmt is F32:
        bits = flush_bits(bits, F32)
    return decode(bits, fmt)


def _float_out(x: np.ndarray, fmt: FloatFormat, mode: str, sat: bool) -> np.ndarray:
    if sat:
        x = saturate(x)
    if fmt is F64:
        return np.ascontiguousarray(x, dtype=np.float64).view(np.uint64)
    return round_f64(x, fmt, mode)


def _nan_to_f64(ctx: ExecContext, op: Operand, afmt: FloatFormat) -> np.ndarray:
    """The f64 NaN a widening conversion yields: the source payload, quieted."""
    bits = read_typed_bits(ctx, op, afmt.name).astype(np.uint64)
    payload = bits & np.uint64((1 << afmt.mbits) - 1)
    sign = (bits >> np.uint64(afmt.nbits - 1)) << np.uint64(63)
    shifted = payload << np.uint64(52 - afmt.mbits)
    return np.asarray(sign | np.uint64(0x7FF8000000000000) | shifted)


def _satfinite(bits: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    """`.satfinite`: a result beyond the largest finite value (infinity) becomes ±MAX_NORM."""
    t = bits.dtype.type
    width = 32 if fmt is TF32 else fmt.nbits
    sign = t(1 << (width - 1))
    inf = t(fmt.inf_bits << 13) if fmt is TF32 else t(fmt.inf_bits)
    mx = t(fmt.max_bits << 13) if fmt is TF32 else t(fmt.max_bits)
    return np.where((bits & ~sign) == inf, (bits & sign) | mx, bits)


def _to_packed(
    instr: Instruction,
    m: Mods,
    dtype: str,
    atype: str,
    rnd: str | None,
    relu: bool,
    satfinite: bool,
) -> Run:
    """cvt.frnd2.{f16x2,bf16x2}.f32 d, a, b (a → upper half, b → lower) and cvt to tf32."""
    if atype != "f32":
        m.fail(f"cvt.{dtype}.{atype} is not supported (only .f32 sources)")
    if dtype == "tf32":
        if rnd not in ("rna", "rn", "rz"):
            m.fail("cvt to .tf32 needs .rna, .rn or .rz")
        if relu and rnd == "rna":
            m.fail(".relu is not defined with .rna")
        d, a_op = operands(instr, 2)

        def run_tf32(ctx: ExecContext) -> None:
            bits = round_f64(_float_in(ctx, a_op, "f32", False), TF32, str(rnd))
            bits = relu_bits(bits, F32) if relu else bits
            write_bits(ctx, d, 32, _satfinite(bits, TF32) if satfinite else bits)

        return run_tf32
    if rnd not in ("rn", "rz"):
        m.fail(f"cvt.{dtype}.f32 needs .rn or .rz")
    fmt = F16 if dtype == "f16x2" else BF16
    d, a_op, b_op = operands(instr, 3)

    def run(ctx: ExecContext) -> None:
        halves = []
        for op in (a_op, b_op):
            h = round_f64(_float_in(ctx, op, "f32", False), fmt, str(rnd))
            h = relu_bits(h, fmt) if relu else h
            halves.append(_satfinite(h, fmt) if satfinite else h)
        packed = (halves[0].astype(np.uint32) << np.uint32(16)) | halves[1].astype(np.uint32)
        write_bits(ctx, d, 32, packed)

    return run


def _int_to_int(
    ctx: ExecContext, d: Operand, a_op: Operand, dtype: str, atype: str, sat: bool
) -> None:
    """Sign/zero extension by the source type, truncation (or .sat clamping) to the destination."""
    v = np.asarray(ctx.read(a_op, atype))
    dw = WIDTH[dtype]
    if sat:
        if is_signed(dtype):
            lo, hi = -(1 << (dw - 1)), (1 << (dw - 1)) - 1
        else:
            lo, hi = 0, (1 << dw) - 1
        if is_signed(atype):
            s = v.astype(np.int64)
            neg = s < 0
            if lo == 0:
                out = np.where(neg, 0, np.minimum(s.astype(np.uint64), np.uint64(hi)))
            else:
                out = np.clip(s, lo, hi)
        else:
            out = np.minimum(v.astype(np.uint64), np.uint64(hi))
        v = out
    raw = np.asarray(v).astype(np.int64 if is_signed(atype) else np.uint64).astype(np.uint64)
    ctx.write(d, dtype, raw.astype(UINT[dw]).view(SINT[dw] if is_signed(dtype) else UINT[dw]))


def _float_to_int(x: np.ndarray, dtype: str, atype: str, rnd: str) -> np.ndarray:
    """Round to an integer, saturate to the destination range, NaN per §9.7.9.21."""
    w = WIDTH[dtype]
    with np.errstate(all="ignore"):
        r = _INTEGRAL[rnd](x)
    nan = np.isnan(r)
    r = np.where(nan, 0.0, r)
    if is_signed(dtype):
        lo, hi = -(2.0 ** (w - 1)), 2.0 ** (w - 1)  # representable range is [lo, hi)
        big, small = r >= hi, r < lo
        body = np.where(big | small, 0.0, r).astype(np.int64)  # exact: |r| <= 2**63
        out = np.where(big, np.int64((1 << (w - 1)) - 1), np.where(small, np.int64(lo), body))
        nan_val = np.int64(-(1 << (w - 1)))
    else:
        half = 2.0 ** (w - 1)
        big, neg = r >= 2.0**w, r < 0
        upper = (r >= half) & ~big
        low = np.where(big | neg, 0.0, np.where(upper, r - half, r)).astype(np.int64)
        out = low.astype(np.uint64) + np.where(upper, np.uint64(1 << (w - 1)), np.uint64(0))
        out = np.where(big, np.uint64((1 << w) - 1), np.where(neg, np.uint64(0), out))
        nan_val = np.uint64(1 << (w - 1))
    # §9.7.9.21: NaN → 0, or 1 << (width-1) from .f64 sources and into 64-bit integers.
    out = np.where(nan, nan_val if atype == "f64" or w == 64 else 0, out)
    return np.asarray(out).astype(SINT[w] if is_signed(dtype) else UINT[w])


def _int_to_float(
    bits: np.ndarray, atype: str, fmt: FloatFormat, mode: str, sat: bool
) -> np.ndarray:
    """An integer correctly rounded to `fmt` (64-bit values split in two exact halves)."""
    w = WIDTH[atype]
    u = bits.astype(np.uint64)
    if w < 64:
        v = u.astype(np.int64)
        if is_signed(atype):
            v = np.where(v >= (1 << (w - 1)), v - (1 << w), v)
        return _float_out(v.astype(np.float64), fmt, mode, sat)
    hi_bits = u >> np.uint64(32)
    hi = hi_bits.astype(np.float64)
    if is_signed(atype):
        hi = np.where(hi_bits >= np.uint64(1 << 31), hi - 2.0**32, hi)
    lo = (u & np.uint64(0xFFFFFFFF)).astype(np.float64)
    z, e = two_sum(hi * 2.0**32, lo)  # value == z + e exactly
    if fmt is F64:
        x = f64ops.directed(z, e, mode)
        return _float_out(x, F64, mode, sat)
    return _float_out(round_to_odd(z, e), fmt, mode, sat)
