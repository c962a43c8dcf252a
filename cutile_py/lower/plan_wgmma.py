"""plan_wgmma: which mmas of a pipelined loop lower to Hopper's `wgmma.mma_async` (a
warpgroup of 4 warps per 64-row slice, both operands read from the cp.async stage ring
through matrix descriptors), and the shared layout their operand tiles then take.

wgmma's accumulator fragment for m64nN (PTX ISA, "wgmma register fragment layout"; see
`cutile_py.sim.wgmma`): warp w of a warpgroup holds rows 16w .. 16w + 15, and in register
4i + r the element (16w + g + 8(r // 2), 8i + 2t + r % 2), g = lane / 4, t = lane % 4. That
is the m16n8 fragment of `mma.sync` for every 8-column slot i: the accumulator keeps the
fragment layout of `assign_fragments` with one warp per 16-row band (a `WarpGrid` of
warps x 1), and warp W's M slot s is rows 64 (W / 4 + (warps / 4) s) + 16 (W % 4), the
m64 block W / 4 + (warps / 4) s of its warpgroup. So element-wise epilogues, row
reductions and stores work on it unchanged.

Operand tiles stay as the cp.async pipeline stages them: a tile whose rows run along M or N
(A loaded (M, K), B loaded (N, K) and transposed) is read "K-major", one whose rows run along
K (B loaded (K, N), A loaded (K, M) and transposed) "MN-major" (imm-trans 1; 16-bit types
only: tf32 takes both operands K-major). The existing swizzle (16-byte chunk c of row r at
c ^ (r / R) % S) is wgmma's 128-, 64- or 32-byte swizzle when a row is that many bytes and
the tile starts on a 1024-byte boundary; wider tiles are cut into panels of 128 bytes per
row (`SharedTile.panel`), each a tile of rows x 128 bytes of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from cutile_py.ir import ops as o
from cutile_py.ir.dtypes import DType, bf16, f16, f32
from cutile_py.ir.uses import DefUse
from cutile_py.lower.fragments import SharedTile, WarpGrid
from cutile_py.ptx.target import Target

GROUP_WARPS = 4
#: Rows of A (and of the accumulator) one wgmma covers.
M_BLOCK = 64
#: Bytes of K one wgmma takes (k16 of f16/bf16, k8 of tf32), and the most N it takes.
K_BYTES = 32
MAX_N = 256
#: Swizzled wgmma tiles start on this boundary (the 128-byte swizzle's period: 8 rows).
ALIGN = 1024
#: Row bytes -> the descriptor's swizzle field (bits 62-63).
SWIZZLE_CODE = {128: 1, 64: 2, 32: 3}


def k_step(dt: type[DType]) -> int:
    """K of one wgmma: 16 for f16 and bf16, 8 for f32 operands (tf32)."""
    return K_BYTES // dt.itemsize()


def ptx_type(dt: type[DType]) -> str:
    return "tf32" if dt is f32 else dt.name


def shapes_fit(mma: o.MmaOp, target: Target) -> bool:
    """Whether `mma`'s types and shapes are ones wgmma takes on `target` (before the block
    size and the operand tiles are known): f16/bf16 (or f32, as tf32) operands into f32, M a
    multiple of 64, N of 8, K of one instruction's K."""
    a, b, acc = mma.operands
    (m, k), n = a.type.shape, b.type.shape[1]
    dt = a.type.dtype
    return (
        target.wgmma
        and dt in (f16, bf16, f32)
        and b.type.dtype is dt
        and acc.type.dtype is f32
        and m % M_BLOCK == 0
        and n % 8 == 0
        and k % k_step(dt) == 0
    )


def _tile_fits(tile: SharedTile) -> bool:
    """A tile whose rows are a swizzle span, or panels of 128 bytes."""
    if tile.xor_step != 1 or not tile.swizzled or tile.pad:
        return False
    row = tile.cols * tile.eb
    return row in SWIZZLE_CODE or row % 128 == 0


def choose(
    target: Target,
    threads: int,
    mmas: Sequence[o.MmaOp],
    staged: dict[o.Value, tuple[SharedTile, bool]],
    grids: Mapping[o.MmaOp, WarpGrid],
) -> tuple[o.MmaOp, ...]:
    """The mmas of a loop body that lower to wgmma: shapes that fit, results in fragments
    of one warp per row band (`grids`: the warp split of each mma whose family
    `assign_fragments` placed so), whole warpgroups that split M evenly, and both operands
    staged by the loop's cp.async pipeline in tiles that fit."""
    warps = threads // 32
    out = []
    for mma in mmas:
        grid = grids.get(mma)
        if not shapes_fit(mma, target) or grid is None:
            continue
        if warps % GROUP_WARPS or grid.wm != warps or grid.wn != 1 or grid.fm % warps:
            continue
        a, b, _ = mma.operands
        ops = [staged.get(a), staged.get(b)]
        if not all(x is not None and _tile_fits(x[0]) for x in ops):
            continue
        # tf32 has no transposed forms: both operands K-major (B loaded (N, K), transposed).
        if a.type.dtype is f32 and any(x is not None and x[1] for x in ops):
            continue
        out.append(mma)
    return tuple(out)


