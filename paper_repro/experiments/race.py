"""Paper §3.5: a permute (transpose) kernel with a swapped store index.

As hand-written PTX (`ct.RawKernel`, outside the checked model) the swap makes threads of
different blocks store to the same element: a write-write race. The checked cutile_py kernel
cannot express it: a block writes only its own tile of a `Mut` partition, shared tensors are
read-only, and passing one tensor as output and input is an `AliasError`. The same swap there
(on the load side) gives a wrong but deterministic result.
"""

from __future__ import annotations

from functools import partial
from typing import Any, TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from paper_repro import paper
from paper_repro.core import Context, Result, Row, attempt, missing_row, random_array, sig
from paper_repro.ptx import PERMUTE_OK, PERMUTE_RACY

TR = TypeVar("TR")
TC = TypeVar("TC")
TILE = 16
#: Poison for the output: elements the racy kernel never writes keep it.
POISON = -7.0


@ct.kernel
def permute_swapped(z: Mut[Tensor[f32, TR, TC]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """The swap, checked: z's tile (i, j) loads x's tile (i, j) instead of (j, i)."""
    z.store(ct.load(x, (ct.bid(0), ct.bid(1)), (z.shape[0], z.shape[1])))


@ct.kernel
def permute_checked(z: Mut[Tensor[f32, TR, TC]], x: Tensor[f32, Dyn, Dyn]) -> None:
    """out tile (i, j) = transpose of x's tile (j, i)."""
    z.store(ct.load(x, (ct.bid(1), ct.bid(0)), (z.shape[1], z.shape[0])).T)  # type: ignore[attr-defined, unused-ignore]


@ct.kernel
def permute_store_shared(
    done: Mut[Tensor[f32, TR]], out: Tensor[f32, Dyn, Dyn], x: Tensor[f32, Dyn, Dyn]
) -> None:
    """cuTile Python's way: store into the output at a computed tile index."""
    t = ct.load(x, (ct.bid(0), 0), (TILE, TILE))
    out.store(t)  # type: ignore[attr-defined]
    done.store(ct.zeros((done.shape[0],), f32))


def _raw_runs(ctx: Context, ptx: str, name: str, a: np.ndarray, runs: int) -> list[np.ndarray]:
    rows, cols = a.shape
    kernel = ct.RawKernel(ptx, name)
    x = ct.from_numpy(a)
    outs = []
    for _ in range(runs):
        out = ct.full((cols, rows), POISON, ct.f32)
        out, x, _, _ = kernel(out, x, rows, cols, grid=-(-(rows * cols) // 256), block=256).sync()
        outs.append(out.to_numpy())
    return outs


def _compare(outs: list[np.ndarray], ref: np.ndarray, **fields: Any) -> Row:
    first = outs[0]
    differing = [float(np.mean(o != first)) for o in outs[1:]]
    return {
        **fields,
        "status": "ok",
        "runs": len(outs),
        "differing_max": sig(max(differing, default=0.0)),
        "differing_mean": sig(float(np.mean(differing)) if differing else 0.0),
        "wrong_vs_reference": sig(float(np.mean(first != ref))),
        "never_written": sig(float(np.mean(first == POISON))),
    }


def _raw(ctx: Context, a: np.ndarray, runs: int) -> list[Row]:
    ref = a.T
    out = []
    for ptx, name in ((PERMUTE_RACY, "permute_racy"), (PERMUTE_OK, "permute_ok")):
        try:
            outs = _raw_runs(ctx, ptx, name, a, runs)
            row = _compare(outs, ref, what=name, impl="ct.RawKernel (hand-written PTX)")
            row["error_raised"] = "none"
        except Exception as e:  # the simulator's checks report races as launch errors
            row = {
                "what": name,
                "impl": "ct.RawKernel (hand-written PTX)",
                "status": "ok",
                "error_raised": f"{type(e).__name__}: {str(e).splitlines()[0]}"[:600],
            }
        out.append(row)
    return out


def _checked(ctx: Context, a: np.ndarray, runs: int, kernel: Any, what: str) -> list[Row]:
    rows, cols = a.shape
    x = ct.from_numpy(a)
    outs = []
    for _ in range(runs):
        z = ct.full((cols, rows), POISON, ct.f32).partition((TILE, TILE))
        z, x = kernel(z, x).sync()
        outs.append(z.unpartition().to_numpy())
    row = _compare(outs, a.T, what=what, impl="cutile_py (checked)")
    row["error_raised"] = "none"
    return [row]


def _attempts(a: np.ndarray) -> list[Row]:
    """The racy kernel written against the checked API: what each attempt raises."""
    rows, cols = a.shape
    found: list[Row] = []

    def note(what: str, fn: Any) -> None:
        try:
            fn()
            got = "no error"
        except (ct.CompileError, ct.BorrowError, TypeError, ValueError) as e:
            got = f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
        found.append(
            {"what": what, "impl": "cutile_py (checked)", "status": "ok", "error_raised": got}
        )

    def store_shared() -> None:
        out = ct.zeros((cols, rows), ct.f32)
        permute_store_shared(ct.zeros(rows).partition(TILE), out, ct.from_numpy(a)).sync()

    def in_place() -> None:
        t = ct.from_numpy(np.ascontiguousarray(a[:, :rows]))
        permute_swapped(t.partition((TILE, TILE)), t).sync()

    note("store into a shared (read-only) tensor at a computed index", store_shared)
    note("in-place permute: one tensor as Mut output and as input", in_place)
    return found


def run(ctx: Context) -> Result:
    res = Result("race", "Permute with a swapped store index (paper §3.5)")
    res.columns = [
        "what",
        "impl",
        "status",
        "runs",
        "differing_max",
        "differing_mean",
        "wrong_vs_reference",
        "never_written",
        "error_raised",
        "note",
    ]
    rows, cols = (32, 64) if ctx.quick else (4096, 8192)
    runs = 3 if ctx.quick else 10
    a = random_array(ctx.rng(3), (rows, cols))
    ctx.log(f"race: {rows}x{cols}, {runs} runs each")
    attempt(ctx, res.rows, "raw", partial(_raw, ctx, a, runs), what="permute_racy")
    attempt(
        ctx,
        res.rows,
        "checked swap",
        lambda: _checked(ctx, a, runs, permute_swapped, "permute_swapped (load-side swap)"),
        what="permute_swapped",
    )
    try:
        res.rows.extend(_checked(ctx, a, runs, permute_checked, "permute_checked (correct)"))
    except ct.CompileError as e:  # tile transposes are being written concurrently
        first = " ".join(str(e).split())[:200]
        res.rows.append(
            missing_row(
                f"tile .T not compilable yet: {first}",
                what="permute_checked (correct)",
                impl="cutile_py",
            )
        )
    res.rows.extend(_attempts(a))
    racy = next((r for r in res.rows if r.get("what") == "permute_racy"), {})
    lo, hi = paper.RACE_DIFFERING
    res.notes.append(
        f"Input {rows}x{cols} f32, output {cols}x{rows}. The racy store index is r*R + c "
        "instead of c*R + r: with C = 2R, threads (r, c) and (r+1, c-R) store to one element. "
        "differing = fraction of output elements that differ from the first run's."
    )
    if ctx.backend == "sim":
        res.notes.append(
            "On sim the race is reported by name: the simulator checks global memory as well "
            "as shared, and the racy kernel stops with a global-memory race naming both "
            "accesses (kernel, PTX line, block, thread, address, allocation); see error_raised."
        )
    found = "global-memory race" in str(racy.get("error_raised", ""))
    seen = (
        "reported as a global-memory race"
        if found
        else f"{racy.get('differing_max', 'n/a')} (max over runs)"
    )
    res.summary.append(
        f"paper (cuTile Python): {lo:.0%}-{hi:.0%} of elements differ between runs; here the "
        f"hand-written PTX race: {seen} ({ctx.backend}); checked cutile_py: cannot be "
        "expressed (see the errors), 0 differing"
    )
    return res
