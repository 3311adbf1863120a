"""The names of the files zoexec keeps in shared memory, and the sweep of stale ones.

Torch-free (`zoexec clean` runs it). Every file of a run in the shared-memory folder
(`--shm-dir`: SHM_DIR, /dev/shm, unless given; every function takes the folder as
`directory`) is named

    zoexec-<run id>-o<machine>.<pid>.<start>-n<node>[-resident|-fence]

after the process that owns it: the launcher of a local run (`zoexec run`), torchrun's
agent under torchrun (the parent of every rank of the node), the process itself for a
one-rank run. <pid>.<start> is a procwatch.ProcessId (the start time tells a reused pid
from the owner), <machine> a hash of the boot and the pid namespace, so that a file
made on another boot, host or container (a shared --shm-dir, docker --ipc=host)
is never judged from here.

A file whose owner has exited is stale: a run killed before its builder unlinked the
name (zoexec.store.blocks) left it, and it holds its memory until removed. Every start of a
run removes the stale files of this machine (one dim line says how much it freed),
`zoexec clean` lists and removes them (--dry-run: lists only), and a rank whose
launcher has gone removes its launcher's files before it dies (procwatch.die_with).
Files of a live owner, and names without an owner (tests, older versions), are never
removed. The same goes for the folder of a local launch's rendezvous file
(`rendezvous_dir`: zoexec-rdzv-o<machine>.<pid>.<start>-* in the temporary folder) and
for the folder the ranks of one torchrun agent share on a node (`node_folder`:
zoexec-rdzv-<agent's tag>-node), which the last of its ranks to leave also removes.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zoexec.config import RuntimeOptions
from zoexec.runtime.procwatch import ProcessId
from zoplan.errors import ZoError
from zoplan.memory import fmt_bytes

SHM_DIR = Path(RuntimeOptions.shm_dir)   # the default of --shm-dir
SHM_DIR_ENV = "ZOEXEC_SHM_DIR"           # its environment default
PREFIX = "zoexec-"
_NAME = re.compile(r"^zoexec-(?P<run>.+)-o(?P<machine>[0-9a-f]{8})\.(?P<pid>\d+)\.(?P<start>\d+)"
                   r"-n\d+(-[a-z]+)?$")
RDZV_DIR = Path(tempfile.gettempdir())
RDZV_PREFIX = "zoexec-rdzv-"
DATA_PREFIX = "zoexec-data-"   # the data library's cache (zoexec.data.records), inside a launch's folder
NODE_SUFFIX = "-node"          # the folder of a torchrun agent's ranks (node_folder)
MEMBERS = ".members"           # in it: the file each rank inside holds a shared flock on
_RDZV_NAME = re.compile(r"^zoexec-rdzv-o(?P<machine>[0-9a-f]{8})\.(?P<pid>\d+)\.(?P<start>\d+)-")
STALE, LIVE, FOREIGN, UNOWNED = "stale", "live", "foreign", "unowned"

_owner: ProcessId | None = None


def set_owner(owner: ProcessId | None) -> None:
    """The process whose name this process's files carry (None: this process)."""
    global _owner
    _owner = owner


def owner() -> ProcessId:
    return _owner if _owner is not None else ProcessId.me()


def machine_id() -> str:
    """8 hex digits naming this boot and pid namespace."""
    parts = []
    readers: tuple[Callable[[], str], ...] = (
        lambda: Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        lambda: os.readlink("/proc/self/ns/pid"))
    for read in readers:
        try:
            parts.append(read())
        except OSError:
            parts.append("?")
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:8]


def owner_tag(process: ProcessId) -> str:
    return f"o{machine_id()}.{process.pid}.{process.start}"


def shm_dir(directory: Path | str | None = None) -> Path:
    """The shared-memory folder: `directory` (--shm-dir), else $ZOEXEC_SHM_DIR (the
    option's environment default, read now: `zoplan profile`, which has no such option,
    maps its buffers where the runs will), else SHM_DIR."""
    return Path(directory or os.environ.get(SHM_DIR_ENV) or SHM_DIR)


def store_path(run_id: str, node: int, *, directory: Path | str | None = None) -> Path:
    """The block store of `node` in run `run_id`, named after this process's owner
    (node.py derives the -resident and -fence files from it)."""
    return shm_dir(directory) / f"{PREFIX}{run_id}-{owner_tag(owner())}-n{node}"


def rendezvous_dir() -> Path:
    """A new private folder for a local launch's rendezvous file, named after this
    process's owner (so that a killed launch's is swept like its store files)."""
    return Path(tempfile.mkdtemp(prefix=f"{RDZV_PREFIX}{owner_tag(owner())}-", dir=RDZV_DIR))


def node_dir(agent: ProcessId) -> Path:
    """The folder the ranks that torchrun's `agent` started share on this node."""
    return RDZV_DIR / f"{RDZV_PREFIX}{owner_tag(agent)}{NODE_SUFFIX}"


@contextmanager
def node_folder(agent: ProcessId) -> Iterator[Path]:
    """This rank inside the folder it shares with the other ranks of `agent` (node_dir:
    made by the first of them, mode 0o700; one that is a link, not a folder or not this
    user's is refused in one line). Each rank inside holds a shared flock on its MEMBERS
    file; the rank that gets the exclusive lock on the way out is the last one and
    removes the folder. A killed rank's lock goes with it; a folder every rank of which
    was killed is stale once the agent has exited (sweep, remove_owner_files)."""
    folder = node_dir(agent)
    fd = _join(folder)
    try:
        yield folder
    finally:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass                 # another rank is still inside: the last one out removes it
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(fd)


