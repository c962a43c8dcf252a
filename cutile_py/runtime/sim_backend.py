"""The `sim` backend: the compiled PTX executed on the CPU by `cutile_py.sim`, with its
memory checks (bounds, alignment, shared-memory races, divergent barriers).

Memory is host memory (HostBuffer) registered with the simulator's global memory, so a kernel
may touch exactly the live allocations. Launches run synchronously; a fault surfaces when the
launch is waited on, as a LaunchFailure carrying the simulator's message.
"""

from __future__ import annotations

import hashlib
import os
import threading
import weakref
from collections.abc import Mapping, Sequence

import numpy as np

from cutile_py.ptx.ast import Module
from cutile_py.ptx.parser import PtxParseError, parse
from cutile_py.ptx.target import Target
from cutile_py.runtime.backend import (
    HOST_EXECUTION,
    Backend,
    Buffer,
    Completion,
    Finished,
    HostBuffer,
    LaunchFailure,
    LoadedKernel,
    ParamValue,
    RuntimeFailure,
    Touch,
)
from cutile_py.sim.context import SimError
from cutile_py.sim.counters import Measurement, measure
from cutile_py.sim.executor import Options, Stats, check_launch, run
from cutile_py.sim.memory import GlobalMemory
from cutile_py.sim.program import ModuleGlobals, Program, Semantics
from cutile_py.sim.tensor_map import encode_tiled


def race_check_default() -> bool:
    """On unless `CUTILE_PY_SIM_RACECHECK=0` (the check costs time only on shared memory)."""
    return os.environ.get("CUTILE_PY_SIM_RACECHECK", "1").strip() not in ("0", "false", "no")


#: The simulated device's SMs (`SimBackend.sm_count`).
SIM_SMS = 3


class SimKernel(LoadedKernel):
    def __init__(self, name: str, program: Program) -> None:
        self.name = name
        self.program = program


