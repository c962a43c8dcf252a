"""Kernel parameters from their annotations, and binding launch arguments to a specialization.

A `Specialization` is the frozen, hashable set of facts that the generated code depends on:
dtypes, ranks, tile shapes, static dims, vector alignment and constant values.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from cutile_py.frontend.capture import CapturedFunction, float_bits
from cutile_py.ir.dtypes import DType, bool_, f32, i32, is_dtype
from cutile_py.language.annotations import Atomic, Constant, Dyn, Mut, is_tensor_class

Kind = Literal["partition", "tensor", "atomic", "scalar", "constant"]
#: A dim of a tensor annotation: ("dyn", None), ("var", "B") or ("lit", 64).
Dim = tuple[str, Any]
SCALAR_TYPES: dict[type, type[DType]] = {int: i32, float: f32, bool: bool_}
#: Shared (read-only) and Atomic tensors may have rank 4 (attention's (B, H, S, D)); Mut
#: partitions stay at rank 3 at most: their grid is the launch grid.
MAX_TENSOR_RANK = 4
MAX_PARTITION_RANK = 3
#: Vector widths never exceed 16 elements; alignment is tracked up to that.
MAX_ALIGN = 16


@dataclass(frozen=True)
class ParamSpec:
    name: str
    kind: Kind
    #: None where the annotation's dtype is a TypeVar (`dtype_var`), bound at launch.
    dtype: type[DType] | None
    dims: tuple[Dim, ...] = ()
    py_type: type | None = None  # for scalars and constants
    dtype_var: str | None = None
    #: The dtypes a constrained `dtype_var` may take (`TypeVar("H", f16, bf16)`); () for any.
    dtype_allowed: tuple[type[DType], ...] = ()


@dataclass(frozen=True)
class TensorArg:
    """What the frontend needs to know of a tensor or partition argument."""

    dtype: type[DType]
    shape: tuple[int, ...]
    tile_shape: tuple[int, ...] | None  # set for a Partition
    #: Elements (a power of two, at most 16) that the start address is aligned to; our own
    #: allocations are 256-byte aligned, borrowed views may not be.
    base_align: int = MAX_ALIGN


@dataclass(frozen=True)
class BoundParam:
    spec: ParamSpec
    dtype: type[DType]
    rank: int = 0
    tile_shape: tuple[int, ...] | None = None
    static_dims: tuple[int | None, ...] = ()
    #: Largest power of two (≤ 16) dividing the tensor's last dim: the widest aligned vector.
    align: int = 1
    #: For a shared tensor: the Mut parameters (by index) whose tensors it covers, dim by dim
    #: at least as long, so that a tile of it inside their edge is inside its own
    #: (`cutile_py.lower.plan_padding`).
    covers: tuple[int, ...] = ()
    #: For constants. Compared through `value_key`: 0.0 and -0.0 compile differently, and a
    #: NaN must equal itself for its compiled code to be found again.
    value: int | float | bool | None = field(default=None, compare=False)
    value_key: tuple[str, int] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        v = self.value
        key = (
            None
            if v is None
            else (type(v).__name__, float_bits(v) if isinstance(v, float) else int(v))
        )
        object.__setattr__(self, "value_key", key)


@dataclass(frozen=True)
class Specialization:
    params: tuple[BoundParam, ...]
    typevars: tuple[tuple[str, int], ...]
    #: The dtype TypeVars (`Tensor[T, ...]`) and the dtypes this launch bound them to.
    dtypevars: tuple[tuple[str, type[DType]], ...] = ()

    def typevar(self, name: str) -> int | type[DType] | None:
        """The value of TypeVar `name` in this launch: a dim's size or a dtype."""
        for k, v in self.typevars:
            if k == name:
                return v
        for k, d in self.dtypevars:
            if k == name:
                return d
        return None


def _fail(kernel: str, param: str, message: str, exc: type[Exception] = TypeError) -> Exception:
    return exc(f"kernel {kernel}, parameter '{param}': {message}")


