"""PTX text → `ptx.ast.Module`: the form the simulator executes (any opcode is accepted here).

Registers declared inside nested `{ }` scopes (nvcc's inline-asm blocks) are renamed
`name~k` so that shadowing works; labels defined in nested scopes are renamed the same way.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

from cutile_py.ptx.ast import (
    Addr,
    Function,
    Imm,
    Instruction,
    Module,
    Neg,
    Operand,
    Param,
    Reg,
    Sink,
    Symbol,
    Variable,
    Vec,
)
from cutile_py.ptx.lexer import PtxParseError, Source, Token, tokenize

__all__ = ["PtxParseError", "parse"]

TYPES = frozenset(
    ["pred", "f16", "f16x2", "bf16", "bf16x2", "tf32", "f32", "f64", "e4m3", "e5m2"]
    + [f"{k}{w}" for k in "bus" for w in (8, 16, 32, 64)]
    + ["b128"]
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


SPACES = ("shared", "global", "const", "local", "param")
#: Special registers (the names before any `.x`): read-only values the executor computes.
SPECIAL = _words(
    "%tid %ntid %ctaid %nctaid %laneid %warpid %nwarpid %smid %nsmid %gridid %clock %clock64 "
    "%clock_hi %lanemask_eq %lanemask_le %lanemask_lt %lanemask_ge %lanemask_gt %globaltimer "
    "%globaltimer_lo %globaltimer_hi %dynamic_smem_size %total_smem_size %aggr_smem_size "
    "%clusterid %nclusterid %cluster_ctaid %cluster_nctaid %cluster_ctarank %cluster_nctarank "
    "%is_explicit_cluster %current_graph_exec %reserved_smem_offset_begin "
    "%reserved_smem_offset_end %reserved_smem_offset_cap"
)
#: Directives that describe a function's launch bounds: kept as written.
PERF_DIRECTIVES = _words(
    ".maxntid .reqntid .minnctapersm .maxnctapersm .maxnreg .maxclusterrank "
    ".reqnctapercluster .explicitcluster .noreturn .blocksareclusters"
)
#: Debug directives, which end at the end of their line (no `;`).
LINE_DIRECTIVES = frozenset([".loc", ".file"])


def is_special(name: str) -> bool:
    base = name.split(".", 1)[0]
    if base in SPECIAL:
        return True
    for prefix in ("%envreg", "%pm"):
        if base.startswith(prefix) and base[len(prefix) :].removesuffix("_64").isdigit():
            return True
    return False


@dataclass
class _Scope:
    ident: int
    regs: dict[str, str] = field(default_factory=dict)  # declared name -> unique name


class _Parser:
    def __init__(self, text: str) -> None:
        self.src = Source(text)
        self.toks: list[Token] = tokenize(self.src)
        self.i = 0

    # -- token helpers ----------------------------------------------------------------------
    def peek(self, k: int = 0) -> Token | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def line(self) -> int:
        t = self.peek()
        return t.line if t else (self.toks[-1].line if self.toks else 1)

    def fail(self, message: str, line: int | None = None) -> PtxParseError:
        return self.src.error(self.line() if line is None else line, message)

    def next(self) -> Token:
        t = self.peek()
        if t is None:
            raise self.fail("unexpected end of the PTX text")
        self.i += 1
        return t

    def at(self, text: str) -> bool:
        t = self.peek()
        return t is not None and t.text == text

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.i += 1
            return True
        return False

    def expect(self, text: str) -> Token:
        t = self.peek()
        if t is None or t.text != text:
            got = repr(t.text) if t else "the end of the text"
            raise self.fail(f"expected {text!r}, found {got}")
        self.i += 1
        return t

    def integer(self) -> int:
        neg = self.accept("-")
        t = self.next()
        if t.kind != "num":
            raise self.fail(f"expected an integer, found {t.text!r}", t.line)
        v = _int_value(t.text)
        if v is None:
            raise self.fail(f"expected an integer, found {t.text!r}", t.line)
        return -v if neg else v

    def skip_line(self, line: int) -> None:
        while (t := self.peek()) is not None and t.line == line:
            self.i += 1

    def skip_braces(self) -> None:
        """From a `{`, skip to its matching `}` (for `.section` bodies)."""
        depth = 0
        while True:
            t = self.next()
            depth += (t.text == "{") - (t.text == "}")
            if depth == 0:
                return

    # -- module -----------------------------------------------------------------------------
    def module(self) -> Module:
        mod = Module((0, 0), "", 64, {}, [])
        while (t := self.peek()) is not None:
            if t.text == ".version":
                self.i += 1
                v = self.next()
                major, _, minor = v.text.partition(".")
                if not (major.isdigit() and minor.isdigit()):
                    raise self.fail(f"bad .version {v.text!r}", v.line)
                mod.version = (int(major), int(minor))
            elif t.text == ".target":
                self.i += 1
                names = [self.next().text]
                while self.accept(","):
                    names.append(self.next().text)
                mod.target = names[0]
            elif t.text == ".address_size":
                self.i += 1
                mod.address_size = self.integer()
            elif t.text in LINE_DIRECTIVES:
                self.skip_line(t.line)
            elif t.text == ".section":
                self.i += 2
                if self.at("{"):
                    self.skip_braces()
            elif t.text == ".pragma":
                self.skip_statement()
            else:
                self.declaration(mod)
        return mod

    def skip_statement(self) -> None:
        while not self.accept(";"):
            self.next()

    def declaration(self, mod: Module) -> None:
        start = self.i
        attrs: list[str] = []
        while (
            (t := self.peek()) is not None
            and t.kind == "dir"
            and t.text
            not in (
                ".entry",
                ".func",
            )
        ):
            if t.text[1:] in SPACES:
                self.i = start
                mod.variables.extend(self.variables())
                return
            attrs.append(t.text)
            self.i += 1
        t = self.peek()
        if t is None or t.text not in (".entry", ".func"):
            found = repr(t.text) if t else "the end of the text"
            raise self.fail(f"expected a declaration (.entry, .func or a variable), found {found}")
        fn = self.function()
        if fn is not None:
            if fn.name in mod.functions:
                raise self.fail(f"function {fn.name} is defined twice", fn.line)
            mod.functions[fn.name] = fn

    # -- variables --------------------------------------------------------------------------
    def variables(self) -> list[Variable]:
        """`[.extern|.visible|.weak] .space [.align N] .type name[dims] [= init], ... ;`."""
        line = self.line()
        space, ptype, align = "", "", 0
        while (t := self.peek()) is not None and t.kind == "dir":
            self.i += 1
            word = t.text[1:].split("::")[0]
            if word in SPACES:
                space = word
            elif word == "align":
                align = self.integer()
            elif word in TYPES:
                ptype = word
            elif word in ("v2", "v4", "v8", "ptr"):
                pass
        if not space or not ptype:
            raise self.fail("a variable needs a state space and a type", line)
        out = []
        while True:
            name = self.next()
            if name.kind != "name":
                raise self.fail(f"expected a variable name, found {name.text!r}", name.line)
            count, sized = 1, True
            while self.accept("["):
                if self.accept("]"):
                    sized = False
                    continue
                count *= self.integer()
                self.expect("]")
            init: tuple[int | float, ...] = ()
            if self.accept("="):
                init = tuple(self.initializer())
            out.append(
                Variable(name.text, space, ptype, count if sized else 0, align or 0, line, init)
            )
            if not self.accept(","):
                break
        self.expect(";")
        return out

    def initializer(self) -> list[int | float]:
        if self.accept("{"):
            vals: list[int | float] = []
            if not self.at("}"):
                vals += self.initializer()
                while self.accept(","):
                    vals += self.initializer()
            self.expect("}")
            return vals
        op = self.immediate()
        if op is None:
            raise self.fail("only numeric initializers are supported")
        return [op.value]

    # -- functions --------------------------------------------------------------------------
    def params(self, is_entry: bool) -> list[Param]:
        self.expect("(")
        out: list[Param] = []
        while not self.accept(")"):
            ptype, align = "", 0
            while (t := self.peek()) is not None and t.kind == "dir":
                self.i += 1
                word = t.text[1:]
                if word == "align":
                    align = self.integer()
                elif word in TYPES:
                    ptype = word
            name = self.next()
            if name.kind != "name" or not ptype:
                raise self.fail(f"bad parameter declaration near {name.text!r}", name.line)
            count = 1
            if self.accept("["):
                count = self.integer() if not self.at("]") else 0
                self.expect("]")
            out.append(Param(name.text, ptype, count, align))
            if not self.accept(","):
                self.expect(")")
                break
        return out

    def function(self) -> Function | None:
        head = self.next()
        is_entry = head.text == ".entry"
        if not is_entry and self.at("("):
            self.params(False)  # return values of a .func: not needed by an executor
        name = self.next()
        if name.kind != "name":
            raise self.fail(f"expected a function name, found {name.text!r}", name.line)
        params = self.params(is_entry) if self.at("(") else []
        fn = Function(name.text, is_entry, params, {}, [], [], {}, head.line)
        while (t := self.peek()) is not None and t.kind == "dir":
            self.i += 1
            if t.text == ".pragma":
                self.skip_statement()
                continue
            if t.text not in PERF_DIRECTIVES:
                raise self.fail(f"unexpected {t.text} in the header of {fn.name}", t.line)
            values = []
            if (nt := self.peek()) is not None and nt.kind == "num":
                values.append(self.integer())
                while self.accept(","):
                    values.append(self.integer())
            fn.directives[t.text[1:]] = tuple(values)
        if self.accept(";"):
            return None  # a declaration (`.extern .func vprintf(...)`): nothing to execute
        _Body(self, fn).parse()
        return fn

    # -- operands ---------------------------------------------------------------------------
    def immediate(self) -> Imm | None:
        """An immediate at the cursor (with an optional minus sign), or None."""
        neg = self.at("-")
        t = self.peek(1 if neg else 0)
        if t is None or t.kind not in ("num", "hexf"):
            return None
        self.i += 2 if neg else 1
        if t.kind == "hexf":
            bits = int(t.text[2:], 16)
            if len(t.text) == 10:
                value: int | float = struct.unpack(">f", bits.to_bytes(4, "big"))[0]
                if neg:
                    bits ^= 0x80000000
            else:
                value = struct.unpack(">d", bits.to_bytes(8, "big"))[0]
                if neg:
                    bits ^= 1 << 63
            return Imm(-value if neg else value, bits)
        iv = _int_value(t.text)
        if iv is not None:
            return Imm(-iv if neg else iv)
        fv = float(t.text)
        return Imm(-fv if neg else fv)


def _int_value(text: str) -> int | None:
    t = text.rstrip("U")
    if t[:2] in ("0x", "0X"):
        return int(t[2:], 16)
    if t[:2] in ("0b", "0B"):
        return int(t[2:], 2)
    if t.isdigit():
        # PTX reads a leading 0 as octal (`017` is 15), like C.
        return int(t, 8) if len(t) > 1 and t[0] == "0" else int(t)
    return None


class _Body:
    """The statements between a function's braces, with their nested scopes."""

    def __init__(self, p: _Parser, fn: Function) -> None:
        self.p = p
        self.fn = fn
        self.scopes: list[_Scope] = []
        self.n_scopes = 0
        # For nested-scope labels: every instruction's scope chain, and labels per scope.
        self.chains: list[tuple[int, ...]] = []
        self.scoped_labels: dict[tuple[int, str], int] = {}

    def parse(self) -> None:
        p = self.p
        p.expect("{")
        self.open()
        while self.scopes:
            t = p.next()
            if t.text == "{":
                self.open()
            elif t.text == "}":
                self.scopes.pop()
            elif t.kind == "dir":
                self.directive(t)
            elif t.kind == "name" and p.at(":"):
                p.i += 1
                self.label(t)
            elif t.text == "@" or t.kind == "name":
                self.instruction(t)
            else:
                raise p.fail(f"unexpected {t.text!r} in the body of {self.fn.name}", t.line)
        self.resolve_scoped_labels()

    def open(self) -> None:
        self.scopes.append(_Scope(self.n_scopes))
        self.n_scopes += 1

    def unique(self, name: str) -> str:
        depth = len(self.scopes) - 1
        return name if depth == 0 else f"{name}~{self.scopes[-1].ident}"

    def declare_reg(self, name: str, ptype: str, line: int) -> None:
        scope = self.scopes[-1]
        if name in scope.regs:
            raise self.p.fail(f"register {name} is declared twice in one scope", line)
        unique = self.unique(name)
        scope.regs[name] = unique
        self.fn.regs[unique] = ptype

    def directive(self, t: Token) -> None:
        p = self.p
        if t.text in LINE_DIRECTIVES:
            p.skip_line(t.line)
        elif t.text == ".pragma":
            p.skip_statement()
        elif t.text == ".reg":
            ptype = ""
            while (d := p.peek()) is not None and d.kind == "dir":
                p.i += 1
                if d.text[1:] in TYPES:
                    ptype = d.text[1:]
            if not ptype:
                raise p.fail(".reg needs a type", t.line)
            while True:
                name = p.next()
                if name.kind != "name":
                    raise p.fail(f"expected a register name, found {name.text!r}", name.line)
                if p.accept("<"):
                    count = p.integer()
                    p.expect(">")
                    for k in range(count):
                        self.declare_reg(f"{name.text}{k}", ptype, name.line)
                else:
                    self.declare_reg(name.text, ptype, name.line)
                if not p.accept(","):
                    break
            p.expect(";")
        else:
            p.i -= 1
            start = p.i
            while (d := p.peek()) is not None and d.kind == "dir" and d.text[1:] not in SPACES:
                p.i += 1
            d = p.peek()
            if d is None or d.text[1:].split("::")[0] not in SPACES:
                raise p.fail(f"unexpected {t.text} in the body of {self.fn.name}", t.line)
            p.i = start
            for v in p.variables():
                unique = self.unique(v.name)
                self.scopes[-1].regs[v.name] = unique  # variables shadow like registers
                self.fn.variables.append(
                    Variable(unique, v.space, v.ptype, v.count, v.align, v.line, v.init)
                )

    def label(self, t: Token) -> None:
        key = (self.scopes[-1].ident, t.text)
        if key in self.scoped_labels:
            raise self.p.fail(f"label {t.text} is defined twice", t.line)
        self.scoped_labels[key] = len(self.fn.body)
        if len(self.scopes) == 1:
            self.fn.labels[t.text] = len(self.fn.body)

    def instruction(self, first: Token) -> None:
        p = self.p
        guard: Reg | None = None
        negated = False
        if first.text == "@":
            negated = p.accept("!")
            g = p.next()
            op = self.name_operand(g)
            if not isinstance(op, Reg):
                raise p.fail(f"a guard must be a predicate register, not {g.text!r}", g.line)
            guard = op
            first_op = p.next()
        else:
            first_op = first
        if first_op.kind != "name":
            raise p.fail(f"expected an instruction, found {first_op.text!r}", first_op.line)
        opcode, *mods = first_op.text.split(".")
        operands: list[Operand] = []
        if not p.at(";"):
            operands.append(self.operand())
            while p.accept(","):
                operands.append(self.operand())
        end = p.expect(";")
        text = p.src.span(first.start, end.end)
        self.fn.body.append(
            Instruction(
                first.line,
                text,
                opcode,
                tuple(mods),
                tuple(operands),
                guard,
                negated and guard is not None,
            )
        )
        self.chains.append(tuple(s.ident for s in self.scopes))

    def operand(self) -> Operand:
        p = self.p
        imm = p.immediate()
        if imm is not None:
            return imm
        t = p.next()
        if t.text in ("{", "("):
            close = "}" if t.text == "{" else ")"
            items: list[Operand] = []
            if not p.at(close):
                items.append(self.operand())
                while p.accept(","):
                    items.append(self.operand())
            p.expect(close)
            return Vec(tuple(items))
        if t.text == "[":
            return self.address()
        if t.text == "!":
            reg = self.name_operand(p.next())
            if not isinstance(reg, Reg):
                raise p.fail("`!` applies to a predicate register", t.line)
            return Neg(reg)
        if t.kind != "name":
            raise p.fail(f"unexpected {t.text!r} in an operand", t.line)
        op = self.name_operand(t)
        if p.accept("|"):
            return Vec((op, self.name_operand(p.next())))
        return op

    def name_operand(self, t: Token) -> Reg | Symbol | Sink:
        if t.text == "_":
            return Sink()
        if t.kind != "name":
            raise self.p.fail(f"expected a register or a name, found {t.text!r}", t.line)
        if t.text.startswith("%") and is_special(t.text):
            return Reg(t.text)
        for scope in reversed(self.scopes):
            unique = scope.regs.get(t.text)
            if unique is not None:
                return Reg(unique) if unique in self.fn.regs else Symbol(unique)
        if t.text.startswith("%"):
            raise self.p.fail(f"register {t.text} is not declared", t.line)
        return Symbol(t.text)

    def address(self) -> Operand:
        p = self.p
        base: Reg | Symbol | None = None
        offset = 0
        if (t := p.peek()) is not None and t.kind == "name":
            op = self.name_operand(p.next())
            if isinstance(op, Sink):
                raise p.fail("`_` cannot be an address", t.line)
            base = op
            if p.at(","):  # `[tex, {coords}]` and similar: a list, not an address
                items: list[Operand] = [op]
                while p.accept(","):
                    items.append(self.operand())
                p.expect("]")
                return Vec(tuple(items))
        elif p.at("]"):
            raise p.fail("empty address `[]`")
        else:
            offset = p.integer()
        while not p.accept("]"):
            sign = p.next()
            if sign.text not in "+-":
                raise p.fail(f"unexpected {sign.text!r} in an address", sign.line)
            v = p.integer()
            offset += v if sign.text == "+" else -v
        return Addr(base, offset)

    def resolve_scoped_labels(self) -> None:
        """Branch targets defined in nested scopes get the unique names of those scopes."""
        nested = {name for (scope, name) in self.scoped_labels if scope != 0}
        if not nested:
            return
        for (scope, name), index in self.scoped_labels.items():
            if scope != 0:
                self.fn.labels[f"{name}~{scope}"] = index
        body = self.fn.body
        for k, ins in enumerate(body):
            if not any(isinstance(o, Symbol) and o.name in nested for o in ins.operands):
                continue
            chain = self.chains[k]
            ops = list(ins.operands)
            for j, o in enumerate(ops):
                if isinstance(o, Symbol) and o.name in nested:
                    for scope in reversed(chain):
                        if (scope, o.name) in self.scoped_labels:
                            if scope != 0:
                                ops[j] = Symbol(f"{o.name}~{scope}")
                            break
            body[k] = replace(ins, operands=tuple(ops))


def parse(text: str) -> Module:
    """Parse a PTX module; raises PtxParseError naming the line."""
    return _Parser(text).module()
