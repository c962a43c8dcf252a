"""The frontend proper: walks a kernel's AST and builds specialized tile IR.

Expressions evaluate either to compile-time Python values (numbers, tuples, dtypes, builtins)
or to IR values; anything outside the supported subset is a CompileError at its source line.
"""

from __future__ import annotations

import ast
import builtins
import typing
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

from cutile_py import ir
from cutile_py.frontend import call_builtin
from cutile_py.frontend.capture import CapturedFunction
from cutile_py.frontend.errors import CompileError
from cutile_py.frontend.limits import too_large
from cutile_py.frontend.signature import Specialization
from cutile_py.frontend.values import BoundMethod, ParamRef, Reduced, ShapeRef
from cutile_py.ir import TileType, Value, reference
from cutile_py.ir.dtypes import (
    DType,
    OperandType,
    bool_,
    convert_scalar,
    f32,
    i32,
    is_dtype,
    op_type,
    promote,
    promote_weak,
    result_type,
)
from cutile_py.ir.shapes import broadcast_shapes
from cutile_py.ir.types import scalar

BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "add",
    ast.Sub: "sub",
    ast.Mult: "mul",
    ast.Div: "div",
    ast.FloorDiv: "floordiv",
    ast.Mod: "mod",
    ast.BitAnd: "and",
    ast.BitOr: "or",
    ast.BitXor: "xor",
}
CMPOPS: dict[type[ast.cmpop], str] = {
    ast.Lt: "lt",
    ast.LtE: "le",
    ast.Gt: "gt",
    ast.GtE: "ge",
    ast.Eq: "eq",
    ast.NotEq: "ne",
}
UNSUPPORTED_STATEMENTS: dict[type[ast.stmt], str] = {
    ast.While: "while loops are not supported in kernels; use `for i in range(...)`",
    ast.With: "`with` is not supported in kernels",
    ast.Try: "try/except is not supported in kernels",
    ast.Raise: "raise is not supported in kernels",
    ast.FunctionDef: "nested function definitions are not supported in kernels",
    ast.ClassDef: "class definitions are not supported in kernels",
    ast.Global: "global is not supported in kernels",
    ast.Nonlocal: "nonlocal is not supported in kernels",
    ast.Delete: "del is not supported in kernels",
    ast.Import: "import is not supported in kernels; import at module level",
    ast.ImportFrom: "import is not supported in kernels; import at module level",
    ast.Assert: "assert is not supported in kernels",
    ast.Break: "break is not supported in kernels",
    ast.Continue: "continue is not supported in kernels",
}
UNSUPPORTED_EXPRESSIONS: dict[type[ast.expr], str] = {
    ast.ListComp: "list comprehensions are not supported in kernels",
    ast.SetComp: "set comprehensions are not supported in kernels",
    ast.DictComp: "dict comprehensions are not supported in kernels",
    ast.GeneratorExp: "generator expressions are not supported in kernels",
    ast.Lambda: "lambda is not supported in kernels",
    ast.List: "lists are not supported in kernels; use a tuple",
    ast.Dict: "dicts are not supported in kernels",
    ast.Set: "sets are not supported in kernels",
    ast.Starred: "starred expressions are not supported in kernels",
    ast.JoinedStr: "f-strings are only supported as arguments of print()",
}
#: Python builtins a kernel may name; calls are handled in `call_builtin`.
PY_BUILTINS = frozenset(
    {"range", "print", "breakpoint", "int", "float", "bool", "min", "max", "abs", "len"}
)


def ir_params(spec: Specialization) -> tuple[ir.Param, ...]:
    """The IR parameters of a specialization (they depend on the signature alone, not the body)."""
    params: list[ir.Param] = []
    for bp in spec.params:
        ps = bp.spec
        if ps.kind in ("tensor", "partition", "atomic"):
            mut = ps.kind == "partition"
            params.append(
                ir.TensorParam(
                    ps.name,
                    bp.dtype,
                    bp.rank,
                    mut,
                    bp.static_dims,
                    bp.align,
                    atomic=ps.kind == "atomic",
                    covers=bp.covers,
                )
            )
        else:
            params.append(ir.ScalarParam(ps.name, bp.dtype, bp.value))
    return tuple(params)