def parse_signature(cap: CapturedFunction) -> tuple[ParamSpec, ...]:
    """Read the parameter annotations (evaluating string annotations in the kernel's scope)."""
    sig = inspect.signature(cap.fn)
    names = cap.visible_names()
    specs = []
    for p in sig.parameters.values():
        node = next((a for a in cap.tree.args.args if a.arg == p.name), cap.tree)
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            raise cap.error(
                node,
                f"parameter '{p.name}': *args, **kwargs and keyword-only "
                "parameters are not supported in kernels",
            )
        ann = p.annotation
        if ann is inspect.Parameter.empty:
            raise cap.error(
                node,
                f"parameter '{p.name}' needs a type annotation "
                "(Mut[Tensor[...]], Tensor[...], int, float, bool or ct.Constant[...])",
            )
        if isinstance(ann, str):
            try:
                ann = eval(ann, names)  # annotations are the kernel author's own code
            except Exception as e:
                raise cap.error(node, f"cannot evaluate the annotation of '{p.name}': {e}") from e
        specs.append(_param_spec(cap, node, p.name, ann))
    _check_typevar_roles(cap, specs)
    return tuple(specs)


def _check_typevar_roles(cap: CapturedFunction, specs: list[ParamSpec]) -> None:
    """A TypeVar names either a dtype or a dim, never both (its one value is one or the other)."""
    dim_vars = {v: s.name for s in specs for k, v in s.dims if k == "var"}
    dim_vars.update({s.name: s.name for s in specs if s.kind == "constant"})
    for s in specs:
        if s.dtype_var is not None and s.dtype_var in dim_vars:
            node = next((a for a in cap.tree.args.args if a.arg == s.name), cap.tree)
            raise cap.error(
                node,
                f"parameter '{s.name}': TypeVar {s.dtype_var} is its dtype here but a dim "
                f"of '{dim_vars[s.dtype_var]}'; use one TypeVar per role",
            )


def _param_spec(cap: CapturedFunction, node: Any, name: str, ann: Any) -> ParamSpec:
    origin = typing.get_origin(ann)
    if origin is Mut:
        (inner,) = typing.get_args(ann)
        dtype, dims = _tensor_dims(cap, node, name, inner)
        if any(k == "dyn" for k, _ in dims):
            raise cap.error(
                node,
                f"parameter '{name}': the dims of a Mut tile must be static "
                "(a TypeVar or Literal[n]), not Dyn",
            )
        if len(dims) > MAX_PARTITION_RANK:
            raise cap.error(
                node,
                f"parameter '{name}': Mut tiles have rank 1 to {MAX_PARTITION_RANK} (the "
                f"launch grid's), not {len(dims)}; reshape the output tensor first",
            )
        return _tensor_spec(name, "partition", dtype, dims)
    if origin is Atomic:
        (inner,) = typing.get_args(ann)
        if not (is_tensor_class(typing.get_origin(inner)) or is_tensor_class(inner)):
            raise cap.error(node, f"parameter '{name}': write Atomic[Tensor[dtype, Dyn, ...]]")
        dtype, dims = _tensor_dims(cap, node, name, inner)
        return _tensor_spec(name, "atomic", dtype, dims)
    if is_tensor_class(origin) or is_tensor_class(ann):
        dtype, dims = _tensor_dims(cap, node, name, ann)
        return _tensor_spec(name, "tensor", dtype, dims)
    if origin is Constant:
        (t,) = typing.get_args(ann)
        if t not in SCALAR_TYPES:
            raise cap.error(node, f"parameter '{name}': Constant takes int, float or bool")
        return ParamSpec(name, "constant", SCALAR_TYPES[t], py_type=t)
    if ann in SCALAR_TYPES:
        return ParamSpec(name, "scalar", SCALAR_TYPES[ann], py_type=ann)
    raise cap.error(node, f"parameter '{name}': unsupported annotation {ann!r}")


def _tensor_spec(
    name: str, kind: Kind, dtype: type[DType] | typing.TypeVar, dims: tuple[Dim, ...]
) -> ParamSpec:
    if isinstance(dtype, typing.TypeVar):
        allowed = tuple(c for c in dtype.__constraints__ if is_dtype(c))
        return ParamSpec(name, kind, None, dims, dtype_var=dtype.__name__, dtype_allowed=allowed)
    return ParamSpec(name, kind, dtype, dims)


