"""The disk side of the JIT cache: a process-independent key for a specialization, and a
compiled kernel's lowered form as plain data (see `cutile_py.runtime.disk_cache`).

The in-memory key (`kernel.CacheKey`) holds objects, and user functions, modules and other
objects by identity: fine within a process, meaningless in the next. The disk key is built from
a stable textual form of the same things instead: the kernel's source hash and qualname, the
specialization (dtypes by name, floats by their bits), the values of the names and module
attributes the kernel reads (`CapturedFunction.reads`; helper functions by their source hash
and, recursively, what they read), the target, the kernel's options (fast_math, stages) and the
compiler version. A value with no stable form (an arbitrary object) makes the kernel uncacheable
on disk; it still compiles and caches in memory.

What a payload says is checked before use: the parameter map (which argument each `.param`
carries) is recomputed from the specialization (`param_map`), never taken from disk.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import types
from typing import Any, TypeVar

from cutile_py.frontend.build_ir import ir_params
from cutile_py.frontend.capture import CapturedFunction, capture_helper, float_bits
from cutile_py.frontend.errors import CompileError
from cutile_py.frontend.signature import Specialization
from cutile_py.lower.emit_ptx import PtxParam, entry_name, entry_params
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.ptx.target import Target

#: Bumped when the payload's layout changes (independently of the compiler version).
FORMAT = 3  # 2: dynamic_shared; 3: tensor-map parameters (box, swizzle, data type)


class Unstable(Exception):
    """A value that has no process-independent form."""


def _qual(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"


def stable_form(value: Any, seen: set[int] | None = None) -> Any:
    """A JSON-able, process-independent description of `value`; `Unstable` if there is none.

    Equal forms mean "compiles the same" for everything a kernel key holds: plain values,
    tuples, enums, dataclasses (field by field), classes (dtypes, by qualified name), TypeVars,
    modules (by name), cutile_py's own functions (by name: the compiler version covers them)
    and user functions and kernels (by source hash and the stable form of what they read).
    """
    seen = set() if seen is None else seen
    if value is None or isinstance(value, (bool, int, str)):
        return [type(value).__name__, value]
    if isinstance(value, float):
        return ["float", float_bits(value)]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, [stable_form(v, seen) for v in value]]
    if isinstance(value, (frozenset, set)):
        items = sorted(json.dumps(stable_form(v, seen), sort_keys=True) for v in value)
        return ["set", items]
    if isinstance(value, enum.Enum):
        return ["enum", _qual(type(value)), value.name]
    if isinstance(value, TypeVar):
        return ["typevar", value.__name__]
    if isinstance(value, type):
        return ["type", _qual(value)]
    if isinstance(value, types.ModuleType):
        return ["module", value.__name__]
    if dataclasses.is_dataclass(value):
        fields = [
            [f.name, stable_form(getattr(value, f.name), seen)] for f in dataclasses.fields(value)
        ]
        return ["dataclass", _qual(type(value)), fields]
    captured = getattr(value, "captured", None)
    if isinstance(captured, CapturedFunction):  # another @ct.kernel
        return ["kernel", _qual(value), *_function_form(captured, seen)]
    module = getattr(value, "__module__", None) or ""
    if module == "cutile_py" or module.startswith("cutile_py."):
        return ["cutile_py", _qual(value)]
    if isinstance(value, types.FunctionType):
        try:
            cap = capture_helper(value)
        except CompileError as e:
            raise Unstable(f"cannot read the source of {_qual(value)}") from e
        return ["function", _qual(value), *_function_form(cap, seen)]
    raise Unstable(f"no stable form for {type(value).__name__} {value!r:.60}")


def _function_form(cap: CapturedFunction, seen: set[int]) -> list[Any]:
    if id(cap.fn) in seen:
        return ["recursive"]
    seen.add(id(cap.fn))
    try:
        return [cap.source_hash, stable_deps(cap, seen)]
    finally:
        seen.discard(id(cap.fn))


def stable_deps(cap: CapturedFunction, seen: set[int] | None = None) -> list[Any]:
    """The stable form of the values of the names and module attributes `cap`'s body reads
    from outside (the same reads as `CapturedFunction.fingerprint`)."""
    seen = set() if seen is None else seen
    return [[list(path), stable_form(value, seen)] for path, value in cap.reads()]


def disk_key(
    *,
    captured: CapturedFunction,
    qualname: str,
    spec: Any,
    target: Target,
    fast_math: bool,
    compiler: str,
    stages: int | None = None,
    num_warps: int | None = None,
    group_m: int | None = None,
    warp_specialize: bool = False,
    persistent: bool = False,
) -> str | None:
    """The hex key of a specialization's PTX on disk, or None if some part has no stable form."""
    try:
        parts = {
            "format": FORMAT,
            "compiler": compiler,
            "source": captured.source_hash,
            "qualname": qualname,
            "spec": stable_form(spec),
            "deps": stable_deps(captured),
            "target": target.sm,
            # The lowering plans shared memory (pipeline stages, operand tiles) to this limit.
            "max_shared": target.max_shared_bytes,
            "fast_math": fast_math,
            "stages": stages,
        }
        if num_warps is not None:  # absent otherwise: earlier entries keep their keys
            parts["num_warps"] = num_warps
        if group_m is not None:
            parts["group_m"] = group_m
        if warp_specialize:
            parts["warp_specialize"] = True
        if persistent:
            parts["persistent"] = True
        if target.wgmma:  # whether the lowering may emit sm_90a's wgmma
            parts["wgmma"] = True
    except (Unstable, RecursionError):
        return None
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def encode(lowered: LoweredKernel, ir_text: str) -> bytes:
    """A lowered kernel and its printed IR as the bytes of a disk entry."""
    data = {
        "format": FORMAT,
        "ptx": lowered.ptx,
        "entry": lowered.entry,
        "block_threads": lowered.block_threads,
        "params": [
            [p.arg, p.what, p.axis, p.ptype, list(p.box), p.swizzle, p.map_dtype]
            for p in lowered.params
        ],
        "target": lowered.target.sm,
        "arch_specific": lowered.target.arch_specific,
        "dynamic_shared": lowered.dynamic_shared,
        "ir_text": ir_text,
    }
    return json.dumps(data, separators=(",", ":")).encode()


