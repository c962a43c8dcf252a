"""Distributed layouts: which thread of the block holds which element of a tile.

A `Blocked` base spreads an ordered list of dims over the threads: along the last (fastest)
dim each thread holds `vec` consecutive elements (one vectorized access), and `threads[d]`
consecutive thread groups tile dim `d`, repeated `reps[d]` times to cover it. Thread counts
are powers of two, so each dim owns a contiguous bit field of the thread index and a
reduction over it is a butterfly of shuffles (lane bits) then shared memory (warp bits).
Threads left over once every dim is covered hold replicas. A tile reduced along its last dim
(a row reduction) and along no other gives that dim at most one warp's threads where the
dims before it can take the other warps without more elements a thread (`row_blocked`): a
row then reduces within its warp, by shuffles alone (rms_norm's 4 rows of 1024 on 4 warps:
no shared memory, no barrier; sm_90 SASS 12.8 -> 8.8 instructions an element), where the
last dim first would spread each row over every warp. A warp's accesses still cover 32
consecutive vectors of a row.

A value's `Layout` maps each of its dims to a base dim, or to none for a dim of size 1. Base
dims a value does not use are replicated: every thread along them holds the same elements.
So a row reduction's result, its broadcast back over the row and the row weights of a norm
all share one base, and broadcasting between them costs nothing. Layouts are planned by
unifying the dims that element-wise ops, broadcasts, reductions and permutes relate; when
two uses disagree, the emitter converts through shared memory. One broadcast relates
nothing: that of a costly value (a transcendental of it) over at least 4 times its elements,
which is planned in a family of its own, spread over the block so that each thread computes
as few of its elements as it can, and converted at the broadcast (`_costly_broadcasts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product
from math import prod

from cutile_py.ir import ops as o
from cutile_py.ir.types import TileType
from cutile_py.ir.uses import walk
from cutile_py.ptx.target import Target

MAX_THREADS = 256
MIN_THREADS = 32
WARP_THREADS = 32
VECTOR_BYTES = 16
#: Target chunks per thread when the tile is large and its size has few factors of two.
CHUNKS_PER_THREAD = 4
ELEMS_PER_THREAD = 16


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def _pow2_factor(n: int) -> int:
    return n & -n


@dataclass(frozen=True)
class Blocked:
    """An ordered list of dims (`shape`, last fastest) spread over `block` threads."""

    shape: tuple[int, ...]
    vec: int
    threads: tuple[int, ...]
    block: int

    @property
    def rank(self) -> int:
        return len(self.shape)

    def unit(self, d: int) -> int:
        """Consecutive elements one thread holds along dim d."""
        return self.vec if d == self.rank - 1 else 1

    def reps(self, d: int) -> int:
        return -(-self.shape[d] // (self.threads[d] * self.unit(d)))

    def stride(self, d: int) -> int:
        """Distance in thread index between neighbours along dim d."""
        return prod(self.threads[d + 1 :])

    @property
    def used(self) -> int:
        """Threads that hold distinct elements; the others (tid >= used) are replicas."""
        return prod(self.threads)

    def held(self, d: int) -> int:
        """How many elements one thread holds along dim d: `len(offsets(d))`, in O(1)."""
        return self.reps(d) * self.unit(d)

    def offsets(self, d: int) -> list[int]:
        """Static element offsets of one thread along dim d (thread part excluded)."""
        u = self.unit(d)
        return [r * self.threads[d] * u + v for r in range(self.reps(d)) for v in range(u)]

    def position(self, d: int, offset: int) -> int:
        """Where `offset` sits in `offsets(d)`."""
        u = self.unit(d)
        return (offset // (self.threads[d] * u)) * u + offset % u

    def guarded(self, d: int, offset: int) -> bool:
        """Whether some thread's element at `offset` along d lies past the dim's end."""
        return (self.threads[d] - 1) * self.unit(d) + offset >= self.shape[d]


@dataclass(frozen=True)
class Layout:
    """A value's distribution: value dim i lives on base dim `dims[i]` (None: size 1)."""

    base: Blocked
    dims: tuple[int | None, ...]

    @property
    def present(self) -> tuple[int, ...]:
        """Base dims this value uses, in base order."""
        return tuple(sorted(d for d in self.dims if d is not None))

    @property
    def replicated(self) -> tuple[int, ...]:
        used = set(self.present)
        return tuple(d for d in range(self.base.rank) if d not in used)

    def registers(self) -> list[dict[int, int]]:
        """Per register: the static offset along each present base dim (base order, last
        base dim fastest)."""
        dims = self.present
        combos = product(*(self.base.offsets(d) for d in dims))
        return [dict(zip(dims, c)) for c in combos]

    def index(self, offsets: dict[int, int]) -> int:
        """The register holding the element at `offsets` (extra dims are ignored)."""
        k = 0
        for d in self.present:
            k = k * self.base.held(d) + self.base.position(d, offsets[d])
        return k

    def count(self) -> int:
        return prod(self.base.held(d) for d in self.present)

    def restricted(self, dims: tuple[int | None, ...]) -> Layout:
        return Layout(self.base, dims)