def _tensor_dims(
    cap: CapturedFunction, node: Any, name: str, ann: Any
) -> tuple[type[DType] | typing.TypeVar, tuple[Dim, ...]]:
    """The dtype (a DType or a TypeVar bound at launch) and dims of `Tensor[dtype, dims...]`."""
    args = typing.get_args(ann)
    if not args or not (is_dtype(args[0]) or isinstance(args[0], typing.TypeVar)):
        raise cap.error(
            node,
            f"parameter '{name}': write Tensor[dtype, dim, ...], e.g. Tensor[f32, Dyn] "
            "(the dtype may be a TypeVar, bound at launch)",
        )
    var = args[0]
    if isinstance(var, typing.TypeVar) and not all(map(is_dtype, var.__constraints__)):
        names = ", ".join(getattr(c, "__name__", repr(c)) for c in var.__constraints__)
        raise cap.error(
            node,
            f"parameter '{name}': TypeVar {var.__name__} is constrained to {names}; a dtype "
            "TypeVar's constraints must be dtypes, e.g. TypeVar('H', ct.f16, ct.bf16)",
        )
    dims: list[Dim] = []
    for d in args[1:]:
        if d is Dyn:
            dims.append(("dyn", None))
        elif isinstance(d, typing.TypeVar):
            dims.append(("var", d.__name__))
        elif typing.get_origin(d) is Literal and isinstance(typing.get_args(d)[0], int):
            dims.append(("lit", int(typing.get_args(d)[0])))
        else:
            raise cap.error(
                node, f"parameter '{name}': a dim must be Dyn, a TypeVar or Literal[n], not {d!r}"
            )
    if not 1 <= len(dims) <= MAX_TENSOR_RANK:
        raise cap.error(
            node,
            f"parameter '{name}': tensors of rank 1 to {MAX_TENSOR_RANK} are supported, "
            f"not {len(dims)}",
        )
    return args[0], tuple(dims)


def _align(n: int) -> int:
    a = 1
    while a < MAX_ALIGN and n % (a * 2) == 0:
        a *= 2
    return a


def bind(kernel: str, specs: tuple[ParamSpec, ...], args: tuple[Any, ...]) -> Specialization:
    """Check launch arguments against the parameters; TypeError/ValueError name the parameter.

    `args` holds a `TensorArg` for tensors and partitions and the Python value for scalars.
    """
    typevars: dict[str, int] = {}
    where: dict[str, str] = {}

    def bind_var(var: str, value: int, param: str) -> None:
        if var in typevars and typevars[var] != value:
            raise _fail(
                kernel,
                param,
                f"dim {var} = {value} disagrees with {var} = "
                f"{typevars[var]} bound by '{where[var]}'",
                ValueError,
            )
        typevars.setdefault(var, value)
        where.setdefault(var, param)

    dtypevars: dict[str, type[DType]] = {}
    # Bind TypeVars from partitions and constants first, then check every use.
    for spec, arg in zip(specs, args):
        if spec.dtype_var is not None and isinstance(arg, TensorArg):
            var = spec.dtype_var
            if spec.dtype_allowed and arg.dtype not in spec.dtype_allowed:
                names = ", ".join(d.name for d in spec.dtype_allowed)
                raise _fail(
                    kernel,
                    spec.name,
                    f"dtype {var} = {arg.dtype.name} is not one of {var}'s dtypes: {names}",
                )
            if var in dtypevars and dtypevars[var] is not arg.dtype:
                raise _fail(
                    kernel,
                    spec.name,
                    f"dtype {var} = {arg.dtype.name} disagrees with {var} = "
                    f"{dtypevars[var].name} bound by '{where[var]}'",
                )
            dtypevars.setdefault(var, arg.dtype)
            where.setdefault(var, spec.name)
        if spec.kind == "partition" and isinstance(arg, TensorArg) and arg.tile_shape is not None:
            for (k, v), t in zip(spec.dims, arg.tile_shape):
                if k == "var":
                    bind_var(v, t, spec.name)
        elif spec.kind == "constant" and isinstance(arg, int) and not isinstance(arg, bool):
            bind_var(spec.name, arg, spec.name)

    bound = []
    for spec, arg in zip(specs, args):
        bound.append(_bind_one(kernel, spec, arg, typevars))
    bound = _with_covers(specs, args, bound)
    return Specialization(
        tuple(bound), tuple(sorted(typevars.items())), tuple(sorted(dtypevars.items()))
    )


