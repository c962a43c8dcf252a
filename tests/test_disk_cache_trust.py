"""The disk JIT cache does not trust what it reads: a directory or entry that someone else could
have written is refused, only regular files of a sane size are read, and an entry whose PTX does
not load or whose parameter map is not the kernel's is recompiled. Each case: one warning that
names the path, the right result, and never a failed launch."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.host import kernel as kmod
from cutile_py.runtime import disk_cache
from cutile_py.runtime.disk_cache import MAGIC, MAX_ENTRY_BYTES, DiskCache

ROOT = Path(__file__).resolve().parent.parent
B = TypeVar("B")
N = 50


@ct.kernel
def multiply(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) * ct.load_tile_like(y, z))


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    d = tmp_path / "jit"
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(d))
    monkeypatch.setattr(disk_cache, "_DEFAULT", None)
    yield d


def new_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget the in-memory caches, as a new process would (the files on disk stay)."""
    kmod._CACHE.clear()
    monkeypatch.setattr(disk_cache, "_DEFAULT", None)


def run(x: np.ndarray, y: np.ndarray, tile: int = 16) -> tuple[np.ndarray, np.ndarray]:
    """multiply(z, x, y) on sim: (z, x as it is after the launch)."""
    z = ct.full(x.shape, np.nan, ct.f32).partition((tile,))  # poisoned
    (z, xt, _) = multiply(z, ct.from_numpy(x), ct.from_numpy(y)).sync()
    return z.unpartition().to_numpy(), xt.to_numpy()


def the_entry(cache_dir: Path, tile: int = 16) -> tuple[str, dict[str, Any]]:
    """The key and decoded payload of multiply's entry for tile `tile` (compiling it)."""
    kmod._CACHE.clear()  # compiled by an earlier test: compile again, into this cache
    x = np.ones(N, np.float32)
    run(x, x, tile)
    cache = DiskCache(cache_dir)
    keys = {e.key for e in cache.entries() if e.meta.get("kernel") == "multiply"}
    for key in keys:
        payload = cache.get(key)
        assert payload is not None
        data: dict[str, Any] = json.loads(payload)
        if f"{tile}" in data["ir_text"]:
            return key, data
    raise AssertionError(f"no entry of multiply for tile {tile} in {keys}")


def plant(cache_dir: Path, key: str, data: dict[str, Any]) -> Path:
    """Write `data` as the entry under `key`, with a valid checksum (as an attacker could)."""
    DiskCache(cache_dir).put(key, json.dumps(data).encode())
    return cache_dir / f"{key}.bin"


