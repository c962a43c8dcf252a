"""Every `examples/*.py` runs as a user would run it, in a fresh interpreter on `sim`, exits 0
and prints what it promises. The examples use small sizes on the CPU; the whole file takes
well under a minute (each run is also capped, so a hang fails instead of stalling the suite).
The GPU test runs the serving loop unchanged on `cuda`, at a larger size.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.py"))

#: Text each example must print (besides exiting 0); examples not listed only need to exit 0.
EXPECTED: dict[str, list[str]] = {
    "hello_world.py": ["backend: sim", "[0 0 0 0 0 0 0 0 1 1 1 1 1 1 1 1 2 2 2 2]", ".entry"],
    "add.py": ["as expected:", "backend sim: 65536 sums correct"],
    "saxpy.py": ["backend sim: max |error|"],
    "generic_dtype.py": ["backend sim: f32:", "backend sim: f16:", "backend sim: bf16:"],
    "async_pipeline.py": ["backend sim: 4 pipelines in flight", "graph replays max |error|"],
    "qwen3_decode.py": [
        "backend sim (the PTX simulator",
        "prompt [1, 2, 3, 4] -> [",
        "tokens/s; roofline",
        "% of the roofline",
    ],
    "serving_loop.py": [
        "backend sim (the PTX simulator",
        "captured 6 launches",
        "token 7:",
        "max |replay - eager|",
    ],
}
#: Examples whose last line of output must be exactly "ok".
ENDS_WITH_OK = {"serving_loop.py"}
#: Per-run cap (seconds). The examples take a few seconds each on sim with a cold JIT cache.
RUN_CAP = 45.0
#: The whole file's budget on sim (seconds), checked after each run (qwen3_decode.py compiles
#: about 20 kernels on a cold cache).
FILE_BUDGET = 90.0
_spent: list[float] = []


def run_example(name: str, backend: str, *args: str, cap: float = RUN_CAP) -> str:
    """Run `examples/<name>` in a fresh interpreter; returns its stdout (fails on exit != 0)."""
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), CUTILE_PY_BACKEND=backend)
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=cap,
    )
    if backend == "sim":
        _spent.append(time.perf_counter() - start)
    assert result.returncode == 0, (
        f"examples/{name} exited {result.returncode}\n--- stdout\n{result.stdout}\n"
        f"--- stderr\n{result.stderr}"
    )
    return result.stdout


def test_every_example_is_listed() -> None:
    """A new example gets its expected output written down here."""
    assert set(EXPECTED) == set(EXAMPLES), "update EXPECTED in tests/test_examples.py"


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_on_sim(name: str) -> None:
    out = run_example(name, "sim")
    for text in EXPECTED.get(name, []):
        assert text in out, f"examples/{name} did not print {text!r}; it printed:\n{out}"
    if name in ENDS_WITH_OK:
        assert out.strip().splitlines()[-1] == "ok", f"examples/{name} did not end with 'ok'"
    assert sum(_spent) < FILE_BUDGET, (
        f"the examples took {sum(_spent):.1f} s on sim so far, over the {FILE_BUDGET:.0f} s "
        "budget of this file; keep their default sizes small"
    )


def test_qwen3_decode_refuses_a_prompt_id_outside_the_vocabulary() -> None:
    """--prompt takes token ids: one past the vocabulary is a usage error naming it (it was
    silently taken modulo the vocabulary size)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUTILE_PY_BACKEND="sim")
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "qwen3_decode.py"), "--prompt", "1,256"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=RUN_CAP,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "--prompt: token id 256 is not in [0, 256)" in result.stderr


@pytest.mark.gpu
def test_serving_loop_on_gpu() -> None:
    out = run_example("serving_loop.py", "cuda", "--hidden", "2048", cap=300.0)
    assert "backend cuda: hidden 2048, ffn 6144" in out
    assert out.strip().splitlines()[-1] == "ok"
