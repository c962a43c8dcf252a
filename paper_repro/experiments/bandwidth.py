"""Memory-bound kernels of `cutile_py_kernels`: achieved GB/s (bytes read + written, per the
formula table below) and the fraction of the measured device-to-device copy bandwidth, with
Triton, PyTorch and CuPy beside them."""

from __future__ import annotations

import math
import statistics
import sys
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np

from paper_repro import peers
from paper_repro.core import (
    Context,
    Result,
    Row,
    Value,
    error_row,
    missing_row,
    random_array,
    sig,
)
from paper_repro.experiments.common import (
    bw_row,
    copy_ceiling,
    peer_missing,
    rotate_count,
    same_size_copy,
    time_peer,
    to_ct,
    torch_tensor,
)
from paper_repro.replay import Replay
from paper_repro.timing import Measurement

Shape = tuple[int, ...]
ELEMENTWISE_GPU = [1 << p for p in (20, 22, 24, 26, 28)]
ROWS = 4096
ROW_WIDTHS_GPU = [1024, 1536, 2048, 4096, 8192, 16384, 32768]
#: The dtypes a spec of float tensors only is timed at, and their sizes in bytes.
FLOATS = ("f32", "f16", "bf16")
ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}


@dataclass(frozen=True)
class Input:
    """An input: its shape, and `ids` > 0 for int32 values in [0, ids) (indices)."""

    shape: Shape
    ids: int = 0


@dataclass(frozen=True)
class Spec:
    """A library kernel: its cases, inputs, the call, the bytes it must move, its peers."""

    name: str
    cases: Callable[[bool], list[Shape]]
    inputs: Callable[[Shape], list[Input]]
    call: Callable[[Any, list[Any]], Any]
    nbytes: Callable[[Shape], int]
    #: Peer name -> (tensors, output) -> a function queuing the peer's kernel(s).
    peers: dict[str, Callable[[list[Any], Any], Callable[[], Any]]] = field(default_factory=dict)
    #: The output's shape and dtype name ("f32": the dtype timed), for the peers'
    #: preallocated output.
    out: Callable[[Shape], tuple[Shape, str]] = lambda s: (s, "f32")
    #: The dtypes it can be timed at (`--dtype`): all three floats where every tensor it
    #: moves is of the dtype timed (`nbytes` then scales with the element size).
    dtypes: tuple[str, ...] = ("f32",)


def _flat(quick: bool) -> list[Shape]:
    return [(n,) for n in ([1 << 10, 1 << 12] if quick else ELEMENTWISE_GPU)]


def _rows(quick: bool) -> list[Shape]:
    return [(8, w) for w in (64, 96)] if quick else [(ROWS, w) for w in ROW_WIDTHS_GPU]


def _rows_short(quick: bool) -> list[Shape]:
    return [(8, 64)] if quick else [(ROWS, w) for w in (1024, 4096, 16384)]


def _torch() -> Any:
    return peers.load("torch")[0]


def _triton() -> Any:
    from paper_repro.peers import triton_kernels

    return triton_kernels


def _rms_torch(t: list[Any], out: Any) -> Callable[[], Any]:
    torch = _torch()
    f = torch.nn.functional
    h = t[0].shape[-1]
    if hasattr(f, "rms_norm"):
        return lambda: f.rms_norm(t[0], (h,), t[1], 1e-6)
    return lambda: t[0] * torch.rsqrt(t[0].pow(2).mean(-1, keepdim=True) + 1e-6) * t[1]


def _rope_triton(t: list[Any], out: Any) -> Callable[[], Any]:
    """Triton's rope (the library's algorithm) with the library's frequency tables."""
    torch = _torch()
    half = t[0].shape[-1] // 2
    freq = 10000.0 ** (-np.arange(half, dtype=np.float64) / half)
    high = freq.astype(np.float32)
    low = (freq - high.astype(np.float64)).astype(np.float32)
    fh, fl = (torch.from_numpy(a).to("cuda") for a in (high, low))
    return lambda: _triton().rope(t[0], t[1], fh, fl, out)


def _causal_torch(t: list[Any], out: Any) -> Callable[[], Any]:
    torch = _torch()
    s = t[0].shape[-1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool, device="cuda"), 1)
    return lambda: torch.softmax(t[0].masked_fill(mask, float("-inf")), -1)


