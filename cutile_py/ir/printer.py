"""Deterministic text form of tile IR (what `kernel.ir()` shows and golden tests compare)."""

from __future__ import annotations

from cutile_py.ir import ops as o


def print_kernel(kernel: o.Kernel) -> str:
    return _render(kernel)[0]


def value_names(kernel: o.Kernel) -> dict[o.Value, str]:
    """The name (`%N`) `print_kernel` gives each value, so that other printouts (a lowering
    plan) can refer to the values of the printed IR."""
    return _render(kernel)[1]


def _render(kernel: o.Kernel) -> tuple[str, dict[o.Value, str]]:
    names: dict[o.Value, str] = {}

    def name(v: o.Value) -> str:
        if v not in names:
            names[v] = f"%{len(names)}"
        return names[v]

    def param(i: int, p: o.Param) -> str:
        if isinstance(p, o.ScalarParam):
            v = kernel.param_values[i]
            if v is None:
                return f"const {p.name}: {p.dtype.name} = {p.constant!r}"
            return f"{name(v)}: {p.dtype.name} {p.name}"
        dims = ", ".join("?" if d is None else str(d) for d in p.dims)
        kind = "partition" if p.mut else "tensor"
        return f"@{i}: {kind}<{p.dtype.name}; {dims}; align {p.align}> {p.name}"

    lines = [f"kernel {kernel.name}(" + ", ".join(param(i, p) for i, p in enumerate(kernel.params))]
    lines[0] += (
        f") grid_rank={kernel.grid_rank}"
        + (" fast_math" if kernel.fast_math else "")
        + (f" stages={kernel.stages}" if kernel.stages is not None else "")
        + (f" num_warps={kernel.num_warps}" if kernel.num_warps is not None else "")
        + (f" group_m={kernel.group_m}" if kernel.group_m is not None else "")
        + (" warp_specialize" if kernel.warp_specialize else "")
        + (" persistent" if kernel.persistent else "")
        + " {"
    )

    def region(r: o.Region, indent: str) -> None:
        for op in r.ops:
            res = ", ".join(name(v) for v in op.results)
            lhs = f"{res} = " if res else ""
            args = ", ".join(name(v) for v in op.operands)
            attrs = op.attrs()
            text = f"{indent}{lhs}{op.opname}"
            if attrs:
                text += f"[{attrs}]"
            if args:
                text += f" {args}"
            if op.results:
                text += " : " + ", ".join(str(v.type) for v in op.results)
            subs = op.regions()
            if subs:
                text += " {"
            lines.append(text)
            for k, sub in enumerate(subs):
                if k:
                    lines.append(f"{indent}}} else {{")
                if sub.args:
                    lines.append(f"{indent}  ^(" + ", ".join(name(a) for a in sub.args) + ")")
                region(sub, indent + "  ")
            if subs:
                lines.append(f"{indent}}}")

    region(kernel.body, "  ")
    lines.append("}")
    return "\n".join(lines) + "\n", names
