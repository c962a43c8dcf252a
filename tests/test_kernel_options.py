"""`@ct.kernel` options: `stages` is checked at decoration, shown in the IR and kept apart in
the in-memory and disk JIT caches."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.host import jit_disk
from cutile_py.host.kernel import COMPILER_VERSION, Kernel

B = TypeVar("B")

SPEC = (ct.PartitionSpec((64,), (16,)), ct.TensorSpec((64,)))


def _copy(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z))


def _def_line(name: str) -> int:
    """The line of this file's only `def name(` (after decorators), as errors report it."""
    lines = Path(__file__).read_text().splitlines()
    (line,) = (i + 1 for i, text in enumerate(lines) if text.lstrip().startswith(f"def {name}("))
    return line


@pytest.mark.parametrize(
    ("stages", "error", "match"),
    [
        (0, ValueError, "from 1 to 8, got 0"),
        (9, ValueError, "from 1 to 8, got 9"),
        (-2, ValueError, "got -2"),
        (True, TypeError, "must be an int or None, got True"),
        (2.0, TypeError, "got 2.0"),
        ("3", TypeError, "got '3'"),
    ],
)
def test_bad_stages_are_rejected_at_decoration(
    stages: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:

        @ct.kernel(stages=stages)
        def bad_stages(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
            z.store(ct.load_tile_like(x, z))

    message = str(info.value)
    assert "stages" in message
    assert "kernel bad_stages" in message
    # The location of the decorated `def`, in the form CompileError uses (file:line).
    assert f"{__file__}:{_def_line('bad_stages')}:" in message


def test_the_error_names_the_def_line() -> None:
    with pytest.raises(ValueError) as info:
        Kernel(_copy, stages=10)
    assert f"{__file__}:{_def_line('_copy')}: kernel _copy: stages" in str(info.value)


@pytest.mark.parametrize("stages", [None, 1, 3, 8])
def test_valid_stages_are_kept(stages: int | None) -> None:
    k = ct.kernel(stages=stages)(_copy)
    assert k.stages == stages
    assert ct.kernel(_copy).stages is None


def test_ir_shows_stages() -> None:
    staged = ct.kernel(stages=3)(_copy)
    header = staged.ir(*SPEC).splitlines()[0]
    assert header.endswith(" grid_rank=1 stages=3 {"), header
    assert staged.compile(*SPEC, target="sm_80").ir.stages == 3
    both = ct.kernel(fast_math=True, stages=2)(_copy)
    assert both.ir(*SPEC).splitlines()[0].endswith(" fast_math stages=2 {")
    plain = ct.kernel(_copy).ir(*SPEC).splitlines()[0]
    assert "stages" not in plain


def test_kernels_differing_only_in_stages_do_not_share_a_cache_entry() -> None:
    two, three = ct.kernel(stages=2)(_copy), ct.kernel(stages=3)(_copy)
    default, three_again = ct.kernel(_copy), ct.kernel(stages=3)(_copy)
    c2, c3 = two.compile(*SPEC, target="sm_80"), three.compile(*SPEC, target="sm_80")
    cd = default.compile(*SPEC, target="sm_80")
    assert len({id(c2), id(c3), id(cd)}) == 3
    assert (c2.ir.stages, c3.ir.stages, cd.ir.stages) == (2, 3, None)
    # The same source, qualname and options: the same entry.
    assert three_again.compile(*SPEC, target="sm_80") is c3
    # IR-only entries (the interpreter's) are kept apart too.
    assert "stages=2" in two.ir(*SPEC) and "stages=3" in three.ir(*SPEC)


def test_disk_keys_differ_by_stages() -> None:
    k = ct.kernel(_copy)
    spec = k.specialize(SPEC)

    def key(stages: int | None) -> str | None:
        return jit_disk.disk_key(
            captured=k.captured,
            qualname=k.__qualname__,
            spec=spec,
            target=ct.Target(80),
            fast_math=False,
            stages=stages,
            compiler=COMPILER_VERSION,
        )

    keys = [key(s) for s in (None, 1, 2, 3)]
    assert None not in keys and len(set(keys)) == 4
    assert key(2) == key(2)


# -- num_warps ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("num_warps", "error", "match"),
    [
        (0, ValueError, "1, 2, 4, 8, 16 or 32, got 0"),
        (3, ValueError, "got 3"),
        (64, ValueError, "got 64"),
        (True, TypeError, "must be an int or None, got True"),
        (4.0, TypeError, "got 4.0"),
    ],
)
def test_bad_num_warps_are_rejected_at_decoration(
    num_warps: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        ct.kernel(num_warps=num_warps)(_copy)
    assert f"{__file__}:{_def_line('_copy')}: kernel _copy: num_warps" in str(info.value)


@pytest.mark.parametrize("num_warps", [1, 2, 8, 32])
def test_num_warps_sets_the_block_and_runs(num_warps: int, rng: Any) -> None:
    """The block is num_warps warps, whatever the tile would give (64 elements: 32 threads by
    default), and the copy is right on the simulator with every block size."""
    k = ct.kernel(num_warps=num_warps)(_copy)
    spec = (ct.PartitionSpec((1000,), (64,)), ct.TensorSpec((1000,)))
    assert k.compile(*spec, target="sm_80").lowered.block_threads == 32 * num_warps
    header = k.ir(*spec).splitlines()[0]
    assert header.endswith(f" num_warps={num_warps} {{"), header
    ct.set_backend("sim")
    xs = rng.standard_normal(1000).astype("float32")
    z, _ = k(ct.empty((1000,)).partition(64), ct.from_numpy(xs)).sync()
    assert (z.unpartition().to_numpy() == xs).all()


def test_kernels_differing_only_in_num_warps_do_not_share_a_cache_entry() -> None:
    one, four = ct.kernel(num_warps=1)(_copy), ct.kernel(num_warps=4)(_copy)
    c1, c4 = one.compile(*SPEC, target="sm_80"), four.compile(*SPEC, target="sm_80")
    cd = ct.kernel(_copy).compile(*SPEC, target="sm_80")
    assert len({id(c1), id(c4), id(cd)}) == 3
    assert (c1.lowered.block_threads, c4.lowered.block_threads) == (32, 128)
    k = ct.kernel(_copy)
    spec = k.specialize(SPEC)
    keys = {
        jit_disk.disk_key(captured=k.captured, qualname=k.__qualname__, spec=spec,
                          target=ct.Target(80), fast_math=False, compiler=COMPILER_VERSION,
                          num_warps=w)
        for w in (None, 1, 4)
    }  # fmt: skip
    assert None not in keys and len(keys) == 3
