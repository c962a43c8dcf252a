"""`CUTILE_PY_DUMP=DIR`: the tile IR, the lowering plan and the PTX of every kernel compiled are
written into DIR, one file each per specialization, named after the kernel
(`<kernel>.<target>.<ir hash>.ir|.plan|.ptx`), so a user can see what the compiler decided."""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from pathlib import Path

from cutile_py.ir import Kernel as KernelIR
from cutile_py.lower.pipeline import LoweredKernel
from cutile_py.lower.plan import format_plan

ENV = "CUTILE_PY_DUMP"


def dump_dir() -> Path | None:
    """The directory `CUTILE_PY_DUMP` names, or None where it is unset or empty."""
    value = os.environ.get(ENV, "")
    return Path(value) if value else None


def dump_compiled(name: str, kir: KernelIR, ir_text: str, lowered: LoweredKernel) -> None:
    """Write the three files of one compiled specialization, if dumping is on. A directory
    that cannot be written is reported with a warning; the kernel still runs."""
    directory = dump_dir()
    if directory is None:
        return
    digest = hashlib.sha256(ir_text.encode()).hexdigest()[:12]
    stem = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name)}.{lowered.target.name}.{digest}"
    plan = format_plan(kir, lowered.plan) if lowered.plan is not None else ""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".ir", ir_text), (".plan", plan), (".ptx", lowered.ptx)):
            (directory / (stem + suffix)).write_text(text)
    except OSError as e:
        warnings.warn(
            f"{ENV}={directory}: could not write the dump of kernel {name}: {e}",
            RuntimeWarning,
            stacklevel=2,
        )
