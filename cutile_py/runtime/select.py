"""Choosing the active backend: `CUTILE_PY_BACKEND`, `set_backend`, or what the machine has."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from cutile_py.ptx.target import Target, parse_target
from cutile_py.runtime.backend import Backend, InterpretBackend

BACKEND_NAMES = ("cuda", "sim", "interpret")
#: Backends by key: the name, or "sim:sm_90" for a simulator of a target other than sm_80
#: (each its own memory: tensors stay on the backend they were made on).
_instances: dict[str, Backend] = {}
_active: str | None = None
#: What the simulator is, unless `set_backend("sim", target=...)` says otherwise.
SIM_DEFAULT_TARGET = Target(80)


def _create(name: str) -> Backend:
    if name == "cuda":
        from cutile_py.runtime.cuda_backend import CudaBackend
        from cutile_py.runtime.cuda_driver import driver_available

        if not driver_available():
            raise ValueError(
                "the cuda backend needs an NVIDIA GPU and driver; none was found "
                "(use 'sim' or 'interpret' on this machine)"
            )
        return CudaBackend()
    if name == "sim":
        from cutile_py.runtime.sim_backend import SimBackend

        return SimBackend()
    if name == "interpret":
        return InterpretBackend()
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")


def get_backend(name: str) -> Backend:
    """The backend of key `name` ("sim:sm_90" is a simulator of sm_90), made at first use."""
    if name not in _instances:
        base, _, target = name.partition(":")
        if target:
            from cutile_py.runtime.sim_backend import SimBackend

            assert base == "sim", name
            _instances[name] = SimBackend(parse_target(target))
        else:
            _instances[name] = _create(name)
    return _instances[name]


def _key(name: str, target: Target | str | int | None) -> str:
    """The instance key of `set_backend(name, target=target)`."""
    if target is None:
        return name
    if name != "sim":
        raise ValueError(
            f"set_backend({name!r}, target={target!r}): only the 'sim' backend takes a "
            "target (cuda compiles for its device; interpret runs no PTX)"
        )
    call = f"set_backend('sim', target={target!r})"
    t = target if isinstance(target, Target) else parse_target(target, call)
    if t != Target(t.sm):  # the instance key is the name: sm_90 stands for Target(90) alone
        raise ValueError(f"{call}: only a plain Target(sm) or its name is simulated")
    return "sim" if t == SIM_DEFAULT_TARGET else f"sim:{t.name}"


def default_backend_name() -> str:
    """`CUTILE_PY_BACKEND` if set; else cuda where a GPU is found; else sim (the compiled
    PTX on the CPU; `interpret` stays selectable)."""
    env = os.environ.get("CUTILE_PY_BACKEND", "").strip()
    if env:
        if env not in BACKEND_NAMES:
            raise ValueError(f"CUTILE_PY_BACKEND={env!r} is not one of {', '.join(BACKEND_NAMES)}")
        return env
    from cutile_py.runtime.cuda_driver import driver_available

    return "cuda" if driver_available() else "sim"


def active_backend() -> Backend:
    global _active
    backend = _instances.get(_active)  # type: ignore[arg-type]  # (every launch asks)
    if backend is not None:
        return backend
    if _active is None:
        _active = default_backend_name()
    return get_backend(_active)


def set_backend(name: str, *, target: Target | str | int | None = None) -> None:
    """Make `name` the active backend (tensors made before stay on theirs). `target` (sim
    only, e.g. "sm_90") is the device the simulator is: kernels compile for it, and its
    limits (shared memory per block) apply; default sm_80."""
    global _active
    if name not in BACKEND_NAMES:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")
    key = _key(name, target)
    get_backend(key)  # raises if unavailable
    _active = key


def install(name: str, backend: Backend) -> None:
    """Make `backend` the instance of `name` and the active backend: a stand-in (a cuda
    backend over a driver that returns at once) or a simulator with its own options. Undo
    with `restored`."""
    global _active
    _instances[name] = backend
    _active = name


@contextlib.contextmanager
def restored() -> Iterator[None]:
    """Meanwhile backends may be installed or set; afterwards the instances and the active
    backend from before are back."""
    global _active
    saved, active = dict(_instances), _active
    try:
        yield
    finally:
        _instances.clear()
        _instances.update(saved)
        _active = active