def param_map(spec: Specialization) -> tuple[PtxParam, ...]:
    """Which argument each `.param` of a specialization's entry carries, derived from its
    signature exactly as the compiler derives it (never read from disk)."""
    return entry_params(ir_params(spec))


def mismatch(lowered: LoweredKernel, name: str, spec: Specialization, target: Target) -> str | None:
    """Why a lowered kernel read from disk is not one the compiler would have made for this
    kernel `name`, specialization and target (None if nothing says so)."""
    if lowered.target.sm != target.sm or lowered.target.wgmma != target.wgmma:
        return f"it was compiled for {lowered.target.describe()}, not {target.describe()}"
    if lowered.entry != entry_name(name):
        return f"its entry is {lowered.entry!r}, not {entry_name(name)!r}"
    # The signature's parameters, then the tensor maps its TMA pipelines read (planned) and
    # a persistent kernel's grid.
    expected = param_map(spec)
    head, maps = lowered.params[: len(expected)], lowered.params[len(expected) :]
    if head != expected or any(p.what not in ("tmap", "grid") for p in maps):
        return "its parameter map does not match the kernel's signature"
    return None


def decode(payload: bytes) -> tuple[LoweredKernel, str] | None:
    """The inverse of `encode`; None if the payload is not one (the caller recompiles)."""
    try:
        data = json.loads(payload)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return None
        ptx, entry, ir_text = data["ptx"], data["entry"], data["ir_text"]
        threads, sm, dynamic = data["block_threads"], data["target"], data["dynamic_shared"]
        if not (isinstance(ptx, str) and isinstance(entry, str) and isinstance(ir_text, str)):
            return None
        if not (isinstance(threads, int) and isinstance(sm, int) and isinstance(dynamic, int)):
            return None
        params = []
        for arg, what, axis, ptype, box, swizzle, map_dtype in data["params"]:
            if not all(isinstance(x, int) for x in (arg, axis, swizzle, map_dtype, *box)):
                return None
            if not (isinstance(what, str) and isinstance(ptype, str)):
                return None
            params.append(PtxParam(arg, what, axis, ptype, tuple(box), swizzle, map_dtype))
        arch_specific = data.get("arch_specific", True)
        if not isinstance(arch_specific, bool):
            return None
        target = Target(sm, arch_specific=arch_specific)
        lowered = LoweredKernel(ptx, entry, threads, tuple(params), target, dynamic)
        return lowered, ir_text
    except (ValueError, TypeError, KeyError, RecursionError):
        return None
