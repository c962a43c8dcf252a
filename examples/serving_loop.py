"""A decoder step served token by token: one chained op, captured once, replayed per token.

The step is an MLP block with a residual, built from the kernels of `cutile_py_kernels`:

    h      = rms_norm(x, w_norm)
    gate   = W_gate @ h            (gemv)      } these two run together (ct.zip)
    up     = W_up @ h              (gemv)      }
    a      = silu_mul(gate, up)
    y      = W_down @ a            (gemv)
    x_next = x + y                 (add)

The six launches are one op (`.then` chains and a `ct.zip`), captured with `ct.graph`. Each
token writes its input into the captured `x` with `g.update`, replays the graph and reads
`x_next` with `g.read`. Every token is also run eagerly through the library's host functions
(which allocate their outputs and sync each launch) and checked against both that result and
a NumPy float64 reference. The next token is picked greedily from the output through a NumPy
unembedding, so the loop looks like serving.

Run: python examples/serving_loop.py [--hidden 4096] [--tokens 8]
(on the GPU where there is one, else the simulator; the default sizes are for the simulator)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import cutile_py as ct
from cutile_py import Tensor, f32
from cutile_py_kernels import add, gemv, rms_norm, silu_mul
from cutile_py_kernels._common import next_pow2, prev_pow2, row_plan, row_warps, view
from cutile_py_kernels.activations import SILU_TILE, _silu_mul_kernel
from cutile_py_kernels.elementwise import TILE as ADD_TILE
from cutile_py_kernels.elementwise import add_kernel
from cutile_py_kernels.gemv import _gemv_kernel
from cutile_py_kernels.norms import _rms_kernels

EPS = 1e-6
VOCAB = 32

AnyTensor = Tensor[Any, Any]


class Weights:
    """The layer's weights, on the host (NumPy f32) and on the device."""

    def __init__(self, hidden: int, ffn: int, rng: np.random.Generator) -> None:
        def mat(rows: int, cols: int) -> np.ndarray:
            m: np.ndarray = rng.standard_normal((rows, cols)) / np.sqrt(cols)
            return m.astype(np.float32)

        self.w_norm = (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
        self.w_gate = mat(ffn, hidden)
        self.w_up = mat(ffn, hidden)
        self.w_down = mat(hidden, ffn)
        self.embed = rng.standard_normal((VOCAB, hidden)).astype(np.float32)
        self.unembed = rng.standard_normal((VOCAB, hidden)).astype(np.float32)
        self.d_norm = ct.from_numpy(self.w_norm)
        self.d_gate = ct.from_numpy(self.w_gate)
        self.d_up = ct.from_numpy(self.w_up)
        self.d_down = ct.from_numpy(self.w_down)


def reference(w: Weights, x: np.ndarray) -> np.ndarray:
    """The step in NumPy float64."""
    x64 = x.astype(np.float64)
    h = x64 / np.sqrt(np.mean(x64 * x64) + EPS) * w.w_norm
    gate = w.w_gate.astype(np.float64) @ h
    up = w.w_up.astype(np.float64) @ h
    a = gate / (1.0 + np.exp(-gate)) * up
    y = w.w_down.astype(np.float64) @ a
    out: np.ndarray = x64 + y
    return out


def eager_step(w: Weights, x: np.ndarray) -> np.ndarray:
    """The step through the library's host functions: each allocates, launches and syncs."""
    xt = ct.from_numpy(x)
    h = rms_norm(xt, w.d_norm, EPS)
    a = silu_mul(gemv(w.d_gate, h), gemv(w.d_up, h))
    out: np.ndarray = add(xt, gemv(w.d_down, a)).to_numpy()
    return out


def gemv_partition(m: int, k: int) -> tuple[ct.Partition, int]:
    """A fresh (m,) output partitioned as `gemv` does for f32, and its K chunk."""
    bk = min(next_pow2(k), 256)
    bm = min(prev_pow2(max(1, 2048 // bk)), next_pow2(m))
    return ct.zeros((m,), f32).partition(bm), bk


class Step:
    """The decoder step as one op over tensors allocated once; `x` is its input, `out` the
    partition holding `x_next`."""

    def __init__(self, w: Weights) -> None:
        hidden, ffn = w.w_gate.shape[1], w.w_gate.shape[0]
        self.hidden, self.ffn = hidden, ffn
        self.x = ct.zeros((hidden,), f32)
        self.out = ct.zeros((hidden,), f32).partition(ADD_TILE)
        self.w = w

    def op(self) -> ct.OpLike:
        w, hidden, ffn = self.w, self.hidden, self.ffn
        gemv_k = _gemv_kernel(f32)

        # rms_norm works on rows: x and h are seen as (1, hidden).
        plan = row_plan(1, hidden, f32)
        rms_tile, rms_loop, _, _ = _rms_kernels(f32, row_warps(plan))
        x_rows = view(self.x, (1, hidden))
        if plan.loop:
            h_part = ct.zeros((1, hidden), f32).partition(
                (1, -(-hidden // plan.width) * plan.width)
            )
            first: ct.OpLike = rms_loop(h_part, x_rows, w.d_norm, 1.0 / hidden, EPS, plan.width)
        else:
            h_part = ct.zeros((1, hidden), f32).partition((plan.rows, plan.width))
            first = rms_tile(h_part, x_rows, w.d_norm, 1.0 / hidden, EPS)

        def gate_and_up(res: tuple[Any, ...]) -> ct.OpLike:
            h = view(res[0].unpartition(), (hidden,))
            gate, bk = gemv_partition(ffn, hidden)
            up, _ = gemv_partition(ffn, hidden)
            zipped: ct.OpLike = ct.zip(gemv_k(gate, w.d_gate, h, bk), gemv_k(up, w.d_up, h, bk))
            return zipped

        def silu(res: tuple[Any, ...]) -> ct.OpLike:
            (gate, *_), (up, *_) = res
            a = ct.zeros((ffn,), f32).partition(SILU_TILE)
            op: ct.OpLike = _silu_mul_kernel(f32)(a, gate.unpartition(), up.unpartition())
            return op

        def down(res: tuple[Any, ...]) -> ct.OpLike:
            y, bk = gemv_partition(hidden, ffn)
            op: ct.OpLike = gemv_k(y, w.d_down, res[0].unpartition(), bk)
            return op

        def residual(res: tuple[Any, ...]) -> ct.OpLike:
            op: ct.OpLike = add_kernel(self.out, self.x, res[0].unpartition())
            return op

        return first.then(gate_and_up).then(silu).then(down).then(residual)


def check(name: str, got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> float:
    err = float(np.abs(got.astype(np.float64) - want).max())
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        raise AssertionError(f"{name}: max |error| {err:.3g} (rtol {rtol}, atol {atol})")
    return err


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    parser.add_argument("--ffn-mult", type=int, default=3, help="ffn = mult * hidden (3)")
    parser.add_argument("--tokens", type=int, default=8, help="tokens to serve (8)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    hidden, ffn, tokens = args.hidden, args.ffn_mult * args.hidden, args.tokens
    rng = np.random.default_rng(args.seed)
    w = Weights(hidden, ffn, rng)
    backend = ct.backend()
    note = " (the PTX simulator on the CPU: not GPU timings)" if backend == "sim" else ""
    print(f"backend {backend}{note}: hidden {hidden}, ffn {ffn}, {tokens} tokens")

    step = Step(w)
    start = time.perf_counter()
    g = ct.graph(step.op(), name="decoder step")
    capture_s = time.perf_counter() - start
    print(f"captured {g.launches} launches in {capture_s * 1e3:.1f} ms")
    eager_step(w, w.embed[0])  # warm up: compiles anything the capture did not

    # f32 against float64: sums of ~ffn products of O(1) terms.
    tol = 1e-4 * max(1.0, np.sqrt(ffn / 64))
    token = 0
    worst_ref = worst_eager = 0.0
    eager_total = replay_total = 0.0
    for t in range(tokens):
        x = w.embed[token]

        t0 = time.perf_counter()
        eager = eager_step(w, x)
        t1 = time.perf_counter()
        g.update(step.x, x)
        g.replay()
        got = g.read(step.out)
        t2 = time.perf_counter()

        want = reference(w, x)
        worst_ref = max(worst_ref, check(f"token {t}: replay vs NumPy", got, want, tol, tol))
        check(f"token {t}: eager vs NumPy", eager, want, tol, tol)
        worst_eager = max(
            worst_eager,
            check(f"token {t}: replay vs eager", got, eager.astype(np.float64), 1e-5, 1e-6),
        )
        eager_total += t1 - t0
        replay_total += t2 - t1
        nxt = int(np.argmax(w.unembed @ got))  # greedy pick of the next token
        print(
            f"token {t}: id {token:2d} -> {nxt:2d}   eager {(t1 - t0) * 1e3:8.2f} ms   "
            f"replay {(t2 - t1) * 1e3:8.2f} ms"
        )
        token = nxt

    g.release()
    print(
        f"per token: eager {eager_total / tokens * 1e3:.2f} ms, replay "
        f"{replay_total / tokens * 1e3:.2f} ms (wall clock, including the input upload and "
        f"output read){note}"
    )
    print(f"max |replay - float64| {worst_ref:.3g}, max |replay - eager| {worst_eager:.3g}")
    print("ok")


if __name__ == "__main__":
    main()