def foreign(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `path` look owned by another user (chown as root; else pretend to be another)."""
    if os.geteuid() == 0:
        os.chown(path, 54321, -1)
    else:
        uid = os.geteuid() + 1
        monkeypatch.setattr(os, "geteuid", lambda: uid)


def inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal(N).astype(np.float32), rng.standard_normal(N).astype(np.float32)


def trust_warnings(record: list[warnings.WarningMessage], text: str) -> list[str]:
    return [str(w.message) for w in record if text in str(w.message)]


# -- 4: trust -----------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["group-writable", "foreign"])
def test_an_entry_someone_else_could_write_is_refused(
    cache_dir: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    key, data = the_entry(cache_dir)
    data["ptx"], swapped = re.subn(r"\bmul((\.rn)?\.f32)", r"add\1", data["ptx"])
    assert swapped >= 1
    path = plant(cache_dir, key, data)
    new_process(monkeypatch)
    if how == "group-writable":
        path.chmod(0o666)
        why = "group or others may write to it (mode 0666)"
    else:
        disk_cache.default_cache().get("0" * 64)  # the directory is checked (and passes) first
        foreign(path, monkeypatch)
        why = "not by you"
    x, y = inputs(rng)
    with pytest.warns(RuntimeWarning) as record:
        z, _ = run(x, y)
    np.testing.assert_array_equal(z, x * y)  # not x + y
    [message] = trust_warnings(record, "ignored the disk JIT cache entry")
    assert str(path) in message and why in message and "cache clear" in message
    monkeypatch.undo()  # the real uid again
    monkeypatch.setenv("CUTILE_PY_CACHE_DIR", str(cache_dir))
    # Replaced by the recompiled entry: the user's own, mode 0600, the real PTX.
    st = path.stat()
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o600
    payload = DiskCache(cache_dir).get(key)
    assert payload is not None and not re.search(r"\badd(\.rn)?\.f32", json.loads(payload)["ptx"])


@pytest.mark.parametrize("how", ["group-writable", "foreign"])
def test_a_directory_someone_else_could_write_is_not_used(
    cache_dir: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    key, data = the_entry(cache_dir)
    data["ptx"] = re.sub(r"\bmul((\.rn)?\.f32)", r"add\1", data["ptx"])
    path = plant(cache_dir, key, data)
    planted = path.read_bytes()
    new_process(monkeypatch)
    if how == "group-writable":
        cache_dir.chmod(0o777)
        what = f"run `chmod go-w {cache_dir}`"
    else:
        foreign(cache_dir, monkeypatch)
        what = "CUTILE_PY_CACHE_DIR to a directory of your own"
    x, y = inputs(rng)
    with pytest.warns(RuntimeWarning) as record:
        z, _ = run(x, y)
        z2, _ = run(x, y, tile=32)  # another kernel: no second warning
    np.testing.assert_array_equal(z, x * y)
    np.testing.assert_array_equal(z2, x * y)
    [message] = trust_warnings(record, "disk JIT cache turned off")
    assert str(cache_dir) in message and what in message
    assert path.read_bytes() == planted  # nothing read, nothing written there
    assert len(list(cache_dir.glob("*.bin"))) == 1


def test_new_directory_and_entries_are_private(cache_dir: Path) -> None:
    DiskCache(cache_dir).put("a" * 64, b"payload")
    assert cache_dir.stat().st_mode & 0o777 == 0o700
    assert (cache_dir / f"{'a' * 64}.bin").stat().st_mode & 0o777 == 0o600


def test_the_parameter_map_is_never_taken_from_disk(
    cache_dir: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted map that binds the output to the read-only input `x` (whose pointer param
    index it changes), and one with an index out of range: both refused, both recompiled."""
    key16, data16 = the_entry(cache_dir, 16)
    key32, data32 = the_entry(cache_dir, 32)
    assert data16["params"][0][:2] == [0, "ptr"]
    data16["params"][0][0] = 1  # z's pointer param now carries x's address
    data32["params"][0][0] = 99  # no such argument
    plant(cache_dir, key16, data16)
    plant(cache_dir, key32, data32)
    new_process(monkeypatch)
    x, y = inputs(rng)
    with pytest.warns(RuntimeWarning) as record:
        z, x_after = run(x, y, 16)
        z32, _ = run(x, y, 32)
    np.testing.assert_array_equal(x_after, x)  # the read-only input was not written
    np.testing.assert_array_equal(z, x * y)
    np.testing.assert_array_equal(z32, x * y)
    [message] = trust_warnings(record, "parameter map does not match")  # once per cause
    assert str(cache_dir / f"{key16}.bin") in message


# -- 6: entries whose PTX does not load ---------------------------------------------------------


def test_an_entry_whose_ptx_does_not_parse_is_recompiled(
    cache_dir: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    key, data = the_entry(cache_dir)
    real = data["ptx"]
    data["ptx"] = real.replace("ret;", "ret a b c;;;")
    path = plant(cache_dir, key, data)
    new_process(monkeypatch)
    x, y = inputs(rng)
    with pytest.warns(RuntimeWarning) as record:
        z, _ = run(x, y)
        z_again, _ = run(x, y)
    np.testing.assert_array_equal(z, x * y)
    np.testing.assert_array_equal(z_again, x * y)
    [message] = trust_warnings(record, "its PTX does not load")
    assert str(path) in message
    payload = DiskCache(cache_dir).get(key)
    assert payload is not None and json.loads(payload)["ptx"] == real  # replaced
    new_process(monkeypatch)
    before = ct.cache_info()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z, _ = run(x, y)
    np.testing.assert_array_equal(z, x * y)
    after = ct.cache_info()
    assert after.disk_hits == before.disk_hits + 1 and after.compiles == before.compiles


# -- 5: only regular files, of a sane size ------------------------------------------------------

SCRIPT = """
import json, sys
from typing import TypeVar

import numpy as np

import cutile_py as ct
from cutile_py import Dyn, Mut, Tensor, f32
from cutile_py.cache import show
from cutile_py.runtime.disk_cache import default_cache

B = TypeVar("B")


@ct.kernel
def multiply(z: Mut[Tensor[f32, B]], x: Tensor[f32, Dyn], y: Tensor[f32, Dyn]) -> None:
    z.store(ct.load_tile_like(x, z) * ct.load_tile_like(y, z))


ct.set_backend("sim")
rng = np.random.default_rng()
x, y = rng.standard_normal(50).astype(np.float32), rng.standard_normal(50).astype(np.float32)
(z, _, _) = multiply(ct.zeros(50).partition(16), ct.from_numpy(x), ct.from_numpy(y)).sync()
ok = bool(np.array_equal(z.unpartition().to_numpy(), x * y))
print(json.dumps({"ok": ok, "stats": vars(ct.cache_info()), "show": show(default_cache(), True)}))
"""


def _limits() -> None:
    """No more than 3 GiB of address space: reading a huge file whole fails fast."""
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def _python(cache_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["CUTILE_PY_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OPENBLAS_NUM_THREADS"] = "1"
    return subprocess.run(
        [sys.executable, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,  # a FIFO read would block for ever
        preexec_fn=_limits,
    )


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "huge"])
def test_a_non_regular_or_huge_entry_is_never_read(
    tmp_path: Path, cache_dir: Path, kind: str
) -> None:
    script = tmp_path / "multiply_script.py"
    script.write_text(SCRIPT)
    first = _python(cache_dir, str(script))
    assert first.returncode == 0, first.stderr
    [path] = list(cache_dir.glob("*.bin"))
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
        cause = "not a regular file"
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
        cause = "not a regular file"
    elif kind == "huge":
        head = json.dumps({"key": path.stem, "size": 1 << 30, "sha256": "0", "meta": {}})
        with path.open("wb") as f:
            f.write(MAGIC + head.encode() + b"\n")
            f.truncate(1 << 30)  # sparse: 1 GiB that takes no disk
        cause = f"over the {MAX_ENTRY_BYTES}"
    shown = _python(cache_dir, "-m", "cutile_py.cache", "show", "-v")
    assert shown.returncode == 0, shown.stderr
    assert f"entries:  {int(kind == 'huge')}" in shown.stdout, shown.stdout  # headers only
    again = _python(cache_dir, str(script))
    assert again.returncode == 0, again.stderr
    result = json.loads(again.stdout.strip().splitlines()[-1])
    assert result["ok"] and result["stats"]["disk_hits"] == 0
    assert again.stderr.count("ignored the disk JIT cache entry") == 1, again.stderr
    assert cause in again.stderr and str(path) in again.stderr
    # The recompiled entry replaced it: the next process reads it.
    assert path.is_file() and not path.is_symlink() and path.stat().st_size < MAX_ENTRY_BYTES
    third = _python(cache_dir, str(script))
    assert json.loads(third.stdout.strip().splitlines()[-1])["stats"]["disk_hits"] == 1
    assert "ignored" not in third.stderr


def test_an_entry_only_the_user_could_write_is_trusted_like_their_code(
    cache_dir: Path, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trust model's other half (and proof that the planted PTX above would run): the
    user's own entry, mode 0600 in a 0700 directory, is used as it is."""
    key, data = the_entry(cache_dir)
    data["ptx"] = re.sub(r"\bmul((\.rn)?\.f32)", r"add\1", data["ptx"])
    plant(cache_dir, key, data)
    new_process(monkeypatch)
    x, y = inputs(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        z, _ = run(x, y)
    np.testing.assert_array_equal(z, x + y)


def test_show_says_why_a_directory_is_refused(cache_dir: Path) -> None:
    from cutile_py.cache import show

    DiskCache(cache_dir).put("a" * 64, b"payload")
    assert "refused" not in show(DiskCache(cache_dir))
    cache_dir.chmod(0o775)
    assert "refused:  group or others may write to it (mode 0775)" in show(DiskCache(cache_dir))
