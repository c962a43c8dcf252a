"""What every experiment shares: rows, results, the run context and input data."""

from __future__ import annotations

import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from paper_repro.timing import Measurement, Timer

Value = str | int | float | bool | None
Row = dict[str, Value]


@dataclass
class Result:
    """One experiment's output: rows (CSV/JSON), notes and summary lines for the report."""

    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: Columns shown in REPORT.md (all rows' keys go to CSV/JSON).
    columns: list[str] = field(default_factory=list)
    #: Comparisons with the paper's numbers, one line each.
    summary: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Context:
    """The run: backend, size regime, timer, device facts and measured ceilings."""

    backend: str
    quick: bool
    timer: Timer
    l2_bytes: int
    device: dict[str, Value]
    seed: int = 0
    #: GPU sizes, but only the largest few per experiment (`--lean`).
    lean: bool = False
    #: Measured ceilings shared between experiments (copy GB/s, cuBLAS TFLOP/s, ...).
    ceilings: dict[str, float] = field(default_factory=dict)
    #: GB/s of device copies by the bytes they move (`same_size_copy`), measured once each.
    copies: dict[int, float] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)
    #: Writes an unfinished result's rows so far (set by the command line): a run cut short
    #: by a time limit keeps what it measured.
    checkpoint: Callable[[Result], None] | None = None

    def log(self, message: str) -> None:
        """Progress, to stderr."""
        print(
            f"[{time.perf_counter() - self.started:7.1f}s] {message}", file=sys.stderr, flush=True
        )

    def rng(self, salt: int = 0) -> np.random.Generator:
        return np.random.default_rng(self.seed * 1_000_003 + salt)


def random_array(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> Any:
    """Random float32 values (never zeros: a kernel that writes nothing cannot pass)."""
    a = rng.standard_normal(shape, dtype=np.float32)
    a *= np.float32(scale)
    a[a == 0] = np.float32(0.5)
    return a


def sig(x: float, digits: int = 4) -> float:
    """`x` rounded to `digits` significant digits (tiny CPU numbers stay non-zero)."""
    return float(f"{x:.{digits}g}")


def measured_row(m: Measurement, **fields: Value) -> Row:
    """A row with the timing columns of `m` filled in."""
    row: Row = dict(fields)
    row.update(
        status="ok",
        time_us=sig(m.median_us),
        min_us=sig(m.min_us),
        samples=m.samples,
        method=m.method,
    )
    if m.host_bound:
        row["note"] = "host-bound samples (device waited for the host)"
    return row


def missing_row(why: str, **fields: Value) -> Row:
    row: Row = dict(fields)
    row.update(status="missing", note=why)
    return row


def error_row(e: BaseException, **fields: Value) -> Row:
    row: Row = dict(fields)
    first = (str(e).strip().splitlines() or [""])[0]
    row.update(status="error", note=f"{type(e).__name__}: {first}"[:300])
    return row


def attempt(
    ctx: Context, rows: list[Row], label: str, body: Callable[[], list[Row]], **fields: Value
) -> None:
    """Run `body` and add its rows; an exception becomes one error row (the run goes on)."""
    try:
        rows.extend(body())
    except Exception as e:  # one failing measurement must not lose the others
        ctx.log(f"  {label}: {type(e).__name__}: {e}")
        if "--debug" in sys.argv:
            traceback.print_exc(file=sys.stderr)
        rows.append(error_row(e, **fields))
