"""The layout change of a 2-D tile between a layout that walks one of its dims and one that
walks the other (a transpose), through a shared tile with staggered row groups.

The tile is stored row-major in the source's order, each thread's vector of consecutive
elements as one wide `st.shared` (16-bit pairs packed into words, not stored one by one).
The destination reads element by element across the rows; its lanes sit `g` rows apart (`g`
its vector width), so on a plain row-major tile they would all hit one bank. One source
vector's worth of bytes is left free after every `g` rows, which moves each lane's row to
the next banks. Rows stay 16-byte aligned for the source's vectors, and, unlike an XOR
swizzle, the address stays a sum of a per-thread part and a static part (along every dim a
thread's coordinate and a register's static offset occupy disjoint bits), so each side needs
one base register and an immediate per access.
"""

from __future__ import annotations

from cutile_py.ir.types import TileType
from cutile_py.lower.context import EmitContext
from cutile_py.lower.isel import MOV
from cutile_py.lower.layout import Layout
from cutile_py.lower.size_scratch import transpose_bytes, transpose_tile, transposed
from cutile_py.ptx.builder import Reg, Vec, f32_imm


def applies(em: EmitContext, src: Layout, dst: Layout, src_t: TileType, dst_t: TileType) -> bool:
    """Whether `convert` takes this path: the plan's own test (`size_scratch.transposed`),
    so that the buffer it sized is the one addressed; planned buffers start on 16-byte
    boundaries, which the source's widest vector store needs."""
    return transposed(src, dst, src_t, dst_t)


class _Staggered:
    """The shared tile's addressing: its rows run along value dim `row` and its columns along
    value dim `col`, row-major, with one `pad`-byte gap after every `group` rows."""

    def __init__(self, em: EmitContext, src: Layout, dst: Layout, src_t: TileType) -> None:
        row, self.row_bytes, self.pad, self.shift = transpose_tile(src, dst, src_t)
        self.em, self.eb = em, src_t.dtype.itemsize()
        self.row, self.col = row, 1 - row
        self.smem = em.shared_scratch(transpose_bytes(src, dst, src_t))
        self._bases: dict[Layout, Reg] = {}

    def _offset(self, r: int, c: int) -> int:
        return r * self.row_bytes + (r >> self.shift) * self.pad + c * self.eb

    def address(self, lay: Layout, offs: dict[int, int]) -> str:
        """The `[reg+imm]` address of the element at static offsets `offs` of layout `lay`:
        the register holds this thread's part, the immediate the static part."""
        d_row, d_col = lay.dims[self.row], lay.dims[self.col]
        assert d_row is not None and d_col is not None
        if lay not in self._bases:
            fb = self.em.fb
            coord = self.em.bases[lay.base].coord
            r, c = coord[d_row], coord[d_col]
            base, gap = fb.reg("b32"), fb.reg("b32")
            fb.ins("mad.lo.u32", base, r, self.row_bytes, self.smem)
            fb.ins("shr.u32", gap, r, self.shift)
            fb.ins("mad.lo.u32", base, gap, self.pad, base)
            fb.ins("mad.lo.u32", base, c, self.eb, base)
            self._bases[lay] = base
        imm = self._offset(offs[d_row], offs[d_col])
        return f"[{self._bases[lay]}+{imm}]" if imm else f"[{self._bases[lay]}]"


def convert_transposed(
    em: EmitContext, regs: list[Reg], src: Layout, dst: Layout, src_t: TileType
) -> list[Reg]:
    """Move the tile from `src` to `dst` (where `applies`) through a staggered shared tile."""
    fb = em.fb
    dt = src_t.dtype
    eb = dt.itemsize()
    vec = src.base.vec
    tile = _Staggered(em, src, dst, src_t)
    owner = em.owner(src)
    # The source's registers run along its last base dim fastest, `vec` per vector.
    placed = src.registers()
    for k in range(0, len(regs), vec):
        offs = placed[k]
        pred = em.conj(em.valid(src, offs), owner)
        words = regs[k : k + vec]
        if eb == 2:  # 16-bit pairs packed into words
            packed = []
            for lo, hi in zip(words[::2], words[1::2]):
                w = fb.reg("b32")
                fb.ins("mov.b32", w, Vec((lo, hi)))
                packed.append(w)
            words, bits = packed, 32
        else:
            bits = 8 * eb
        where = tile.address(src, offs)
        if len(words) == 1:
            fb.ins(f"st.shared.b{bits}", where, words[0], pred=pred)
        else:
            fb.ins(f"st.shared.v{len(words)}.b{bits}", where, Vec(tuple(words)), pred=pred)
    em.barrier()
    out = []
    for offs in dst.registers():
        pred = em.valid(dst, offs)
        x = em.new(dt)
        if pred is not None:
            fb.ins(f"mov.{MOV[x.ptype]}", x, 0 if x.ptype != "f32" else f32_imm(0.0))
        fb.ins(f"ld.shared.b{8 * eb}", x, tile.address(dst, offs), pred=pred)
        out.append(x)
    em.barrier()
    return out