def _join(folder: Path) -> int:
    """A descriptor of `folder`'s MEMBERS file, shared-locked; made again when the last
    rank of before removed the folder between this one's making it and its lock."""
    while True:
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass                 # another rank's, or not a folder (judged below)
        except OSError as exc:
            raise ZoError(f"cannot make the node's temporary folder {folder}: "
                          f"{exc.strerror or exc}") from None
        try:
            held = os.lstat(folder)
        except FileNotFoundError:
            continue             # removed meanwhile
        if not stat.S_ISDIR(held.st_mode) or held.st_uid != os.getuid():   # lstat: a link is no folder
            what = ("a link" if stat.S_ISLNK(held.st_mode) else "not a folder"
                    if not stat.S_ISDIR(held.st_mode) else f"owned by uid {held.st_uid}")
            raise ZoError(f"the node's temporary folder {folder} is {what}: not used "
                          f"(remove it, or set TMPDIR to another folder)")
        try:
            fd = os.open(folder / MEMBERS, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            continue             # removed meanwhile
        except OSError as exc:
            raise ZoError(f"cannot use the node's temporary folder {folder}: "
                          f"{exc.strerror or exc}") from None
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            now = os.stat(folder / MEMBERS, follow_symlinks=False)
            mine = os.fstat(fd)
            if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)             # the folder was removed while this rank waited: again


def remove_run_files(run_id: str, *, directory: Path | str | None = None) -> list[str]:
    """Remove every file of a run still named in the folder; returns what it removed."""
    return _remove(glob.glob(str(shm_dir(directory) / f"{glob.escape(PREFIX + run_id)}-*")))


def remove_owner_files(process: ProcessId, *, directory: Path | str | None = None) -> list[str]:
    """Remove every file `process` owns (a dead launcher's, from its last rank), and
    its rendezvous folders."""
    tag = owner_tag(process)
    for folder in glob.glob(str(RDZV_DIR / f"{RDZV_PREFIX}{tag}-*")):
        shutil.rmtree(folder, ignore_errors=True)
    return _remove(glob.glob(str(shm_dir(directory) / f"{PREFIX}*-{tag}-n*")))


def _remove(names: list[str]) -> list[str]:
    removed = []
    for name in names:
        try:
            Path(name).unlink()
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed


@dataclass(frozen=True, kw_only=True)
class ShmFile:
    """A zoexec file in SHM_DIR: its size in memory, owner and state (stale: its owner
    has exited; live; foreign: made on another boot, host or container; unowned: no
    owner in its name)."""

    path: Path
    nbytes: int
    state: str
    owner: ProcessId | None = None


def scan(directory: Path | str | None = None) -> list[ShmFile]:
    """Every zoexec file in `directory` (default SHM_DIR), every rendezvous folder in
    RDZV_DIR (a launch's private folder, or a torchrun node's: its temporary files
    inside), by name, and the data library's cache folders an older zoexec left there
    (zoexec-data-*: no owner in their names, listed, never removed)."""
    found = []
    for path in sorted(shm_dir(directory).glob(f"{PREFIX}*")):
        found.append(_judge(path, _NAME.match(path.name), _allocated(path)))
    for path in sorted(RDZV_DIR.glob(f"{RDZV_PREFIX}*")):
        match = _RDZV_NAME.match(path.name)
        if match is not None:      # a folder without an owner is no business of ours
            found.append(_judge(path, match, sum(_allocated(p) for p in path.rglob("*"))))
    for path in sorted(RDZV_DIR.glob(f"{DATA_PREFIX}*")):
        if path.is_dir() and not path.is_symlink():
            found.append(ShmFile(path=path, nbytes=sum(_allocated(p) for p in path.rglob("*")),
                                 state=UNOWNED))
    return [item for item in found if item.nbytes >= 0]


def _allocated(path: Path) -> int:
    try:
        return path.stat().st_blocks * 512
    except OSError:
        return -1


def _judge(path: Path, match: re.Match[str] | None, nbytes: int) -> ShmFile:
    if match is None:
        return ShmFile(path=path, nbytes=nbytes, state=UNOWNED)
    process = ProcessId(pid=int(match["pid"]), start=int(match["start"]))
    if match["machine"] != machine_id():
        return ShmFile(path=path, nbytes=nbytes, state=FOREIGN, owner=process)
    return ShmFile(path=path, nbytes=nbytes, state=LIVE if process.alive() else STALE,
                   owner=process)


def sweep(*, dry_run: bool = False, directory: Path | str | None = None) -> list[ShmFile]:
    """Remove the stale files (none with `dry_run`); returns every file scanned, the
    stale ones being those removed (or that would be)."""
    found = scan(directory)
    if not dry_run:
        for item in found:
            if item.state != STALE:
                continue
            if item.path.is_dir():
                shutil.rmtree(item.path, ignore_errors=True)
            else:
                item.path.unlink(missing_ok=True)
    return found


def freed_line(found: list[ShmFile], *, dry_run: bool = False) -> str | None:
    """'zoexec: removed 2 stale files of dead runs from /dev/shm (150.0 MiB)', or None."""
    stale = [item for item in found if item.state == STALE]
    if not stale:
        return None
    verb = "would remove" if dry_run else "removed"
    what = "file" if len(stale) == 1 else "files"
    where = " and ".join(sorted({str(item.path.parent) for item in stale}))
    return (f"zoexec: {verb} {len(stale)} stale {what} of dead runs from {where} "
            f"({fmt_bytes(sum(item.nbytes for item in stale))})")

