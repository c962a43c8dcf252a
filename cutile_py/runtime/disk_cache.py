"""A small on-disk byte cache: compiled modules that outlive the process.

Generic: it stores bytes under a hex key, each entry one file `<key>.bin`:

    MAGIC  one line of JSON metadata (payload size, sha256, creation time, caller's `meta`)  \\n
    payload bytes

Where: `CUTILE_PY_CACHE_DIR` if set, else the user cache directory (`$XDG_CACHE_HOME/cutile_py`
or `~/.cache/cutile_py` on Linux, `~/Library/Caches/cutile_py` on macOS,
`%LOCALAPPDATA%\\cutile_py\\Cache` on Windows).

Guarantees:
- An entry is written to a temporary file in the same directory and moved into place with
  `os.replace`, so readers see a whole entry or none: two processes writing the same key at
  once both succeed (the last one wins), and a crash midway leaves at most a stray temporary
  file (removed by a later eviction pass), never a half entry under the key.
- A corrupt or truncated entry (bad magic or header, size or checksum mismatch) reads as a miss
  and is deleted; the caller recompiles and writes it again.
- An I/O error (read-only directory, full disk) turns the cache off for the rest of the process
  with one `RuntimeWarning`; it never fails the caller.
- Size bound `CUTILE_PY_CACHE_MAX_BYTES` (default 1 GiB; 0 turns the cache off): after a write,
  the least recently used entries (by mtime, which a hit refreshes) are evicted until the total
  is within the bound.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_DIR = "CUTILE_PY_CACHE_DIR"
ENV_MAX_BYTES = "CUTILE_PY_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 1 << 30
MAGIC = b"CUTILE_PY-CACHE-1\n"
SUFFIX = ".bin"
TMP_PREFIX = ".tmp-"
#: A temporary file older than this is a crashed writer's and may be removed.
STALE_TMP_SECONDS = 600.0
_KEY = re.compile(r"[0-9a-f]{8,128}")


def user_cache_dir() -> Path:
    """The platform's per-user cache directory for cutile_py (not created)."""
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "cutile_py" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "cutile_py"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base_dir = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base_dir / "cutile_py"


def cache_dir() -> Path:
    """`CUTILE_PY_CACHE_DIR` if set (and not empty), else `user_cache_dir()`."""
    override = os.environ.get(ENV_DIR, "")
    return Path(override).expanduser() if override else user_cache_dir()


def max_bytes_from_env() -> int:
    """`CUTILE_PY_CACHE_MAX_BYTES` (an integer, 0 turns the cache off), else 1 GiB."""
    text = os.environ.get(ENV_MAX_BYTES, "").strip()
    try:
        return max(0, int(text)) if text else DEFAULT_MAX_BYTES
    except ValueError:
        return DEFAULT_MAX_BYTES


@dataclass(frozen=True)
class EntryInfo:
    """One entry as `entries()` lists it (its header read, its payload not checked)."""

    key: str
    path: Path
    size: int  # bytes on disk, header included
    mtime: float  # last write or hit
    meta: dict[str, Any]


@dataclass
class DiskCacheStats:
    hits: int = 0
    misses: int = 0
    writes: int = 0
    corrupt: int = 0  # entries found damaged and deleted
    evictions: int = 0


