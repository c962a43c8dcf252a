"""Loading a parsed kernel for execution: steps with their handlers, the CFG's reconvergence
points, and the layouts of its parameters, shared, local and global variables.

Every instruction is decoded here, once, into its handler: one registry maps each opcode to a
decoder `(instruction, program) -> handler`, so modifiers are parsed at load and never per step,
and an instruction the simulator lacks (in any branch, taken or not) is an error naming the
kernel and its PTX line when the kernel is loaded, never at run time.
"""

from __future__ import annotations

import importlib
import struct
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cutile_py.ptx.ast import Function, Imm, Instruction, Module, Symbol, Variable
from cutile_py.sim.async_copy import make_cp
from cutile_py.sim.atomics import make_atom, make_red
from cutile_py.sim.cfg import EXITS, branch_target, build_cfg
from cutile_py.sim.context import PTYPE_DTYPE, ExecContext, SimError
from cutile_py.sim.mbarrier import make_mbarrier
from cutile_py.sim.memops import (
    make_cvta,
    make_fence,
    make_ld,
    make_ldmatrix,
    make_mov_symbol,
    make_nop,
    make_st,
    make_stmatrix,
    make_trap,
    make_warp_sync,
    unsupported,
)
from cutile_py.sim.memory import GlobalMemory
from cutile_py.sim.regfile import Slots
from cutile_py.sim.wgmma import make_setmaxnreg, make_wgmma

if TYPE_CHECKING:
    from cutile_py.sim.spaces import Batch

#: A register semantic (`cutile_py.sim.semantics`): decodes an instruction into what runs it.
Semantics = Callable[[Instruction], Callable[[ExecContext], None]]
Handler = Callable[["Batch"], None]
#: Decodes one instruction into its handler, once, at load (SimError for forms it lacks).
Factory = Callable[[Instruction, "Program"], Handler]

#: WAIT: an `mbarrier.test_wait` / `try_wait`, run like NORMAL; where it fails for every lane
#: that runs it, the executor may run other paths before it tries again.
NORMAL, BRANCH, EXIT, BARRIER, WAIT = range(5)


def default_instructions() -> Mapping[str, Semantics]:
    """`cutile_py.sim.semantics.INSTRUCTIONS`, or nothing where that package is absent."""
    try:
        mod = importlib.import_module("cutile_py.sim.semantics")
    except ModuleNotFoundError as e:
        if e.name not in ("cutile_py.sim.semantics",):
            raise
        return {}
    # Until its __init__ exists the directory imports as an empty namespace package.
    return cast(Mapping[str, Semantics], getattr(mod, "INSTRUCTIONS", {}))


@dataclass
class Step:
    kind: int
    instr: Instruction
    run: Handler | None  # NORMAL and WAIT steps only
    guard: int | None  # the guard predicate's register slot
    negated: bool
    own: bool = False  # run by the executor's own handler (not register semantics)
    target: int = -1  # BRANCH: the body index it jumps to
    reconv: int = -1  # BRANCH: where divergent lanes meet again (len(body): at the exit)
    back: bool = False  # BRANCH: to itself or an earlier instruction (a loop's back-edge)


def _type_size(ptype: str) -> int:
    return 16 if ptype == "b128" else PTYPE_DTYPE[ptype].itemsize


