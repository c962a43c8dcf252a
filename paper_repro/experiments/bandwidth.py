"""Memory-bound kernels of `cutile_py_kernels`: achieved GB/s (bytes read + written, per the
formula table below) and the fraction of the measured device-to-device copy bandwidth, with
Triton, PyTorch and CuPy beside them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from paper_repro import peers
from paper_repro.core import Context, Result, Row, attempt, missing_row, random_array, sig
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

Shape = tuple[int, ...]
ELEMENTWISE_GPU = [1 << p for p in (20, 22, 24, 26, 28)]
ROWS = 4096
ROW_WIDTHS_GPU = [1024, 1536, 2048, 4096, 8192, 16384, 32768]


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
    #: The output's shape and numpy dtype name, for the peers' preallocated output.
    out: Callable[[Shape], tuple[Shape, str]] = lambda s: (s, "f32")


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
    ),
    Spec(
        "rms_norm",
        _rows,
        lambda s: [Input(s), Input(s[-1:])],
        lambda f, t: f(t[0], t[1]),
        lambda s: 8 * s[0] * s[1] + 4 * s[1],
        {"torch": _rms_torch, "triton": lambda t, o: lambda: _triton().rms_norm(t[0], t[1], o)},
    ),
    Spec(
        "add_rms_norm",
        _rows_short,
        lambda s: [Input(s), Input(s), Input(s[-1:])],
        lambda f, t: f(t[0], t[1], t[2]),
        lambda s: 16 * s[0] * s[1] + 4 * s[1],
        {"torch": lambda t, o: lambda: _rms_torch([t[0] + t[1], t[2]], o)()},
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
    ),
    Spec(
        "rope",
        lambda q: [(4, 2, 16)] if q else [(t, 32, 128) for t in (1024, 4096, 16384)],
        lambda s: [Input(s), Input(s[:1], ids=4096)],
        lambda f, t: f(t[0], t[1]),
        lambda s: 8 * s[0] * s[1] * s[2] + 4 * s[0],
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


def host_arrays(ctx: Context, spec: Spec, shape: Shape) -> list[np.ndarray]:
    rng = ctx.rng(hash((spec.name, shape)) % 10_000)
    out = []
    for inp in spec.inputs(shape):
        if inp.ids:
            out.append(rng.integers(0, inp.ids, size=inp.shape, dtype=np.int32))
        else:
            out.append(random_array(rng, inp.shape))
    return out


def _ct_input(a: np.ndarray) -> Any:
    return to_ct(a, "i32" if a.dtype == np.int32 else "f32")


def measure_cutile(ctx: Context, spec: Spec, fn: Any, shape: Shape) -> list[Row]:
    arrays = host_arrays(ctx, spec, shape)
    nbytes = spec.nbytes(shape)
    rotate = rotate_count(ctx, nbytes)
    sets = [[_ct_input(a) for a in arrays] for _ in range(rotate)]

    def call(*tensors: Any) -> Any:
        return spec.call(fn, list(tensors))

    replay = Replay(call, sets[0], sets)
    m = ctx.timer.device(replay.launch, rotate=rotate)
    return [
        bw_row(
            m,
            nbytes,
            ctx,
            kernel=spec.name,
            impl="cutile_py",
            shape=_label(shape),
            kernels="+".join(replay.kernel_names),
        )
    ]


def measure_peer(ctx: Context, spec: Spec, peer: str, shape: Shape) -> list[Row]:
    arrays = host_arrays(ctx, spec, shape)
    nbytes = spec.nbytes(shape)
    rotate = rotate_count(ctx, nbytes)
    out_shape, _ = spec.out(shape)
    torch = _torch()
    if peer == "cupy":
        cupy = peers.load("cupy")[0]
        sets = [[cupy.asarray(a) for a in arrays] for _ in range(rotate)]
        outs = [cupy.empty(out_shape, dtype=cupy.float32) for _ in range(rotate)]
        stream = peers.cupy_stream()
    else:
        sets = [
            [torch_tensor(a, "i32" if a.dtype == np.int32 else "f32") for a in arrays]
            for _ in range(rotate)
        ]
        outs = [torch.empty(out_shape, device="cuda") for _ in range(rotate)]
        stream = peers.torch_stream()
    calls = [spec.peers[peer](sets[i], outs[i]) for i in range(rotate)]
    m = time_peer(ctx, stream, rotate, lambda slot: calls[slot]())
    return [bw_row(m, nbytes, ctx, kernel=spec.name, impl=peer, shape=_label(shape))]


def _label(shape: Sequence[int]) -> str:
    return "x".join(str(d) for d in shape)


def run(ctx: Context, only: Sequence[str] = ()) -> Result:
    import cutile_py_kernels as lib

    res = Result("bandwidth", "Memory-bound kernels: GB/s and fraction of copy bandwidth")
    res.columns = ["kernel", "impl", "shape", "status", "time_us", "gbps", "frac_copy",
                   "frac_same_copy", "note"]  # fmt: skip
    ceiling_rows = copy_ceiling(ctx)
    for r in ceiling_rows:
        r["kernel"] = "copy (ceiling)"
    res.rows.extend(ceiling_rows)
    for spec in SPECS:
        if only and spec.name not in only:
            continue
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
        for shape in cases:
            if fn is not None:
                attempt(
                    ctx,
                    res.rows,
                    f"{spec.name} {shape}",
                    partial(measure_cutile, ctx, spec, fn, shape),
                    kernel=spec.name,
                    impl="cutile_py",
                    shape=_label(shape),
                )
            for peer in spec.peers:
                if peer_missing(peer) is not None:
                    continue
                if ctx.backend != "cuda":
                    continue
                attempt(
                    ctx,
                    res.rows,
                    f"{spec.name} {peer} {shape}",
                    partial(measure_peer, ctx, spec, peer, shape),
                    kernel=spec.name,
                    impl=peer,
                    shape=_label(shape),
                )
        for peer in spec.peers:
            row = peer_missing(peer, kernel=spec.name)
            if row is not None:
                res.rows.append(row)
            elif ctx.backend != "cuda":
                res.rows.append(
                    missing_row(f"{peer} needs the cuda backend", kernel=spec.name, impl=peer)
                )
    ctx.log("bandwidth: copies of each measured size")
    for r in res.rows:
        nbytes, bw = r.get("bytes"), r.get("gbps")
        if r.get("kernel") == "copy (ceiling)" or r.get("status") != "ok":
            continue
        if isinstance(nbytes, int) and isinstance(bw, float) and "copy_gbps" in ctx.ceilings:
            r["frac_same_copy"] = sig(bw / same_size_copy(ctx, nbytes))
    best: dict[str, float] = {}
    for r in res.rows:
        frac = r.get("frac_copy")
        if r.get("impl") == "cutile_py" and r.get("status") == "ok" and isinstance(frac, float):
            best[str(r["kernel"])] = max(best.get(str(r["kernel"]), 0.0), frac)
    res.summary.append(
        f"best fraction of copy bandwidth per cutile_py kernel ({ctx.backend}): "
        + (", ".join(f"{k} {v:.3g}" for k, v in best.items()) or "none measured")
    )
    res.notes.append(
        "Bytes per call (f32 = 4 B): add/saxpy/silu_mul 12n; gelu 8n; rms_norm 8RH+4H; "
        "add_rms_norm 16RH+4H; layer_norm 8RH+8H; softmax 8RH (causal: full SxS read and "
        "written); rope 8·T·heads·D+4T; transpose 8RC; argmax 4RC+4R; embedding 4T+8TD. "
        "frac_copy = GB/s ÷ the copy ceiling measured in the same run; frac_same_copy = GB/s "
        "÷ that of a copy moving the same bytes, measured in the same run (below 1 GiB; the "
        "ceiling above): "
        "a copy of tens of MB does not reach the ceiling either."
    )
    res.notes.append(
        "cutile_py numbers time the launches the library host function makes, replayed on "
        "preallocated outputs (the host function itself also allocates and uploads its output). "
        "PyTorch peers are eager ops (some are several kernels: silu·mul, causal mask + softmax); "
        "PyTorch's allocations are included."
    )
    return res