SPECS: list[Spec] = [
    Spec(
        "add",
        _flat,
        lambda s: [Input(s), Input(s)],
        lambda f, t: f(t[0], t[1]),
        lambda s: 12 * s[0],
        {
            "torch": lambda t, o: lambda: _torch().add(t[0], t[1], out=o),
            "triton": lambda t, o: lambda: _triton().add(t[0], t[1], o),
            "cupy": lambda t, o: lambda: peers.load("cupy")[0].add(t[0], t[1], out=o),
        },
    ),
    Spec(
        "saxpy",
        _flat,
        lambda s: [Input(s), Input(s)],
        lambda f, t: f(2.0, t[0], t[1]),
        lambda s: 12 * s[0],
        {"torch": lambda t, o: lambda: _torch().add(t[1], t[0], alpha=2.0, out=o)},
    ),
    Spec(
        "silu_mul",
        _flat,
        lambda s: [Input(s), Input(s)],
        lambda f, t: f(t[0], t[1]),
        lambda s: 12 * s[0],
        {
            "torch": lambda t, o: (
                lambda: _torch().mul(_torch().nn.functional.silu(t[0]), t[1], out=o)
            )
        },
        dtypes=FLOATS,
    ),
    Spec(
        "gelu",
        _flat,
        lambda s: [Input(s)],
        lambda f, t: f(t[0]),
        lambda s: 8 * s[0],
        {
            "torch": lambda t, o: lambda: _torch().nn.functional.gelu(t[0], approximate="tanh"),
            "triton": lambda t, o: lambda: _triton().gelu(t[0], o),
        },
        dtypes=FLOATS,
    ),
    Spec(
        "rms_norm",
        _rows,
        lambda s: [Input(s), Input(s[-1:])],
        lambda f, t: f(t[0], t[1]),
        lambda s: 8 * s[0] * s[1] + 4 * s[1],
        {"torch": _rms_torch, "triton": lambda t, o: lambda: _triton().rms_norm(t[0], t[1], o)},
        dtypes=FLOATS,
    ),
    Spec(
        "add_rms_norm",
        _rows_short,
        lambda s: [Input(s), Input(s), Input(s[-1:])],
        lambda f, t: f(t[0], t[1], t[2]),
        lambda s: 16 * s[0] * s[1] + 4 * s[1],
        {"torch": lambda t, o: lambda: _rms_torch([t[0] + t[1], t[2]], o)()},
        dtypes=FLOATS,
    ),
    Spec(
        "layer_norm",
        _rows_short,
        lambda s: [Input(s), Input(s[-1:]), Input(s[-1:])],
        lambda f, t: f(t[0], t[1], t[2]),
        lambda s: 8 * s[0] * s[1] + 8 * s[1],
        {
            "torch": lambda t, o: (
                lambda: _torch().nn.functional.layer_norm(t[0], (t[0].shape[-1],), t[1], t[2], 1e-5)
            )
        },
        dtypes=FLOATS,
    ),
    Spec(
        "softmax",
        _rows,
        lambda s: [Input(s)],
        lambda f, t: f(t[0]),
        lambda s: 8 * s[0] * s[1],
        {
            "torch": lambda t, o: lambda: _torch().softmax(t[0], -1),
            "triton": lambda t, o: lambda: _triton().softmax(t[0], o),
        },
        dtypes=FLOATS,
    ),
    Spec(
        "softmax_causal",
        lambda q: [(2, 16, 16)] if q else [(16, 1024, 1024), (4, 2048, 2048), (1, 4096, 4096)],
        lambda s: [Input(s)],
        lambda f, t: f(t[0], causal=True),
        lambda s: 8 * s[0] * s[1] * s[2],
        {
            "torch": _causal_torch,
            "triton": lambda t, o: lambda: _triton().softmax(t[0], o, causal=True),
        },
        dtypes=FLOATS,
    ),
    Spec(
        "rope",
        lambda q: [(4, 2, 16)] if q else [(t, 32, 128) for t in (1024, 4096, 16384)],
        lambda s: [Input(s), Input(s[:1], ids=4096)],
        lambda f, t: f(t[0], t[1]),
        lambda s: 8 * s[0] * s[1] * s[2] + 4 * s[0],
        {"triton": _rope_triton},
    ),
    Spec(
        "gemv",
        lambda q: [(8, 96)] if q else [(4096, 4096), (14336, 4096), (151936, 1024)],
        lambda s: [Input(s), Input(s[1:])],
        lambda f, t: f(t[0], t[1]),
        lambda s: 4 * s[0] * s[1] + 4 * s[1] + 4 * s[0],
        {
            "torch": lambda t, o: lambda: _torch().mv(t[0], t[1], out=o),
            "triton": lambda t, o: lambda: _triton().gemv(t[0], t[1], o),
        },
        lambda s: (s[:1], "f32"),
        dtypes=FLOATS,
    ),
    Spec(
        "transpose",
        lambda q: [(32, 48)] if q else [(n, n) for n in (4096, 8192, 16384)],
        lambda s: [Input(s)],
        lambda f, t: f(t[0]),
        lambda s: 8 * s[0] * s[1],
        {"torch": lambda t, o: lambda: o.copy_(t[0].t())},
        lambda s: ((s[1], s[0]), "f32"),
    ),
    Spec(
        "argmax",
        lambda q: [(8, 64)] if q else [(ROWS, w) for w in (1024, 8192, 32768)],
        lambda s: [Input(s)],
        lambda f, t: f(t[0]),
        lambda s: 4 * s[0] * s[1] + 4 * s[0],
        {"torch": lambda t, o: lambda: _torch().argmax(t[0], -1)},
    ),
    Spec(
        "embedding",
        lambda q: [(64, 32, 8)] if q else [(32000, 4096, t) for t in (1024, 8192, 32768)],
        lambda s: [Input(s[:2]), Input(s[2:], ids=s[0])],
        lambda f, t: f(t[0], t[1]),
        lambda s: 4 * s[2] + 8 * s[2] * s[1],
        {"torch": lambda t, o: lambda: _torch().nn.functional.embedding(t[1].long(), t[0])},
        lambda s: ((s[2], s[1]), "f32"),
    ),
]


