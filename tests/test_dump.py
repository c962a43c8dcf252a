"""`CUTILE_PY_DUMP=DIR` writes the tile IR, the lowering plan and the PTX of every kernel
compiled, one file each per specialization, named after the kernel."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")


@ct.kernel
def dumped_scale(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    t = ct.load_tile_like(x, z)
    z.store(t * 3.0 - ct.max(t, 0, keepdims=True))


def test_dump_writes_ir_plan_and_ptx_per_specialization(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    ct.set_backend("sim")
    out = tmp_path / "dump"
    monkeypatch.setenv("CUTILE_PY_DUMP", str(out))
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))  # compiled, not read
    for n, tile in ((256, 128), (64, 32)):  # two specializations
        x = rng.standard_normal(n).astype(np.float32)
        z = ct.full((n,), np.nan, f32)
        (zp, _) = dumped_scale(z.partition((tile,)), ct.from_numpy(x)).sync()
        got = zp.unpartition().to_numpy()
        for s in range(0, n, tile):
            ref = x[s : s + tile] * np.float32(3.0) - x[s : s + tile].max()
            np.testing.assert_allclose(got[s : s + tile], ref, rtol=1e-6)
    files = sorted(p.name for p in out.iterdir())
    assert len(files) == 6, files
    stems = {f.rsplit(".", 1)[0] for f in files}
    assert len(stems) == 2 and all(s.startswith("dumped_scale.sm_80.") for s in stems)
    for stem in stems:
        ir_text = (out / f"{stem}.ir").read_text()
        plan = (out / f"{stem}.plan").read_text()
        ptx = (out / f"{stem}.ptx").read_text()
        assert ir_text.startswith("kernel dumped_scale(") and "reduce[max axis=0]" in ir_text
        assert plan.startswith("plan of kernel dumped_scale for sm_80 [mma_sync cp_async]")
        assert "layouts:" in plan and "bases:" in plan
        assert ".visible .entry" in ptx and ".target sm_80" in ptx


def test_unwritable_dump_directory_warns_and_the_kernel_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator
) -> None:
    ct.set_backend("sim")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CUTILE_PY_DUMP", str(blocker / "dump"))
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "cache"))
    x = rng.standard_normal(48).astype(np.float32)
    z = ct.full((48,), np.nan, f32)
    with pytest.warns(RuntimeWarning, match=r"CUTILE_PY_DUMP=.*could not write the dump"):
        (zp, _) = dumped_scale(z.partition((16,)), ct.from_numpy(x)).sync()
    ref = x.reshape(3, 16) * np.float32(3.0) - x.reshape(3, 16).max(axis=1, keepdims=True)
    np.testing.assert_allclose(zp.unpartition().to_numpy(), ref.reshape(-1), rtol=1e-6)
