"""The arch-specific target sm_90a: which targets may use wgmma, the `.target` and `.version` a
module that uses it gets, nvJitLink assembling it, and the caches keeping the targets apart."""

from __future__ import annotations

from typing import TypeVar

import pytest

import cutile_py as ct
from cutile_py import Mut, Tensor, f32
from cutile_py.host import jit_disk
from cutile_py.host.kernel import parse_target
from cutile_py.ptx.builder import FunctionBuilder, ModuleBuilder
from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import PtxAssemblyError, assemble, nvjitlink_available

B = TypeVar("B")


@ct.kernel
def ones(out: Mut[Tensor[f32, B]]) -> None:
    out.store(ct.load_tile_like(out, out) + 1.0)


def test_wgmma_only_on_arch_specific_sm_90() -> None:
    assert Target(90).wgmma
    assert not Target(90, arch_specific=False).wgmma
    assert not Target(80).wgmma and not Target(89).wgmma
    assert not Target(100).wgmma  # sm_100a has no wgmma (tcgen05 instead)


def test_ptx_target_and_version_follow_the_features() -> None:
    t = Target(90)
    assert t.ptx_target(frozenset()) == "sm_90"
    assert t.ptx_target(frozenset({"wgmma"})) == "sm_90a"
    assert t.ptx_version(frozenset({"wgmma"})) == (8, 0)
    assert t.ptx_version(frozenset()) == (7, 8)
    with pytest.raises(ValueError, match="arch_specific"):
        Target(90, arch_specific=False).ptx_target(frozenset({"wgmma"}))


def _fence_module(target: Target, features: set[str]) -> str:
    fb = FunctionBuilder("k", [])
    fb.ins("wgmma.fence.sync.aligned")
    fb.ins("wgmma.commit_group.sync.aligned")
    fb.ins("wgmma.wait_group.sync.aligned 0")
    fb.ins("ret")
    module = ModuleBuilder(target, features)
    module.functions.append(fb)
    return module.render()


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
def test_a_wgmma_module_assembles_for_sm_90a_only() -> None:
    ptx = _fence_module(Target(90), {"wgmma"})
    assert ".target sm_90a" in ptx and ".version 8.0" in ptx
    report = assemble(ptx, Target(90))
    assert "sm_90a" in report.info_log
    # The same instructions under plain sm_90 are refused: the variant is what makes them legal.
    plain = ptx.replace(".target sm_90a", ".target sm_90")
    with pytest.raises(PtxAssemblyError):
        assemble(plain, Target(90))


def test_parse_target_reads_the_variant() -> None:
    assert parse_target("sm_90a") == Target(90)
    assert parse_target("sm_90") == Target(90)
    with pytest.raises(ValueError, match="sm_90a"):
        parse_target("sm_90x")


def test_disk_entries_keep_arch_specific_apart() -> None:
    k = ones
    spec = k.specialize((ct.PartitionSpec((64,), (32,)),))
    keys = {
        jit_disk.disk_key(
            captured=k.captured, qualname="ones", spec=spec, target=t, fast_math=False, compiler="c"
        )
        for t in (Target(90), Target(90, arch_specific=False), Target(80))
    }
    assert len(keys) == 3
    lowered = k.compile(ct.PartitionSpec((64,), (32,)), target=Target(90)).lowered
    assert lowered is not None
    decoded = jit_disk.decode(jit_disk.encode(lowered, "ir"))
    assert decoded is not None and decoded[0].target == Target(90)
    why = jit_disk.mismatch(decoded[0], k.name, spec, Target(90, arch_specific=False))
    assert why is not None and "wgmma" in why