def spec_bytes(spec: Spec, shape: Shape, dtype: str) -> int:
    """The bytes `spec` moves at `shape` in `dtype` (`Spec.nbytes` is at f32)."""
    return spec.nbytes(shape) * ITEMSIZE[dtype] // 4


def host_arrays(ctx: Context, spec: Spec, shape: Shape) -> list[np.ndarray]:
    """The inputs of `spec` at `shape` (f32, or int32 indices), the same for every dtype,
    implementation and run: each rounds them to the dtype it is timed at."""
    # A stable salt (Python's str hash changes from one process to the next): the same
    # inputs in every run, so that runs compare on the same data.
    rng = ctx.rng(zlib.crc32(f"{spec.name} {_label(shape)}".encode()) % 10_000)
    out = []
    for inp in spec.inputs(shape):
        if inp.ids:
            out.append(rng.integers(0, inp.ids, size=inp.shape, dtype=np.int32))
        else:
            out.append(random_array(rng, inp.shape))
    return out


def _dtype_of(a: np.ndarray, dtype: str) -> str:
    return "i32" if a.dtype == np.int32 else dtype


@dataclass(frozen=True)
class Prepared:
    """An implementation of a spec at one shape and dtype, its buffers allocated and its
    kernels compiled: `time()` measures it again (interleaved rounds reuse it)."""

    impl: str
    nbytes: int
    time: Callable[[], Measurement]
    #: The row's fields besides the measurement (kernel, impl, shape, dtype, ...).
    fields: dict[str, Value]

    def row(self, ctx: Context, m: Measurement) -> Row:
        return bw_row(m, self.nbytes, ctx, **self.fields)


def _fields(spec: Spec, impl: str, shape: Shape, dtype: str) -> dict[str, Value]:
    return {"kernel": spec.name, "impl": impl, "shape": _label(shape), "dtype": dtype}


def prepare_cutile(
    ctx: Context,
    spec: Spec,
    fn: Any,
    shape: Shape,
    dtype: str = "f32",
    arrays: list[np.ndarray] | None = None,
) -> Prepared:
    """The launches library function `fn` makes for `spec` at `shape`, replayed on rotated
    buffer sets (`Replay`); `arrays`: the host inputs (`host_arrays` when None)."""
    arrays = host_arrays(ctx, spec, shape) if arrays is None else arrays
    nbytes = spec_bytes(spec, shape, dtype)
    rotate = rotate_count(ctx, nbytes)
    sets = [[to_ct(a, _dtype_of(a, dtype)) for a in arrays] for _ in range(rotate)]

    def call(*tensors: Any) -> Any:
        return spec.call(fn, list(tensors))

    replay = Replay(call, sets[0], sets)
    fields = _fields(spec, "cutile_py", shape, dtype)
    fields["kernels"] = "+".join(replay.kernel_names)
    return Prepared(
        "cutile_py", nbytes, partial(ctx.timer.device, replay.launch, rotate=rotate), fields
    )


