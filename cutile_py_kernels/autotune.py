"""Tile-shape choice for `gemm` / `bmm`: a fixed default, or on `cuda` the fastest candidate.

A config is the output tile (BM, BN) of one block, the K step BK, the number of cp.async
pipeline stages, the warps per block and the block order (`group_m`: L2-grouped bands of
`GROUP_M` tile rows, or the plain order). Valid configs obey the `ct.mma` shape rule (BM a
multiple of 16, BN of 8, BK of 16 for f16/bf16 and of 8 for tf32), keep the f32 accumulator
at most 128 registers per thread (a 64x64 tile per warp at most), and fit their operand
stages in 96 KiB of shared memory (every supported GPU allows a block at least 99 KiB).

- On `sim` and `interpret` nothing is timed (timings of a CPU simulation say nothing about a
  GPU): `Autotuner.choose` returns `default_config`, clamped to the problem.
- On `cuda` each candidate runs on scratch buffers that the tuner's caller allocates for it
  (never the caller's output), timed with CUDA events (the best of 5 runs), and the
  FINALISTS fastest again with launches queued back to back (`cuda_final_timer`), in
  FINAL_ROUNDS turns; the lowest median wins. The choice (as its
  unclamped template) is cached per `TuneKey` (M, N, K and the batch count rounded up to
  powers of two, dtypes, trans_b, device name) in the JSON file
  `<cache dir>/autotune/gemm.json` (the cache dir of `cutile_py.runtime.disk_cache`:
  `CUTILE_PY_CACHE_DIR` or the user cache directory), written atomically (a temporary file
  in the same directory, then `os.replace`).
- A timer passed to `Autotuner(timer=...)` is used on every backend (tests inject a fake one
  to make the choice deterministic).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cutile_py as ct
from cutile_py_kernels._common import next_pow2

#: Shared memory the operand stages may take: under every supported target's limit.
SHARED_LIMIT = 96 * 1024
#: With wgmma (sm_90: 227 KiB per block): 4 stages of 128 x 256 x 32 tiles or 3 of BK 64, less
#: the epilogue's accumulator band (it reuses the ring after the loop).
WGMMA_SHARED_LIMIT = 192 * 1024
#: wgmma multiplies 64 rows per warpgroup: BM is a multiple of this on wgmma targets.
WGMMA_BM = 64
#: Largest f32 accumulator tile (elements): 128 registers per thread of a 256-thread block.
MAX_ACC = 128 * 256
#: Stages when a config does not say.
STAGES = 3
#: The cache file's format and the tuning method: a choice made by an earlier method is
#: dropped, not reused (6: finalists timed run after run in rotating turns, where 5 took the
#: best of 5 short runs and picked configs 12 points below the best at 8192 on an H200;
#: the persistent candidates and GemmConfig.persistent are new too).
CACHE_VERSION = 6
#: Accumulator elements one warp may own: 64 x 64, 128 f32 registers per thread.
WARP_TILE = 64 * 64
#: Warps per block a config may ask for (0: the compiler's choice, 8 for these tiles).
WARPS = (0, 1, 2, 4, 8)
#: Tile rows per band of the L2-grouped block order (`@ct.kernel(group_m=...)`): 8 bands of
#: 128-row tiles read 1024 rows of A while they walk the columns of B.
GROUP_M = 8


@dataclass(frozen=True, order=True)
class GemmConfig:
    """Output tile (bm, bn) per block; K advances by bk per step of the loop, whose operand
    tiles are loaded `stages` - 1 steps ahead; `warps` warps per block (0: the compiler's
    choice), which split the tile into warp tiles of bm x bn / warps; blocks take their
    tiles in L2-grouped bands of `group_m` tile rows (0: the plain order); `ws` 1 runs the K
    loop warp-specialized (wgmma targets, the compiler's warps)."""

    bm: int
    bn: int
    bk: int
    stages: int = STAGES
    warps: int = 0
    group_m: int = 0
    #: 1: the K loop warp-specialized (`@ct.kernel(warp_specialize=True)`: a producer warp
    #: group issues the TMA copies); 0: not.
    ws: int = 0
    #: 1: a persistent grid (`@ct.kernel(persistent=True)`: one wave of blocks walks the
    #: tiles; a warp-specialized ring runs on from tile to tile); 0: a block per tile.
    persistent: int = 0

    def astuple(self) -> list[int]:
        """The fields as a list (`ws` and `persistent` only where set: earlier cache
        entries keep their form)."""
        out = [self.bm, self.bn, self.bk, self.stages, self.warps, self.group_m]
        if self.persistent:
            return [*out, self.ws, self.persistent]
        return [*out, self.ws] if self.ws else out

    @property
    def specialized(self) -> bool:
        """The kernel's `warp_specialize` option."""
        return self.ws == 1

    @property
    def persists(self) -> bool:
        """The kernel's `persistent` option."""
        return self.persistent == 1

    @property
    def num_warps(self) -> int | None:
        """The kernel's `num_warps` option."""
        return self.warps or None

    @property
    def group(self) -> int | None:
        """The kernel's `group_m` option."""
        return self.group_m or None


def k_step(dtype: type[ct.DType]) -> int:
    """The mma K granule: 8 for tf32 (f32 operands), 16 for f16 and bf16."""
    return 8 if dtype is ct.f32 else 16


def _up(x: int, m: int) -> int:
    return -(-max(x, 1) // m) * m


def shared_bytes(cfg: GemmConfig, dtype: type[ct.DType]) -> int:
    """Shared memory of the pipeline: `stages` copies of the A and B tiles. (The f32
    accumulator passes through shared memory only after the loop, in bands of at most
    48 KiB, in the same space.)"""
    return cfg.stages * (cfg.bm + cfg.bn) * cfg.bk * dtype.itemsize()


def is_valid(cfg: GemmConfig, dtype: type[ct.DType], wgmma: bool = False) -> bool:
    """Within the shape rules, the accumulator and the shared memory budget; on a `wgmma`
    target also a whole number of 64-row warpgroup blocks in BM."""
    return (
        cfg.bm % (WGMMA_BM if wgmma else 16) == 0
        and cfg.bn % 8 == 0
        and cfg.bk % k_step(dtype) == 0
        and min(cfg.bm, cfg.bn, cfg.bk) > 0
        and 1 <= cfg.stages <= 8
        and cfg.bm * cfg.bn <= MAX_ACC
        and cfg.warps in WARPS
        and (cfg.warps == 0 or cfg.bm * cfg.bn <= cfg.warps * WARP_TILE)
        and cfg.warps <= _fragments(cfg)
        and cfg.group_m >= 0
        and cfg.ws in (0, 1)
        and cfg.persistent in (0, 1)
        and (cfg.ws == 0 or (wgmma and cfg.warps == 0))
        and shared_bytes(cfg, dtype) <= (WGMMA_SHARED_LIMIT if wgmma else SHARED_LIMIT)
    )


def _fragments(cfg: GemmConfig) -> int:
    """m16n8 accumulator fragments of the tile: no more warps than these."""
    return max(1, (cfg.bm // 16) * (cfg.bn // 8))


def clamp(
    cfg: GemmConfig, dtype: type[ct.DType], m: int, n: int, k: int, wgmma: bool = False
) -> GemmConfig:
    """`cfg` shrunk to the problem (tiles no larger than M, N, K rounded up to the granules,
    BM to 64 rows on a `wgmma` target, and no more warps than the smaller tile has
    fragments), so that tiny problems do not compute (and compile) mostly padding; grouping
    dropped where the grid has no more tile rows than a band (the grouped order is then the
    plain one, column by column: one kernel, not two)."""
    out = GemmConfig(
        min(cfg.bm, _up(m, WGMMA_BM if wgmma else 16)),
        min(cfg.bn, _up(n, 8)),
        min(cfg.bk, _up(k, k_step(dtype))),
        cfg.stages,
    )
    warps = cfg.warps
    while warps > 1 and warps > _fragments(out):
        warps //= 2
    group = cfg.group_m if -(-m // out.bm) > cfg.group_m else 0
    return GemmConfig(out.bm, out.bn, out.bk, out.stages, warps, group, cfg.ws, cfg.persistent)


def default_config(
    dtype: type[ct.DType], m: int, n: int, k: int, wgmma: bool = False, grouped: bool = True
) -> GemmConfig:
    """64 x 64 output tiles, BK 32 (f16, bf16) or 16 (tf32), 3 stages, the L2-grouped
    order where `grouped` (2-D problems) and M has more than `GROUP_M` tile rows, clamped to
    the problem (what runs where nothing is timed); on a `wgmma` target BK 64 for f16 and
    bf16 (128-byte rows of A: wgmma's widest swizzle)."""
    bk = 16 if dtype is ct.f32 else 64 if wgmma else 32
    group = GROUP_M if grouped else 0
    return clamp(GemmConfig(64, 64, bk, group_m=group), dtype, m, n, k, wgmma)


#: Output tiles tried: the 128-row ones are what large problems want; 64-row ones keep
#: enough blocks in flight for small ones.
TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256))
#: On wgmma targets also 256 x 128 (two warpgroups of two m64 blocks each).
WGMMA_TILES = (*TILES, (256, 128))
#: Warp-specialized variants tried on wgmma targets (BK 64, 3 or 4 stages where they fit):
#: the tiles of the fastest plain configs on an H200 (128 x 256 x 64, 4 stages, group 8).
WS_TILES = ((128, 128), (128, 256), (256, 128))
#: Persistent variants (bm, bn, stages) of the best warp-specialized configs on the H200
#: (BK 64): 128 x 256 and 256 x 128 at 3 stages (99.6% and 98% of cuBLAS in a burst, the
#: latter at 4) and 128 x 128 at 4. With a 16-bit output their rings run on across tiles
#: (144 or 128 KiB, the TMA store's 64 or 32 KiB staging tile past it); with an f32 output
#: the staging tile does not fit past the 144 KiB rings, which are then set up per tile.
PERSISTENT = ((128, 256, 3), (256, 128, 3), (128, 128, 4))


def tile_warps(bm: int, bn: int) -> tuple[int, ...]:
    """Warps tried for a bm x bn tile: a 64x64 tile per warp (the most mma per fragment
    load the registers allow), and twice as many warps (64x32 each) where that is at most 8."""
    w = max(1, bm * bn // WARP_TILE)
    return (w, 2 * w) if 2 * w <= 8 else (w,)


def stageable(dtype: type[ct.DType], rows: tuple[int, ...]) -> bool:
    """Whether operands whose rows hold `rows` elements can be copied by cp.async (rows a
    multiple of 4 bytes): otherwise they are loaded through registers, and a block of fewer
    warps than the compiler's choice holds too much of them."""
    return all(r * dtype.itemsize() % 4 == 0 for r in rows)


def candidate_templates(
    dtype: type[ct.DType],
    m: int,
    n: int,
    k: int,
    wgmma: bool = False,
    staged: bool = True,
    grouped: bool = True,
) -> dict[GemmConfig, GemmConfig]:
    """The configs tried, each as it is written in `TILES` (the template, what the cache
    stores) → as it runs on this problem (clamped). Templates are `TILES` with two K steps
    and 3 or 4 stages (the longer K step with 3) and the warps of `tile_warps` (the
    compiler's choice where the operands are not `staged`), kept where the clamped config
    is valid; on a `wgmma` target (f16, bf16, staged operands) `WGMMA_TILES` with BK 64 and
    3 or 4 stages, or BK 32 and 4 stages, within sm_90's larger shared memory, with the
    compiler's warps (one warpgroup per 64 rows). Each in the plain and, where `grouped`
    (2-D problems: grid axis 0 of `bmm` is the batch), the L2-grouped block order; the
    grouped one clamps to the plain one where M has at most `GROUP_M` tile rows. On a
    `wgmma` target also warp-specialized variants (`ws` 1) of `WS_TILES`, BK 64, 3 and 4
    stages, in the grouped order where `grouped`, and persistent ones (`persistent` 1) of
    `PERSISTENT`."""
    wgmma = wgmma and staged and dtype is not ct.f32
    out = {}
    for template in _templates(dtype, wgmma, staged, grouped):
        fitted = clamp(template, dtype, m, n, k, wgmma)
        if is_valid(fitted, dtype, wgmma):
            out[template] = fitted
    return out


def _templates(
    dtype: type[ct.DType], wgmma: bool, staged: bool, grouped: bool
) -> Iterator[GemmConfig]:
    """The templates `candidate_templates` fits to a problem, in its order."""
    g = k_step(dtype)
    steps = ((64, 3), (64, 4), (32, 4)) if wgmma else ((2 * g, 3), (2 * g, 4), (4 * g, 3))
    for bm, bn in WGMMA_TILES if wgmma else TILES:
        for bk, stages in steps:
            for warps in tile_warps(bm, bn) if staged and not wgmma else (0,):
                for group in (0, GROUP_M) if grouped else (0,):
                    yield GemmConfig(bm, bn, bk, stages, warps, group)
    for bm, bn in WS_TILES if wgmma else ():
        for stages in (3, 4):
            yield GemmConfig(bm, bn, 64, stages, 0, GROUP_M if grouped else 0, 1)
    for bm, bn, stages in PERSISTENT if wgmma else ():
        yield GemmConfig(bm, bn, 64, stages, 0, GROUP_M if grouped else 0, 1, 1)


def candidates(
    dtype: type[ct.DType],
    m: int,
    n: int,
    k: int,
    wgmma: bool = False,
    staged: bool = True,
    grouped: bool = True,
) -> list[GemmConfig]:
    """The distinct configs tried on this problem (the clamped templates), sorted."""
    return sorted(set(candidate_templates(dtype, m, n, k, wgmma, staged, grouped).values()))


@dataclass(frozen=True)
class TuneKey:
    """What a cached choice is valid for: sizes (and the batch count, 0 for a 2-D gemm)
    bucketed to the next power of two, operand and output dtypes, B's layout, the device."""

    m: int
    n: int
    k: int
    dtype: str
    trans_b: bool
    device: str
    out_dtype: str = ""
    batch: int = 0
    #: Whether the operands' rows allow cp.async copies (see `candidate_templates`).
    staged: bool = True

    @classmethod
    def make(
        cls,
        m: int,
        n: int,
        k: int,
        dtype: type[ct.DType],
        trans_b: bool,
        device: str,
        out_dtype: type[ct.DType] | None = None,
        batch: int | None = None,
        staged: bool = True,
    ) -> TuneKey:
        return cls(
            next_pow2(m),
            next_pow2(n),
            next_pow2(k),
            dtype.name,
            trans_b,
            device,
            (out_dtype or dtype).name,
            0 if batch is None else next_pow2(batch),
            staged,
        )

    def text(self) -> str:
        t = "t" if self.trans_b else "n"
        shape = f"{self.m}x{self.n}x{self.k}"
        if self.batch:
            shape = f"{self.batch}x{shape}"
        unstaged = "" if self.staged else "|unstaged"
        return f"{self.device}|{self.dtype}->{self.out_dtype}|{t}|{shape}{unstaged}"


#: Runs one launch (a fresh op on scratch buffers) for `cfg` and returns its time in ms.
Launch = Callable[[], ct.DeviceOp]
Timer = Callable[[GemmConfig, Launch], float]


def cuda_event_timer(cfg: GemmConfig, launch: Launch, repeats: int = 5) -> float:
    """Best of `repeats` launches timed with CUDA events (`ct.profiling.time_ms`, which
    warms up first)."""
    return min(ct.profiling.time_ms(launch, repeats))


#: Candidates timed again after the first round, run after run and in turns: the best of a
#: few short runs ranks them, but a GPU's clocks drift as it heats under a stream of launches
#: (an H200 ran cuBLAS's bf16 8192 GEMM 13% slower run after run than in a burst), so a
#: config timed first, on a cool GPU, can look better than one timed after it. Each finalist
#: is timed in FINAL_ROUNDS turns, the order rotating, and its median decides.
FINALISTS = 4
FINAL_ROUNDS = 3
#: Scratch outputs per finalist in the final round (the queued launches take them in turn).
QUEUED = 3
#: Times a finalist: `(config, make_launch) -> ms`, `make_launch` as `Autotuner.choose` has it.
FinalTimer = Callable[[GemmConfig, Callable[[GemmConfig], Launch]], float]


def cuda_final_timer(
    cfg: GemmConfig, make_launch: Callable[[GemmConfig], Launch], runs: int = 12
) -> float:
    """Device ms per launch of `cfg` with `runs` launches queued back to back over QUEUED
    scratch outputs (`ct.profiling.time_ms_queued`)."""
    return ct.profiling.time_ms_queued([make_launch(cfg) for _ in range(QUEUED)], runs)


class Autotuner:
    """Picks a `GemmConfig` per problem; see the module docstring for when it times."""

    def __init__(
        self, path: Path | None = None, timer: Timer | None = None, final: FinalTimer | None = None
    ) -> None:
        self._path = path
        self.timer = timer
        #: Times the FINALISTS fastest of the first round again (on cuda by default:
        #: `cuda_final_timer`; where `timer` is injected, only if `final` is too).
        self.final = final
        self._lock = threading.Lock()
        self._memo: dict[str, GemmConfig] = {}
        #: Number of candidate sweeps run (tests check that a cached choice is reused).
        self.sweeps = 0
        #: The config the last `choose` returned (reports name it beside their timings).
        self.last: GemmConfig | None = None
        #: Milliseconds the last sweep measured, per config: the first round's and, for the
        #: finalists, the median of their turns (None for the others). Empty where the last
        #: `choose` timed nothing (a cached or a default choice).
        self.last_times: dict[GemmConfig, tuple[float, float | None]] = {}

    @property
    def path(self) -> Path:
        return self._path or ct.profiling.cache_dir() / "autotune" / "gemm.json"

    def choose(
        self,
        key: TuneKey,
        options: Mapping[GemmConfig, GemmConfig],
        default: GemmConfig,
        make_launch: Callable[[GemmConfig], Launch],
    ) -> GemmConfig:
        """`options` maps each template to the config it runs as on this problem. The
        cached template for `key`, if one of `options`, runs as its config; else each
        distinct config is timed and the fastest runs (its template cached: another problem
        in the same bucket clamps it to its own sizes, not re-tuning). `default` where
        nothing is timed (no injected timer, not on cuda)."""
        timer, final = self.timer, self.final
        if timer is None:
            if ct.backend() != "cuda":
                self.last, self.last_times = default, {}
                return default
            timer, final = cuda_event_timer, final or cuda_final_timer
        text = key.text()
        with self._lock:
            hit = self._memo.get(text) or self._load().get(text)
            if hit is not None and hit in options:
                self._memo[text] = hit
                self.last, self.last_times = options[hit], {}
                return self.last
        self.sweeps += 1
        configs = sorted(set(options.values()))
        times = {cfg: timer(cfg, make_launch(cfg)) for cfg in configs}
        ranked = sorted(configs, key=lambda c: (times[c], c))
        final_times: dict[GemmConfig, float] = {}
        if final is not None and len(ranked) > 1:
            finalists = ranked[:FINALISTS]
            turns: dict[GemmConfig, list[float]] = {cfg: [] for cfg in finalists}
            for r in range(FINAL_ROUNDS):
                for cfg in finalists[r % len(finalists) :] + finalists[: r % len(finalists)]:
                    turns[cfg].append(final(cfg, make_launch))
            final_times = {cfg: sorted(ts)[len(ts) // 2] for cfg, ts in turns.items()}
            ranked = sorted(finalists, key=lambda c: (final_times[c], c))
        best = ranked[0]
        template = min(t for t, c in options.items() if c == best)
        with self._lock:
            self._memo[text] = template
            self._store(text, template)
        self.last = best
        self.last_times = {cfg: (times[cfg], final_times.get(cfg)) for cfg in configs}
        return best

    # -- the JSON file ----------------------------------------------------------------------
    def _load(self) -> dict[str, GemmConfig]:
        """The cached entries; a missing, unreadable or malformed file reads as empty."""
        try:
            raw: Any = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION:
            return {}
        out: dict[str, GemmConfig] = {}
        for name, v in dict(raw.get("entries", {})).items():
            if isinstance(v, list) and len(v) in (6, 7) and all(isinstance(x, int) for x in v):
                out[str(name)] = GemmConfig(*v)
        return out

    def _store(self, text: str, cfg: GemmConfig) -> None:
        """Merge one entry into the file: re-read (another process may have added entries),
        write a temporary file beside it and `os.replace` it in, so that readers see the old
        file or the new one, never half of one. An I/O error only warns: tuning still works."""
        entries = {k: c.astuple() for k, c in self._load().items()}
        entries[text] = cfg.astuple()
        path = self.path
        tmp = ""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump({"version": CACHE_VERSION, "entries": entries}, f, indent=1)
            os.replace(tmp, path)
        except OSError as e:
            if tmp:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            warnings.warn(f"gemm autotune cache {path} not written: {e}", RuntimeWarning, 2)


#: The tuner `gemm` and `bmm` use (tests replace it).
TUNER = Autotuner()
