"""Assemble the PTX of every shipped kernel (library and examples) for sm_80 and sm_90; a
kernel whose sm_90 module is arch-specific (sm_90a: wgmma) is assembled as portable sm_90
too (`Target(90, arch_specific=False)`, the mma.sync path).

`python -m cutile_py.tools.validate_ptx` prints registers and spills per kernel and target, and
exits non-zero if nvJitLink rejects any module or a kernel spills registers.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import cutile_py as ct
from cutile_py.runtime.nvjitlink import PtxAssemblyError, assemble

TARGETS = (ct.Target(80), ct.Target(90))
ROOT = Path(__file__).resolve().parents[2]


def _load_example(name: str) -> ModuleType:
    path = ROOT / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_cutile_example_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cases() -> Iterator[tuple[str, ct.Kernel, tuple[Any, ...]]]:
    """(label, kernel, arguments as specs) for each shipped kernel, at representative shapes."""
    import cutile_py_kernels.cases as library
    import cutile_py_kernels.elementwise as lib

    n = 1 << 20
    for tail in (n, n + 3):  # aligned (vectorized) and unaligned (scalar) accesses
        out = ct.PartitionSpec((tail,), (lib.TILE,))
        v = ct.TensorSpec((tail,))
        yield f"kernels.add n={tail}", lib.add_kernel, (out, v, v)
        yield f"kernels.saxpy n={tail}", lib.saxpy_kernel, (out, 2.0, v, v)
    for label, kernel, args in library.cases():
        yield f"kernels.{label}", kernel, args
    if (ROOT / "examples").is_dir():
        hello = _load_example("hello_world")
        ids = ct.PartitionSpec((20,), (8,), ct.i32)
        yield "examples.hello_world", hello.write_block_ids, (ids,)
        saxpy = _load_example("saxpy")
        v = ct.TensorSpec((10_007,))
        yield "examples.saxpy", saxpy.saxpy, (ct.PartitionSpec((10_007,), (1024,)), 2.5, v, v)
        add = _load_example("add")
        v = ct.TensorSpec((65536,))
        yield "examples.add", add.add, (ct.PartitionSpec((65536,), (1024,)), v, v)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args(argv)
    failures = 0
    for label, kernel, args in cases():
        targets = list(TARGETS)
        for target in targets:
            ptx = kernel.ptx(*args, target=target)
            name = target.name if target.arch_specific else f"{target.name} (portable)"
            if f".target {target.name}a\n" in ptx:
                name = f"{target.name}a"
                targets.append(ct.Target(target.sm, arch_specific=False))
            try:
                report = assemble(ptx, target)
            except PtxAssemblyError as e:
                print(f"FAIL {label} {name}: {e}")
                failures += 1
                continue
            status = "ok  " if report.spill_free else "FAIL"
            failures += not report.spill_free
            spilled = (
                f"{report.spill_stores} spill stores, {report.spill_loads} spill loads"
                if report.spills_logged
                else "spills not in nvJitLink's log"
            )
            print(f"{status} {label:32} {name}: {report.registers:3} registers, {spilled}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
