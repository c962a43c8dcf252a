"""Decode speed of a `Qwen3` beside its HBM roofline: tokens/s of replays of the captured decode
step, and the tokens/s that moving the step's bytes (all weights, plus the KV cache read at the
current length) at the measured device copy bandwidth would allow."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py_kernels.models.qwen3 import Qwen3

B = TypeVar("B")
COPY_TILE = 4096


@ct.kernel
def _copy(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    """z = x, one tile per block (the bandwidth probe)."""
    z.store(ct.load_tile_like(x, z))


def copy_bandwidth(nbytes: int, repeats: int = 5) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + written) of an f32 copy kernel over
    `nbytes`, the best of `repeats` (device time on cuda, wall clock elsewhere)."""
    n = max(COPY_TILE, nbytes // 4 // COPY_TILE * COPY_TILE)
    x = ct.zeros((n,), f32)
    z = ct.zeros((n,), f32).partition(COPY_TILE)

    def launch() -> ct.DeviceOp:
        op: ct.DeviceOp = _copy(z, x)  # each op hands z back when synced
        return op

    best = min(ct.profiling.time_ms(launch, repeats=repeats))
    return 8.0 * n / (best * 1e-3)


@dataclass(frozen=True)
class DecodeSpeed:
    """One measurement: tokens/s of graph replays at context lengths `start` .. `start + tokens`,
    and the roofline from `bytes_per_token` at `copy_bytes_per_s`; `launches` per replay."""

    tokens: int
    start: int
    seconds: float
    weight_bytes: int
    kv_bytes_per_token: float
    copy_bytes_per_s: float
    launches: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def bytes_per_token(self) -> float:
        return self.weight_bytes + self.kv_bytes_per_token

    @property
    def roofline_tokens_per_s(self) -> float:
        return self.copy_bytes_per_s / self.bytes_per_token

    @property
    def fraction(self) -> float:
        return self.tokens_per_s / self.roofline_tokens_per_s


def measure_decode(model: Qwen3, start: int, tokens: int, copy_bytes_per_s: float) -> DecodeSpeed:
    """Replay the captured decode step `tokens` times at positions start .. start+tokens-1
    (a zero KV cache: the bytes moved, not the values, set the speed), each replay with the
    token read back from the last one and its position written, as `generate` does (through
    `DecodeGraph.step`); wall-clock time."""
    step = model.decode_graph(start + tokens)
    try:
        token = step.step(0, start)  # warm: compiles nothing (capture did), but may upload
        t0 = time.perf_counter()
        for p in range(start, start + tokens):
            token = step.step(token, p)
        seconds = time.perf_counter() - t0
    finally:
        step.release()
    cfg = model.config
    itemsize = model.embed.nbytes // model.embed.size
    mean_len = start + (tokens + 1) / 2
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * itemsize * mean_len
    return DecodeSpeed(
        tokens, start, seconds, model.weight_bytes(), kv, copy_bytes_per_s, step.launches
    )