class KernelBuilder:
    def __init__(
        self,
        cap: CapturedFunction,
        spec: Specialization,
        fast_math: bool,
        stages: int | None = None,
        num_warps: int | None = None,
        group_m: int | None = None,
        warp_specialize: bool = False,
        persistent: bool = False,
    ) -> None:
        self.cap = cap
        self.warp_specialize = warp_specialize
        self.persistent = persistent
        self.num_warps = num_warps
        self.group_m = group_m
        self.spec = spec
        self.fast_math = fast_math
        self.stages = stages
        self.globals = cap.visible_names()
        self.b: ir.Builder = ir.Builder()
        self.env: dict[str, Any] = {}
        #: Names of the `@ct.function` helpers being inlined, outermost first.
        self.helper_stack: list[str] = []
        #: Scalars `a if c else b` chose between two Python numbers: weak like them, so each
        #: use rebuilds the choice from the numbers in the type it needs (as the interpreter,
        #: which holds the number chosen).
        self.weak_choices: dict[Value, tuple[Value, Any, Any]] = {}
        #: Tiles made by reductions that dropped axes, to catch their misaligned broadcasts.
        self.reduced: dict[Value, Reduced] = {}
        self.node: ast.AST = cap.tree

    # -- errors -----------------------------------------------------------------------------
    def fail(self, message: str, node: ast.AST | None = None) -> NoReturn:
        raise self.cap.error(node if node is not None else self.node, message)

    @contextmanager
    def at(self, node: ast.AST) -> Iterator[None]:
        saved = self.node, self.b.span
        self.node = node
        loc = self.cap.location(node)
        self.b.span = (loc.file, loc.line, loc.col)
        try:
            yield
        except ir.IRTypeError as e:
            self.fail(str(e), node)
        finally:
            self.node, self.b.span = saved

    # -- entry ------------------------------------------------------------------------------
    def build(self) -> ir.Kernel:
        params = ir_params(self.spec)
        values: list[Value | None] = []
        for i, bp in enumerate(self.spec.params):
            spec = bp.spec
            if spec.kind in ("tensor", "partition", "atomic"):
                values.append(None)
                self.env[spec.name] = ParamRef(i, bp)
            elif spec.kind == "scalar":
                v = Value(scalar(bp.dtype), spec.name)
                values.append(v)
                self.env[spec.name] = v
            else:
                self.env[spec.name] = bp.value
                values.append(None)
        body = self.cap.tree.body
        self.block(body, top=True)
        ranks = {bp.rank for bp in self.spec.params if bp.tile_shape is not None}
        if len(ranks) > 1:
            self.fail("all Mut parameters must have the same rank (they share the launch grid)")
        kernel = ir.Kernel(
            self.cap.name,
            params,
            tuple(values),
            self.b.region,
            grid_rank=max(ranks, default=1),
            fast_math=self.fast_math,
            stages=self.stages,
            num_warps=self.num_warps,
            group_m=self.group_m,
            warp_specialize=self.warp_specialize,
            persistent=self.persistent,
        )
        ir.verify(kernel)
        return kernel

    # -- statements -------------------------------------------------------------------------
    def block(self, stmts: Sequence[ast.stmt], top: bool = False) -> None:
        for k, stmt in enumerate(stmts):
            with self.at(stmt):
                if isinstance(stmt, ast.Return):
                    if not top or k != len(stmts) - 1:
                        self.fail("return is only supported as the last statement of a kernel")
                    if stmt.value is not None and not (
                        isinstance(stmt.value, ast.Constant) and stmt.value.value is None
                    ):
                        self.fail("kernels return nothing; store results with z.store(tile)")
                    continue
                self.stmt(stmt)

    def stmt(self, s: ast.stmt) -> None:
        if isinstance(s, ast.Assign):
            value = self.expr(s.value)
            for target in s.targets:
                self.assign(target, value)
        elif isinstance(s, ast.AnnAssign):
            if s.value is None:
                self.fail("a declaration without a value is not supported in kernels")
            self.assign(s.target, self.expr(s.value))
        elif isinstance(s, ast.AugAssign):
            if not isinstance(s.target, ast.Name):
                self.fail("augmented assignment is only supported to a name")
            self.assign(
                s.target, self.binop(s.op, self.lookup(s.target.id, s.target), self.expr(s.value))
            )
        elif isinstance(s, ast.Expr):
            self.expr(s.value)
        elif isinstance(s, ast.Pass):
            pass
        elif isinstance(s, ast.For):
            self.for_(s)
        elif isinstance(s, ast.If):
            self.if_(s)
        else:
            msg = UNSUPPORTED_STATEMENTS.get(
                type(s), f"{type(s).__name__} statements are not supported in kernels"
            )
            self.fail(msg)

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, ast.Tuple):
            if not isinstance(value, tuple) or len(value) != len(target.elts):
                self.fail("tuple unpacking needs a tuple of the same length", target)
            for t, v in zip(target.elts, value):
                self.assign(t, v)
        elif isinstance(target, ast.Subscript):
            name = ast.unparse(target.value)
            self.fail(
                f"`{ast.unparse(target)} = ...` cannot write into a tensor or tile in a kernel: "
                f"store a whole tile with `{name}.store(tile)`, or a sub-tile with "
                f"`ct.store({name}, index, tile)`; to change some elements of a tile, build a "
                "new one with `ct.where(mask, new, old)`",
                target,
            )
        else:
            self.fail(
                "only names can be assigned in kernels; write results with z.store(tile)", target
            )

    def for_(self, s: ast.For) -> None:
        if s.orelse:
            self.fail("for/else is not supported in kernels")
        it = s.iter
        if not (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Name)
            and it.func.id == "range"
            and self.lookup_global("range") is builtins.range
        ):
            self.fail("kernels loop only over range(...)", it)
        if not isinstance(s.target, ast.Name):
            self.fail("the loop variable must be a single name", s.target)
        if it.keywords or not 1 <= len(it.args) <= 3:
            self.fail("range() takes 1 to 3 positional arguments", it)
        bounds = [self.expr(a) for a in it.args]
        lo, hi, step = (
            [0, *bounds, 1] if len(bounds) == 1 else [*bounds, 1] if len(bounds) == 2 else bounds
        )[:3]
        if not isinstance(step, int) or isinstance(step, bool) or step == 0:
            self.fail("the step of range() must be a non-zero compile-time integer", it)
        lo_v, hi_v, step_v = (self.scalar_i32(v, it) for v in (lo, hi, step))
        assigned = assigned_names(s.body)
        carried = [
            n
            for n in sorted(assigned)
            if n in self.env and not isinstance(self.env[n], _Unreadable) and n != s.target.id
        ]
        inits = [self.materialize(self.env[n], None, n) for n in carried]
        loop = self.b.for_loop(lo_v, hi_v, step_v, inits, descending=step < 0)
        before = dict(self.env)
        self.env[s.target.id] = loop.body.args[0]
        for n, arg in zip(carried, loop.body.args[1:]):
            self.env[n] = arg
        with self.b.inside(loop.body):
            self.block(s.body)
            outs = []
            for n, init in zip(carried, inits):
                v = self.materialize(self.env[n], init.type, n)
                if v.type != init.type:
                    self.fail(
                        f"variable '{n}' is carried through the loop as {init.type} but "
                        f"becomes {v.type} in the body; give it its final type before the "
                        "loop (e.g. ct.zeros(shape, dtype))"
                    )
                outs.append(v)
            self.b.yield_(outs)
        self.env = before
        self.env[s.target.id] = _Unreadable(
            f"the loop variable '{s.target.id}' cannot be read after its loop; copy it into "
            "a variable that the loop carries"
        )
        for n, r in zip(carried, loop.results):
            self.env[n] = r

    def if_(self, s: ast.If) -> None:
        cond = self.expr(s.test)
        if not isinstance(cond, Value):
            if isinstance(cond, (bool, int, float)):  # decided at compile time
                self.block(s.body if cond else s.orelse)
                return
            self.fail("an if condition must be a scalar", s.test)
        if not cond.type.is_scalar or cond.type.dtype is not bool_:
            self.fail(
                f"an if condition must be a bool scalar, not {cond.type}; for tiles use ct.where",
                s.test,
            )
        before = dict(self.env)
        op = self.b.if_(cond, [])
        envs = []
        for region, stmts in ((op.then, s.body), (op.orelse, s.orelse)):
            self.env = dict(before)
            with self.b.inside(region):
                self.block(stmts)
            envs.append(self.env)
        then_env, else_env = envs
        names = sorted(assigned_names(s.body) | assigned_names(s.orelse))
        merged: dict[str, Any] = {}
        results: list[tuple[str, Value, Value]] = []
        for n in names:
            a, b = then_env.get(n, _MISSING), else_env.get(n, _MISSING)
            if not _readable(a) or not _readable(b):
                unreadable = self.one_path(n, s, _readable(a), _readable(b), a, b)
                if unreadable is not None:
                    merged[n] = unreadable
                continue
            if a is b or (
                not isinstance(a, Value)
                and not isinstance(b, Value)
                and a == b
                and type(a) is type(b)
            ):
                merged[n] = a
                continue
            t = a.type if isinstance(a, Value) else b.type if isinstance(b, Value) else None
            if t is None:  # two different Python numbers: their common type
                t = scalar(promote(_py_dtype(a), _py_dtype(b)))
            with self.b.inside(op.then):
                va = self.materialize(a, t, n)
            with self.b.inside(op.orelse):
                vb = self.materialize(b, va.type, n)
            if va.type != vb.type:
                self.fail(
                    f"variable '{n}' is {va.type} after the if branch but {vb.type} after "
                    "the else branch"
                )
            results.append((n, va, vb))
        with self.b.inside(op.then):
            self.b.yield_([va for _, va, _ in results])
        with self.b.inside(op.orelse):
            self.b.yield_([vb for _, _, vb in results])
        op.results = tuple(Value(va.type) for _, va, _ in results)
        self.env = {k: v for k, v in before.items()}
        self.env.update(merged)
        for (n, _, _), r in zip(results, op.results):
            self.env[n] = r

    def one_path(
        self, n: str, s: ast.If, in_if: bool, in_else: bool, a: Any, b: Any
    ) -> _Unreadable | None:
        """What `n` stands for after the `if` `s` when it has no value on some path (None:
        nothing, as on neither path was it ever assigned)."""
        line = self.cap.location(s).line
        fix = "assign it before the `if` or in both branches"
        if in_if:
            if not s.orelse:
                return _Unreadable(
                    f"`{n}` is assigned only in the `if` branch at line {line}; {fix}"
                )
            return _Unreadable(
                f"`{n}` is assigned in the `if` branch at line {line} but not in its `else` "
                f"branch; {fix}"
            )
        if in_else:
            return _Unreadable(
                f"`{n}` is assigned only in the `else` branch of the `if` at line {line}; {fix}"
            )
        # Unreadable on both paths already (say, assigned in one branch of an inner `if`).
        return a if isinstance(a, _Unreadable) else b if isinstance(b, _Unreadable) else None

    # -- expressions ------------------------------------------------------------------------
    def expr(self, e: ast.expr) -> Any:
        with self.at(e):
            value = self._expr(e)
            # Every tile comes out of some expression: the innermost one that makes a tile too
            # large to exist is where it is refused, before anything is planned per element.
            if isinstance(value, Value) and (why := too_large(value.type.size, value.type.dtype)):
                self.fail(why)
            return value

    def _expr(self, e: ast.expr) -> Any:
        if isinstance(e, ast.Constant):
            if isinstance(e.value, (bool, int, float, str)) or e.value is None:
                return e.value
            self.fail(f"constant {e.value!r} is not supported in kernels")
        if isinstance(e, ast.Name):
            return self.lookup(e.id, e)
        if isinstance(e, ast.Tuple):
            return tuple(self.expr(x) for x in e.elts)
        if isinstance(e, ast.BinOp):
            if isinstance(e.op, ast.MatMult):
                return call_builtin.matmul(self, self.expr(e.left), self.expr(e.right), e)
            return self.binop(e.op, self.expr(e.left), self.expr(e.right))
        if isinstance(e, ast.IfExp):
            return self.if_expr(e)
        if isinstance(e, ast.UnaryOp):
            x = self.expr(e.operand)
            if not isinstance(x, (Value, bool, int, float)):
                self.fail(f"unary {type(e.op).__name__} cannot apply to {_describe(x)}")
            if isinstance(e.op, ast.Invert) and isinstance(x, float):
                self.fail("~ needs a bool or an integer")
            if isinstance(e.op, ast.USub):
                return -x if not isinstance(x, Value) else self.b.unary("neg", x)
            if isinstance(e.op, ast.UAdd):
                return x
            if isinstance(e.op, ast.Invert):
                if isinstance(x, Value):
                    return self.b.unary("not", x)
                return (not x) if isinstance(x, bool) else ~int(x)
            # `not`
            if not isinstance(x, Value):
                return not x
            if x.type != scalar(bool_):
                self.fail("`not` needs a bool scalar; for tiles use ~")
            return self.b.unary("not", x)
        if isinstance(e, ast.BoolOp):
            values = [self.expr(v) for v in e.values]
            kind = "and" if isinstance(e.op, ast.And) else "or"
            acc = values[0]
            for v in values[1:]:
                for x in (acc, v):
                    if isinstance(x, Value) and x.type != scalar(bool_):
                        self.fail(f"`{kind}` needs bool scalars; for bool tiles use & and |")
                acc = (
                    self.binary(kind, acc, v)
                    if isinstance(acc, Value) or isinstance(v, Value)
                    else ((acc and v) if kind == "and" else (acc or v))
                )
            return acc
        if isinstance(e, ast.Compare):
            if len(e.ops) != 1:
                self.fail("chained comparisons are not supported in kernels; combine with &")
            cmp = CMPOPS.get(type(e.ops[0]))
            if cmp is None:
                self.fail(f"comparison {type(e.ops[0]).__name__} is not supported in kernels")
            return self.compare(cmp, self.expr(e.left), self.expr(e.comparators[0]))
        if isinstance(e, ast.Attribute):
            return self.attribute(self.expr(e.value), e.attr, e)
        if isinstance(e, ast.Subscript):
            obj = self.expr(e.value)
            if isinstance(obj, (ParamRef, Value)):  # before the index, which may be a slice
                self.fail(_no_indexing(obj, ast.unparse(e.value), e.slice), e)
            return self.subscript(obj, self.expr(e.slice), e)
        if isinstance(e, ast.Call):
            fn = self.expr(e.func)
            args = [self.expr(a) for a in e.args]
            kwargs = {}
            for kw in e.keywords:
                if kw.arg is None:
                    self.fail("**kwargs is not supported in kernels", kw)
                kwargs[kw.arg] = self.expr(kw.value)
            return call_builtin.call(self, fn, args, kwargs, e)
        msg = UNSUPPORTED_EXPRESSIONS.get(
            type(e), f"{type(e).__name__} expressions are not supported in kernels"
        )
        self.fail(msg)

    def lookup(self, name: str, node: ast.AST) -> Any:
        if name in self.env:
            value = self.env[name]
            if isinstance(value, _Unreadable):
                self.fail(value.message, node)
            return value
        value = self.lookup_global(name)
        if value is _MISSING:
            self.fail(f"name '{name}' is not defined here", node)
        if isinstance(value, typing.TypeVar):
            bound = self.spec.typevar(value.__name__)
            if bound is None:
                self.fail(
                    f"TypeVar {value.__name__} has no value in this launch: no parameter binds "
                    f"it (a dtype TypeVar takes its value from a Tensor[{value.__name__}, ...] "
                    "argument, a dim TypeVar from a Partition's tile shape or a Constant "
                    "parameter of that name)",
                    node,
                )
            return bound
        return value

    def lookup_global(self, name: str) -> Any:
        if name in self.globals:
            return self.globals[name]
        if name in PY_BUILTINS:
            return getattr(builtins, name)
        return _MISSING

    def attribute(self, obj: Any, attr: str, node: ast.AST) -> Any:
        if isinstance(obj, ParamRef):
            if attr == "shape":
                return (
                    tuple(obj.bound.tile_shape)
                    if obj.is_partition and obj.bound.tile_shape
                    else ShapeRef(obj)
                )
            if attr == "dtype":
                return obj.bound.dtype
            if attr in ("store", "load"):
                if not obj.is_partition:
                    self.fail(
                        f"'{obj.name}' is a shared, read-only Tensor: only Mut parameters "
                        f"have .{attr}(); use ct.load(...) to read it",
                        node,
                    )
                return BoundMethod(obj, attr)
            self.fail(f"tensor parameter '{obj.name}' has no attribute '{attr}' in kernels", node)
        if isinstance(obj, Value):
            # A tile's shape, dtype and rank are compile-time facts of its type.
            if attr == "shape":
                return obj.type.shape
            if attr == "dtype":
                return obj.type.dtype
            if attr == "ndim":
                return len(obj.type.shape)
            if attr == "size":
                return obj.type.size
            if attr == "T":
                return self.b.permute(obj, tuple(reversed(range(len(obj.type.shape)))))
            if attr in ("astype", "reshape", "item"):
                return BoundMethod(obj, attr)
            self.fail(f"a tile has no attribute '{attr}'", node)
        if isinstance(obj, type(builtins)):  # a module: ct.exp, math.pi, ...
            if not hasattr(obj, attr):
                self.fail(f"module {obj.__name__} has no attribute '{attr}'", node)
            return getattr(obj, attr)
        if is_dtype(obj) and attr == "name":
            return obj.name
        self.fail(f"attribute '{attr}' of {type(obj).__name__} is not supported in kernels", node)

    def subscript(self, obj: Any, index: Any, node: ast.AST) -> Any:
        if isinstance(obj, ShapeRef):
            if not isinstance(index, int) or isinstance(index, bool):
                self.fail("shape indices must be integer constants", node)
            bp = obj.param.bound
            if not -bp.rank <= index < bp.rank:
                self.fail(
                    f"'{obj.param.name}' has rank {bp.rank}; shape[{index}] is out of range", node
                )
            axis = index % bp.rank
            static = bp.static_dims[axis]
            if static is not None:
                return static
            return self.b.tensor_dim(obj.param.index, axis)
        if isinstance(obj, tuple):
            if not isinstance(index, int):
                self.fail("tuple indices must be integer constants", node)
            try:
                return obj[index]
            except IndexError:
                self.fail(f"index {index} is out of range for a tuple of length {len(obj)}", node)
        self.fail(f"subscripting {type(obj).__name__} is not supported in kernels", node)

    # -- typing helpers -----------------------------------------------------------------------
    def constant(self, value: Any, dtype: type[DType]) -> Value:
        """A Python number as an IR constant of `dtype`, converted as a cast would."""
        try:
            converted = convert_scalar(value, dtype)
        except ValueError as e:
            self.fail(f"constant {e}")
        return self.b.constant(converted, dtype)

    def materialize(self, v: Any, like: TileType | None, name: str) -> Value:
        """`v` as an IR value (a Python number takes `like`'s type, or its default dtype)."""
        if isinstance(v, Value):
            return v
        if isinstance(v, (bool, int, float)):
            dtype = like.dtype if like is not None else _py_dtype(v)
            if promote_weak(dtype, type(v)) is not dtype:
                self.fail(
                    f"variable '{name}' is {dtype.name} on one path but {v!r} "
                    f"({type(v).__name__}) on another; give it one type on every path"
                )
            c = self.constant(v, dtype)
            return self.b.broadcast(c, like.shape) if like is not None and like.shape else c
        self.fail(
            f"variable '{name}' holds {type(v).__name__}, which cannot change in a loop or branch"
        )

    def scalar_i32(self, v: Any, node: ast.AST) -> Value:
        if isinstance(v, Value):
            if v.type != scalar(i32):
                self.fail(f"expected an i32 scalar, got {v.type}", node)
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return self.constant(v, i32)
        self.fail(f"expected an integer, got {type(v).__name__}", node)

    def operands(
        self, *xs: Any, with_shape: tuple[int, ...] = ()
    ) -> tuple[list[Value], type[DType], tuple[int, ...]]:
        """Promote and broadcast operands to one type and shape (NumPy rules, Python numbers
        weak); `with_shape` takes part in the broadcast (a where() condition's shape)."""
        types: list[OperandType] = []
        shapes = [with_shape]
        for x in xs:
            weak = self.weak_choices.get(x) if isinstance(x, Value) else None
            if weak is not None:
                types += [type(weak[1]), type(weak[2])]
                shapes.append(())
            elif isinstance(x, Value):
                types.append(x.type.dtype)
                shapes.append(x.type.shape)
            elif isinstance(x, (bool, int, float)):
                types.append(type(x))
            else:
                self.fail(f"expected a tile or a number, got {_describe(x)}")
        dtype = result_type(*types)
        try:
            shape = broadcast_shapes(*shapes)
        except ValueError as e:
            hints = [self.reduced[x] for x in xs if isinstance(x, Value) and x in self.reduced]
            if hints:
                self.fail(f"{e}: the {hints[0].call} dropped its axis; keep it with keepdims=True")
            self.fail(str(e))
        for x in xs:
            if isinstance(x, Value):
                self.check_realigned(x, shape)
        out = [self.to_shape(self.operand(x, dtype), shape) for x in xs]
        return out, dtype, shape

    def check_realigned(self, v: Value, shape: tuple[int, ...]) -> None:
        """CompileError if broadcasting `v` to `shape` lines a reduction's result up with other
        axes than those it came from: `t / ct.sum(t, axis=1)` of a square `t` divides row i by
        the sum of row j (NumPy's rule, and never what was meant)."""
        r = self.reduced.get(v)
        if r is None or r.source_shape != shape:
            return
        trailing = tuple(range(len(shape) - len(r.kept), len(shape)))
        if r.kept == trailing:
            return  # e.g. a column sum of a 2-D tile: its broadcast puts it back in place
        self.fail(
            f"the {v.type.shape} result of {r.call} is broadcast back against a {shape} tile "
            f"along axis {', '.join(map(str, trailing))}, not axis "
            f"{', '.join(map(str, r.kept))} where it came from (NumPy's rule, which mixes up "
            "rows here): keep the reduced axis with keepdims=True"
        )

    def to_shape(self, v: Value, shape: tuple[int, ...]) -> Value:
        """`v` broadcast to `shape` (NumPy rules; the caller checked they apply): a lower
        rank first gains leading 1-dims by a reshape, as the IR's broadcast keeps the rank."""
        have = v.type.shape
        if have and len(have) < len(shape):
            v = self.b.reshape(v, (1,) * (len(shape) - len(have)) + have)
        return self.b.broadcast(v, shape)

    def binary(self, kind: str, a: Any, b: Any) -> Any:
        if not isinstance(a, Value) and not isinstance(b, Value):
            return _fold(self, kind, a, b)
        (x, y), dtype, _ = self.operands(a, b)
        dtype = op_type(kind, dtype)  # true division of integers computes in f32
        return self.b.binary(kind, self.b.cast(x, dtype), self.b.cast(y, dtype))

    def binop(self, op: ast.operator, a: Any, b: Any) -> Any:
        """`a <op> b` for a Python operator node (`**` included)."""
        if isinstance(op, ast.Pow):
            return self.power(a, b)
        kind = BINOPS.get(type(op))
        if kind is None:
            self.fail(f"operator {type(op).__name__} is not supported in kernels")
        return self.binary(kind, a, b)

    def power(self, a: Any, b: Any) -> Any:
        """`a ** b`: a constant integer exponent multiplies (`reference.int_power`; a negative
        one takes the reciprocal after); any other exponent is `ct.pow`."""
        if not isinstance(a, Value) and not isinstance(b, Value):
            if not all(isinstance(x, (bool, int, float)) for x in (a, b)):
                self.fail(f"cannot apply ** to {_describe(a)} and {_describe(b)}")
            try:
                r = a**b
            except (ZeroDivisionError, OverflowError) as e:
                self.fail(f"{a!r} ** {b!r} in a compile-time expression: {e}")
            if isinstance(r, complex):
                self.fail(f"{a!r} ** {b!r} is complex; kernels compute real numbers")
            return r
        if isinstance(b, int) and isinstance(a, Value):
            (x,), dtype, _ = self.operands(a)
            if dtype is bool_:  # NumPy: bools to an integer power are integers
                x, dtype = self.b.cast(x, i32), i32
            if b < 0 and not dtype.is_float():
                self.fail(
                    "integers to negative integer powers are not allowed (NumPy raises); "
                    "convert to float first, e.g. x.astype(ct.f32) ** -1"
                )

            def one() -> Value:
                return self.to_shape(self.constant(1, dtype), x.type.shape)

            r = reference.int_power(x, abs(b), lambda p, q: self.b.binary("mul", p, q), one)
            return self.b.binary("div", one(), r) if b < 0 else r
        (x, y), dtype, _ = self.operands(a, b)
        if not dtype.is_float():
            self.fail(
                f"** of {dtype.name} values needs a constant integer exponent (x ** 3); for a "
                "run-time or tile exponent convert to float first (x.astype(ct.f32) ** y)"
            )
        return self.b.binary("pow", x, y)

    def if_expr(self, e: ast.IfExp) -> Any:
        """`a if c else b` on scalars: each branch evaluated under its own side of an IfOp,
        the result of the branches' common type (as a binary op's)."""
        cond = self.expr(e.test)
        if not isinstance(cond, Value):
            if isinstance(cond, (bool, int, float)):  # decided at compile time
                return self.expr(e.body if cond else e.orelse)
            self.fail("the condition of `a if c else b` must be a scalar", e.test)
        if not cond.type.is_scalar or cond.type.dtype is not bool_:
            self.fail(
                f"the condition of `a if c else b` must be a bool scalar, not {cond.type}; "
                "for tiles use ct.where(cond, a, b)",
                e.test,
            )
        op = self.b.if_(cond, [])
        branches = []
        for region, node in ((op.then, e.body), (op.orelse, e.orelse)):
            with self.b.inside(region):
                v = self.expr(node)
            if isinstance(v, Value) and not v.type.is_scalar:
                self.fail(
                    f"`a if c else b` chooses between scalars, and this branch is a tile of "
                    f"shape {v.type.shape}; for tiles use ct.where(cond, a, b)",
                    node,
                )
            if not isinstance(v, (Value, bool, int, float)):
                self.fail(
                    f"`a if c else b` with a run-time condition needs numbers or scalars in "
                    f"both branches, not {_describe(v)}",
                    node,
                )
            branches.append(v)
        a, b = branches
        if (
            not isinstance(a, Value)
            and not isinstance(b, Value)
            and not op.then.ops
            and not (op.orelse.ops)
        ):
            # Two Python numbers: no IfOp, a weak choice (see `weak_choices`).
            self.b.region.ops.remove(op)
            dtype = result_type(type(a), type(b))
            r = self.b.select(cond, self.constant(a, dtype), self.constant(b, dtype))
            self.weak_choices[r] = (cond, a, b)
            return r
        dtype = result_type(*(v.type.dtype if isinstance(v, Value) else type(v) for v in (a, b)))
        outs = []
        for region, v in ((op.then, a), (op.orelse, b)):
            with self.b.inside(region):
                out = self.b.cast(self.operand(v, dtype), dtype)
                self.b.yield_([out])
            outs.append(out)
        op.results = (Value(outs[0].type),)
        return op.results[0]

    def operand(self, x: Any, dtype: type[DType]) -> Value:
        """A number, a weak choice or a value as an operand of `dtype` (before broadcasting)."""
        if not isinstance(x, Value):
            return self.constant(x, dtype)
        weak = self.weak_choices.get(x)
        if weak is not None and x.type.dtype is not dtype:
            cond, a, b = weak
            return self.b.select(cond, self.constant(a, dtype), self.constant(b, dtype))
        return self.b.cast(x, dtype)

    def compare(self, kind: str, a: Any, b: Any) -> Any:
        if not isinstance(a, Value) and not isinstance(b, Value):
            return _fold(self, kind, a, b)
        (x, y), _, _ = self.operands(a, b)
        return self.b.compare(kind, x, y)


