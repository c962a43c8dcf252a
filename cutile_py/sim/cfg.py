"""Control-flow graph of a PTX function and the immediate post-dominator of each branch.

Divergent lanes reconverge at the branch's immediate post-dominator (the first instruction
every path from the branch must pass); `EXIT` where only the function's end joins them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cutile_py.ptx.ast import Instruction, Symbol

#: Opcodes that end a thread.
EXITS = frozenset(["ret", "exit", "trap"])


@dataclass(frozen=True)
class Cfg:
    #: First instruction index of each basic block, in order.
    starts: tuple[int, ...]
    succs: tuple[tuple[int, ...], ...]  # block -> successor blocks (len(starts) = exit node)
    ipdom: tuple[int, ...]  # block -> instruction index of its immediate post-dominator


def branch_target(ins: Instruction, labels: dict[str, int]) -> int:
    """The body index a `bra` jumps to; KeyError if its label is unknown."""
    op = ins.operands[0] if ins.operands else None
    if not isinstance(op, Symbol):
        raise KeyError("bra needs a label operand")
    return labels[op.name]


def build_cfg(body: Sequence[Instruction], labels: dict[str, int]) -> tuple[Cfg, list[int]]:
    """The CFG of `body` and, for each instruction, the index of its basic block."""
    n = len(body)
    leaders = {0} | {i for i in labels.values() if i < n}
    for i, ins in enumerate(body):
        if ins.opcode == "bra" or ins.opcode in EXITS:
            if i + 1 < n:
                leaders.add(i + 1)
            if ins.opcode == "bra":
                leaders.add(branch_target(ins, labels))
    starts = sorted(x for x in leaders if x < n) if n else [0]
    block_of = [0] * max(n, 1)
    for b, s in enumerate(starts):
        end = starts[b + 1] if b + 1 < len(starts) else n
        for i in range(s, end):
            block_of[i] = b
    nb = len(starts)
    exit_node = nb
    start_index = {s: b for b, s in enumerate(starts)}

    def block_at(i: int) -> int:
        return exit_node if i >= n else start_index[i]

    succs: list[tuple[int, ...]] = []
    for b in range(nb):
        last = (starts[b + 1] if b + 1 < nb else n) - 1
        if n == 0:
            succs.append((exit_node,))
            continue
        ins = body[last]
        if ins.opcode == "bra":
            target = block_at(branch_target(ins, labels))
            succs.append((target,) if ins.guard is None else (target, block_at(last + 1)))
        elif ins.opcode in EXITS:
            succs.append((exit_node,) if ins.guard is None else (exit_node, block_at(last + 1)))
        else:
            succs.append((block_at(last + 1),))
    ipdom_block = _immediate_post_dominators(succs, exit_node)
    ipdom = tuple(n if d == exit_node else starts[d] for d in ipdom_block)
    return Cfg(tuple(starts), tuple(succs), ipdom), block_of


def _immediate_post_dominators(succs: list[tuple[int, ...]], exit_node: int) -> list[int]:
    """Cooper-Harvey-Kennedy on the reversed graph; blocks that cannot reach the exit (an
    endless loop) get the exit as post-dominator."""
    nb = len(succs)
    preds_rev: list[list[int]] = [[] for _ in range(nb + 1)]  # successors in the reverse graph
    for b, ss in enumerate(succs):
        for s in ss:
            preds_rev[s].append(b)
    # Reverse post-order of the reversed graph, from the exit.
    order: list[int] = []
    seen = [False] * (nb + 1)
    stack: list[tuple[int, int]] = [(exit_node, 0)]
    seen[exit_node] = True
    while stack:
        node, k = stack.pop()
        if k < len(preds_rev[node]):
            stack.append((node, k + 1))
            nxt = preds_rev[node][k]
            if not seen[nxt]:
                seen[nxt] = True
                stack.append((nxt, 0))
        else:
            order.append(node)
    order.reverse()
    rank = {node: i for i, node in enumerate(order)}
    idom = [-1] * (nb + 1)
    idom[exit_node] = exit_node

    def intersect(a: int, b: int) -> int:
        while a != b:
            while rank[a] > rank[b]:
                a = idom[a]
            while rank[b] > rank[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for node in order[1:]:
            cands = [s for s in succs[node] if idom[s] != -1 and s in rank]
            if not cands:
                continue
            new = cands[0]
            for s in cands[1:]:
                new = intersect(s, new)
            if idom[node] != new:
                idom[node] = new
                changed = True
    return [exit_node if (d == -1 or b not in rank) else d for b, d in enumerate(idom[:nb])]
