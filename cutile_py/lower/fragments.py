"""mma fragment layouts and swizzled shared tiles, as data: how warps split an accumulator
into m16n8 fragments, which slots each warp holds, and where a tile's chunks live in shared
memory. `emit_mma` and `emit_pipeline` emit the instructions that use them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cutile_py.ptx.builder import Reg
from cutile_py.ptx.target import MAX_STATIC_SHARED

#: Shared memory used without asking for more: accumulator bands stay within it, and
#: pipelines choose their default stage count by it.
SHARED_LIMIT = MAX_STATIC_SHARED
CHUNK = 16  # bytes: one ldmatrix row, one vectorized shared access, the swizzle unit


def log2(n: int) -> int:
    assert n > 0 and n & (n - 1) == 0, n
    return n.bit_length() - 1


@dataclass(frozen=True)
class SharedTile:
    """A rows x cols tile at byte `offset` of `smem`, row-major.

    Swizzled tiles store 16-byte chunk c of row r at chunk `c ^ f(r)`, f(r) = (r // R) % S,
    S the largest power of two (at most 8) dividing the chunks per row and R = 8 / S: any 8
    consecutive rows then cover all 32 banks at a fixed chunk, so ldmatrix (8 row addresses
    per matrix) and row-wise stores are conflict-free, and c ^ f(r) stays inside the row.
    With `xor_step` 2, f(r) = 2 (r // R) % S: then 4 consecutive rows at 2 adjacent chunks
    cover all 32 banks, as the word-wise tf32 fragment reads of a K-row tile need.
    Unswizzled tiles (the f32 accumulator stage) pad rows by `pad` elements instead.
    With `panel` (columns per panel, 0: none) the tile is cols / panel tiles of rows x panel
    one after the other, each swizzled on its own: wgmma's 128-byte swizzle takes rows of at
    most 128 bytes (`plan_wgmma`).
    """

    offset: int
    rows: int
    cols: int
    eb: int  # bytes per element
    swizzled: bool
    pad: int = 0
    xor_step: int = 1
    panel: int = 0

    @property
    def row_bytes(self) -> int:
        """Bytes from one row to the next (within a panel)."""
        return (self.panel or self.cols + self.pad) * self.eb

    @property
    def nbytes(self) -> int:
        return self.rows * (self.cols + self.pad) * self.eb

    @property
    def panels(self) -> int:
        return self.cols // self.panel if self.panel else 1

    @property
    def xor_width(self) -> int:
        """S: chunk indices are XORed with values below this."""
        chunks = self.row_bytes // CHUNK
        return min(chunks & -chunks, 8) if self.swizzled else 1

    @property
    def rows_per_step(self) -> int:
        """R: rows that share one XOR value."""
        return 8 // self.xor_width


@dataclass(frozen=True)
class WarpGrid:
    """Warps as a wm x wn grid over the (M/16) x (N/8) fragments, round-robin: warp (y, x)
    owns fragment rows y, y + wm, ... (sm slots) and columns x, x + wn, ... (sn slots)."""

    wm: int
    wn: int
    fm: int
    fn: int

    @property
    def sm(self) -> int:
        return -(-self.fm // self.wm)

    @property
    def sn(self) -> int:
        return -(-self.fn // self.wn)


def warp_grid(warps: int, fm: int, fn: int) -> WarpGrid:
    """The split with the fewest fragments per warp, then the fewest fragment loads."""
    options = [WarpGrid(1 << i, warps >> i, fm, fn) for i in range(log2(warps) + 1)]
    return min(options, key=lambda g: (g.sm * g.sn, 2 * g.sm + g.sn, g.wm))


@dataclass
class Slot:
    """Fragment index `reg + static` along M or N for one slot of this warp; `valid` is
    warp-uniform and None where the slot always holds a real fragment. `nominal` is the
    slot's first fragment index over all warps (slot s: s * warps), clamped or not."""

    reg: Reg
    static: int
    valid: Reg | None
    nominal: int


@dataclass
class Lane:
    lane: Reg
    g: Reg  # lane / 4: the row of a C fragment
    t: Reg  # lane % 4
    wm: Reg
    wn: Reg


@dataclass(frozen=True)
class Operand:
    """An mma operand in shared memory: `tile` at `base` + its offset, its rows along M (A)
    or N (B), read with plain `ldmatrix`, or along K if `k_rows`, read with `ldmatrix.trans`
    (16-bit) or word by word (tf32, from a tile of `xor_step` 2)."""

    tile: SharedTile
    base: Reg
    k_rows: bool
    #: f32 values not yet rounded to tf32 (copied from memory as they are): their
    #: fragments are rounded once read.
    unrounded: bool = False


@dataclass(frozen=True)
class Setup:
    """The per-thread fragment addressing of one mma op, computed once (before a loop that
    carries the accumulator, so that the epilogue after it can use it too)."""

    grid: WarpGrid
    lane: Lane
    slots_m: list[Slot]
    slots_n: list[Slot]

    @property
    def count(self) -> int:
        """Registers of the accumulator in fragment form: 4 per (M slot, N slot)."""
        return 4 * len(self.slots_m) * len(self.slots_n)


#: Reads one k step of an operand's fragments: per slot, its registers in mma order.
Reader = Callable[[int], list[list[Reg]]]
#: The addressing of an operand tile, computed once, as a reader of the copy at byte offset
#: `stage` past it (a pipeline stage; None: the tile itself): one add per address register.
Bindable = Callable[[Reg | None], Reader]


@dataclass(frozen=True)
class Ahead:
    """Register double buffering of an mma in a pipelined loop (`PipelinePlan.ahead`): the
    fragments of the first k step (A's, then B's) are `held`, loaded by the previous
    iteration; `turn` waits for the next stage and refills the one just read (the top of
    the next iteration: its barrier) and returns the next stage's byte offset, which
    `readers` (A, B) bind to load its first k step before this iteration's last mma."""

    held: tuple[list[list[Reg]], list[list[Reg]]]
    turn: Callable[[], Reg]
    readers: tuple[Bindable, Bindable]


def round_region(nbytes: int) -> int:
    """Regions start on 128-byte boundaries (a full bank sweep)."""
    return -(-nbytes // 128) * 128
