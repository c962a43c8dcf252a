"""The parsed form of a PTX module: what `ptx.parser` produces and the simulator executes.

Instructions keep their source line so that every simulator error can name it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reg:
    """A register operand (`%r1`, `%p2`) or a special register (`%tid.x`, `%laneid`)."""

    name: str


@dataclass(frozen=True)
class Imm:
    """An immediate. `value` is an int, or a float for `0f`/`0d` and decimal float literals."""

    value: int | float
    #: For `0fXXXXXXXX` / `0dXXXXXXXXXXXXXXXX`: the exact bits as written (else None).
    bits: int | None = None


@dataclass(frozen=True)
class Vec:
    """`{a, b, ...}`; an element may be `Sink` (`_`).

    The paired destination `d|p` of `setp`, `shfl.sync` and `match` parses as the 2-item Vec
    `(d, p)` too.
    """

    items: tuple[Operand, ...]


@dataclass(frozen=True)
class Sink:
    """`_`: a destination whose value is discarded."""


@dataclass(frozen=True)
class Addr:
    """`[base+offset]`: base is a register or a symbol (param, shared or global variable)."""

    base: Reg | Symbol | None
    offset: int = 0


@dataclass(frozen=True)
class Symbol:
    """A name used as a value: a label (branch target), a variable's address, a function."""

    name: str


@dataclass(frozen=True)
class Neg:
    """`!%p`: a negated predicate source operand."""

    reg: Reg


Operand = Reg | Imm | Vec | Sink | Addr | Symbol | Neg


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line in the module text
    text: str  # the source text of the instruction (for messages)
    opcode: str  # the base name: "ld", "mma", "setp", ...
    modifiers: tuple[str, ...]  # the dotted parts after it: ("global", "nc", "v4", "f32")
    operands: tuple[Operand, ...]
    guard: Reg | None = None  # `@%p` / `@!%p`
    guard_negated: bool = False

    def has(self, modifier: str) -> bool:
        return modifier in self.modifiers


@dataclass(frozen=True)
class Variable:
    """A `.shared` / `.global` / `.const` / `.local` variable or array."""

    name: str
    space: str  # "shared", "global", "const", "local"
    ptype: str  # element type: "b8", "u32", "f32", ...
    count: int  # elements (1 for a scalar; 0 for an `extern` array of unknown size)
    align: int
    line: int
    init: tuple[int | float, ...] = ()


@dataclass(frozen=True)
class Param:
    name: str
    ptype: str  # "u64", "f32", "b8" ...
    count: int = 1  # > 1 for `.param .align 8 .b8 p[16]` style byte arrays
    align: int = 0


@dataclass
class Function:
    name: str
    is_entry: bool
    params: list[Param]
    #: Declared registers and their type ("b32", "f32", "pred", ...); `%r<4>` expands to
    #: %r0..%r3.
    regs: dict[str, str]
    variables: list[Variable]
    body: list[Instruction]
    #: Label name → index into `body` of the instruction it precedes.
    labels: dict[str, int]
    line: int
    #: `.maxntid`, `.reqntid`, `.minnctapersm` and similar performance directives, as written.
    directives: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class Module:
    version: tuple[int, int]
    target: str
    address_size: int
    functions: dict[str, Function]
    variables: list[Variable]  # module-scope `.global` / `.const` / `.shared`