def _layout(variables: Sequence[Variable], start: int = 0) -> tuple[dict[str, int], int]:
    """Offsets of sized variables laid out in order at their alignment; and the end."""
    offsets: dict[str, int] = {}
    end = start
    for v in variables:
        if v.count == 0:
            continue
        align = max(v.align, _type_size(v.ptype))
        end = -(-end // align) * align
        offsets[v.name] = end
        end += v.count * _type_size(v.ptype)
    return offsets, end


class ModuleGlobals:
    """The `.global` and `.const` variables of one module, placed in a global memory: one
    copy shared by all the module's entries (as on a GPU), unregistered with this object."""

    def __init__(self, module: Module, memory: GlobalMemory) -> None:
        self.addresses: dict[str, int] = {}
        self._keep: list[np.ndarray] = []
        for v in module.variables:
            if v.space in ("global", "const"):
                self._place(v, memory)

    def _place(self, v: Variable, memory: GlobalMemory) -> None:
        nbytes = max(v.count, 1) * _type_size(v.ptype)
        raw = np.zeros(nbytes + 256, dtype=np.uint8)
        start = (-raw.ctypes.data) % 256
        data = raw[start : start + nbytes]
        if v.init:
            init = np.array(v.init, dtype=PTYPE_DTYPE[v.ptype] if v.ptype != "b128" else np.uint64)
            data[: init.nbytes] = init.view(np.uint8)[:nbytes]
        kind = "constant" if v.space == "const" else "global"
        address = memory.register(data, f"{kind} variable {v.name}", readonly=v.space == "const")
        self.addresses[v.name] = address
        self._keep.append(raw)
        weakref.finalize(self, memory.unregister, address)


class Program:
    """One `.entry` of a module, ready to run on the global memory it was loaded into."""

    def __init__(
        self,
        module: Module,
        entry: str,
        memory: GlobalMemory,
        instructions: Mapping[str, Semantics] | None = None,
        globals_: ModuleGlobals | None = None,
    ) -> None:
        """`globals_`: the module's variables, when other entries of it are loaded too."""
        fn = module.functions.get(entry)
        if fn is None or not fn.is_entry:
            have = ", ".join(n for n, f in module.functions.items() if f.is_entry) or "none"
            raise SimError(f"the PTX has no .entry {entry!r} (entries: {have})")
        self.module = module
        self.fn: Function = fn
        self.name = entry
        self.regs = dict(fn.regs)
        self.slots = Slots(self.regs)
        self.directives = fn.directives
        self._layout_params(fn)
        shared = [v for v in (*module.variables, *fn.variables) if v.space == "shared"]
        self.shared_offsets, self.static_shared = _layout(shared)
        dyn = [v for v in shared if v.count == 0]
        align = max([16, *(v.align for v in dyn)])
        self.dynamic_base = -(-self.static_shared // align) * align
        self.shared_offsets.update({v.name: self.dynamic_base for v in dyn})
        self.has_dynamic = bool(dyn)
        local = [v for v in (*module.variables, *fn.variables) if v.space == "local"]
        self.local_offsets, self.local_size = _layout(local)
        self.globals = globals_ if globals_ is not None else ModuleGlobals(module, memory)
        self.global_addresses = self.globals.addresses
        self.steps = self._build_steps(fn, instructions)
        #: Whether the kernel has `bar.warp.sync` (the shared race tracker keeps the warps of
        #: readers only then).
        self.warp_syncs = any(
            st.instr.opcode == "bar" and "warp" in st.instr.modifiers for st in self.steps
        )
        #: Whether the kernel has bulk stores (the race tracker then checks that the shared
        #: memory they read was fenced for the async proxy after its generic writes).
        self.bulk_stores = any(
            st.instr.opcode == "cp" and "bulk_group" in st.instr.modifiers for st in self.steps
        )
        #: Per lane count: the immediates batches of that many lanes broadcast (read-only, so
        #: shared; broadcasting each again at every launch cost more than reading it).
        self._immediates: dict[int, dict[tuple[int, str], tuple[Imm, np.ndarray]]] = {}

    def immediates(self, lanes: int) -> dict[tuple[int, str], tuple[Imm, np.ndarray]]:
        """The immediates broadcast to `lanes` lanes so far (a batch adds to it)."""
        return self._immediates.setdefault(lanes, {})

    # -- layouts --------------------------------------------------------------------------------
    def _layout_params(self, fn: Function) -> None:
        self.param_offsets: dict[str, int] = {}
        self.param_types: list[tuple[str, str, int]] = []  # name, ptype, bytes
        end = 0
        for p in fn.params:
            size = _type_size(p.ptype) * max(p.count, 1)
            align = max(p.align, _type_size(p.ptype))
            end = -(-end // align) * align
            self.param_offsets[p.name] = end
            self.param_types.append((p.name, p.ptype, size))
            end += size
        self.param_size = end

    def shared_size(self, dynamic: int) -> int:
        return self.dynamic_base + dynamic if (dynamic or self.has_dynamic) else self.static_shared

    def pack_params(self, values: Sequence[tuple[str, int | float | bytes]]) -> bytes:
        """The parameter bytes of a launch; `values` are (ptype, value) in declared order,
        where an array parameter (`.param .b8 name[N]`) takes `bytes` of its size."""
        if len(values) != len(self.param_types):
            raise SimError(
                f"kernel {self.name} declares {len(self.param_types)} parameters; "
                f"the launch passed {len(values)}"
            )
        buf = bytearray(self.param_size)
        for (name, ptype, size), (given, value) in zip(self.param_types, values):
            off = self.param_offsets[name]
            if isinstance(value, bytes):  # an array parameter: a tensor map, a struct
                if len(value) != size:
                    raise SimError(f"kernel {self.name}: parameter {name} takes {size} bytes; "
                                   f"{len(value)} were passed")  # fmt: skip
                buf[off : off + size] = value
                continue
            dtype = PTYPE_DTYPE.get(ptype)
            if dtype is None or size != dtype.itemsize:
                raise SimError(f"kernel {self.name}: parameter {name} (.{ptype}, {size} bytes) "
                               "cannot be passed a scalar")  # fmt: skip
            if _type_size(given) != size:
                raise SimError(
                    f"kernel {self.name}: parameter {name} is .{ptype} but was passed as .{given}"
                )
            buf[off : off + size] = _scalar_bytes(ptype, value)
        return bytes(buf)

    # -- steps ----------------------------------------------------------------------------------
    def _build_steps(
        self, fn: Function, instructions: Mapping[str, Semantics] | None
    ) -> list[Step]:
        table = registry(default_instructions() if instructions is None else instructions)
        _check_labels(fn)
        cfg, block_of = build_cfg(fn.body, fn.labels)
        steps = []
        slots = self.slots
        for pc, src in enumerate(fn.body):
            ins = slots.instruction(src)
            try:
                guard = None if ins.guard is None else slots.index.get(ins.guard.name)
                if ins.guard is not None and guard is None:
                    raise unsupported(ins, f"guard {ins.guard.name} is not a declared predicate")
                kind = control_kind(ins)
                step = Step(kind, ins, None, guard, ins.guard_negated)
                if kind == BRANCH:
                    step.target = branch_target(ins, fn.labels)
                    step.back = step.target <= pc
                    step.reconv = cfg.ipdom[block_of[pc]]
                elif kind in (NORMAL, WAIT):
                    decode = table.get(ins.opcode)
                    if decode is None:
                        raise unsupported(ins, f"the simulator does not implement `{ins.opcode}`")
                    step.run = decode(ins, self)
                    step.own = executor_owned(ins)
            except SimError as e:
                raise self._load_error(ins, e) from None
            steps.append(step)
        return steps

    def _load_error(self, ins: Instruction, e: SimError) -> SimError:
        """`e`, raised decoding `ins`, with the kernel and PTX line in front."""
        text = str(e)
        where = f"PTX line {ins.line} `{ins.text}`"
        if not text.startswith(where):
            text = f"{where}: {text}"
        return SimError(f"kernel {self.name}, {text}")


#: The instructions the executor implements itself (memory, barriers, fences), by opcode;
#: everything else is register arithmetic from `cutile_py.sim.semantics`.
OWN: dict[str, Factory] = {
    "ld": make_ld,
    "ldu": make_ld,
    "st": make_st,
    "cvta": make_cvta,
    "ldmatrix": make_ldmatrix,
    "stmatrix": make_stmatrix,
    "wgmma": make_wgmma,
    "mbarrier": make_mbarrier,
    "setmaxnreg": make_setmaxnreg,
    "cp": make_cp,
    "atom": make_atom,
    "red": make_red,
    "prefetch": make_nop,
    "prefetchu": make_nop,
    "membar": make_fence,
    "fence": make_fence,
    "nanosleep": make_nop,
    "brkpt": make_nop,
    "trap": make_trap,
    "bar": make_warp_sync,  # only `bar.warp.sync` reaches a decoder (see `control_kind`)
}


def registry(semantics: Mapping[str, Semantics]) -> dict[str, Factory]:
    """The decoder of every opcode the simulator runs: its own (`OWN`) and the register
    semantics; `mov` of a symbol (an address) is its own, every other `mov` a semantic."""
    table: dict[str, Factory] = {op: _semantic(sem) for op, sem in semantics.items()}
    table.update(OWN)
    table["mov"] = _mov(semantics.get("mov"))
    return table


def _semantic(sem: Semantics) -> Factory:
    def decode(ins: Instruction, prog: Program) -> Handler:
        return sem(ins)

    return decode


def _mov(sem: Semantics | None) -> Factory:
    def decode(ins: Instruction, prog: Program) -> Handler:
        if _moves_symbol(ins):
            return make_mov_symbol(ins, prog)
        if sem is None:
            raise unsupported(ins, "the simulator does not implement `mov`")
        return sem(ins)

    return decode


def _moves_symbol(ins: Instruction) -> bool:
    return len(ins.operands) == 2 and isinstance(ins.operands[1], Symbol)


def executor_owned(ins: Instruction) -> bool:
    """Whether `ins` runs on the executor's own handler rather than a register semantic."""
    return _moves_symbol(ins) if ins.opcode == "mov" else ins.opcode in OWN


def control_kind(ins: Instruction) -> int:
    """NORMAL, BRANCH, EXIT, BARRIER or WAIT; SimError for control forms not supported."""
    op = ins.opcode
    if op == "bra":
        return BRANCH
    if op in EXITS and op != "trap":
        return EXIT
    if op in ("bar", "barrier"):
        mods = ins.modifiers
        if "warp" in mods:
            return NORMAL
        if "cluster" in mods:
            raise unsupported(ins, f"{op}.{'.'.join(mods)} is not supported")
        return BARRIER
    if op == "mbarrier" and ("test_wait" in ins.modifiers or "try_wait" in ins.modifiers):
        return WAIT
    return NORMAL


def _check_labels(fn: Function) -> None:
    for ins in fn.body:
        if ins.opcode == "bra":
            op = ins.operands[0] if ins.operands else None
            if not isinstance(op, Symbol) or op.name not in fn.labels:
                raise unsupported(ins, "branch to an unknown label")


def _scalar_bytes(ptype: str, value: Any) -> bytes:
    if ptype in ("f32", "f64"):
        return struct.pack("<f" if ptype == "f32" else "<d", float(value))
    if ptype == "f16":
        return np.array(value, dtype=np.float16).tobytes()
    if ptype == "bf16":
        bits = int(np.array(value, dtype=np.float32).view(np.uint32))
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return struct.pack("<H", bits)
    if isinstance(value, float):
        raise SimError(f"a .{ptype} parameter needs an integer, not {value!r}")
    width = _type_size(ptype) * 8
    lo = -(1 << (width - 1)) if ptype[0] in "sb" else 0
    hi = (1 << width) if ptype[0] in "ub" else (1 << (width - 1))
    v = int(value)
    if not lo <= v < hi:
        raise SimError(f"{v} does not fit a .{ptype} parameter")
    return (v % (1 << width)).to_bytes(width // 8, "little")