class SimBackend(Backend):
    """Runs PTX on the CPU. `options` tune batching and the race check (see sim.executor)."""

    name = "sim"
    runs_ptx = True
    executes_on_host = True

    def __init__(
        self,
        target: Target | None = None,
        options: Options | None = None,
        instructions: Mapping[str, Semantics] | None = None,
    ) -> None:
        self._target = target or Target(80)
        self.options = options or Options(race_check=race_check_default())
        # None: cutile_py.sim.semantics; tests may pass a smaller table.
        self.instructions = instructions
        #: What the last launch executed (steps, thread-instructions): for speed reports.
        self.last_stats: Stats | None = None
        self.memory = GlobalMemory()
        self._modules: dict[str, Module] = {}
        self._kernels: dict[tuple[str, str], SimKernel] = {}
        self._globals: dict[str, ModuleGlobals] = {}
        self._lock = threading.Lock()
        #: Releases of memory made while a launch held the memory map (see `_release`).
        self._due: list[int] = []
        #: SMs the simulated device has, one block each: few, so that a persistent grid
        #: gives each block several tiles (`resident_blocks`).
        self.sm_count = SIM_SMS

    @property
    def target(self) -> Target:
        # The simulator executes sm_80 and sm_90 PTX alike; this is what the compiler targets.
        return self._target

    # --- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Buffer:
        return self._addressable(HostBuffer(nbytes), "allocation")

    def borrow_host(self, data: np.ndarray) -> Buffer:
        return self._addressable(HostBuffer.over(data), "borrowed host array")

    def _addressable(self, buf: HostBuffer, name: str) -> HostBuffer:
        """Let launches reach `buf` while it lives. Other buffers may view the same memory
        (two tensors borrowing one array, a re-import of an exported tensor): the memory stays
        addressable until the last of them is gone."""
        if buf.nbytes:
            with HOST_EXECUTION:  # not while a launch in a worker thread reads the map
                self._release_due()
                self.memory.acquire(buf.bytes, name)
            weakref.finalize(buf, self._release, buf.address)
        return buf

    def _release(self, address: int) -> None:
        """End a buffer's hold on the memory map, or, where a launch holds the map now (in a
        worker thread), leave it to that launch's end: a garbage collection anywhere (the
        event loop's thread) never waits for a launch. The map keeps the bytes meanwhile, and
        no launch uses the memory of a buffer already collected."""
        if not HOST_EXECUTION.acquire(blocking=False):
            self._due.append(address)  # (atomic: the launch's thread may pop meanwhile)
            return
        try:
            self._release_due()
            self.memory.release(address)
        finally:
            HOST_EXECUTION.release()

    def _release_due(self) -> None:
        """The releases left to this thread's hold of HOST_EXECUTION (the caller holds it)."""
        due = self._due
        while due:
            self.memory.release(due.pop())

    def upload(self, buf: Buffer, data: np.ndarray) -> None:
        if not isinstance(buf, HostBuffer):
            raise TypeError(f"the sim backend cannot write to a {type(buf).__name__}")
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        if raw.size > buf.nbytes:
            raise ValueError(f"{raw.size} bytes do not fit a {buf.nbytes}-byte buffer")
        buf.bytes[: raw.size] = raw

    def tensor_map(
        self,
        dtype: int,
        address: int,
        dims: tuple[int, ...],
        strides: tuple[int, ...],
        box: tuple[int, ...],
        swizzle: int,
    ) -> bytes:
        """The simulator's own encoding (`sim.tensor_map.encode_tiled`), which its
        `cp.async.bulk.tensor` decodes."""
        return encode_tiled(dtype, address, dims, strides, box, swizzle)

    def download(self, buf: Buffer, nbytes: int) -> np.ndarray:
        if not isinstance(buf, HostBuffer):
            raise TypeError(f"the sim backend cannot read from a {type(buf).__name__}")
        if nbytes > buf.nbytes:
            raise ValueError(f"cannot read {nbytes} bytes from a {buf.nbytes}-byte buffer")
        out: np.ndarray = np.array(buf.bytes[:nbytes], dtype=np.uint8)
        return out

    # --- kernels ------------------------------------------------------------------------------
    def load_kernel(self, ptx: str, name: str) -> SimKernel:
        """Parse once per PTX text; every opcode is checked here (an error names its line)."""
        key = hashlib.sha256(ptx.encode()).hexdigest()
        with self._lock:
            kernel = self._kernels.get((key, name))
            if kernel is not None:
                return kernel
            module = self._modules.get(key)
            if module is None:
                try:
                    module = self._modules[key] = parse(ptx)
                except PtxParseError as e:
                    raise RuntimeFailure(f"the simulator cannot parse the PTX: {e}") from e
            globals_ = self._globals.get(key)
            if globals_ is None:
                globals_ = self._globals[key] = ModuleGlobals(module, self.memory)
            try:
                program = Program(module, name, self.memory, self.instructions, globals_)
            except SimError as e:
                raise RuntimeFailure(f"the simulator cannot load kernel {name!r}: {e}") from e
            kernel = self._kernels[(key, name)] = SimKernel(name, program)
            return kernel

    def resident_blocks(self, kernel: LoadedKernel, threads: int, shared_mem: int) -> int:
        return self.sm_count

    def launch(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        params: Sequence[ParamValue],
        stream: object | None = None,
        touches: Sequence[Touch] | None = None,
    ) -> Completion:
        # Every launch runs to the end here, so streams need no ordering.
        if not isinstance(kernel, SimKernel):
            raise TypeError(f"the sim backend cannot launch a {type(kernel).__name__}")
        with HOST_EXECUTION:  # (held already where a launcher called: reentrant)
            try:
                return self._launch(kernel, grid, block, shared_mem, params)
            finally:
                self._release_due()  # what was collected while this launch held the map

    def _launch(
        self,
        kernel: SimKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        params: Sequence[ParamValue],
    ) -> Completion:
        values = [(p.ptype, p.value) for p in params]
        try:
            check_launch(kernel.program, grid, block, shared_mem, self._target.max_shared_bytes)
            kernel.program.pack_params(values)
        except SimError as e:
            raise RuntimeFailure(str(e)) from e
        try:
            self.last_stats = run(
                kernel.program,
                self.memory,
                grid,
                block,
                shared_mem,
                values,
                self.options,
                self._target.max_shared_bytes,
            )
        except SimError as e:
            failure = LaunchFailure(str(e))
            failure.__cause__ = e
            return Finished(failure)
        return Finished()

    def measure(
        self,
        kernel: LoadedKernel,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        params: Sequence[ParamValue],
        regions: Sequence[tuple[int, int]],
        max_blocks: int = 256,
    ) -> Measurement:
        """Run `kernel` as `launch` would, counting its memory traffic (see `sim.counters`):
        every block, or `max_blocks` of them from the two ends of a larger grid."""
        if not isinstance(kernel, SimKernel):
            raise TypeError(f"the sim backend cannot measure a {type(kernel).__name__}")
        values = [(p.ptype, p.value) for p in params]
        try:
            return measure(kernel.program, self.memory, grid, block, shared_mem, values, regions,
                           max_blocks, self._target.max_shared_bytes)  # fmt: skip
        except SimError as e:
            raise LaunchFailure(str(e)) from e
