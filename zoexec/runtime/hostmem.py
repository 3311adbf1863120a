"""What the operating system says about host memory: the file system that holds a
path, the file mapped at an address, and the share of a mapping this process holds."""

from __future__ import annotations

import os
from pathlib import Path


def mapping_pss_bytes(path: Path) -> tuple[int, int]:
    """(PSS, RSS) in bytes of this process's mapping of `path` (psutil smaps)."""
    import psutil

    pss = rss = 0
    names = (str(path), f"{path} (deleted)")
    for region in psutil.Process().memory_maps(grouped=True):
        if region.path in names:
            pss += region.pss
            rss += region.rss
    return pss, rss


def filesystem_type(path: Path, *, mounts: Path = Path("/proc/self/mounts")) -> str | None:
    """The file system type (tmpfs, ext4, overlay, ...) that holds `path`: the longest
    mount point of `mounts` above it; None where that cannot be read."""
    target = os.path.realpath(path.parent) + "/"
    best, kind = "", None
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ").rstrip("/") + "/"
        if target.startswith(point) and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def mapped_file(addr: int) -> Path | None:
    """The file this process maps at address `addr` (/proc/self/maps; a name already
    unlinked is given without its ' (deleted)' mark), None for anonymous memory."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split(maxsplit=5)
        low, _, high = fields[0].partition("-")
        if int(low, 16) <= addr < int(high, 16):
            name = fields[5].removesuffix(" (deleted)") if len(fields) == 6 else ""
            return Path(name) if name.startswith("/") else None
    return None
