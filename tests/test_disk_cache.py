"""The disk JIT cache: round trip, a second process's hit, two processes compiling at once,
corrupt entries, LRU eviction, an unwritable directory, and `python -m cutile_py.cache`.

Every test points `CUTILE_PY_CACHE_DIR` at its own temporary directory (conftest.py already
keeps the whole run away from the user's cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from cutile_py.runtime.disk_cache import MAGIC, TMP_PREFIX, DiskCache, default_cache

ROOT = Path(__file__).resolve().parent.parent

KEY_A = "a" * 64
KEY_B = "b" * 64

# A kernel in a file of its own (kernels must have a source file), run in a fresh process:
# prints the cache counters, the PTX's hash, and whether a sim launch and `ir()` worked.
SCRIPT = """
import hashlib, json, sys, time
from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32

B = TypeVar("B")
FACTOR = float(sys.argv[1])


@ct.kernel
def scaled(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) * FACTOR)


start = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
while time.time() < start:  # a crude barrier: processes started together compile together
    time.sleep(0.001)
ct.set_backend("sim")
x = np.arange(100, dtype=np.float32)
t0 = time.perf_counter()
(z, _) = scaled(ct.zeros(100).partition(32), ct.from_numpy(x)).sync()
seconds = time.perf_counter() - t0
ok = bool(np.array_equal(z.unpartition().to_numpy(), x * np.float32(FACTOR)))
spec = (ct.PartitionSpec((100,), (32,)), ct.TensorSpec((100,)))
ptx = scaled.ptx(*spec, target="sm_90")
ir_ok = "kernel scaled" in scaled.ir(*spec)
info = vars(ct.cache_info())
print(json.dumps({"stats": info, "ptx": hashlib.sha256(ptx.encode()).hexdigest(),
                  "ok": ok, "ir_ok": ir_ok, "seconds": seconds}))
