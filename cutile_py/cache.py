"""`python -m cutile_py.cache show|clear`: inspect or empty the disk JIT cache.

`show` prints the cache's location, its entries (kernel, target, size, last use) with
`--verbose`, their number, total size against the bound, and the oldest and newest entry;
`clear` deletes them all. A directory that someone else could write is refused by launches,
and `show` says why. The location is `CUTILE_PY_CACHE_DIR` if set, else the user cache
directory (see `cutile_py.runtime.disk_cache`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from cutile_py.runtime.disk_cache import DiskCache, default_cache


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def show(cache: DiskCache, verbose: bool = False) -> str:
    """The report `show` prints."""
    entries = cache.entries()
    total = sum(e.size for e in entries)
    lines = [
        f"location: {cache.directory}" + ("" if cache.directory.is_dir() else " (not created)"),
        f"entries:  {len(entries)}",
        f"size:     {_size(total)} of {_size(cache.max_bytes)}",
    ]
    distrust = cache.check_directory()
    if distrust is not None:
        lines.append(f"refused:  {distrust}; kernels compile in memory only (see the warning)")
    if entries:
        lines.append(f"oldest:   {_when(entries[0].mtime)}")
        lines.append(f"newest:   {_when(entries[-1].mtime)}")
    if verbose:
        for e in entries:
            kernel = e.meta.get("kernel", "?")
            target = e.meta.get("target", "?")
            lines.append(
                f"  {e.key[:16]}  {_when(e.mtime)}  {_size(e.size):>10}  {kernel} {target}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cutile_py.cache", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_show = sub.add_parser("show", help="location, entries, total size, oldest and newest")
    p_show.add_argument("-v", "--verbose", action="store_true", help="list every entry")
    sub.add_parser("clear", help="delete every entry")
    args = parser.parse_args(argv)
    cache = default_cache()
    if args.command == "show":
        print(show(cache, args.verbose))
    else:
        removed = cache.clear()
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
