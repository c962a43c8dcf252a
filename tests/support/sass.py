"""SASS opcodes of PTX assembled by nvJitLink, for tests that look at the machine code."""

from __future__ import annotations

import pytest

from cutile_py.ptx.target import Target
from cutile_py.runtime.nvjitlink import assemble
from cutile_py.runtime.sass import SassUnavailable, disassemble, instructions


def opcodes_without_spills(ptx: str, target: Target) -> list[str]:
    """The opcodes of `ptx` assembled for `target`, once it is checked to spill nothing;
    the test is skipped where no disassembler is installed."""
    report = assemble(ptx, target)
    assert report.spill_free, report.info_log
    try:
        return [i.split()[0] for i in instructions(disassemble(report.cubin)) if i.split()]
    except SassUnavailable as e:
        pytest.skip(str(e))
