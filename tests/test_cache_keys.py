"""What keys the compiled-kernel caches (memory and disk): everything a kernel reads, through
every helper it inlines at any depth (globals, closure variables, module attributes `a.b.c`),
and float constants by their bits. A changed value must give new code on `sim` (compiled, so
cached) just as on `interpret` (the kernel's Python, never stale)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.host import kernel as kmod
from cutile_py.runtime.disk_cache import default_cache

ROOT = Path(__file__).resolve().parent.parent
B = TypeVar("B")
N = 70

SCALE = 2.0
OFFSET = 1.0
ZERO = 0.0


@ct.function
def shift(t: ct.Tile) -> ct.Tile:
    return t + OFFSET  # a global read two helpers below the kernel


@ct.function
def scale_shift(t: ct.Tile) -> ct.Tile:
    return shift(t * SCALE)


@ct.kernel
def through_helpers(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(scale_shift(ct.load_tile_like(x, z)))


@ct.kernel
def reciprocal_scaled(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], a: ct.Constant[float]) -> None:
    z.store(1.0 / (ct.load_tile_like(x, z) * a))


@ct.kernel
def reciprocal_of_zero_global(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(1.0 / (ct.load_tile_like(x, z) * ZERO))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "jit"
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(d))
    return d


@pytest.fixture(params=["sim", "interpret"])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    ct.set_backend(request.param)
    yield str(request.param)


def run(kernel: Any, x: np.ndarray, *scalars: Any) -> np.ndarray:
    z = ct.full(x.shape, np.nan, ct.f32).partition((16,))  # poisoned
    (z, *_) = kernel(z, ct.from_numpy(x), *scalars).sync()
    return z.unpartition().to_numpy()  # type: ignore[no-any-return]


def new_process() -> None:
    """Forget the in-memory cache, as a new process would (the disk cache stays)."""
    kmod._CACHE.clear()


# -- 1: globals read inside helpers -------------------------------------------------------------


def test_a_global_read_inside_a_nested_helper_keys_the_cache(
    backend: str, cache_dir: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = rng.standard_normal(N).astype(np.float32)
    this = sys.modules[__name__]
    for scale, offset in [(2.0, 1.0), (3.0, 1.0), (3.0, -4.0), (2.0, 1.0)]:
        monkeypatch.setattr(this, "SCALE", scale)
        monkeypatch.setattr(this, "OFFSET", offset)
        want = x * np.float32(scale) + np.float32(offset)
        np.testing.assert_allclose(run(through_helpers, x), want, rtol=1e-6, atol=1e-6)
    # From the disk cache alone (a new process): the helper's global keys the disk too.
    monkeypatch.setattr(this, "OFFSET", 7.0)
    new_process()
    np.testing.assert_allclose(
        run(through_helpers, x), x * np.float32(2.0) + np.float32(7.0), rtol=1e-6, atol=1e-6
    )


def test_relaunches_on_the_same_tensors_see_changed_reads_shapes_and_constants(
    backend: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launch on the tensors of the kernel's last hit takes that plan without a key lookup:
    # a changed global, an interleaved other shape and a changed constant must still count.
    this = sys.modules[__name__]
    xs = [rng.standard_normal(n).astype(np.float32) for n in (N, 2 * N)]
    ins = [ct.from_numpy(x) for x in xs]
    outs = [ct.full(x.shape, np.nan, ct.f32).partition((16,)) for x in xs]
    # Each pair: launched with the first value, then again on the same tensors with the
    # second; the result must be the second's.
    for k, (s1, s2) in [(0, (2.0, 3.0)), (1, (3.0, 3.0)), (0, (3.0, 2.0)), (1, (2.0, 3.0))]:
        for scale in (s1, s2):
            monkeypatch.setattr(this, "SCALE", scale)
            outs[k], ins[k] = through_helpers(outs[k], ins[k]).sync()
        got = outs[k].unpartition()
        want = xs[k] * np.float32(s2) + np.float32(OFFSET)
        np.testing.assert_allclose(got.to_numpy(), want, rtol=1e-6)
        outs[k] = got.partition((16,))
    z, x = outs[0], ins[0]
    with np.errstate(divide="ignore"):
        for a1, a2 in [(2.0, 3.0), (0.0, -0.0), (-0.0, 0.0), (3.0, 3.0)]:
            for a in (a1, a2):
                z, x, _ = reciprocal_scaled(z, x, a).sync()
            got = z.unpartition()
            want = np.float32(1) / (xs[0] * np.float32(a2))
            np.testing.assert_array_equal(got.to_numpy(), want)
            z = got.partition((16,))


def test_unchanged_helpers_hit_the_memory_cache(rng: np.random.Generator) -> None:
    x = rng.standard_normal(N).astype(np.float32)
    run(through_helpers, x)
    before = ct.cache_info()
    np.testing.assert_allclose(
        run(through_helpers, x), x * np.float32(SCALE) + np.float32(OFFSET), rtol=1e-6, atol=1e-6
    )
    after = ct.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 1


# -- 2: module attributes -----------------------------------------------------------------------

KERNEL_MODULE = """
from typing import TypeVar

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

import {settings}
import {pkg}.sub.consts

B = TypeVar("B")


@ct.function
def plus_eps(t: ct.Tile) -> ct.Tile:
    return t + {settings}.EPS  # a module attribute read inside a helper