_MISSING = object()


class _Unreadable:
    """Stands for a name that exists but may not be read here: a `for` loop's variable after
    the loop (its last value is not kept), or a name assigned on one path of an `if` only."""

    def __init__(self, message: str) -> None:
        self.message = message


def _readable(v: Any) -> bool:
    return v is not _MISSING and not isinstance(v, _Unreadable)


def _py_dtype(v: Any) -> type[DType]:
    return bool_ if isinstance(v, bool) else i32 if isinstance(v, int) else f32


def _no_indexing(obj: ParamRef | Value, name: str, index: ast.expr) -> str:
    """Why `name[index]` is refused, and what to write instead."""
    if isinstance(obj, ParamRef) and obj.is_partition:
        return (
            f"`{name}[...]` cannot read a tensor in a kernel: read this block's tile with "
            f"`{name}.load()`, or a sub-tile of it with `ct.load({name}, index, shape)`"
        )
    if isinstance(obj, ParamRef):
        same = _as_load(index)
        example = (
            f"`{name}[{ast.unparse(index)}]` is `ct.load({name}, {same[0]}, {same[1]})`"
            if same is not None
            else f"`{name}[8:12]` is `ct.load({name}, (2,), (4,))`"
        )
        return (
            f"`{name}[...]` cannot read a tensor in a kernel: load a tile with "
            f"`ct.load({name}, index, shape)`, whose index counts tiles of that shape "
            f"({example})"
        )
    if obj.type.is_scalar:
        return f"`{name}` is a scalar; it cannot be indexed"
    return (
        f"a tile cannot be indexed or sliced (`{name}[...]`): load the part you need with "
        "`ct.load(src, index, shape)`, pick elements with `ct.where(mask, tile, 0)` (masks "
        "from `ct.arange`) and reduce, or take the one element of a size-1 tile with `.item()`"
    )