def prepare_peer(
    ctx: Context,
    spec: Spec,
    peer: str,
    shape: Shape,
    dtype: str = "f32",
    arrays: list[np.ndarray] | None = None,
) -> Prepared:
    """Peer `peer`'s kernel(s) for `spec` at `shape` on its own tensors and stream, writing
    into preallocated outputs where it can."""
    arrays = host_arrays(ctx, spec, shape) if arrays is None else arrays
    nbytes = spec_bytes(spec, shape, dtype)
    rotate = rotate_count(ctx, nbytes)
    out_shape, out_dtype = spec.out(shape)
    out_dtype = dtype if out_dtype == "f32" else out_dtype
    if peer == "cupy":
        if dtype != "f32":
            raise ValueError(f"the cupy peer is timed at f32 only, not {dtype}")
        cupy = peers.load("cupy")[0]
        sets = [[cupy.asarray(a) for a in arrays] for _ in range(rotate)]
        outs = [cupy.empty(out_shape, dtype=cupy.float32) for _ in range(rotate)]
        stream = peers.cupy_stream()
    else:
        torch = _torch()
        sets = [[torch_tensor(a, _dtype_of(a, dtype)) for a in arrays] for _ in range(rotate)]
        torch_dtype = getattr(torch, peers.TORCH_DTYPES.get(out_dtype, "int32"))
        outs = [torch.empty(out_shape, device="cuda", dtype=torch_dtype) for _ in range(rotate)]
        stream = peers.torch_stream()
    calls = [spec.peers[peer](sets[i], outs[i]) for i in range(rotate)]
    time = partial(time_peer, ctx, stream, rotate, lambda slot: calls[slot]())
    return Prepared(peer, nbytes, time, _fields(spec, peer, shape, dtype))


