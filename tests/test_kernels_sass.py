"""The issue-19 budget of the memory-bound library kernels, as a ratchet: sm_90 SASS
instructions per element (`paper_repro.kernels_sass`, counted through ptxas line info and the
simulator) at most these, and global bytes at most 1.05x the ideal. Triton 3.9's counts for
the same kernels, from paper_repro/results/kernels-sass-sm90.md, are in the comments; the
bounds are ours at the time of writing plus a little, so a change that costs instructions
shows here."""

from __future__ import annotations

import pytest

from cutile_py.runtime.nvjitlink import nvjitlink_available
from cutile_py.runtime.sass import find_tool
from paper_repro import kernels_sass

pytestmark = pytest.mark.skipif(
    find_tool("nvdisasm") is None or not nvjitlink_available(),
    reason="nvdisasm or nvJitLink is not installed",
)

#: Case name -> the most SASS instructions per element allowed (Triton's in the comment).
#: Every bf16 row: a loaded bf16 widens from its b32 pair with one shift or mask
#: (`EmitContext.widen`), where unpacking the half and converting it took two (rms_norm 4096
#: 11.4 -> 10.4, layer_norm 4096 16.4 -> 14.9, gemv 4.4 -> 3.7).
BUDGET = {
    # Loads whose padding no store can see write none (plan_padding): add 5.25 -> 4.19.
    "add f32": 4.5,  # 5.1
    "saxpy f32": 4.5,  # 5.2
    "silu_mul f32": 17.75,  # 17.2
    "silu_mul bf16": 19.5,  # 18.6
    # 4 KiB of input a block, not 16 (an H200: 0.99 of the copy ceiling, not 0.96): the
    # set-up spread over fewer elements, 19.4 -> 23.8 (f32) and 20.2 -> 22.5 (bf16).
    "gelu f32": 24.5,  # 22.2
    "gelu bf16": 22.5,  # 22.6
    "softmax f32 4096x1024": 17.0,  # 22.0
    "softmax bf16 4096x1024": 17.5,  # 23.1
    # Every chunk's address computed, so that its load issues with the others (was 23.2);
    # the chunk a row ends in read element by element, its visible part only (as Triton's
    # masked loads): 1.04x -> 1.00x the ideal bytes, 23.9 -> 26.7 (f32), 20.2 -> 22.4 (bf16).
    # Chunks no row of the block sees neither converted, compared, exponentiated nor summed
    # (a branch per chunk; zeros stored): 26.7 -> 25.7 (f32), 22.4 -> 18.8 (bf16), registers
    # unchanged. (Converting a chunk again for its exp, not carrying it: f32 23.6, but bf16
    # 102 registers, not 96: 16 warps an SM, not 20.)
    "causal softmax f32 16x1024x1024": 26.5,  # 26.6
    "causal softmax bf16 16x1024x1024": 18.7,  # 28.0
    "rms_norm f32 4096x4096": 10.5,  # 10.6
    # 16 elements a thread, not 32 (4 warps: 36 warps an SM, not 20; _common.per_thread);
    # two warps a row, not four (lower.layout: rows reduced in their warps), 11.3 -> 9.9.
    "rms_norm f32 4096x1536": 10.5,  # 20.0
    "layer_norm f32 4096x4096": 14.0,  # 15.8
    "add_rms_norm bf16 4096x4096": 14.2,  # 15.1 (15.3 -> 14.2)
    "transpose f32 4096x4096": 8.5,  # 8.1
    "embedding f32 4096x4096": 3.9,  # 3.4
    "embedding bf16 4096x4096": 2.5,  # 2.6
    # A warp a row (4 rows, 4 warps): shuffles only, 14.5 -> 7.9 (f32), 15.4 -> 8.6 (bf16).
    "argmax f32 4096x1024": 8.5,  # 15.8
    # Its loop's loads split from the tensor's edge (lower.emit_memory): 8.8 -> 7.9 (f32),
    # 9.6 -> 9.2 (bf16).
    "argmax f32 4096x32768": 8.2,  # 8.9
    "argmax bf16 4096x1024": 8.5,  # 15.4
    "argmax bf16 4096x32768": 9.0,  # 9.2
    # Its closing barrier dropped (ptx.barriers), ptxas schedules it in 36 registers, not 56,
    # at 4.59 instructions an element, not 4.4.
    "transpose bf16 4096x4096": 4.6,  # 4.1
    "add_rms_norm bf16 4096x2048": 13.8,  # 20.5 (18.4 -> 13.7: two warps a row, not eight)
    "layer_norm bf16 4096x4096": 15.4,  # 19.1 (17.7 -> 16.4)
    "layer_norm bf16 4096x2048": 15.1,  # 25.2 (21.6 -> 16.1)
    # 2 warps, 64 elements a thread: each angle's cos and sin computed once a block (a costly
    # broadcast planned apart: lower.layout) and converted once, not once per 4 columns a
    # thread holds on 8 warps: 37.8 -> 9.7 (f32), 63.9 -> 9.4 (bf16). Triton's kernel of the
    # same algorithm and tiling.
    "rope f32 4096x32x128": 10.3,  # 9.0
    "rope bf16 4096x32x128": 9.8,  # 10.5
    # 2 warps, (8, 512) steps, fused multiply-adds; loads in the loop split from the edge
    # (lower.emit_memory): 8.5 -> 2.7 (f32), 11.2 -> 4.4 (bf16). Triton's of the same tiling.
    "gemv f32 4096x4096": 2.9,  # 2.6
    "gemv bf16 4096x4096": 3.9,  # 3.9
}


