"""Choosing the active backend: `CUTILE_PY_BACKEND`, `set_backend`, or what the machine has."""

from __future__ import annotations

import os

from cutile_py.runtime.backend import Backend, InterpretBackend

BACKEND_NAMES = ("cuda", "sim", "interpret")
_instances: dict[str, Backend] = {}
_active: str | None = None


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
    if name not in _instances:
        _instances[name] = _create(name)
    return _instances[name]


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


def set_backend(name: str) -> None:
    """Make `name` the active backend (tensors made before stay on theirs)."""
    global _active
    get_backend(name)  # raises if unavailable
    _active = name
