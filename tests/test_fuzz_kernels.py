"""Random kernels: element-wise expression trees with row reductions inside, over f32, f16,
bf16 and i32, compiled and run on `sim` and `interpret`, compared with NumPy on fresh inputs.

The base seed is `CUTILE_PY_FUZZ_SEED` (random if unset) and the number of kernels
`CUTILE_PY_FUZZ_KERNELS`; a failure prints the seed, the case and the kernel's source, and how to
run that case again.
"""

from __future__ import annotations

import importlib.util
import os
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.ir.dtypes import round_to

SEED = int(os.environ.get("CUTILE_PY_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
KERNELS = int(os.environ.get("CUTILE_PY_FUZZ_KERNELS", "200"))
DRAWS = 3  # fresh inputs per kernel and backend
DTYPES = ["f32", "f16", "bf16", "i32"]
R, C = 8, 32  # one tile: the block's rows and columns

#: Relative tolerance of the float computation, against the largest magnitude the expression
#: went through (cancellation makes a small result carry the error of large intermediates).
#: Compiled f32 math (exp, tanh: approximations good to a few ulp; sums in another order)
#: stays within 1e-5 of that scale; f16/bf16 results are rounded once more at the end.
TOLERANCE = {"f32": 2e-5, "f16": 2e-3, "bf16": 1.6e-2, "i32": 0.0}


@dataclass
class Node:
    """One expression: its kernel source, its NumPy evaluation and whether it is a full
    (R, C) tile or a row (R, 1) that broadcasts."""

    src: str
    value: Callable[[dict[str, np.ndarray]], np.ndarray]
    row: bool


class Grammar:
    """Random trees for one dtype. Floats compute in f32 (f16/bf16 inputs converted on load);
    i32 computes in i32 with small values, so nothing overflows."""

    def __init__(self, rng: random.Random, dtype: str) -> None:
        self.rng = rng
        self.is_int = dtype == "i32"
        self.np = np.int32 if self.is_int else np.float32
        self.scale = [0.0]

    def _seen(self, v: np.ndarray) -> np.ndarray:
        finite = np.abs(v[np.isfinite(v)]) if not self.is_int else np.abs(v)
        if finite.size:
            self.scale[0] = max(self.scale[0], float(finite.max()))
        return v

    def leaf(self) -> Node:
        name = self.rng.choice(["x", "y"])
        return Node(name, lambda env: env[name], False)

    def constant(self) -> Node:
        """A Python number in the source (weakly typed: it takes the tile's dtype)."""
        c = self.rng.randint(-3, 3) if self.is_int else round(self.rng.uniform(-2, 2), 3)
        k = self.np(c)
        return Node(f"({c})", lambda env: np.asarray(k), True)  # broadcasts like a row

    def tree(self, depth: int) -> Node:
        if depth == 0 or self.rng.random() < 0.2:
            return self.leaf()
        kind = self.rng.random()
        if kind < 0.55:
            return self.binary(depth)
        if kind < 0.85:
            return self.unary(depth)
        return self.reduction(depth)

    def binary(self, depth: int) -> Node:
        a, b = self.tree(depth - 1), self.tree(depth - 1)
        ops: dict[str, tuple[str, Callable[[np.ndarray, np.ndarray], np.ndarray]]] = {
            "add": ("({} + {})", np.add),
            "sub": ("({} - {})", np.subtract),
            "mul": ("({} * {})", np.multiply),
            "max": ("ct.maximum({}, {})", np.maximum),
            "min": ("ct.minimum({}, {})", np.minimum),
        }
        if not self.is_int:
            # A divisor bounded away from zero: the quotient stays on the scale of its operands.
            ops["div"] = (
                "({} / (ct.abs({}) + 1.0))",
                lambda p, q: p / (np.abs(q) + self.np(1.0)),
            )
        src, fn = ops[self.rng.choice(sorted(ops))]
        if (self.is_int and src == "({} * {})") or self.rng.random() < 0.25:
            # A constant operand (for i32 products, to keep them small), on either side.
            if self.rng.random() < 0.5 or src.startswith("({} / "):
                b = self.constant()
            else:
                a = self.constant()

        def value(env: dict[str, np.ndarray]) -> np.ndarray:
            return self._seen(fn(a.value(env), b.value(env)).astype(self.np))

        return Node(src.format(a.src, b.src), value, a.row and b.row)

    def unary(self, depth: int) -> Node:
        a = self.tree(depth - 1)
        ops: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
            "neg": ("(-{})", np.negative),
            "abs": ("ct.abs({})", np.abs),
        }
        if not self.is_int:
            ops |= {
                "exp": ("ct.exp(-ct.abs({}))", lambda v: np.exp(-np.abs(v))),
                "sqrt": ("ct.sqrt(ct.abs({}))", lambda v: np.sqrt(np.abs(v))),
                "tanh": ("ct.tanh({})", np.tanh),
                "log": ("ct.log(ct.abs({}) + 1.0)", lambda v: np.log(np.abs(v) + self.np(1))),
            }
        src, fn = ops[self.rng.choice(sorted(ops))]

        def value(env: dict[str, np.ndarray]) -> np.ndarray:
            return self._seen(fn(a.value(env)).astype(self.np))

        return Node(src.format(a.src), value, a.row)

    def reduction(self, depth: int) -> Node:
        a = self.tree(depth - 1)
        if a.row:
            return a
        reductions: dict[str, Callable[..., np.ndarray]] = {
            "sum": np.sum,
            "max": np.max,
            "min": np.min,
        }
        name = self.rng.choice(sorted(reductions))
        fn = reductions[name]

        def value(env: dict[str, np.ndarray]) -> np.ndarray:
            v = a.value(env)
            if name == "sum":
                self._seen(np.abs(v).sum(axis=1, keepdims=True))  # the sum's own scale
            return self._seen(fn(v, axis=1, keepdims=True).astype(self.np))

        return Node(f"ct.{name}({a.src}, axis=1, keepdims=True)", value, True)


KERNEL_TEMPLATE = """\
from typing import TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, bf16, f16, f32, i32

R = TypeVar("R")
C = TypeVar("C")


@ct.kernel
def fuzz(z: Mut[Tensor[{dt}, R, C]], a: Tensor[{dt}, Dyn, Dyn], b: Tensor[{dt}, Dyn, Dyn]) -> None:
    x = ct.load_tile_like(a, z){load}
    y = ct.load_tile_like(b, z){load}
    z.store(ct.broadcast_to({expr}, z.shape){store})
"""


@dataclass
class Case:
    index: int
    seed: int
    dtype: str
    source: str
    node: Node
    grammar: Grammar

    def describe(self) -> str:
        return (
            f"fuzz case {self.index} ({self.dtype}), base seed {SEED}; reproduce with "
            f"CUTILE_PY_FUZZ_SEED={SEED} CUTILE_PY_FUZZ_KERNELS={KERNELS} "
            f"pytest tests/test_fuzz_kernels.py -k 'case{self.index}_'\n{self.source}"
        )


def make_case(index: int) -> Case:
    seed = (SEED * 1_000_003 + index) % 2**63
    rng = random.Random(seed)
    dtype = DTYPES[index % len(DTYPES)]
    grammar = Grammar(rng, dtype)
    node = grammar.tree(rng.randint(2, 5))
    small = dtype in ("f16", "bf16")
    source = KERNEL_TEMPLATE.format(
        dt=dtype,
        expr=node.src,
        load=".astype(f32)" if small else "",
        store=f".astype({dtype})" if small else "",
    )
    return Case(index, seed, dtype, source, node, grammar)


CASES = [make_case(i) for i in range(KERNELS)]


def _load(case: Case, directory: Path) -> Any:
    path = directory / f"fuzz_case{case.index}.py"
    path.write_text(case.source)
    spec = importlib.util.spec_from_file_location(f"fuzz_case{case.index}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # the frontend reads the kernel's module
    spec.loader.exec_module(module)
    return module.fuzz


def _inputs(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    if case.dtype == "i32":
        return tuple(rng.integers(-20, 21, (R, C)).astype(np.int32) for _ in range(2))  # type: ignore[return-value]
    dt = getattr(ct, case.dtype)
    return tuple(  # type: ignore[return-value]
        np.asarray(round_to(rng.standard_normal((R, C)).astype(np.float32) * 3, dt))
        for _ in range(2)
    )


@pytest.fixture(scope="module")
def kernel_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("fuzz_kernels")
    yield directory
    for name in [n for n in sys.modules if n.startswith("fuzz_case")]:
        del sys.modules[name]


@pytest.mark.parametrize("case", CASES, ids=[f"case{c.index}_{c.dtype}" for c in CASES])
def test_random_kernel_matches_numpy(case: Case, kernel_dir: Path) -> None:
    kernel = _load(case, kernel_dir)
    dt = getattr(ct, case.dtype)
    rng = np.random.default_rng(case.seed)
    for draw in range(DRAWS):
        a, b = _inputs(case, rng)
        case.grammar.scale[0] = 0.0
        env = {"x": a.astype(case.grammar.np), "y": b.astype(case.grammar.np)}
        want = np.broadcast_to(case.node.value(env), (R, C))
        if case.dtype in ("f16", "bf16"):
            want = np.asarray(round_to(want.astype(np.float32), dt)).astype(np.float32)
        for backend in ("sim", "interpret"):
            ct.set_backend(backend)
            try:
                z = ct.zeros((R, C), dt).partition((R, C))
                out = kernel(z, ct.from_numpy(a, dt), ct.from_numpy(b, dt)).sync()
                got = out[0].unpartition().to_numpy().astype(want.dtype)
            finally:
                ct.set_backend("sim")
            what = f"{backend}, draw {draw}: {case.describe()}"
            if case.dtype == "i32":
                np.testing.assert_array_equal(got, want, err_msg=what)
            else:
                tol = TOLERANCE[case.dtype] * max(case.grammar.scale[0], 1.0)
                np.testing.assert_allclose(
                    got, want, rtol=TOLERANCE[case.dtype], atol=tol, equal_nan=True, err_msg=what
                )