"""


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(d))
    return d


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "scaled_kernel.py"
    path.write_text(SCRIPT)
    return path


def _env(cache_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["CUTILE_PY_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _run(script: Path, cache_dir: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, str(script), *args],
        env=_env(cache_dir),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["ir_ok"], result
    return result


def _entries(d: Path) -> list[Path]:
    return sorted(p for p in d.glob("*.bin") if not p.name.startswith(TMP_PREFIX))


# -- the store itself ---------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c")
    assert cache.get(KEY_A) is None
    assert cache.put(KEY_A, b"payload \x00\xff", {"kernel": "k"})
    assert cache.get(KEY_A) == b"payload \x00\xff"
    [entry] = cache.entries()
    assert entry.key == KEY_A and entry.meta == {"kernel": "k"}
    assert cache.stats.hits == 1 and cache.stats.misses == 1 and cache.stats.writes == 1
    assert not list((tmp_path / "c").glob(f"{TMP_PREFIX}*")), "temporary file left behind"
    with pytest.raises(ValueError):
        cache.get("../escape")


def test_default_location_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(tmp_path / "x"))
    monkeypatch.setenv("CUTILE_PY_CACHE_MAX_BYTES", "12345")
    cache = default_cache()
    assert cache.directory == tmp_path / "x" and cache.max_bytes == 12345
    monkeypatch.delenv("CUTILE_PY_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform.startswith("linux"):
        assert default_cache().directory == tmp_path / "xdg" / "cutile_py"
    monkeypatch.setenv("CUTILE_PY_CACHE_MAX_BYTES", "0")
    assert not default_cache().enabled  # 0 turns it off; nothing is written


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "header"])
def test_damaged_entry_is_a_miss_and_deleted(tmp_path: Path, damage: str) -> None:
    cache = DiskCache(tmp_path)
    cache.put(KEY_A, bytes(range(256)) * 4)
    path = cache.path_for(KEY_A)
    blob = bytearray(path.read_bytes())
    if damage == "truncate":
        blob = blob[: len(blob) - 100]
    elif damage == "flip":
        blob[-10] ^= 0xFF
    elif damage == "magic":
        blob[0] ^= 0xFF
    else:
        blob[len(MAGIC)] = ord("[")  # the JSON header no longer parses
    path.write_bytes(bytes(blob))
    assert cache.get(KEY_A) is None
    assert not path.exists()
    assert cache.stats.corrupt == 1


def test_eviction_removes_least_recently_used_first(tmp_path: Path) -> None:
    payload = b"x" * 1000
    probe = DiskCache(tmp_path / "probe")
    probe.put(KEY_A, payload)
    entry_size = probe.entries()[0].size
    cache = DiskCache(tmp_path / "c", max_bytes=3 * entry_size + 10)
    keys = [f"{i:064x}" for i in range(3)]
    for age, key in zip((30, 20, 10), keys):
        cache.put(key, payload)
        t = time.time() - age
        os.utime(cache.path_for(key), (t, t))
    assert cache.get(keys[0]) == payload  # a hit makes the oldest the most recently used
    cache.put(KEY_B, payload)  # over the bound: keys[1] is now the least recently used
    left = {e.key for e in cache.entries()}
    assert left == {keys[0], keys[2], KEY_B}
    assert cache.total_bytes() <= cache.max_bytes
    assert cache.stats.evictions == 1


def test_eviction_removes_stale_temporary_files(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path)
    stale = tmp_path / f"{TMP_PREFIX}crashed.bin"
    stale.write_bytes(b"half an entry")
    os.utime(stale, (0, 0))
    fresh = tmp_path / f"{TMP_PREFIX}writing.bin"
    fresh.write_bytes(b"being written")
    assert cache.entries() == []  # neither is an entry
    cache.put(KEY_A, b"data")
    assert not stale.exists() and fresh.exists()


def test_unwritable_directory_degrades_with_one_warning(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")  # works even as root, unlike chmod
    cache = DiskCache(blocker / "cache")
    with pytest.warns(RuntimeWarning, match="disk JIT cache turned off") as record:
        assert not cache.put(KEY_A, b"data")
        assert not cache.put(KEY_B, b"data")
        assert cache.get(KEY_A) is None
    assert len(record) == 1
    assert not cache.enabled and cache.disabled_reason


# -- the JIT ------------------------------------------------------------------------------------


def test_second_process_gets_a_disk_hit(script: Path, tmp_path: Path) -> None:
    cache = tmp_path / "jit"
    first = _run(script, cache, "2.0")
    assert first["stats"]["compiles"] >= 1 and first["stats"]["disk_hits"] == 0
    assert len(_entries(cache)) == 2  # the sim launch's target and sm_90
    second = _run(script, cache, "2.0")
    # Nothing compiled: the launch and `ptx()` both read PTX from disk; `ir()` builds IR alone.
    assert second["stats"]["disk_hits"] == 2 and second["stats"]["disk_misses"] == 0
    assert second["stats"]["compiles"] == 1  # the IR that ir() asked for, nothing else
    assert second["ptx"] == first["ptx"]
    third = _run(script, cache, "3.0")  # a changed constant is a different key
    assert third["stats"]["disk_hits"] == 0 and third["ptx"] != first["ptx"]
    assert len(_entries(cache)) == 4


def test_two_processes_compiling_at_once(script: Path, tmp_path: Path) -> None:
    cache = tmp_path / "jit"
    start = str(time.time() + 1.5)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), "2.0", start],
            env=_env(cache),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["ok"] for r in results) and results[0]["ptx"] == results[1]["ptx"]
    assert len(_entries(cache)) == 2
    assert not list(cache.glob(f"{TMP_PREFIX}*"))
    reader = DiskCache(cache)
    assert all(reader.get(p.stem) is not None for p in _entries(cache))
    assert _run(script, cache, "2.0")["stats"]["disk_hits"] == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "bad_payload"])
def test_corrupt_entry_is_recompiled_and_replaced(
    script: Path, tmp_path: Path, damage: str
) -> None:
    cache = tmp_path / "jit"
    first = _run(script, cache, "2.0")
    for path in _entries(cache):
        if damage == "bad_payload":  # checksum fine, contents not a compiled kernel
            DiskCache(cache).put(path.stem, b'{"format": 1, "ptx": 7}')
        else:
            blob = bytearray(path.read_bytes())
            if damage == "flip":
                blob[len(blob) // 2] ^= 0x55
            path.write_bytes(bytes(blob[: len(blob) // 3] if damage == "truncate" else blob))
    again = _run(script, cache, "2.0")
    assert again["stats"]["disk_hits"] == 0 and again["stats"]["disk_misses"] == 2
    assert again["ptx"] == first["ptx"]
    assert _run(script, cache, "2.0")["stats"]["disk_hits"] == 2  # replaced by valid entries


def test_unwritable_cache_never_fails_a_launch(script: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    result = subprocess.run(
        [sys.executable, "-W", "always", str(script), "2.0"],
        env=_env(blocker / "cache"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout.strip().splitlines()[-1])["ok"]
    assert result.stderr.count("disk JIT cache turned off") == 1, result.stderr


def test_in_process_disk_hit_skips_the_frontend(cache_dir: Path) -> None:
    import cutile_py as ct
    from cutile_py.host import kernel as kmod
    from tests.support import elementwise_kernels as K

    spec = (ct.PartitionSpec((64,), (16,)), ct.TensorSpec((64,)), ct.TensorSpec((64,)))
    ptx = K.add.ptx(*spec, target="sm_90")
    kmod._CACHE.clear()  # as if in a new process
    before = ct.cache_info()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert K.add.ptx(*spec, target="sm_90") == ptx
    after = ct.cache_info()
    assert after.disk_hits == before.disk_hits + 1
    assert after.compiles == before.compiles
    compiled = K.add.compile(*spec, target="sm_90")
    assert compiled.ir.name and compiled.ir_text  # IR built on demand
    assert ct.cache_info().compiles == before.compiles + 1


# -- python -m cutile_py.cache -----------------------------------------------------------------


def test_cli_show_and_clear(tmp_path: Path) -> None:
    cache = tmp_path / "cli"
    DiskCache(cache).put(KEY_A, b"x" * 2048, {"kernel": "k", "target": "sm_90"})

    def cli(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "cutile_py.cache", *args],
            env=_env(cache),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout

    shown = cli("show", "-v")
    assert f"location: {cache}" in shown and "entries:  1" in shown
    assert "oldest:" in shown and "newest:" in shown and "k sm_90" in shown
    assert "removed 1 entry" in cli("clear")
    assert "entries:  0" in cli("show")