@dataclass
class LayoutPlan:
    threads: int
    layouts: dict[o.Value, Layout] = field(default_factory=dict)
    #: LoadOp/StoreOp → the coalesced layout it accesses memory in, where the value's
    #: own layout walks memory across rows (a transposed tile); converted on the way.
    memory: dict[o.Op, Layout] = field(default_factory=dict)
    #: A broadcast → an earlier one of its region with the same operand, shape and layout:
    #: its result is that one's registers (a costly operand planned apart is converted
    #: through shared memory once, not at each broadcast: `repeated_broadcasts`).
    repeats: dict[o.BroadcastOp, o.BroadcastOp] = field(default_factory=dict)

    def of(self, v: o.Value) -> Layout:
        return self.layouts[v]


def canonical_blocked(
    shape: tuple[int, ...],
    itemsize: int,
    block: int,
    max_vec: int = VECTOR_BYTES,
    last_threads: int | None = None,
) -> Blocked:
    """The coalesced layout of `shape` in memory order for a block of `block` threads, with
    vectors of at most 16 bytes and `max_vec` elements; at most `last_threads` threads
    along the last dim if given (the rest go to the dims before it)."""
    limit = max(1, min(VECTOR_BYTES // itemsize, max_vec))
    vec = 1
    while vec * 2 <= limit and shape[-1] % (vec * 2) == 0:
        vec *= 2
    threads = [1] * len(shape)
    left = block
    for d in reversed(range(len(shape))):
        units = -(-shape[d] // (vec if d == len(shape) - 1 else 1))
        t = min(left, _pow2_floor(units))
        # A dim with few factors of two: one more thread level halves the repetitions but
        # leaves some threads idle in the last one; worth it while the waste stays small.
        if t < left and t < units and _pow2_ceil(units) <= left:
            wasted = _pow2_ceil(units) - units
            if wasted * 8 <= units:
                t = _pow2_ceil(units)
        if d == len(shape) - 1 and last_threads is not None:
            t = min(t, last_threads)
        threads[d] = t
        left //= t
    return Blocked(shape, vec, tuple(threads), block)


def row_blocked(shape: tuple[int, ...], itemsize: int, block: int) -> Blocked:
    """`canonical_blocked` for a tile reduced along its last dim alone: the fewest threads
    along that dim (whole warps, at least one) whose layout holds at most 8/7 the elements a
    thread of the uncapped one (7 rows in 8 row slots, whose in-warp reductions still pay).
    Rows that fill the other warps unevenly would otherwise cost more in repeated, masked rows
    than the cross-warp reduction saves: 5 rows of 1024 f32 on 4 warps in 2 row slots a warp
    hold 64 elements a thread, not 40 (sm_90: 90 registers, not 70; 24.0 SASS an element, not
    17.9); 3 rows in 2 slots of 2 warps, 32 not 24 (22.4, not 18.8)."""
    full = canonical_blocked(shape, itemsize, block)
    best, cap = full, block // 2
    while cap >= WARP_THREADS:
        capped = canonical_blocked(shape, itemsize, block, last_threads=cap)
        if _held(capped) * 7 <= _held(full) * 8:
            best = capped
        cap //= 2
    return best


def _held(b: Blocked) -> int:
    """Elements one thread holds of a value spanning every dim of `b`."""
    return prod(b.held(d) for d in range(b.rank))


def block_size(chunks: int, vec: int) -> int:
    """Threads per block for a tile of `chunks` vector chunks of `vec` elements."""
    p = _pow2_factor(chunks)
    if p >= MIN_THREADS and (p >= 128 or chunks // p <= 8):
        return min(p, MAX_THREADS)
    # Few factors of two: aim at a few chunks, and at most ELEMS_PER_THREAD elements, per
    # thread (16-bit tiles have 8-element chunks: registers, not chunks, are the limit).
    want = max(-(-chunks // CHUNKS_PER_THREAD), -(-chunks * vec // ELEMS_PER_THREAD))
    return min(MAX_THREADS, max(MIN_THREADS, _pow2_ceil(want)))


class _DimUnion:
    """Union-find over (value, dim) nodes; a class may hold at most one dim of each value."""

    def __init__(self) -> None:
        self.parent: dict[tuple[int, int], tuple[int, int]] = {}
        self.members: dict[tuple[int, int], set[int]] = {}
        self.size: dict[tuple[int, int], int] = {}

    def node(self, v: o.Value, i: int) -> tuple[int, int]:
        key = (id(v), i)
        if key not in self.parent:
            self.parent[key] = key
            self.members[key] = {id(v)}
            self.size[key] = v.type.shape[i]
        return key

    def find(self, k: tuple[int, int]) -> tuple[int, int]:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: o.Value, i: int, b: o.Value, j: int) -> bool:
        """Merge unless a value would then have two dims in one class (x + x.T)."""
        ra, rb = self.find(self.node(a, i)), self.find(self.node(b, j))
        if ra == rb:
            return True
        if self.size[ra] != self.size[rb] or self.members[ra] & self.members[rb]:
            return False
        self.parent[rb] = ra
        self.members[ra] |= self.members.pop(rb)
        return True


def _relate(op: o.Op, u: _DimUnion) -> None:
    """Unify the dims `op` relates (same-position dims of element-wise operands, and so on)."""

    def same(a: o.Value, b: o.Value, pairs: list[tuple[int, int]]) -> None:
        for i, j in pairs:
            if a.type.shape[i] > 1 and b.type.shape[j] > 1 and not u.union(a, i, b, j):
                return  # the emitter converts this operand

    if isinstance(op, o.PermuteOp):
        (x,) = op.operands
        same(op.result, x, list(enumerate(op.axes)))
    elif isinstance(op, o.ReduceOp):
        (x,) = op.operands
        same(op.result, x, [(i, i) for i in range(len(x.type.shape)) if i != op.axis])
    elif isinstance(op, o.ReshapeOp):
        (x,) = op.operands
        big_in = [i for i, s in enumerate(x.type.shape) if s > 1]
        big_out = [i for i, s in enumerate(op.result.type.shape) if s > 1]
        if [x.type.shape[i] for i in big_in] == [op.result.type.shape[i] for i in big_out]:
            same(op.result, x, list(zip(big_out, big_in)))
    elif isinstance(op, (o.ForOp, o.IfOp)):
        groups: list[list[o.Value]]
        if isinstance(op, o.ForOp):
            inits = op.operands[3:]
            yields = op.body.ops[-1].operands
            groups = [
                [a, b, c, d] for a, b, c, d in zip(inits, op.body.args[1:], yields, op.results)
            ]
        else:
            groups = [
                [a, b, c]
                for a, b, c in zip(op.then.ops[-1].operands, op.orelse.ops[-1].operands, op.results)
            ]
        for g in groups:
            rank = len(g[0].type.shape)
            for v in g[1:]:
                same(g[0], v, [(i, i) for i in range(rank)])
    elif isinstance(op, (o.ScatterOp, o.AtomicOp)):
        # The coordinates in the value's layout: the store converts none of them (a row-reduced
        # value's layout is not its coordinates' canonical one).
        *coords, value = op.operands
        for c in coords:
            if len(c.type.shape) == len(value.type.shape):
                same(value, c, [(i, i) for i in range(len(value.type.shape))])
    elif isinstance(op, o.MmaOp):
        # Only the accumulator shares the result's layout; a and b go through shared memory.
        acc = op.operands[2]
        same(op.result, acc, [(0, 0), (1, 1)])
    elif isinstance(op, (o.LoadOp, o.StoreOp, o.IotaOp, o.YieldOp)):
        return
    elif op.results:
        res = op.result
        for x in op.operands:
            if len(x.type.shape) == len(res.type.shape) and x.type.shape:
                same(res, x, [(i, i) for i in range(len(res.type.shape))])


#: Element-wise ops that cost tens of instructions an element (precise transcendentals).
COSTLY_UNARY = frozenset({"exp", "exp2", "log", "log2", "tanh", "sigmoid", "sin", "cos", "erf"})
COSTLY_BINARY = frozenset({"pow"})
#: A costly value broadcast to at least this many times its elements is computed apart.
SPLIT_BROADCAST = 4


def _costly_broadcasts(ops: list[o.Op]) -> set[int]:
    """The broadcasts (by id) whose operand is made by a costly element-wise op on values no
    larger than itself (through element-wise ops and reshapes), and repeated at least
    SPLIT_BROADCAST times. Planned in the result's family, such an operand is computed again
    by every thread along the broadcast dims (rope's cos and sin of each angle, once per 4
    columns a thread holds); planned apart, each of its elements is computed about once,
    spread over the block, and the broadcast converts it through shared memory (as Triton
    does)."""
    producer = {id(r): op for op in ops for r in op.results}
    costly: dict[int, bool] = {}

    def made_costly(v: o.Value, limit: int) -> bool:
        op = producer.get(id(v))
        if op is None or not v.type.shape or v.type.size > limit:
            return False
        if id(v) not in costly:
            costly[id(v)] = False  # (cycles: loop-carried values)
            here = (isinstance(op, o.UnaryOp) and op.kind in COSTLY_UNARY) or (
                isinstance(op, o.BinaryOp) and op.kind in COSTLY_BINARY
            )
            through = isinstance(
                op,
                (o.UnaryOp, o.BinaryOp, o.CompareOp, o.SelectOp, o.FmaOp, o.CastOp, o.ReshapeOp),
            )
            costly[id(v)] = through and (here or any(made_costly(x, limit) for x in op.operands))
        return costly[id(v)]

    out: set[int] = set()
    for op in ops:
        if isinstance(op, o.BroadcastOp):
            (x,) = op.operands
            n = x.type.size if x.type.shape else 1
            if op.result.type.size >= SPLIT_BROADCAST * n and made_costly(x, n):
                out.add(id(op))
    return out


def plan_layouts(kernel: o.Kernel, target: Target, max_threads: int | None = None) -> LayoutPlan:
    """Assign each tile value a layout; dims that ops relate share base dims. The block is
    the kernel's `num_warps` warps, else at most `MAX_THREADS` threads (a choice well inside
    every target's limit); and at most `max_threads` if given (a power of two: mma fragment
    families ask for fewer)."""
    assert target.max_threads_per_block >= MAX_THREADS
    if kernel.num_warps is not None and kernel.num_warps * 32 > target.max_threads_per_block:
        raise ValueError(
            f"kernel {kernel.name}: num_warps={kernel.num_warps} is more than the "
            f"{target.max_threads_per_block} threads per block of {target.name}"
        )
    ops = list(walk(kernel.body))
    u = _DimUnion()
    values: list[o.Value] = []
    seen: set[int] = set()

    def note(v: o.Value) -> None:
        if v.type.shape and id(v) not in seen:
            seen.add(id(v))
            values.append(v)
            for i, s in enumerate(v.type.shape):
                if s > 1:
                    u.node(v, i)

    for op in ops:
        for v in (*op.operands, *op.results):
            note(v)
        for r in op.regions():
            for v in r.args:
                note(v)
    split = _costly_broadcasts(ops)
    for op in ops:
        if id(op) not in split:
            _relate(op, u)

    # Families: classes linked by appearing together in a value share one base.
    fam_parent: dict[tuple[int, int], tuple[int, int]] = {}

    def ffind(k: tuple[int, int]) -> tuple[int, int]:
        fam_parent.setdefault(k, k)
        while fam_parent[k] != k:
            k = fam_parent[k]
        return k

    def classes(v: o.Value) -> list[tuple[int, int] | None]:
        return [u.find((id(v), i)) if s > 1 else None for i, s in enumerate(v.type.shape)]

    for v in values:
        linked = [c for c in classes(v) if c is not None]
        for c in linked[1:]:
            a, b = ffind(linked[0]), ffind(c)
            if a != b:
                fam_parent[b] = a

    # Memory ops decide each family's dim order and vector width: the largest one wins.
    mem: list[tuple[int, int, o.Value]] = []
    for op in ops:
        if isinstance(op, o.LoadOp):
            mem.append((op.result.type.size, op.result.type.dtype.itemsize(), op.result))
        elif isinstance(op, o.StoreOp):
            v = op.operands[-1]
            mem.append((v.type.size, v.type.dtype.itemsize(), v))
    mem.sort(key=lambda m: -m[0])

    families: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for v in values:
        for cls in classes(v):
            if cls is not None:
                fam = families.setdefault(ffind(cls), [])
                if cls not in fam:
                    fam.append(cls)
    order: dict[tuple[int, int], list[tuple[int, int]]] = {}
    itemsize: dict[tuple[int, int], int] = {}
    for fam_root, members in families.items():
        anchor = next(
            (m for m in mem if any(c is not None and ffind(c) == fam_root for c in classes(m[2]))),
            None,
        )
        if anchor is None:
            order[fam_root] = members
            itemsize[fam_root] = 4
            continue
        lead = [c for c in classes(anchor[2]) if c is not None]
        order[fam_root] = [c for c in members if c not in lead] + lead
        itemsize[fam_root] = anchor[1]

    sizes = {c: u.size[c] for members in families.values() for c in members}
    chunks, vec = 1, 1
    for fam_root, members in order.items():
        widest = canonical_blocked(
            tuple(sizes[c] for c in members), itemsize[fam_root], MAX_THREADS
        )
        if prod(widest.shape) // widest.vec > chunks:
            chunks, vec = prod(widest.shape) // widest.vec, widest.vec
    block = 32 * kernel.num_warps if kernel.num_warps is not None else block_size(chunks, vec)
    if max_threads is not None:
        block = min(block, max_threads)
    # A family reduced along its fastest dim, and along no other, keeps warps off that dim
    # where its other dims can take them at no more work a thread (`row_blocked`): each
    # row's reduction stays in its warp (shuffles only; no shared memory, no barrier), and a
    # warp's accesses still cover 32 consecutive vectors of a row.
    along_rows: set[tuple[int, int]] = set()
    across: set[tuple[int, int]] = set()
    for op in ops:
        if isinstance(op, (o.ReduceOp, o.ScanOp)) and op.operands[0].type.shape[op.axis] > 1:
            cls = u.find((id(op.operands[0]), op.axis))
            fam_root = ffind(cls)
            if order[fam_root][-1] != cls:
                across.add(fam_root)  # a scan too: down the rows, it would cross the warps
            elif isinstance(op, o.ReduceOp):
                along_rows.add(fam_root)
    # The families of the costly broadcast operands planned apart (where nothing else ties
    # them to their broadcast's family).
    apart: set[tuple[int, int]] = set()
    for op in ops:
        if id(op) in split:
            (x,) = op.operands
            mine = {ffind(c) for c in classes(x) if c is not None}
            theirs = {ffind(c) for c in classes(op.result) if c is not None}
            apart |= mine - theirs
    bases: dict[tuple[int, int], Blocked] = {}
    position: dict[tuple[int, int], int] = {}
    for fam_root, members in order.items():
        shape = tuple(sizes[c] for c in members)
        if fam_root in along_rows - across and len(shape) > 1:
            bases[fam_root] = row_blocked(shape, itemsize[fam_root], block)
        elif fam_root in apart:
            # As few elements a thread as the block allows: each is computed about once.
            spread = _pow2_floor(max(1, prod(shape) // block))
            bases[fam_root] = canonical_blocked(shape, itemsize[fam_root], block, spread)
        else:
            bases[fam_root] = canonical_blocked(shape, itemsize[fam_root], block)
        for k, c in enumerate(members):
            position[c] = k

    plan = LayoutPlan(block)
    unit_base = Blocked((1,), 1, (1,), block)
    for v in values:
        vc = classes(v)
        real = [c for c in vc if c is not None]
        if not real:
            plan.layouts[v] = Layout(unit_base, tuple(None for _ in vc))
            continue
        base = bases[ffind(real[0])]
        plan.layouts[v] = Layout(base, tuple(None if c is None else position[c] for c in vc))
    for op in ops:
        if isinstance(op, (o.LoadOp, o.StoreOp)):
            v = op.result if isinstance(op, o.LoadOp) else op.operands[-1]
            lay = plan.layouts[v]
            if v.type.shape[-1] > 1 and lay.dims[-1] != lay.base.rank - 1:
                plan.memory[op] = canonical_layout(v.type, block)
    repeated_broadcasts(kernel.body, plan)
    return plan


def repeated_broadcasts(region: o.Region, plan: LayoutPlan) -> None:
    """Note in `plan.repeats` each broadcast of a tile that an earlier op of the same region
    broadcast to the same shape and layout (`x * c` and `y * c` broadcast `c` twice). Its
    registers are defined there, before it on every path: a region's ops run in order."""
    first: dict[tuple[int, tuple[int, ...], Layout], o.BroadcastOp] = {}
    for op in region.ops:
        if isinstance(op, o.BroadcastOp) and op.operands[0].type.shape:
            res = op.result
            key = (id(op.operands[0]), res.type.shape, plan.layouts[res])
            if key in first:
                plan.repeats[op] = first[key]
            else:
                first[key] = op
        for r in op.regions():
            repeated_broadcasts(r, plan)


def canonical_layout(t: TileType, block: int) -> Layout:
    """A value's own coalesced layout (for memory ops whose planned layout is not)."""
    big = [i for i, s in enumerate(t.shape) if s > 1]
    if not big:
        return Layout(Blocked((1,), 1, (1,), block), tuple(None for _ in t.shape))
    base = canonical_blocked(tuple(t.shape[i] for i in big), t.dtype.itemsize(), block)
    pos = {i: k for k, i in enumerate(big)}
    return Layout(base, tuple(pos.get(i) for i in range(len(t.shape))))