def _label(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def interleaved(
    ctx: Context, prepared: Sequence[Prepared], rounds: int
) -> tuple[dict[str, list[Measurement]], list[Row]]:
    """Each of `prepared` timed `rounds` times in turn, round r starting at the r-th (no
    implementation always the first after a pause): their measurements by impl, and an error
    row for each that failed (it is timed no more)."""
    times: dict[str, list[Measurement]] = {p.impl: [] for p in prepared}
    errors: list[Row] = []
    failed: set[str] = set()
    for r in range(rounds):
        for i in range(len(prepared)):
            p = prepared[(i + r) % len(prepared)]
            if p.impl in failed:
                continue
            try:
                times[p.impl].append(p.time())
            except Exception as e:  # one failing implementation must not lose the others
                ctx.log(f"  {p.fields['kernel']} {p.impl} {p.fields['shape']}: {e}")
                failed.add(p.impl)
                errors.append(error_row(e, **p.fields))
    return {k: v for k, v in times.items() if k not in failed}, errors


def combined_row(ctx: Context, p: Prepared, ms: Sequence[Measurement]) -> Row:
    """`p`'s row from its rounds: the median of their medians, the least sample, and with
    several rounds `rounds` and `spread` (their medians' range over their median)."""
    if len(ms) == 1:
        return p.row(ctx, ms[0])
    medians = [m.median_us for m in ms]
    mid = statistics.median(medians)
    m = Measurement(
        mid,
        min(m.min_us for m in ms),
        max(m.max_us for m in ms),
        sum(m.samples for m in ms),
        ms[0].method,
        any(m.host_bound for m in ms),
    )
    row = p.row(ctx, m)
    row["rounds"] = len(ms)
    row["spread"] = sig((max(medians) - min(medians)) / mid) if mid > 0 else None
    return row


def against(ours: Sequence[Measurement], theirs: Sequence[Measurement]) -> dict[str, Value]:
    """Triton's time over ours, round by round (above 1: ours is faster): the median of the
    rounds' ratios, and with several rounds their range."""
    ratios = [t.median_us / o.median_us for o, t in zip(ours, theirs) if o.median_us > 0]
    if not ratios or any(not math.isfinite(r) for r in ratios):
        return {}
    out: dict[str, Value] = {"vs_triton": sig(statistics.median(ratios))}
    if len(ratios) > 1:
        out["vs_triton_range"] = f"{min(ratios):.3f}-{max(ratios):.3f}"
    return out


#: Prepares an implementation on the host inputs it is given (`prepare_cutile`, `prepare_peer`
#: with all but the inputs bound).
Preparer = Callable[[list[np.ndarray]], Prepared]


def timed_rounds(
    ctx: Context,
    spec: Spec,
    shape: Shape,
    dtype: str,
    preparers: dict[str, Preparer],
    rounds: int,
) -> tuple[list[Row], dict[str, list[Measurement]]]:
    """Each of `preparers` (by the impl name its row carries) prepared on the same host
    inputs, then all timed in `rounds` interleaved rounds (`interleaved`): the error rows of
    those that failed, then a row each for the others (`combined_row`), in the preparers'
    order; and the measurements of those. Their buffers are released on return."""
    arrays = host_arrays(ctx, spec, shape)
    rows: list[Row] = []
    prepared: list[Prepared] = []
    for impl, prepare in preparers.items():
        try:
            got = prepare(arrays)
        except Exception as e:  # one failing implementation must not lose the others
            ctx.log(f"  {spec.name} {impl} {_label(shape)} {dtype}: {type(e).__name__}: {e}")
            if "--debug" in sys.argv:
                traceback.print_exc(file=sys.stderr)
            rows.append(error_row(e, **_fields(spec, impl, shape, dtype)))
            continue
        prepared.append(replace(got, impl=impl, fields={**got.fields, "impl": impl}))
    times, errors = interleaved(ctx, prepared, rounds)
    rows += errors
    rows += [combined_row(ctx, p, times[p.impl]) for p in prepared if p.impl in times]
    return rows, times


def measure_shape(
    ctx: Context, spec: Spec, fn: Any, shape: Shape, dtype: str, rounds: int
) -> list[Row]:
    """The rows of `spec` at `shape` and `dtype`: the library's (where `fn` exists) and each
    available peer's, prepared once and timed in `rounds` interleaved rounds; the library's
    row says how it compares with Triton's round by round; each row its same-size copy."""
    preparers: dict[str, Preparer] = {}
    if fn is not None:
        preparers["cutile_py"] = partial(prepare_cutile, ctx, spec, fn, shape, dtype)
    if ctx.backend == "cuda":
        for peer in spec.peers:
            if peer_missing(peer) is None and (peer != "cupy" or dtype == "f32"):
                preparers[peer] = partial(prepare_peer, ctx, spec, peer, shape, dtype)
    rows, times = timed_rounds(ctx, spec, shape, dtype, preparers, rounds)
    if "cutile_py" in times and "triton" in times:
        ours = next(r for r in rows if r["impl"] == "cutile_py" and r["status"] == "ok")
        ours.update(against(times["cutile_py"], times["triton"]))
    # (the buffers went with timed_rounds, before the copies of the same size are timed)
    for r in rows:
        nbytes, bw = r.get("bytes"), r.get("gbps")
        if isinstance(nbytes, int) and isinstance(bw, float) and "copy_gbps" in ctx.ceilings:
            r["frac_same_copy"] = sig(bw / same_size_copy(ctx, nbytes))
    return rows


def summary(ctx: Context, res: Result) -> list[str]:
    """The report's lines: each library kernel's best fraction of the copy bandwidth, and
    where Triton was timed beside it, at which shapes the library is behind."""
    best: dict[str, float] = {}
    for r in res.rows:
        frac = r.get("frac_copy")
        if r.get("impl") == "cutile_py" and r.get("status") == "ok" and isinstance(frac, float):
            best[str(r["kernel"])] = max(best.get(str(r["kernel"]), 0.0), frac)
    lines = [
        f"best fraction of copy bandwidth per cutile_py kernel ({ctx.backend}): "
        + (", ".join(f"{k} {v:.3g}" for k, v in best.items()) or "none measured")
    ]
    compared = [r for r in res.rows if isinstance(r.get("vs_triton"), float)]
    if compared:
        behind = [r for r in compared if float(r["vs_triton"] or 0) < 1.0]
        rounds = max(int(r.get("rounds") or 1) for r in compared)
        lines.append(
            f"against Triton (its time over ours, the median of {rounds} interleaved "
            f"round{'s' if rounds > 1 else ''}): even or ahead at "
            f"{len(compared) - len(behind)} of {len(compared)}"
            + (
                "; behind at "
                + ", ".join(
                    f"{r['kernel']} {r['shape']} {r['dtype']} {r['vs_triton']}"
                    + (f" (rounds {r['vs_triton_range']})" if r.get("vs_triton_range") else "")
                    for r in behind
                )
                if behind
                else ""
            )
        )
    return lines


def run(
    ctx: Context,
    only: Sequence[str] = (),
    dtypes: Sequence[str] = ("f32",),
    rounds: int = 1,
    shapes: Sequence[str] = (),
) -> Result:
    """Every spec (those named in `only`, in that order) at its shapes (with `shapes`, those
    labelled as one of them, e.g. "4096x1536", or for one kernel "softmax:4096x1024"), at
    each of `dtypes` it can be timed at, each implementation timed in `rounds` interleaved
    rounds; the result is checkpointed after each shape."""
    import cutile_py_kernels as lib

    res = Result("bandwidth", "Memory-bound kernels: GB/s and fraction of copy bandwidth")
    res.columns = [
        "kernel",
        "impl",
        "shape",
        "dtype",
        "status",
        "time_us",
        "gbps",
        "frac_copy",
        "frac_same_copy",
        "spread",
        "vs_triton",
        "vs_triton_range",
        "note",
    ]
    ceiling_rows = copy_ceiling(ctx)
    for r in ceiling_rows:
        r["kernel"] = "copy (ceiling)"
    res.rows.extend(ceiling_rows)
    res.notes += NOTES
    if rounds > 1:
        res.notes.append(
            f"Each implementation at a shape was prepared once and timed in {rounds} rounds in "
            "turn (round r starting at the r-th): time_us is the median of the rounds' "
            "medians, spread their range over it, vs_triton the median of Triton's time over "
            "ours round by round (above 1: ours faster), vs_triton_range its range."
        )
    by_name = {spec.name: spec for spec in SPECS}
    unknown = [name for name in only if name not in by_name]
    if unknown:
        raise ValueError(f"bandwidth: no kernel {', '.join(unknown)}; choose from "
                         f"{', '.join(by_name)}")  # fmt: skip
    for spec in [by_name[name] for name in only] if only else SPECS:
        # causal softmax is `softmax(x, causal=True)`: the Spec's call passes the flag
        fn = getattr(lib, spec.name.removesuffix("_causal"), None)
        ctx.log(f"bandwidth: {spec.name}")
        if fn is None:
            res.rows.append(
                missing_row("not in cutile_py_kernels yet", kernel=spec.name, impl="cutile_py")
            )
        cases = spec.cases(ctx.quick)
        if ctx.lean:  # the middle and the largest shape
            cases = sorted({cases[len(cases) // 2], cases[-1]}, key=cases.index)
        if shapes:
            cases = [c for c in cases if {_label(c), f"{spec.name}:{_label(c)}"} & set(shapes)]
        for dtype in dtypes:
            if dtype not in spec.dtypes:
                res.rows.append(
                    missing_row(
                        f"timed at {', '.join(spec.dtypes)} only",
                        kernel=spec.name,
                        impl="cutile_py",
                        dtype=dtype,
                    )
                )
                continue
            for shape in cases:
                res.rows.extend(measure_shape(ctx, spec, fn, shape, dtype, rounds))
                res.summary = summary(ctx, res)
                if ctx.checkpoint is not None:
                    ctx.checkpoint(res)
        for peer in spec.peers:
            row = peer_missing(peer, kernel=spec.name)
            if row is not None:
                res.rows.append(row)
            elif ctx.backend != "cuda":
                res.rows.append(
                    missing_row(f"{peer} needs the cuda backend", kernel=spec.name, impl=peer)
                )
    res.summary = summary(ctx, res)
    return res


NOTES = [
    "Bytes per call (f32 = 4 B; f16 and bf16 rows half of it): add/saxpy/silu_mul 12n; "
    "gelu 8n; rms_norm 8RH+4H; add_rms_norm 16RH+4H; layer_norm 8RH+8H; softmax 8RH "
    "(causal: full SxS read and written); rope 8·T·heads·D+4T; transpose 8RC; argmax "
    "4RC+4R; embedding 4T+8TD; gemv 4MK+4K+4M. frac_copy = GB/s ÷ the copy ceiling measured in "
    "the same run; "
    "frac_same_copy = GB/s ÷ that of a copy moving the same bytes, measured in the same run "
    "(below 1 GiB; the ceiling above): a copy of tens of MB does not reach the ceiling either.",
    "cutile_py numbers time the launches the library host function makes, replayed on "
    "preallocated outputs (the host function itself also allocates and uploads its output). "
    "PyTorch peers are eager ops (some are several kernels: silu·mul, causal mask + softmax); "
    "PyTorch's allocations are included.",
]
