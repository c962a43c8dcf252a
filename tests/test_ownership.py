"""The ownership rules of API.md §2, checked before anything is launched."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from tests.support import elementwise_kernels as K

B = TypeVar("B")


@ct.kernel
def copy2(a: Mut[Tensor[f32, B]], b: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, a)
    a.store(t)
    b.store(t * 2.0)


@ct.kernel
def with_constant(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], k: ct.Constant[int]) -> None:
    z.store(ct.load_tile_like(x, z) * k)


def test_use_after_partition_is_moved_error_naming_the_line() -> None:
    t = ct.zeros(10)
    t.partition(4)
    with pytest.raises(
        ct.MovedError, match=r"moved by \.partition\(\) at .*test_ownership\.py:\d+"
    ):
        t.to_numpy()
    with pytest.raises(ct.MovedError):
        t.partition(2)
    assert issubclass(ct.MovedError, ct.BorrowError) and issubclass(ct.AliasError, ct.BorrowError)


def test_moved_tensor_passed_to_a_kernel_names_the_parameter() -> None:
    x = ct.zeros(8)
    z = ct.zeros(8).partition(8)
    x.partition(4)
    with pytest.raises(ct.MovedError, match="parameter 'x'"):
        K.add(z, x, ct.zeros(8))


def test_unpartition_moves_the_partition() -> None:
    p = ct.zeros(8).partition(4)
    t = p.unpartition()
    assert t.shape == (8,)
    with pytest.raises(ct.MovedError, match=r"unpartition"):
        p.unpartition()
    with pytest.raises(ct.MovedError):
        K.add(p, ct.zeros(8), ct.zeros(8))


def test_same_partition_twice_is_alias_error() -> None:
    p = ct.zeros(8).partition(4)
    with pytest.raises(ct.AliasError, match="'a' and 'b'"):
        copy2(p, p, ct.zeros(8))
    # Nothing was taken: the partition is still usable.
    copy2(p, ct.zeros(8).partition(4), ct.zeros(8)).sync()


def test_partition_and_its_own_storage_is_alias_error() -> None:
    host = np.arange(8, dtype=np.float32)
    x = ct.from_dlpack(host)  # borrowed zero-copy, twice: two tensors over one memory
    view = ct.from_dlpack(host)
    p = x.partition(4)
    with pytest.raises(ct.AliasError, match="'z' and 'x'"):
        K.add(p, view, ct.zeros(8))
    with pytest.raises(ct.AliasError, match="'z' and 'y'"):
        K.add(p, ct.zeros(8), view)


def test_from_dlpack_of_a_tensor_is_refused() -> None:
    with pytest.raises(TypeError, match="would alias it"):
        ct.from_dlpack(ct.zeros(4))


def test_misaligned_borrowed_view_runs_unvectorized(rng: np.random.Generator) -> None:
    base = rng.standard_normal(1025).astype(np.float32)
    x = ct.from_dlpack(base[1:])  # 4 bytes past a 16-byte boundary
    z, _, _ = K.add(ct.zeros(1024).partition(256), x, x).sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), base[1:] + base[1:])


def test_a_shared_tensor_may_be_passed_twice(rng: np.random.Generator) -> None:
    xs = rng.standard_normal(100).astype(np.float32)
    x = ct.from_numpy(xs)
    z, x1, x2 = K.add(ct.zeros(100).partition(32), x, x).sync()
    assert x1 is x and x2 is x
    np.testing.assert_array_equal(z.unpartition().to_numpy(), xs + xs)


def test_arguments_are_held_until_sync_and_returned_as_the_same_objects() -> None:
    z, x, y = ct.zeros(16).partition(8), ct.ones(16), ct.ones(16)
    op = K.add(z, x, y)
    with pytest.raises(ct.BorrowError, match="held by the pending launch of kernel add"):
        x.to_numpy()
    with pytest.raises(ct.BorrowError):
        z.unpartition()
    with pytest.raises(ct.BorrowError, match="parameter 'z'"):
        K.add(z, x, y)
    # A tensor held shared may be read by another launch.
    other = K.add(ct.zeros(16).partition(8), x, y)
    out = op.sync()
    assert out[0] is z and out[1] is x and out[2] is y
    with pytest.raises(ct.BorrowError, match="held by the pending launch"):
        x.partition(4)  # still shared-held by `other`
    other.sync()
    np.testing.assert_array_equal(z.unpartition().to_numpy(), np.full(16, 2, np.float32))
    x.partition(4)


def test_sync_twice_is_an_error() -> None:
    op = K.add(ct.zeros(4).partition(4), ct.ones(4), ct.ones(4))
    op.sync()
    with pytest.raises(ct.BorrowError, match="already completed"):
        op.sync()


def test_dropping_an_unlaunched_op_releases_its_arguments() -> None:
    z, x = ct.zeros(4).partition(4), ct.ones(4)
    op = K.add(z, x, x)
    del op
    x.to_numpy()
    z.unpartition()


@pytest.mark.parametrize(
    "args,error,pattern",
    [
        (
            lambda: (ct.zeros(8, ct.f16).partition(4), ct.zeros(8), ct.zeros(8)),
            TypeError,
            "'z': expected dtype f32, got f16",
        ),
        (
            lambda: (ct.zeros(8).partition(4), ct.zeros((2, 4)), ct.zeros(8)),
            ValueError,
            "'x': expected rank 1, got rank 2",
        ),
        (
            lambda: (ct.zeros(8), ct.zeros(8), ct.zeros(8)),
            TypeError,
            "'z': a Mut parameter takes a Partition",
        ),
        (
            lambda: (ct.zeros(8).partition(4), ct.zeros(8).partition(4), ct.zeros(8)),
            TypeError,
            "'x': a shared Tensor parameter takes the tensor itself",
        ),
        (
            lambda: (ct.zeros(8).partition(4), 1.0, ct.zeros(8)),
            TypeError,
            "'x': expected a Tensor, got float",
        ),
    ],
)
def test_wrong_arguments_name_the_parameter(
    args: object, error: type[Exception], pattern: str
) -> None:
    built = args()  # type: ignore[operator]
    with pytest.raises(error, match=pattern):
        K.add(*built)
    # No error leaves a tensor half-owned: every argument is still usable.
    for a in built:
        if isinstance(a, ct.Partition):
            a.unpartition()
        elif isinstance(a, ct.Tensor):
            a.to_numpy()


def test_scalar_where_tensor_belongs_and_tensor_where_scalar_belongs() -> None:
    z = ct.zeros(8).partition(4)
    with pytest.raises(TypeError, match="'a': expected a float scalar, got a tensor"):
        K.saxpy(z, ct.zeros(8), ct.zeros(8), ct.zeros(8))
    with pytest.raises(TypeError, match="'a': expected float, got str"):
        K.saxpy(z, "2", ct.zeros(8), ct.zeros(8))


def test_missing_constant_and_missing_argument() -> None:
    z = ct.zeros(8).partition(4)
    with pytest.raises(TypeError, match="kernel with_constant: missing a required argument: 'k'"):
        with_constant(z, ct.zeros(8))
    out = with_constant(z, ct.ones(8), 3).sync()[0].unpartition().to_numpy()
    np.testing.assert_array_equal(out, np.full(8, 3, np.float32))


def test_mut_parameters_must_share_a_grid() -> None:
    with pytest.raises(ValueError, match="same grid"):
        copy2(ct.zeros(8).partition(4), ct.zeros(12).partition(4), ct.zeros(8))


def test_typevar_mismatch_between_partitions_is_value_error() -> None:
    with pytest.raises(ValueError, match="'b': dim B = 2 disagrees with B = 4"):
        copy2(ct.zeros(8).partition(4), ct.zeros(4).partition(2), ct.zeros(8))


def test_tensors_of_another_backend_are_rejected() -> None:
    from cutile_py.host.tensor import Tensor as HostTensor
    from cutile_py.runtime.backend import InterpretBackend

    other = InterpretBackend()
    foreign = HostTensor(other.alloc(32), (8,), ct.f32, other)
    with pytest.raises(ValueError, match="'x': the tensor lives on the interpret backend"):
        K.add(ct.zeros(8).partition(4), foreign, ct.zeros(8))


C = TypeVar("C")


@ct.kernel
def add_rows(z: Mut[Tensor[f32, B, C]], x: Tensor[f32, Dyn, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) + 1.0)


def test_reshape_moves_the_tensor_and_keeps_its_memory() -> None:
    rng = np.random.default_rng()
    a = rng.standard_normal((4, 6)).astype(np.float32)
    t = ct.from_numpy(a)
    r = t.reshape(3, -1)
    assert r.shape == (3, 8)
    with pytest.raises(ct.MovedError, match=r"moved by \.reshape\(\) at .*test_ownership\.py"):
        t.to_numpy()
    np.testing.assert_array_equal(r.to_numpy(), a.reshape(3, 8))
    # A kernel writes through the reshaped view; the flat view sees it (same storage).
    z, _ = add_rows(r.partition((2, 8)), ct.from_numpy(a.reshape(3, 8))).sync()
    flat = z.unpartition().reshape((24,))
    np.testing.assert_allclose(flat.to_numpy(), a.reshape(-1) + 1.0, rtol=1e-6)


def test_reshape_errors_say_what_does_not_fit() -> None:
    t = ct.zeros((4, 6))
    with pytest.raises(ValueError, match=r"shape \(4, 6\) \(24 elements\) into \(5, 5\)"):
        t.reshape(5, 5)
    with pytest.raises(ValueError, match="at most one dim may be -1"):
        t.reshape(-1, -1)
    with pytest.raises(ValueError, match=r"into \(5, -1\)"):
        t.reshape(5, -1)
    with pytest.raises(TypeError, match="dims must be integers"):
        t.reshape(2.0, 12)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="expected a shape"):
        t.reshape()
    assert t.reshape(24).shape == (24,)  # the failed attempts left it usable
    assert ct.full(1, 3.0).reshape(()).to_numpy() == 3.0  # rank 0, as NumPy allows


def test_reshape_of_a_held_tensor_is_refused() -> None:
    x = ct.zeros(8)
    op = K.add(ct.zeros(8).partition(8), x, x)
    with pytest.raises(ct.BorrowError, match="held by the pending launch"):
        x.reshape(2, 4)
    op.sync()
    assert x.reshape(2, 4).shape == (2, 4)
