"""`ptx.barriers.drop_idle_barriers`: a `bar.sync 0` goes only where no pair of accesses it
orders can conflict; kernels whose barriers were dropped still match NumPy on sim, whose race
checker reports any shared-memory access two threads make with no barrier between."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.ptx.barriers import drop_idle_barriers

BAR = "\tbar.sync 0;"
SHARED_WRITE = "\tst.shared.b32 [%r1], %f1;"
SHARED_READ = "\tld.shared.b32 %f2, [%r1+4];"
GLOBAL_WRITE = "\tst.global.v4.f32 [%rd1], {%f1, %f2, %f3, %f4};"
GLOBAL_READ = "\tld.global.v4.f32 {%f1, %f2, %f3, %f4}, [%rd2];"
INPUT_READ = "\t@%p1 ld.global.nc.v4.f32 {%f1, %f2, %f3, %f4}, [%rd2];"
MATH = "\tadd.rn.f32 %f3, %f1, %f2;"
RET = "\tret;"


def bars(body: list[str]) -> list[int]:
    """The positions of the full-block barriers left in `body`."""
    return [i for i, line in enumerate(drop_idle_barriers(body)) if line == BAR]


def test_a_reduction_s_closing_barrier_goes_where_no_shared_access_follows() -> None:
    # A cross-warp reduction: partials stored, barrier, read back, barrier; then the row is
    # scaled and stored. The first barrier orders the shared store before the reads: stays.
    body = [INPUT_READ, MATH, SHARED_WRITE, BAR, SHARED_READ, MATH, BAR, INPUT_READ, MATH,
            GLOBAL_WRITE, RET]  # fmt: skip
    assert drop_idle_barriers(body) == body[:6] + body[7:]


@pytest.mark.parametrize(
    ("after", "kept"),
    [
        ([SHARED_WRITE], True),  # the next op's scratch: its store must wait for the reads
        ([SHARED_READ], False),  # reads after reads: no conflict
        (["\tatom.shared.add.u32 %r2, [%r1], 1;"], True),
        (["$__L_1:"], True),  # a label: code reached from elsewhere
        (["\tbra $__L_1;"], True),
        (["\tcp.async.ca.shared.global [%r1], [%rd1], 16;"], True),  # not known: stays
        (["\tld.b32 %r2, [%rd1];"], True),  # generic addressing may reach shared memory
        (["\tmbarrier.init.shared.b64 [%r1], 1;"], True),
        (["\tldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];"], True),
        ([GLOBAL_WRITE], False),  # the half before the barrier touches shared memory only
        (["\tld.param.u64 %rd1, [p0];", "\tld.local.u32 %r3, [%rd4];"], False),
        (["\tshfl.sync.bfly.b32 %f4, %f3, 1, 31, -1;"], False),
    ],
)
def test_what_follows_a_barrier_decides_it(after: list[str], kept: bool) -> None:
    body = [SHARED_WRITE, BAR, SHARED_READ, BAR, *after, RET]
    assert bars(body) == ([1, 3] if kept else [1])


@pytest.mark.parametrize(
    ("before", "after", "kept"),
    [
        ([GLOBAL_WRITE], [GLOBAL_READ], True),  # another thread's element, written then read
        ([GLOBAL_READ], [GLOBAL_WRITE], True),  # read, then overwritten by another thread
        ([GLOBAL_WRITE], [INPUT_READ], False),  # `.nc`: read-only for the kernel's lifetime
        ([GLOBAL_READ], [GLOBAL_READ], False),
        (["\tred.global.add.f32 [%rd1], %f1;"], [GLOBAL_READ], True),
        (["\tld.volatile.global.u32 %r1, [%rd1];"], [], True),  # ordering forms: not known
        ([SHARED_READ], [GLOBAL_WRITE], False),
    ],
)
def test_a_barrier_stays_between_conflicting_accesses(
    before: list[str], after: list[str], kept: bool
) -> None:
    body = [*before, BAR, *after, RET]
    assert bars(body) == ([len(before)] if kept else [])


def test_barriers_dropped_merge_what_they_separated() -> None:
    # The first barrier orders nothing (nothing before it); with it gone, the second one's
    # half before it holds the shared store, which the read after it needs ordered.
    body = [INPUT_READ, BAR, SHARED_WRITE, BAR, SHARED_READ, RET]
    assert drop_idle_barriers(body) == [INPUT_READ, SHARED_WRITE, BAR, SHARED_READ, RET]


def test_barriers_stay_around_code_the_pass_cannot_see_through() -> None:
    named = "\tbar.sync 1, 128;"  # a warp-specialized kernel's consumers: not the whole block
    guarded = "\t@%p1 bar.sync 0;"
    body = [named, BAR, MATH, RET]
    assert drop_idle_barriers(body) == body  # before BAR: something unknown
    body = [MATH, BAR, guarded, MATH, RET]
    assert drop_idle_barriers(body) == body  # after BAR: something unknown
    body = [MATH, RET, "$__tail:", BAR, MATH, RET]  # a branch-only tail past the ret
    assert drop_idle_barriers(body) == body


def test_comments_and_blank_lines_are_transparent() -> None:
    body = [SHARED_WRITE, BAR, SHARED_READ, "\t// scale the row", "", BAR, MATH, RET]
    assert bars(body) == [1]


R = TypeVar("R")
C = TypeVar("C")


@ct.kernel(num_warps=4)
def scaled_by_sum_and_max(y: Mut[Tensor[f32, R, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """y = x * sum(x) + max(x) per row: two cross-warp reductions in turn, then the store."""
    t = ct.load_tile_like(x, y)
    s = ct.sum(t, axis=1, keepdims=True)
    m = ct.max(t, axis=1, keepdims=True)
    y.store(t * s + m)


@pytest.mark.parametrize("rows", [1, 2])
def test_kernels_keep_the_barriers_they_need(rng: np.random.Generator, rows: int) -> None:
    """Each row spread over the block's 4 warps: the sum's partials stored, a barrier, read;
    a barrier before the max's partials overwrite them; a barrier before they are read; the
    max's closing barrier, with no shared access after it, dropped. On sim (its race checker
    on) the result matches NumPy."""
    ct.set_backend("sim")
    n = 512
    x = rng.standard_normal((4 * rows, n)).astype(np.float32)
    y = ct.empty(x.shape).partition((rows, n))
    ptx = scaled_by_sum_and_max.ptx(y, ct.from_numpy(x), target=90)
    assert ptx.count("bar.sync") == 3, ptx
    (out, _) = scaled_by_sum_and_max(y, ct.from_numpy(x)).sync()
    want = x * x.sum(axis=1, keepdims=True) + x.max(axis=1, keepdims=True)
    np.testing.assert_allclose(out.unpartition().to_numpy(), want, rtol=1e-5, atol=1e-3)