def in_flight(
    loop: o.ForOp,
    mmas: Sequence[o.MmaOp],
    wgmma: Sequence[o.MmaOp],
    carried: Sequence[tuple[int, o.MmaOp]],
    uses: DefUse,
    tma_only: bool,
    stages: int,
) -> int:
    """How many wgmma commit groups a loop leaves in flight per iteration: 1 where every
    mma of the body is a wgmma accumulating in place into a carried value no other op reads
    (the in-flight accumulators are touched by nothing but the next wgmma), the stages are
    all filled by TMA (the refill of the stage a running wgmma reads waits for it to retire
    behind one barrier, `emit_tma`) and there are at least 2 of them; else 0."""
    if not wgmma or len(wgmma) != len(mmas) or not tma_only or stages < 2:
        return 0
    owned = dict((m, k) for k, m in carried)
    for mma in wgmma:
        k = owned.get(mma)
        if k is None:
            return 0
        arg = loop.body.args[k + 1]
        if mma.operands[2] is not arg or len(uses.users(arg)) != 1:
            return 0
        if len(uses.users(mma.result)) != 1:  # the yield alone
            return 0
    return 1


def operand_tile(tile: SharedTile) -> SharedTile:
    """`tile` as a wgmma operand: cut into 128-byte panels where its rows are longer."""
    if tile.cols * tile.eb <= 128:
        return tile
    return replace(tile, panel=128 // tile.eb)


@dataclass(frozen=True)
class Descriptor:
    """The constant fields of an operand tile's matrix descriptors and how its start address
    moves (in bytes from the tile's start, before the swizzle): `mn_step` per block of
    M_BLOCK rows of A or MAX_N columns of B; `k_offset` to a given K. `mn_major`: the
    tile's rows run along K (imm-trans 1), else along M or N ("K-major")."""

    lbo: int
    sbo: int
    swizzle: int
    mn_step: int
    mn_major: bool

    @property
    def high(self) -> int:
        """The descriptor's bits other than the start address."""
        return ((self.lbo >> 4) << 16) | ((self.sbo >> 4) << 32) | (self.swizzle << 62)


def descriptor(tile: SharedTile, k_rows: bool, block: int) -> Descriptor:
    """The descriptors of an operand tile made by `operand_tile`, `block` rows of M (A) or
    columns of N (B) per instruction. With S the row bytes (a swizzle span) and e the element
    size, element (mn, k) of a panel lies at (PTX ISA, "matrix descriptor" canonical layouts):
    K-major  (mn % 8) S + (mn / 8) SBO + k e                          (SBO = 8 S)
    MN-major (mn % (S/e)) e + (mn / (S/e)) LBO + (k % 8) S + (k / 8) SBO  (LBO: panel bytes)."""
    span = tile.row_bytes
    panel_bytes = tile.rows * span
    code = SWIZZLE_CODE[span]
    if k_rows:
        per_panel = span // tile.eb
        step = block // per_panel * panel_bytes if block >= per_panel else block * tile.eb
        return Descriptor(panel_bytes, 8 * span, code, step, True)
    assert span >= K_BYTES
    return Descriptor(0, 8 * span, code, block * span, False)


def k_offset(tile: SharedTile, d: Descriptor, k0: int) -> int:
    """Bytes from the tile's start to K = `k0`: a row of an MN-major tile; in a K-major one,
    a column of the panel holding it."""
    if d.mn_major:
        return k0 * tile.row_bytes
    per_panel = tile.row_bytes // tile.eb
    return (k0 // per_panel) * tile.rows * tile.row_bytes + (k0 % per_panel) * tile.eb


def describe(
    mma: o.MmaOp, tiles: tuple[tuple[SharedTile, bool], tuple[SharedTile, bool]], threads: int
) -> str:
    """One line of the plan: the instruction, warpgroups and the operand layouts."""
    a, b, _ = mma.operands
    (m, k), n = a.type.shape, b.type.shape[1]
    groups = threads // 32 // GROUP_WARPS
    blocks = m // M_BLOCK // groups
    dt = ptx_type(a.type.dtype)
    ks = k_step(a.type.dtype)
    parts = []
    for which, (t, k_rows) in enumerate(tiles):
        major = "MN-major" if k_rows else "K-major"
        panels = f", {t.panels} panels" if t.panels > 1 else ""
        parts.append(f"{'AB'[which]} {major} swizzle {t.row_bytes}B{panels}")
    widths = sorted({min(MAX_N, n - c) for c in range(0, n, MAX_N)})
    shape = "/".join(f"m64n{w}k{ks}" for w in widths)
    return (
        f"wgmma.mma_async {shape}.f32.{dt}: {groups} warpgroup(s) x {blocks} m64 block(s), "
        f"{k // ks} k-step(s), {'; '.join(parts)}"
    )
