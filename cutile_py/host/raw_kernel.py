"""`ct.RawKernel`: launching hand-written PTX, the explicit way out of the checked model.

A Tensor argument passes the address of its first element; a Python scalar is converted to
the type its `.param` declares. Tensors are held exclusively until the op completes; there
are no aliasing checks (the sim backend's memory checks still apply).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from cutile_py.host.device_op import DeviceOp
from cutile_py.host.errors import BorrowError, MovedError
from cutile_py.host.tensor import Partition, Tensor, take_hold
from cutile_py.ptx.ast import Param
from cutile_py.ptx.parser import parse
from cutile_py.runtime.backend import (
    Backend,
    BoundLaunch,
    Completion,
    ParamValue,
    PreparedLaunch,
    Touch,
)
from cutile_py.runtime.select import active_backend

_INTS = {f"{k}{w}": (k, w) for k in "usb" for w in (8, 16, 32, 64)}
_FLOATS = frozenset(["f16", "bf16", "f32", "f64"])


def _dim3(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, (int, np.integer)) else tuple(value)
    if not 1 <= len(dims) <= 3 or any(
        not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 1 for d in dims
    ):
        raise ValueError(f"{what} must be a positive int or 1 to 3 positive ints, got {value!r}")
    padded = (*(int(d) for d in dims), 1, 1)
    return (padded[0], padded[1], padded[2])


class RawKernel:
    """An `.entry` of hand-written PTX: `RawKernel(ptx, name)(*args, grid=, block=)`."""

    def __init__(self, ptx_text: str, name: str) -> None:
        module = parse(ptx_text)  # PtxParseError (a ValueError) names the line
        fn = module.functions.get(name)
        if fn is None or not fn.is_entry:
            have = ", ".join(n for n, f in module.functions.items() if f.is_entry) or "none"
            raise ValueError(f"the PTX has no .entry {name!r} (entries: {have})")
        self.ptx = ptx_text
        self.name = name
        self.params: tuple[Param, ...] = tuple(fn.params)
        #: Launches prepared on a backend, by (backend, grid, block, dynamic shared memory).
        self._prepared: dict[tuple[object, tuple[int, ...], tuple[int, ...], int], Any] = {}

    def prepared(
        self,
        backend: Backend,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
    ) -> PreparedLaunch:
        """This entry ready to launch on `backend` with that shape, made once (the launch path
        every kernel takes)."""
        key = (backend, grid, block, shared_mem)
        launch: PreparedLaunch | None = self._prepared.get(key)
        if launch is None:
            kernel = backend.load_kernel(self.ptx, self.name)
            ptypes = [p.ptype for p in self.params]
            launch = self._prepared[key] = backend.prepare(kernel, grid, block, shared_mem, ptypes)
        return launch

    def __call__(
        self,
        *args: Any,
        grid: int | Sequence[int],
        block: int | Sequence[int],
        shared_mem: int = 0,
    ) -> DeviceOp:
        if len(args) != len(self.params):
            raise TypeError(
                f"raw kernel {self.name} takes {len(self.params)} arguments "
                f"({', '.join(p.name for p in self.params)}), got {len(args)}"
            )
        if not isinstance(shared_mem, int) or shared_mem < 0:
            raise ValueError(f"shared_mem must be a non-negative int, got {shared_mem!r}")
        values = [self._param(p, a) for p, a in zip(self.params, args)]
        backend = active_backend()
        for p, a in zip(self.params, args):
            if isinstance(a, Tensor):
                try:
                    a._check_usable("pass it to a launch")
                    a._check_aliases("pass it to a launch", exclusive=True)
                except BorrowError as e:
                    kind = MovedError if isinstance(e, MovedError) else BorrowError
                    raise kind(f"raw kernel {self.name}, parameter '{p.name}': {e}") from None
                if a.backend is not backend:
                    raise ValueError(
                        f"raw kernel {self.name}, parameter '{p.name}': the tensor lives on the "
                        f"{a.device} backend but the active backend is {backend.name}"
                    )
        op = RawKernelOp(
            backend,
            self,
            tuple(args),
            values,
            _dim3(grid, "grid"),
            _dim3(block, "block"),
            shared_mem,
        )
        op._acquire()
        return op

    def _param(self, p: Param, a: Any) -> ParamValue:
        where = f"raw kernel {self.name}, parameter '{p.name}' (.{p.ptype})"
        if p.count != 1:
            raise TypeError(f"{where}: array parameters cannot be passed from Python")
        if isinstance(a, Partition):
            raise TypeError(f"{where}: pass a Tensor (unpartition the partition first)")
        if isinstance(a, Tensor):
            if _INTS.get(p.ptype, ("", 0))[1] != 64:
                raise TypeError(f"{where}: a Tensor passes a 64-bit address; declare .u64")
            return ParamValue(p.ptype, a.buffer.address)
        if isinstance(a, (bool, np.bool_)):
            a = int(a)
        if isinstance(a, np.integer):
            a = int(a)
        if isinstance(a, np.floating):
            a = float(a)
        if p.ptype in _FLOATS:
            if not isinstance(a, (int, float)):
                raise TypeError(f"{where}: expected a number, got {type(a).__name__}")
            return ParamValue(p.ptype, float(a))
        if p.ptype in _INTS:
            if not isinstance(a, int):
                raise TypeError(f"{where}: expected an int, got {type(a).__name__}")
            kind, width = _INTS[p.ptype]
            lo = 0 if kind == "u" else -(1 << (width - 1))
            hi = (1 << (width - 1)) if kind == "s" else (1 << width)
            if not lo <= a < hi:
                raise ValueError(f"{where}: {a} is out of range")
            return ParamValue(p.ptype, a)
        raise TypeError(f"{where}: parameters of type .{p.ptype} are not supported")


class RawKernelOp(DeviceOp):
    """A pending launch of a RawKernel; holds every Tensor argument exclusively."""

    def __init__(
        self,
        backend: Backend,
        raw: RawKernel,
        args: tuple[Any, ...],
        values: list[ParamValue],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
    ) -> None:
        self._setup(backend, raw.name, args, grid)
        self.raw = raw
        self.values = values
        self.block = block
        self.shared_mem = shared_mem

    def _acquire(self) -> None:
        for a in self.args:
            if isinstance(a, Tensor) and not any(h is a for h, _ in self._holds()):
                self._held = [*self._holds(), take_hold(self, a, exclusive=True)]

    def _launch_now(self) -> tuple[PreparedLaunch, list[int | float | bytes], list[Touch]]:
        """The prepared launch, the parameter values and the memory it touches (hand-written
        PTX may write any tensor it is given)."""
        g = self.grid
        launch = self.raw.prepared(self.backend, (g[0], g[1], g[2]), self.block, self.shared_mem)
        values = [v.value for v in self.values]
        touches = [(a._address, a._nbytes, True) for a in self.args if type(a) is Tensor]
        return launch, values, touches

    def _bound(self) -> BoundLaunch:
        launch, values, _ = self._launch_now()
        return BoundLaunch(launch, tuple(values))

    def _start(self, stream: object | None = None, wait: bool = False) -> Completion:
        launch, values, touches = self._launch_now()
        return launch.start(values, stream, touches, wait)

    def _run(self, stream: object | None, wait: bool = True) -> None:
        launch, values, touches = self._launch_now()
        (launch.launch_and_wait if wait else launch.queue)(values, stream, touches)

    def param_names(self) -> list[str]:
        return [p.name for p in self.raw.params]

    def describe(self) -> str:
        return f"launch of raw kernel {self.name}"