def _with_covers(
    specs: tuple[ParamSpec, ...], args: tuple[Any, ...], bound: list[BoundParam]
) -> list[BoundParam]:
    """`bound` with each shared tensor's `covers`: the partitions of its rank whose whole
    tensor is nowhere longer than it."""
    parts = [
        (i, a.shape)
        for i, (ps, a) in enumerate(zip(specs, args))
        if ps.kind == "partition" and isinstance(a, TensorArg)
    ]
    if not parts:
        return bound
    out = []
    for ps, a, bp in zip(specs, args, bound):
        if ps.kind == "tensor" and isinstance(a, TensorArg):
            covers = tuple(
                i
                for i, shape in parts
                if len(shape) == len(a.shape) and all(m <= n for m, n in zip(shape, a.shape))
            )
            bp = replace(bp, covers=covers) if covers else bp
        out.append(bp)
    return out


def _bind_one(kernel: str, spec: ParamSpec, arg: Any, typevars: dict[str, int]) -> BoundParam:
    name = spec.name
    if spec.kind in ("scalar", "constant"):
        if isinstance(arg, TensorArg):
            raise _fail(
                kernel,
                name,
                f"expected a {spec.py_type.__name__ if spec.py_type else ''} scalar, got a tensor",
            )
        value = _scalar(kernel, spec, arg)
        assert spec.dtype is not None  # scalars have a fixed dtype
        return BoundParam(spec, spec.dtype, value=value if spec.kind == "constant" else None)
    if not isinstance(arg, TensorArg):
        raise _fail(
            kernel,
            name,
            f"expected a {'Partition' if spec.kind == 'partition' else 'Tensor'}, "
            f"got {type(arg).__name__}",
        )
    if spec.kind == "partition" and arg.tile_shape is None:
        raise _fail(
            kernel,
            name,
            "a Mut parameter takes a Partition (t.partition(tile_shape)), not a Tensor",
        )
    if spec.kind in ("tensor", "atomic") and arg.tile_shape is not None:
        raise _fail(
            kernel,
            name,
            f"{'an Atomic' if spec.kind == 'atomic' else 'a shared Tensor'} parameter takes "
            "the tensor itself, not a Partition (p.unpartition() gives it back)",
        )
    if spec.dtype is not None and arg.dtype is not spec.dtype:
        raise _fail(kernel, name, f"expected dtype {spec.dtype.name}, got {arg.dtype.name}")
    if len(arg.shape) != len(spec.dims):
        raise _fail(
            kernel,
            name,
            f"expected rank {len(spec.dims)}, got rank {len(arg.shape)} (shape {arg.shape})",
            ValueError,
        )
    actual = arg.tile_shape if arg.tile_shape is not None else arg.shape
    static: list[int | None] = []
    for axis, ((k, v), n) in enumerate(zip(spec.dims, actual)):
        want = v if k == "lit" else typevars.get(v) if k == "var" else None
        if k == "var" and want is None:
            raise _fail(
                kernel,
                name,
                f"TypeVar {v} (dim {axis}) is not bound: a Partition's tile "
                f"shape or a Constant parameter named {v} must give it",
                ValueError,
            )
        if want is not None and want != n:
            what = "tile dim" if arg.tile_shape is not None else "dim"
            raise _fail(
                kernel,
                name,
                f"{what} {axis} is {n}, expected {want}" + (f" (= {v})" if k == "var" else ""),
                ValueError,
            )
        static.append(want)
    if arg.tile_shape is not None:
        static = list(arg.tile_shape)
    align = min(_align(arg.shape[-1]), arg.base_align)
    return BoundParam(spec, arg.dtype, len(arg.shape), arg.tile_shape, tuple(static), align)


def _scalar(kernel: str, spec: ParamSpec, arg: Any) -> int | float | bool:
    t = spec.py_type
    if hasattr(arg, "item") and callable(arg.item) and getattr(arg, "shape", None) == ():
        arg = arg.item()  # NumPy scalars
    if t is bool:
        ok = isinstance(arg, bool)
    elif t is int:
        ok = isinstance(arg, int) and not isinstance(arg, bool)
    else:
        ok = isinstance(arg, (int, float)) and not isinstance(arg, bool)
    if not ok:
        raise _fail(
            kernel, spec.name, f"expected {t.__name__ if t else '?'}, got {type(arg).__name__}"
        )
    if t is int and not -(2**31) <= arg < 2**31:
        raise _fail(kernel, spec.name, f"{arg} does not fit in i32", ValueError)
    return float(arg) if t is float else arg