def _as_load(index: ast.expr) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The (index, shape) of the ct.load that reads what the constant slices `index` select
    (`8:12` → ((2,), (4,))), or None where no tile index gives it."""
    parts = index.elts if isinstance(index, ast.Tuple) else [index]
    tile: list[int] = []
    shape: list[int] = []
    for p in parts:
        if not isinstance(p, ast.Slice) or p.step is not None:
            return None
        lo = 0 if p.lower is None else _int_constant(p.lower)
        hi = None if p.upper is None else _int_constant(p.upper)
        if lo is None or hi is None or hi <= lo or lo % (hi - lo):
            return None
        tile.append(lo // (hi - lo))
        shape.append(hi - lo)
    return tuple(tile), tuple(shape)


def _int_constant(e: ast.expr) -> int | None:
    return e.value if isinstance(e, ast.Constant) and type(e.value) is int else None


def _describe(x: Any) -> str:
    if isinstance(x, ParamRef):
        return f"tensor parameter '{x.name}' (load a tile from it first)"
    return type(x).__name__


_FOLD: dict[str, Any] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "floordiv": lambda a, b: a // b,
    "mod": lambda a, b: a % b,
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "xor": lambda a, b: a ^ b,
    "max": lambda a, b: reference.fold("max", a, b),
    "min": lambda a, b: reference.fold("min", a, b),
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
}


def _fold(kb: KernelBuilder, kind: str, a: Any, b: Any) -> Any:
    """Evaluate an op on compile-time values in Python."""
    if not all(isinstance(x, (bool, int, float)) for x in (a, b)):
        kb.fail(f"cannot apply {kind} to {_describe(a)} and {_describe(b)}")
    try:
        return _FOLD[kind](a, b)
    except ZeroDivisionError:
        kb.fail("division by zero in a compile-time expression")


def assigned_names(stmts: Sequence[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for s in stmts:
        for node in ast.walk(s):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return names


def build_kernel(
    cap: CapturedFunction,
    spec: Specialization,
    fast_math: bool = False,
    stages: int | None = None,
    num_warps: int | None = None,
    group_m: int | None = None,
    warp_specialize: bool = False,
    persistent: bool = False,
) -> ir.Kernel:
    """Tile IR for `cap` specialized to `spec`; CompileError for anything unsupported."""
    try:
        return KernelBuilder(
            cap, spec, fast_math, stages, num_warps, group_m, warp_specialize, persistent
        ).build()
    except CompileError:
        raise
    except RecursionError as e:
        raise CompileError("kernel is too deeply nested", None, cap.name) from e
