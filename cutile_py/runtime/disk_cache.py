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
- Only regular files are read (opened without following links or blocking, then checked with
  fstat), at most `MAX_ENTRY_BYTES` each: a FIFO, a link to a device or a huge file at an
  entry's path is removed with one warning, never read.

Trust model: an entry is the user's compiled code, and it runs like the user's own code. It is
trusted only because nobody else could have written it: the directory and each entry must be
owned by the current user and not writable by group or others (what pip's and Triton's caches
expect too). The directory is created with mode 0700 and entries with 0600. A directory that
fails the check turns the cache off for the process, an entry that fails it is removed; either
way with one `RuntimeWarning` per cause that names the path and what to do, and the kernel
compiles as if the cache were empty. The checksum in the header detects damage, not tampering;
what the JIT reads from a payload it checks again (`cutile_py.host.jit_disk`). Windows has no
POSIX owner and mode bits: there the directory's ACLs (the user's profile) are relied on.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
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
#: The largest entry file read: compiled modules are far smaller, and nothing larger is loaded
#: into memory.
MAX_ENTRY_BYTES = 64 << 20
#: The longest header line read by `entries()`.
MAX_HEADER_BYTES = 1 << 16
#: Opening an entry never follows a link, blocks (a FIFO) or leaks into a child process.
_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)
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


def distrust(st: os.stat_result) -> str | None:
    """Why a file or directory with this status might hold someone else's code (it is not
    owned by the current user, or group or others may write it); None if it is the user's."""
    if sys.platform == "win32":
        return None  # no POSIX owner and mode bits; the profile's ACLs decide
    uid = os.geteuid()
    if st.st_uid != uid:
        return f"it is owned by uid {st.st_uid}, not by you (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or others may write to it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


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
    rejected: int = 0  # entries refused (not the user's, not a regular file, too large,
    #                   or unusable by the caller) and deleted
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
    #: The directory passed the trust check (it is checked once, when first used).
    _trusted: bool = field(default=False, repr=False)
    #: Causes of rejected entries already warned about.
    _warned: set[str] = field(default_factory=set, repr=False)

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
        """The payload stored under `key`, or None (missing, damaged, refused, or the cache is
        off)."""
        path = self.path_for(key)
        if not self.enabled or not self._directory_trusted():
            return None
        try:
            blob = self._read_entry(key, path)
        except OSError as e:
            self._disable(f"cannot read {path}: {e}")
            return None
        if blob is None:
            self.stats.misses += 1
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

    def _read_entry(self, key: str, path: Path) -> bytes | None:
        """The bytes of the entry file, or None: missing, or refused (and removed, with one
        warning per cause) because it is not a regular file of the user's of a sane size."""
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except FileNotFoundError:
            return None
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENXIO, errno.EOPNOTSUPP):  # a link, a socket
                self.reject(key, "not-regular", "not a regular file (a link, FIFO or device)")
                return None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.reject(key, "not-regular", "not a regular file (a link, FIFO or device)")
                return None
            why = distrust(st)
            if why is not None:
                self.reject(key, "untrusted", f"{why}, so it may not be your compiled code")
                return None
            if st.st_size > MAX_ENTRY_BYTES:
                self.reject(
                    key,
                    "too-large",
                    f"{st.st_size} bytes, over the {MAX_ENTRY_BYTES} an entry may have",
                )
                return None
            return _read_at_most(fd, st.st_size)
        finally:
            os.close(fd)

    def reject(self, key: str, cause: str, detail: str) -> None:
        """Remove the entry under `key` as unusable (`detail` says why), warning once per
        `cause` for this cache; the caller recompiles, and its write replaces the entry."""
        path = self.path_for(key)
        self.stats.rejected += 1
        self.discard(key)
        if cause in self._warned:
            return
        self._warned.add(cause)
        warnings.warn(
            f"cutile_py: ignored the disk JIT cache entry {path}: {detail}. It was removed and "
            "the kernel compiled again. Entries are written by cutile_py alone, as files only "
            f"you can write; if this happens again, run `python -m cutile_py.cache clear` and "
            f"check who else can write to {self.directory}",
            RuntimeWarning,
            stacklevel=3,
        )

    def check_directory(self) -> str | None:
        """Why the directory may not be trusted (see the module doc), or None: it is the
        user's alone, or it does not exist yet."""
        try:
            st = os.stat(self.directory)
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"it cannot be inspected ({e})"
        if not stat.S_ISDIR(st.st_mode):
            return None  # writing there fails, and turns the cache off with its own warning
        return distrust(st)

    def _directory_trusted(self) -> bool:
        """True once the directory passed `check_directory` (or while it does not exist); a
        failure turns the cache off with one warning that says what to do."""
        if self._trusted:
            return True
        why = self.check_directory()
        if why is None:
            self._trusted = self.directory.is_dir()
            return True
        d = self.directory
        if "may write" in why:
            fix = f"run `chmod go-w {d}`, or set {ENV_DIR} to a directory only you can write"
        else:
            fix = f"set {ENV_DIR} to a directory of your own (or remove {d})"
        self._disable(f"{d} is not used: {why}, so another user could plant code in it; {fix}")
        return False

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
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not self._directory_trusted():
                return False
            # mkstemp creates the file with mode 0600: nobody else may write an entry.
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
                st = path.lstat()  # a link counts as itself, never as what it points to
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
                st = path.lstat()
                if not stat.S_ISREG(st.st_mode):
                    continue  # `get` refuses it
                meta = _read_header(path)
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


def _read_at_most(fd: int, size: int) -> bytes:
    """Up to `size` bytes from `fd` (fewer if the file ends first)."""
    chunks: list[bytes] = []
    left = size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_header(path: Path) -> Any:
    """The JSON header of an entry file ({} if it has none), read without following a link or
    blocking, and at most `MAX_HEADER_BYTES` of it."""
    fd = os.open(path, _OPEN_FLAGS)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        blob = _read_at_most(fd, len(MAGIC) + MAX_HEADER_BYTES)
    finally:
        os.close(fd)
    if not blob.startswith(MAGIC):
        return {}
    return json.loads(blob[len(MAGIC) :].split(b"\n", 1)[0])


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