@ct.kernel
def eps_kernel(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(plus_eps(ct.load_tile_like(x, z)) * {pkg}.sub.consts.SCALE)  # three deep
"""


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A kernel module importing `settings_<id>` and a package `pkg_<id>.sub.consts`, all in
    files under tmp_path (unique names: test modules stay in sys.modules)."""
    tag = os.urandom(4).hex()
    settings, pkg = f"settings_{tag}", f"pkg_{tag}"
    (tmp_path / f"{settings}.py").write_text("EPS = 0.5\n")
    sub = tmp_path / pkg / "sub"
    sub.mkdir(parents=True)
    (tmp_path / pkg / "__init__.py").write_text("")
    (sub / "__init__.py").write_text("")
    (sub / "consts.py").write_text("SCALE = 2.0\n")
    (tmp_path / f"kernels_{tag}.py").write_text(KERNEL_MODULE.format(settings=settings, pkg=pkg))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = __import__(f"kernels_{tag}")
    yield module, sys.modules[settings], sys.modules[f"{pkg}.sub.consts"]


def test_a_module_attribute_keys_the_memory_cache(
    backend: str, user_modules: Any, cache_dir: Path, rng: np.random.Generator
) -> None:
    kernels, settings, consts = user_modules
    x = rng.standard_normal(N).astype(np.float32)

    def check(eps: float, scale: float) -> None:
        want = (x + np.float32(eps)) * np.float32(scale)
        np.testing.assert_allclose(run(kernels.eps_kernel, x), want, rtol=1e-6, atol=1e-6)

    check(0.5, 2.0)
    settings.EPS = -3.25
    check(-3.25, 2.0)
    consts.SCALE = 5.0
    check(-3.25, 5.0)
    new_process()  # ... and the disk cache
    settings.EPS = 0.125
    check(0.125, 5.0)


SCRIPT = """
import json, sys

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from typing import TypeVar

import settings

B = TypeVar("B")


@ct.kernel
def eps_kernel(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) + settings.EPS)


ct.set_backend("sim")
x = np.array(json.loads(sys.argv[1]), dtype=np.float32)
(z, _) = eps_kernel(ct.zeros(x.shape).partition(16), ct.from_numpy(x)).sync()
print(json.dumps({"z": z.unpartition().to_numpy().tolist(), "stats": vars(ct.cache_info())}))
"""


def test_an_edited_module_attribute_misses_the_disk_cache_in_a_new_process(
    tmp_path: Path, rng: np.random.Generator
) -> None:
    (tmp_path / "kernel_script.py").write_text(SCRIPT)
    settings = tmp_path / "settings.py"
    env = dict(os.environ)
    env["CUTILE_PY_CACHE_DIR"] = str(tmp_path / "jit")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # a same-second edit must not read a stale .pyc
    x = rng.standard_normal(40).astype(np.float32)

    def run_script() -> dict[str, Any]:
        out = subprocess.run(
            [sys.executable, str(tmp_path / "kernel_script.py"), json.dumps(x.tolist())],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    settings.write_text("EPS = 1.5\n")
    first = run_script()
    np.testing.assert_allclose(first["z"], x + np.float32(1.5), rtol=1e-6)
    assert run_script()["stats"]["disk_hits"] == 1  # the cache works
    settings.write_text("EPS = -0.25\n")
    edited = run_script()
    np.testing.assert_allclose(edited["z"], x + np.float32(-0.25), rtol=1e-6)
    assert edited["stats"]["disk_hits"] == 0


# -- 3: floats by their bits --------------------------------------------------------------------


def test_negative_zero_constant_is_its_own_variant(
    backend: str, cache_dir: Path, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N).astype(np.float32)
    with np.errstate(divide="ignore"):
        for a in (0.0, -0.0, 0.0):
            got = run(reciprocal_scaled, x, a)
            np.testing.assert_array_equal(got, np.float32(1) / (x * np.float32(a)))
        new_process()
        got = run(reciprocal_scaled, x, -0.0)
        np.testing.assert_array_equal(got, np.float32(1) / (x * np.float32(-0.0)))


def test_negative_zero_global_is_its_own_variant(
    backend: str, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = rng.standard_normal(N).astype(np.float32)
    with np.errstate(divide="ignore"):
        for zero in (0.0, -0.0):
            monkeypatch.setattr(sys.modules[__name__], "ZERO", zero)
            got = run(reciprocal_of_zero_global, x)
            np.testing.assert_array_equal(got, np.float32(1) / (x * np.float32(zero)))
            assert np.isinf(got).all()


def test_a_nan_constant_hits_the_cache(
    backend: str, cache_dir: Path, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(N).astype(np.float32)
    assert np.isnan(run(reciprocal_scaled, x, float("nan"))).all()
    before, disk_before = ct.cache_info(), vars(default_cache().stats).copy()
    nan = float("nan")  # another NaN object: equal to the first only by its bits
    assert nan is not math.nan
    assert np.isnan(run(reciprocal_scaled, x, nan)).all()
    after = ct.cache_info()
    assert after.misses == before.misses and after.compiles == before.compiles
    assert after.hits == before.hits + 1
    assert vars(default_cache().stats) == disk_before  # the disk was not read again
    assert len(list(cache_dir.glob("*.bin"))) <= 1
