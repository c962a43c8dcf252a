"""Writing results: per-experiment CSV and JSON, optional PNG plots, and REPORT.md."""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path

from paper_repro.core import Context, Result, Row, Value


def _columns(rows: Sequence[Row]) -> list[str]:
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    return cols


def _clean(v: Value) -> Value:
    return None if isinstance(v, float) and not math.isfinite(v) else v


def write_result(out: Path, res: Result) -> None:
    cols = _columns(res.rows)
    with open(out / f"{res.name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in res.rows:
            w.writerow({k: _clean(r.get(k)) for k in cols})
    data = {
        "name": res.name,
        "title": res.title,
        "seconds": round(res.seconds, 2),
        "notes": res.notes,
        "summary": res.summary,
        "rows": [{k: _clean(v) for k, v in r.items()} for r in res.rows],
    }
    (out / f"{res.name}.json").write_text(json.dumps(data, indent=1) + "\n")
    _plot(out, res)


def _plot(out: Path, res: Result) -> None:
    """A PNG of the main metric per series, where matplotlib is importable (optional)."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found, unused-ignore]
    except Exception:
        return
    metric = next(
        (m for m in ("gbps", "tflops", "us_per_op", "time_us") if any(m in r for r in res.rows)),
        None,
    )
    if metric is None:
        return
    series: dict[str, list[tuple[str, float]]] = {}
    for r in res.rows:
        v = r.get(metric)
        if r.get("status") != "ok" or not isinstance(v, (int, float)):
            continue
        key = " ".join(str(r[k]) for k in ("kernel", "impl", "mode", "dtype") if r.get(k))
        x = str(r.get("shape") or r.get("n") or r.get("size") or len(series.get(key, [])))
        series.setdefault(key, []).append((x, float(v)))
    if not series:
        return
    fig, ax = plt.subplots(figsize=(10, 5))
    for key, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
    ax.set_ylabel(metric)
    ax.set_title(res.title)
    ax.tick_params(axis="x", rotation=45, labelsize=7)
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(out / f"{res.name}.png", dpi=110)
    plt.close(fig)


def _cell(v: Value) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.4g}" if math.isfinite(v) else "nan"
    return str(v).replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[Row], columns: Sequence[str]) -> list[str]:
    cols = [c for c in columns if any(c in r for r in rows)] or _columns(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in cols) + " |" for r in rows]
    return lines


def write_report(
    out: Path,
    ctx: Context,
    results: Sequence[Result],
    argv: Sequence[str],
    running: str | None = None,
) -> None:
    """REPORT.md of `results`; `running` names one still running (its rows so far)."""
    dev = ctx.device
    lines = [
        "# cutile_py: reproduction of the cuTile Rust paper's measurements",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        f"- command: `python -m paper_repro {' '.join(argv)}`",
        f"- backend: `{ctx.backend}`" + (" (quick sizes)" if ctx.quick else ""),
        f"- timing: {ctx.timer.method}, median of {ctx.timer.reps} samples after "
        f"{ctx.timer.warmup} warm-up batches",
    ]
    if ctx.backend != "cuda":
        lines.append(
            "- **Not a GPU measurement**: the kernels ran on the CPU (the `sim` backend executes "
            "the compiled PTX thread by thread). The numbers check that the harness works; "
            "they say nothing about GPU performance."
        )
    lines += ["", "## Machine", ""]
    lines += table(
        [{"field": k, "value": v} for k, v in dev.items() if k != "nvidia_smi"], ["field", "value"]
    )
    if dev.get("nvidia_smi"):
        lines += ["", "```", str(dev["nvidia_smi"]), "```"]
    lines += ["", "## Measured ceilings", ""]
    if ctx.ceilings:
        lines += [f"- {k}: {v:.4g}" for k, v in sorted(ctx.ceilings.items())]
    else:
        lines.append("- none measured")
    lines += ["", "## The paper's numbers and ours", ""]
    for res in results:
        lines += [f"- **{res.name}**: {s}" for s in res.summary]
    missing = sorted(
        {
            f"{res.name}: {r.get('kernel') or r.get('what') or ''} "
            f"{r.get('impl') or r.get('mode') or ''} — {r.get('note')}".replace("  ", " ")
            for res in results
            for r in res.rows
            if r.get("status") == "missing"
        }
    )
    lines += ["", "## Missing", ""]
    lines += [f"- {m}" for m in missing] or ["- nothing"]
    errors = [(res.name, r) for res in results for r in res.rows if r.get("status") == "error"]
    if errors:
        lines += ["", "## Errors", ""]
        lines += [
            f"- {name}: {r.get('kernel') or r.get('impl') or ''} {r.get('note')}"
            for name, r in errors
        ]
    for res in results:
        took = f"({res.seconds:.1f} s)"
        if res.name == running:
            took = f"(unfinished when written: the rows of its first {res.seconds:.1f} s)"
        lines += ["", f"## {res.name}: {res.title}", "", took, ""]
        lines += [f"- {n}" for n in res.notes]
        if res.notes:
            lines.append("")
        shown = [r for r in res.rows if r.get("status") != "missing"]
        lines += table(shown, res.columns) if shown else ["(no measurements)"]
    (out / "REPORT.md").write_text("\n".join(lines) + "\n")
