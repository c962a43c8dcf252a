"""The PTX parser: our compiler's output, every syntax form by hand, nvcc's output, errors."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

import cutile_py as ct
from cutile_py.ptx.ast import Addr, Imm, Instruction, Neg, Reg, Sink, Symbol, Vec
from cutile_py.ptx.parser import PtxParseError, parse
from tests.support import elementwise_kernels as K

DATA = Path(__file__).parent / "data" / "ptx"


def body(
    text: str, decls: str = ".reg .b32 %r<4>;\n.reg .b64 %rd<4>;\n.reg .pred %p<3>;"
) -> list[Instruction]:
    """The instructions of `text` wrapped in an entry with some registers."""
    head = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n"
    mod = parse(f"{head}{{\n{decls}\n{text}\n}}\n")
    return mod.functions["k"].body


# --- our compiler's PTX ----------------------------------------------------------------------

SPECS: list[tuple[Any, tuple[Any, ...]]] = [
    (K.add, (ct.PartitionSpec((1001,), (1024,)), ct.TensorSpec((1001,)), ct.TensorSpec((1001,)))),
    (K.gelu_tanh, (ct.PartitionSpec((4096,), (512,)), ct.TensorSpec((4096,)))),
    (K.column_sum, (ct.PartitionSpec((1, 300), (1, 128)), ct.TensorSpec((6, 300)), 3, 1.5)),
    (K.reverse_tiles, (ct.PartitionSpec((1000,), (96,)), ct.TensorSpec((1000,)), 2.0)),
    (
        K.mixed_bf16,
        (
            ct.PartitionSpec((4096,), (512,), ct.bf16),
            ct.TensorSpec((4096,), ct.bf16),
            ct.TensorSpec((4096,), ct.f16),
        ),
    ),
]


@pytest.mark.parametrize("case", range(len(SPECS)))
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_compiler_output_parses(case: int, arch: str) -> None:
    kernel, args = SPECS[case]
    text = kernel.ptx(*args, target=arch)
    mod = parse(text)
    assert mod.target == arch and mod.address_size == 64
    [fn] = mod.functions.values()
    assert fn.is_entry and fn.name == kernel.name
    lines = text.splitlines()
    n_instr = sum(1 for ln in lines if ln.strip().endswith(";") and not ln.strip().startswith("."))
    assert len(fn.body) == n_instr
    for ins in fn.body:
        # Each instruction keeps its line and text, and names only declared registers.
        assert " ".join(lines[ins.line - 1].split()) == ins.text
        for op in ins.operands:
            for r in _regs(op):
                assert r in fn.regs or r.startswith(("%tid", "%ctaid", "%ntid", "%nctaid"))
    for label, index in fn.labels.items():
        assert f"{label}:" in text and 0 <= index <= len(fn.body)


def _regs(op: Any) -> list[str]:
    if isinstance(op, Reg):
        return [op.name]
    if isinstance(op, Neg):
        return [op.reg.name]
    if isinstance(op, Vec):
        return [r for x in op.items for r in _regs(x)]
    if isinstance(op, Addr) and isinstance(op.base, Reg):
        return [op.base.name]
    return []


# --- hand-written forms ----------------------------------------------------------------------

HEADER = """// a comment
.version 8.0 /* block
comment */
.target sm_90a, texmode_independent
.address_size 64
.file 1 "k.cu"
.extern .func (.param .b32 ret) vprintf (.param .b64 fmt, .param .b64 args);
.global .align 8 .u32 table[4] = {1, 0x10, 017, 0b101};
.const .align 4 .f32 consts[2] = {0f3F800000, -2.5};
.shared .align 16 .b8 tile[2][64];
.extern .shared .align 16 .b8 dyn[];
.visible .global .u64 counter;