@dataclass
class DiskCache:
    """Bytes under hex keys in `directory`, at most `max_bytes` in all (see the module doc)."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES
    stats: DiskCacheStats = field(default_factory=DiskCacheStats)
    #: False once an I/O error turned the cache off (or `max_bytes` is 0).
    enabled: bool = True
    #: Why the cache was turned off, if it was.
    disabled_reason: str | None = None

    def __post_init__(self) -> None:
        if self.max_bytes <= 0:
            self.enabled = False
            self.disabled_reason = f"{ENV_MAX_BYTES} is 0"

    def path_for(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"disk cache keys are 8 to 128 lowercase hex digits, got {key!r}")
        return self.directory / f"{key}{SUFFIX}"

    # -- reading --------------------------------------------------------------------------
    def get(self, key: str) -> bytes | None:
        """The payload stored under `key`, or None (missing, damaged, or the cache is off)."""
        path = self.path_for(key)
        if not self.enabled:
            return None
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError as e:
            self._disable(f"cannot read {path}: {e}")
            return None
        decoded = _decode(blob)
        if decoded is None or decoded[0].get("key") != key:
            self.stats.corrupt += 1
            self.stats.misses += 1
            self.discard(key)
            return None
        with contextlib.suppress(OSError):  # the LRU clock; a read-only cache still serves hits
            os.utime(path)
        self.stats.hits += 1
        return decoded[1]

    def discard(self, key: str) -> None:
        """Remove the entry under `key` if there is one (e.g. a payload the caller can't use)."""
        with contextlib.suppress(OSError):
            self.path_for(key).unlink()

    # -- writing --------------------------------------------------------------------------
    def put(self, key: str, payload: bytes, meta: dict[str, Any] | None = None) -> bool:
        """Store `payload` under `key` atomically, then evict down to the bound. False if the
        cache is off or the write failed (which turns it off, with one warning)."""
        path = self.path_for(key)
        if not self.enabled:
            return False
        header = {
            "key": key,
            "size": len(payload),
            "sha256": hashlib.sha256(payload).hexdigest(),
            "created": time.time(),
            "meta": meta or {},
        }
        head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
        tmp: str | None = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=SUFFIX, dir=self.directory)
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + head + b"\n" + payload)
            os.replace(tmp, path)
            tmp = None
        except OSError as e:
            self._disable(f"cannot write {path}: {e}")
            return False
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        self.stats.writes += 1
        self.evict()
        return True

    def evict(self, max_bytes: int | None = None) -> int:
        """Delete least recently used entries until the total is within `max_bytes` (default:
        the cache's bound), and stale temporary files. Returns how many entries went."""
        bound = self.max_bytes if max_bytes is None else max_bytes
        now = time.time()
        found: list[tuple[float, int, Path]] = []
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        for name in names:
            path = self.directory / name
            try:
                st = path.stat()
            except OSError:
                continue  # removed by another process meanwhile
            if name.startswith(TMP_PREFIX):
                if now - st.st_mtime > STALE_TMP_SECONDS:
                    with contextlib.suppress(OSError):
                        path.unlink()
            elif name.endswith(SUFFIX):
                found.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in found)
        removed = 0
        for _, size, path in sorted(found):
            if total <= bound:
                break
            try:
                path.unlink()
                removed += 1
            except FileNotFoundError:
                pass  # another process evicted it first
            except OSError:
                continue
            total -= size
        self.stats.evictions += removed
        return removed

    # -- listing --------------------------------------------------------------------------
    def entries(self) -> list[EntryInfo]:
        """The entries on disk, oldest (least recently used) first; unreadable ones skipped."""
        out: list[EntryInfo] = []
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return out
        for name in names:
            if not name.endswith(SUFFIX) or name.startswith(TMP_PREFIX):
                continue
            path = self.directory / name
            try:
                st = path.stat()
                with path.open("rb") as f:
                    head = f.read(len(MAGIC))
                    line = f.readline(1 << 16)
                meta = json.loads(line) if head == MAGIC else {}
            except (OSError, ValueError):
                continue
            inner = meta.get("meta") if isinstance(meta, dict) else None
            out.append(
                EntryInfo(
                    name[: -len(SUFFIX)],
                    path,
                    st.st_size,
                    st.st_mtime,
                    inner if isinstance(inner, dict) else {},
                )
            )
        out.sort(key=lambda e: e.mtime)
        return out

    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries())

    def clear(self) -> int:
        """Delete every entry and temporary file; returns how many entries were deleted."""
        removed = 0
        try:
            names = os.listdir(self.directory)
        except OSError:
            return 0
        for name in names:
            if name.endswith(SUFFIX):
                try:
                    (self.directory / name).unlink()
                except OSError:
                    continue
                removed += not name.startswith(TMP_PREFIX)
        return removed

    def _disable(self, reason: str) -> None:
        if self.enabled:
            self.enabled = False
            self.disabled_reason = reason
            warnings.warn(
                f"cutile_py: disk JIT cache turned off for this process ({reason}); "
                "kernels still compile, in memory only",
                RuntimeWarning,
                stacklevel=3,
            )


def _decode(blob: bytes) -> tuple[dict[str, Any], bytes] | None:
    """(header, payload) of an entry, or None if it is damaged in any way."""
    if not blob.startswith(MAGIC):
        return None
    end = blob.find(b"\n", len(MAGIC))
    if end < 0:
        return None
    try:
        header = json.loads(blob[len(MAGIC) : end])
    except ValueError:
        return None
    if not isinstance(header, dict):
        return None
    payload = blob[end + 1 :]
    if header.get("size") != len(payload):
        return None
    if header.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None
    return header, payload


_DEFAULT: DiskCache | None = None


def default_cache() -> DiskCache:
    """The process's cache at `cache_dir()` with the bound from the environment; a new one
    when either variable changes (tests point it at temporary directories)."""
    global _DEFAULT
    directory, bound = cache_dir(), max_bytes_from_env()
    if _DEFAULT is None or _DEFAULT.directory != directory or _DEFAULT.max_bytes != bound:
        _DEFAULT = DiskCache(directory, bound)
    return _DEFAULT
