"""Block barriers that order nothing, dropped from a function's straight-line code.

A `bar.sync 0` orders the memory accesses of the block's threads before it against those
after it (PTX ISA, §9.7.13.1, "bar"). The emitters end each use of shared scratch with one,
so that a later op may reuse the memory; where no later shared access follows, the barrier
only makes warps wait (rms_norm's row reduction ended with two barriers, Triton's with one).

`drop_idle_barriers` removes a barrier B when no pair of accesses it orders can conflict:
with P the last barrier kept before B (or the entry) and N the next barrier (or the `ret`),
the code from P to B and from B to N is straight-line (no label, branch or guarded barrier),
and no access in one half writes a state space (shared, global) the other half accesses.
Accesses that never conflict: `ld.param`, `ld.const`, `ld.local` / `st.local` (a thread's
own), `ld.global.nc` (read-only for the kernel's lifetime). Any instruction this pass does not
know (asynchronous copies, mbarriers, fences, wgmma, generic addressing, named barriers)
stops it: the barriers around it stay.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Instruction roots that touch no memory and order nothing.
_PURE = frozenset((
    "abs", "activemask", "add", "and", "bfe", "bfi", "bfind", "brev", "clz", "cnot", "copysign",
    "cos", "cvt", "cvta", "div", "ex2", "fma", "lg2", "lop3", "mad", "mad24", "max", "min",
    "mma", "mov", "mul", "mul24", "neg", "not", "or", "popc", "prmt", "rcp", "rem", "rsqrt",
    "sad", "selp", "set", "setp", "shf", "shfl", "shl", "shr", "sin", "slct", "sqrt", "sub",
    "tanh", "testp", "vote", "xor",
))  # fmt: skip
_MEMORY = frozenset({"ld", "ldu", "st", "atom", "red"})
_ORDERING = frozenset({"volatile", "relaxed", "acquire", "release", "acq_rel", "sc", "mmio"})


@dataclass
class _Accesses:
    """The state spaces read and written by some straight-line code."""

    read: set[str]
    written: set[str]

    def add(self, other: _Accesses) -> None:
        self.read |= other.read
        self.written |= other.written

    def conflicts(self, other: _Accesses) -> bool:
        return bool(self.written & (other.read | other.written) or other.written & self.read)


# What one body line is: an access (or none), a barrier, the end, or something opaque.
_NONE, _BARRIER, _END, _OPAQUE = "none", "barrier", "end", "opaque"


def _classify(line: str) -> tuple[str, str | None, bool]:
    """(kind, state space accessed or None, whether it writes) of one body line."""
    text = line.strip()
    if not text or text.startswith("//"):
        return _NONE, None, False
    if text.endswith(":"):
        return _OPAQUE, None, False  # a label: code reached from elsewhere
    guarded = text.startswith("@")
    if guarded:
        text = text.split(None, 1)[1]
    opcode, _, operands = text.rstrip(";").partition(" ")
    parts = opcode.split(".")
    root = parts[0]
    if opcode in ("bar.sync", "barrier.sync", "barrier.sync.aligned") and operands == "0":
        return (_OPAQUE if guarded else _BARRIER), None, False
    if root in ("ret", "exit") and not guarded:
        return _END, None, False
    if root in _PURE:
        return _NONE, None, False
    if root not in _MEMORY or _ORDERING.intersection(parts):
        return _OPAQUE, None, False
    writes = root in ("st", "atom", "red")
    space = next((p.split("::")[0] for p in parts[1:] if p.split("::")[0] in
                  ("shared", "global", "param", "const", "local")), None)  # fmt: skip
    if space is None:
        return _OPAQUE, None, False  # generic addressing: any state space
    if space in ("param", "const", "local") or (space == "global" and "nc" in parts):
        return _NONE, None, False
    return _NONE, space, writes


def drop_idle_barriers(body: list[str]) -> list[str]:
    """`body` without the `bar.sync 0`s that order no conflicting accesses (module doc)."""
    kinds = [_classify(line) for line in body]
    dropped: set[int] = set()
    before = _Accesses(set(), set())  # since the last barrier kept (or the entry)
    clear = True  # nothing opaque since then
    i = 0
    while i < len(body):
        kind, space, writes = kinds[i]
        if kind == _OPAQUE:
            clear = False
        elif kind == _BARRIER:
            after, j = _Accesses(set(), set()), i + 1
            while j < len(body) and kinds[j][0] == _NONE:
                _, sp, wr = kinds[j]
                if sp is not None:
                    (after.written if wr else after.read).add(sp)
                j += 1
            ends_clear = j < len(body) and kinds[j][0] in (_BARRIER, _END)
            if clear and ends_clear and not before.conflicts(after):
                dropped.add(i)
                before.add(after)
            else:
                before, clear = after, True  # B stays: the code after it starts afresh
            i = j
            continue
        elif kind == _END:
            before, clear = _Accesses(set(), set()), True
        elif space is not None:
            (before.written if writes else before.read).add(space)
        i += 1
    return [line for k, line in enumerate(body) if k not in dropped]