.visible .entry kern(
    .param .u64 .ptr .global .align 16 kern_p0,
    .param .align 8 .b8 kern_p1[16],
    .param .f32 kern_p2
)
.maxntid 128, 1, 1
.minnctapersm 2
.pragma "nounroll";
{
    .reg .pred %p<3>;
    .reg .b32 %r<5>, %single;
    .reg .f32 %f1, %f2;
    .reg .b64 %rd<4>;
    .local .align 8 .b8 __local_depot0[32];
    .loc 1 12 5
    ld.param.u64 %rd1, [kern_p0];   // trailing comment
    ld.param.u32 %r1, [kern_p1+8];
$L_top:
    @%p1 bra $L_top;
    @!%p2 bra.uni $L_end;
    ld.global.v4.u32 {%r1, _, %r3, _}, [%rd1+16];
    st.shared.u32 [tile+8], %r1;
    ld.shared.u32 %r2, [tile];
    ld.global.u32 %r2, [%rd1+-4];
    mov.b32 %r4, -7;
    mov.b32 %r4, 0xFFFFFFFFU;
    mov.f32 %f1, 0f3F800000;
    mov.f64 %rd2, 0d4000000000000000;
    mov.f32 %f2, 1.5e2;
    and.pred %p1, !%p2, %p0;
    mov.u32 %r1, %tid.x;
    mov.u32 %r1, %nctaid.z;
    mov.u32 %r1, %laneid;
    mov.u64 %rd3, %clock64;
    mov.u32 %r1, %envreg3;
    mov.u64 %rd3, %pm1_64;
    setp.lt.s32 %p1|%p2, %r1, %r2;
    mov.u64 %rd3, __local_depot0;
$L_end:
    ret;
}
.section .debug_str
{
$L__info: .b8 1, 2, 0
}
"""


def test_module_directives_and_variables() -> None:
    mod = parse(HEADER)
    assert mod.version == (8, 0) and mod.target == "sm_90a" and mod.address_size == 64
    assert list(mod.functions) == ["kern"]  # vprintf is only declared
    v = {x.name: x for x in mod.variables}
    assert v["table"].init == (1, 16, 15, 5) and v["table"].align == 8 and v["table"].count == 4
    assert v["consts"].space == "const" and v["consts"].init == (1.0, -2.5)
    assert v["tile"].count == 128 and v["tile"].space == "shared" and v["tile"].align == 16
    assert v["dyn"].count == 0  # an extern unsized array: dynamic shared memory
    assert v["counter"].ptype == "u64" and v["counter"].count == 1


def test_entry_header_params_and_directives() -> None:
    fn = parse(HEADER).functions["kern"]
    p = fn.params
    assert [(x.name, x.ptype, x.count, x.align) for x in p] == [
        ("kern_p0", "u64", 1, 16),
        ("kern_p1", "b8", 16, 8),
        ("kern_p2", "f32", 1, 0),
    ]
    assert fn.directives == {"maxntid": (128, 1, 1), "minnctapersm": (2,)}
    assert {f"%r{i}" for i in range(5)} | {"%single", "%f1", "%f2"} <= set(fn.regs)
    assert "%r5" not in fn.regs and fn.regs["%p2"] == "pred" and fn.regs["%rd3"] == "b64"
    assert [(x.name, x.space, x.count) for x in fn.variables] == [("__local_depot0", "local", 32)]


def test_instructions_operands_and_labels() -> None:
    fn = parse(HEADER).functions["kern"]
    by_text = {i.text: i for i in fn.body}
    assert fn.labels == {"$L_top": 2, "$L_end": len(fn.body) - 1}
    assert by_text["ld.param.u64 %rd1, [kern_p0];"].operands[1] == Addr(Symbol("kern_p0"), 0)
    assert by_text["ld.param.u32 %r1, [kern_p1+8];"].operands[1] == Addr(Symbol("kern_p1"), 8)
    bra = by_text["@%p1 bra $L_top;"]
    assert bra.guard == Reg("%p1") and not bra.guard_negated and bra.operands == (Symbol("$L_top"),)
    uni = by_text["@!%p2 bra.uni $L_end;"]
    assert uni.guard_negated and uni.opcode == "bra" and uni.modifiers == ("uni",)
    ld = by_text["ld.global.v4.u32 {%r1, _, %r3, _}, [%rd1+16];"]
    assert ld.modifiers == ("global", "v4", "u32")
    assert ld.operands == (Vec((Reg("%r1"), Sink(), Reg("%r3"), Sink())), Addr(Reg("%rd1"), 16))
    assert by_text["st.shared.u32 [tile+8], %r1;"].operands[0] == Addr(Symbol("tile"), 8)
    assert by_text["ld.global.u32 %r2, [%rd1+-4];"].operands[1] == Addr(Reg("%rd1"), -4)
    assert by_text["and.pred %p1, !%p2, %p0;"].operands[1] == Neg(Reg("%p2"))
    pair = by_text["setp.lt.s32 %p1|%p2, %r1, %r2;"].operands[0]
    assert pair == Vec((Reg("%p1"), Reg("%p2")))
    specials = [
        by_text[f"mov.u32 %r1, {s};"].operands[1] for s in ("%tid.x", "%nctaid.z", "%laneid")
    ]
    assert specials == [Reg("%tid.x"), Reg("%nctaid.z"), Reg("%laneid")]
    assert by_text["mov.u32 %r1, %envreg3;"].operands[1] == Reg("%envreg3")
    assert by_text["mov.u64 %rd3, %pm1_64;"].operands[1] == Reg("%pm1_64")
    assert by_text["mov.u64 %rd3, __local_depot0;"].operands[1] == Symbol("__local_depot0")
    # Lines survive block comments and `.loc`.
    assert (
        by_text["ld.param.u64 %rd1, [kern_p0];"].line
        == HEADER.splitlines().index("    ld.param.u64 %rd1, [kern_p0];   // trailing comment") + 1
    )


def test_immediates() -> None:
    ins = body(
        "mov.b32 %r1, -7;\nmov.b32 %r1, 0xFFFFFFFFU;\nmov.b32 %r1, 42U;\nmov.b32 %r1, 010;\n"
        "mov.f32 %r1, 0f3F800000;\nmov.f32 %r1, 0FBF800000;\nmov.f64 %rd1, 0d4000000000000000;\n"
        "mov.f32 %r1, 1.5e2;\nmov.f32 %r1, -0.25;\nmov.b32 %r1, 0b1010;"
    )
    imms = [i.operands[1] for i in ins]
    assert imms[:4] == [Imm(-7), Imm(0xFFFFFFFF), Imm(42), Imm(8)]
    assert imms[4] == Imm(1.0, 0x3F800000) and imms[5] == Imm(-1.0, 0xBF800000)
    assert imms[6] == Imm(2.0, 0x4000000000000000)
    assert imms[7] == Imm(150.0) and imms[8] == Imm(-0.25) and imms[9] == Imm(10)
    assert struct.pack(">f", imms[4].value).hex() == "3f800000"


def test_nested_scopes_rename_shadowed_registers_and_labels() -> None:
    ins = body(
        "mov.u32 %r1, 1;\n"
        "{\n.reg .u32 %r1;\n.reg .u32 t;\nmov.u32 %r1, 2;\nadd.u32 t, %r1, %r2;\n"
        "loop:\n@%p1 bra loop;\n}\n"
        "{\n.reg .u32 t;\nmov.u32 t, %r1;\nloop:\n@%p1 bra loop;\n}\n"
        "mov.u32 %r3, %r1;"
    )
    names = [[o.name for o in i.operands if isinstance(o, (Reg, Symbol))] for i in ins]
    assert names[0] == ["%r1"]
    inner, t1 = names[1][0], names[2][0]
    assert inner != "%r1" and inner.startswith("%r1") and names[2] == [t1, inner, "%r2"]
    assert t1.startswith("t") and names[4][0] != t1  # the second scope's t is another register
    assert names[4][1] == "%r1" and names[6] == ["%r3", "%r1"]  # the outer %r1 again
    # Each `bra loop` jumps to the label of its own scope.
    assert names[3][0] != names[5][0]
    fn = parse(
        ".version 7.0\n.target sm_80\n.entry k() {\n.reg .pred %p1;\n{\nl:\n@%p1 bra l;\n}\n"
        "{\nl:\n@%p1 bra l;\n}\nret;\n}\n"
    ).functions["k"]
    targets = [fn.labels[i.operands[0].name] for i in fn.body[:2]]  # type: ignore[union-attr]
    assert targets == [0, 1]


def test_any_opcode_is_accepted_syntactically() -> None:
    [ins] = body("frobnicate.sync.aligned.x4 {%r1, %r2}, [%rd1], 3;")
    assert ins.opcode == "frobnicate" and ins.modifiers == ("sync", "aligned", "x4")
    [cp] = body("cp.async.cg.shared.global.L2::128B [%r1], [%rd1], 16, %r2;")
    assert cp.modifiers == ("async", "cg", "shared", "global", "L2::128B")


# --- nvcc's PTX ------------------------------------------------------------------------------


def test_nvcc_output_parses() -> None:
    text = (DATA / "parser_sample.ptx").read_text()
    mod = parse(text)
    assert mod.version >= (7, 0) and mod.target == "sm_80"
    assert set(mod.functions) == {"block_sum", "collatz", "hash_and_count"}
    coeffs = next(v for v in mod.variables if v.name == "coeffs")
    assert coeffs.space == "const" and len(coeffs.init) == 16  # .b8 bytes of 4 floats
    assert struct.unpack("<4f", bytes(int(b) for b in coeffs.init)) == (1.0, -2.5, 0.25, 3.0)
    bs = mod.functions["block_sum"]
    assert [v.name for v in bs.variables] == ["_ZZ9block_sumE5sdata"]
    assert all(i.opcode != "" for i in bs.body) and "$L__BB0_3" in bs.labels
    hc = mod.functions["hash_and_count"]
    # The two inlined asm blocks each declare `t`: two distinct registers.
    asm_regs = {
        o.name for i in hc.body for o in i.operands if isinstance(o, Reg) and o.name.startswith("t")
    }
    assert len(asm_regs) == 2 and all(r in hc.regs for r in asm_regs)
    assert {"%SP", "%SPL"} <= set(hc.regs)


# --- errors ----------------------------------------------------------------------------------

ERRORS = [
    (
        ".version 7.0\n.target sm_80\n.entry k() {\nmov.u32 %r1, 1;\n}\n",
        4,
        "register %r1 is not declared",
    ),
    (
        ".version 7.0\n.target sm_80\n.entry k() {\n.reg .b32 %r1;\nmov.u32 %r1, 1\nret;\n}\n",
        6,
        "expected ';'",
    ),
    (".version 7.0\n.target sm_80\n.entry k() {\n.reg .b32 %r1;\n.frob 3;\n}\n", 5, ".frob"),
    (".version 7.0\n.target sm_80\n.entry k() {\nl:\nl:\nret;\n}\n", 5, "label l is defined twice"),
    (
        ".version 7.0\n.target sm_80\n.entry k() {\n.reg .b32 %r1;\nmov.u32 %r1, #;\n}\n",
        5,
        "unexpected character",
    ),
    (".version 7.0\n.target sm_80\n.entry k() {\nret;\n", 4, "unexpected end"),
    (".version 7.0\n.target sm_80\n.global .u32 x = {a};\n", 3, "numeric initializers"),
    (
        ".version 7.0\n.target sm_80\n.entry k() {\n.reg .b32 %r1;\n.reg .b32 %r1;\n}\n",
        5,
        "declared twice",
    ),
    (".version seven\n", 1, "bad .version"),
]


@pytest.mark.parametrize(("text", "line", "what"), ERRORS)
def test_errors_name_the_line(text: str, line: int, what: str) -> None:
    with pytest.raises(PtxParseError) as info:
        parse(text)
    e = info.value
    assert e.line == line, str(e)
    assert str(e).startswith(f"PTX line {line}: ") and what in str(e)
    source_line = text.splitlines()[line - 1].strip() if line <= len(text.splitlines()) else ""
    assert source_line in str(e)