@pytest.mark.parametrize("name", sorted(BUDGET))
def test_within_budget(name: str) -> None:
    (case,) = [c for c in kernels_sass.cases() if c.name == name]
    row = kernels_sass.ours(case)
    assert row.instr is not None and row.instr <= BUDGET[name], row
    assert row.bytes_ratio is not None and row.bytes_ratio <= 1.05, row
    assert row.spills == 0, row


def test_table_marks_rows_over_budget() -> None:
    """The script's table says which rows break issue 19's budget, and why."""
    row = kernels_sass.Row
    ok = row("a", 10.0, 32, 0, 1.0, 8.0, triton=9.0)
    slow = row("b", 11.6, 32, 0, 1.0, 8.0, triton=10.0)
    heavy = row("c", 10.0, 32, 0, 1.06, 8.0, triton=None)
    unknown = row("d", None, None, None, None, None, triton=5.0)
    assert kernels_sass.over_budget(ok) == []
    assert kernels_sass.over_budget(slow) == ["instructions"]
    assert kernels_sass.over_budget(heavy) == ["bytes"]
    assert kernels_sass.over_budget(unknown) == ["unmeasured"]
    lines = kernels_sass.table([ok, slow, heavy, unknown])
    assert lines[0].endswith("| budget |")
    assert [line.rsplit("|", 2)[1].strip() for line in lines[2:]] == [
        "ok", "OVER: instructions", "OVER: bytes", "OVER: unmeasured"
    ]  # fmt: skip


LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   ISETP.GE.AND P0, PT, R0, R2, PT ;
        /*0020*/                   FFMA R3, R4, R5, R3 ;
        /*0030*/                   NOP ;
        /*0040*/                   IADD3 R0, R0, 0x1, RZ ;
        /*0050*/              @!P0 BRA 0x20 ;
        /*0060*/               @P1 BRA 0x80 ;
        /*0070*/                   STG.E desc[UR4][R6.64], R3 ;
        /*0080*/                   EXIT ;
        /*0090*/                   BRA 0x90;
"""


def test_loop_instructions_counts_the_body_of_the_backward_branch() -> None:
    """Triton's gemv loops: its body (the FFMA up to the backward branch, the NOP left out)
    runs once per trip; a forward branch is no loop."""
    assert kernels_sass.loop_instructions(LISTING) == 3
    with pytest.raises(RuntimeError, match="one loop"):
        kernels_sass.loop_instructions(LISTING.replace("BRA 0x20", "BRA 0x60"))
