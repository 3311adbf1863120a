"""The node's block store: every offloaded block ONCE per node, in shared host memory.

Layout: one file in /dev/shm holding `num_blocks` flat buffers of `stride` elements
(param dtype) back to back; a block's tensors sit at their TensorSpec offsets and the
tail up to `stride` is padding, so that the block divides evenly into `slices` upload
slices and into `local_ranks` write-back shares (a slice or a share is one contiguous
copy).

Lifetime: local rank 0 creates the file (O_EXCL), sizes it, maps it and fills it; the
other local ranks map the same file after a node barrier (torch.from_file(shared=True):
MAP_SHARED, so the pages exist once whatever the number of ranks); after a second
barrier local rank 0 unlinks the name. From then on nothing is left in /dev/shm: the
memory lives as long as some rank maps it and the kernel frees it when the last one
exits, even on a crash. Local rank 0 also unlinks on any failure before that point, and
the launcher removes `/dev/shm/zoexec-<run id>-*` after its ranks exit. The names carry
their owner (zoexec.store.shmfiles: store_path, remove_run_files), so that what a killed run
left is recognised and removed at the next start or by `zoexec clean`.
On CUDA each rank page-locks the pieces of its mapping it copies (cudaHostRegister,
zoexec.runtime.pinning; zoexec.store.node.rank_copy_spans).

NUMA: local rank 0 sizes the file, maps it, interleaves the mapping over the machine's
memory nodes (zoexec.runtime.numa.interleave) and only then allocates the pages (fallocate), so
on a tmpfs they are spread over the sockets whoever touches them first. A store that
is a regular file (--shm-dir on a disk file system, the fallback of
scripts/gpu_check.sh when /dev/shm is small) is shared through the page cache: the
same code path, but the page cache ignores the mapping's NUMA policy (said once where
there are several nodes), and the kernel may refuse to page-lock it (then the copies go
through pinned staging slots: zoexec.runtime.pinning.Staging).
"""

from __future__ import annotations

import errno
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import torch

from zoexec.runtime import numa
from zoexec.runtime.hostmem import filesystem_type
from zoexec.store.shmfiles import PREFIX as PREFIX
from zoexec.store.shmfiles import SHM_DIR as SHM_DIR
from zoexec.store.shmfiles import remove_run_files as remove_run_files
from zoexec.store.shmfiles import shm_dir
from zoexec.store.shmfiles import store_path as store_path
from zoplan.errors import ZoError


@dataclass(kw_only=True, eq=False)
class BlockStore:
    path: Path
    flat: torch.Tensor         # num_blocks * stride elements, shared mapping
    num_blocks: int
    block_numel: int
    stride: int
    pinned: bool = False
    inode: int | None = None

    @property
    def nbytes(self) -> int:
        return int(self.flat.numel() * self.flat.element_size())

    def block(self, index: int) -> torch.Tensor:
        """Block `index` with its padding (stride elements)."""
        return self.flat[index * self.stride:(index + 1) * self.stride]

    def weights(self, index: int) -> torch.Tensor:
        """Block `index` without padding (block_numel elements)."""
        return self.flat[index * self.stride:index * self.stride + self.block_numel]

    def piece(self, index: int, part: int, parts: int) -> torch.Tensor:
        """Piece `part` of `parts` equal pieces of block `index` (a slice or a share)."""
        size = self.stride // parts
        start = index * self.stride + part * size
        return self.flat[start:start + size]


def _map(path: Path, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.from_file(str(path), shared=True, size=numel, dtype=dtype)


def unnamed_store(numel: int, dtype: torch.dtype, *, prefix: str) -> torch.Tensor:
    """A flat tensor mapped as a run's store is (create_store), from a file in the
    store's folder (shmfiles.shm_dir()) whose name is removed at once: the mapping lives
    as long as the tensor, and no sweep or leftover check ever sees a file. The name is
    `prefix`-<pid>-<random>."""
    path = shm_dir() / f"{prefix}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        store = create_store(path, num_blocks=1, block_numel=numel, stride=numel, dtype=dtype)
    finally:
        path.unlink(missing_ok=True)
    return store.flat


def create_store(path: Path, *, num_blocks: int, block_numel: int, stride: int,
                 dtype: torch.dtype) -> BlockStore:
    """Create and map a zero-filled store file (fails if the name exists): sized,
    mapped, interleaved over the NUMA nodes, then its pages allocated."""
    numel = num_blocks * stride
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    _check_room(path, nbytes)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError as exc:
        raise ZoError(f"cannot create the block store {path}: {exc.strerror}") from None
    try:
        os.ftruncate(fd, nbytes)
        flat = _map(path, numel, dtype)
        _interleave(path, flat, nbytes)
        _reserve(fd, nbytes)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise ZoError(f"cannot size the block store {path} to {nbytes} bytes: "
                      f"{exc.strerror}; give --shm-dir a folder with room") from None
    finally:
        os.close(fd)
    return BlockStore(path=path, flat=flat, num_blocks=num_blocks,
                      block_numel=block_numel, stride=stride)


def _interleave(path: Path, flat: torch.Tensor, nbytes: int) -> None:
    """Spread the store's pages over the memory nodes before any of them exists."""
    if not numa.interleave(flat.data_ptr(), nbytes, what=f"the block store {path.name}"):
        return
    kind = filesystem_type(path)
    if kind not in (None, "tmpfs"):
        numa.say_once("page-cache", f"the block store {path} is a file on {kind}, not "
                      f"tmpfs: its page-cache pages ignore the NUMA interleave and sit "
                      f"where they are first touched")


def _check_room(path: Path, nbytes: int) -> None:
    """A tmpfs smaller than the store would kill the filling rank with SIGBUS later."""
    stat = os.statvfs(path.parent)
    free = stat.f_bavail * stat.f_frsize
    if free < nbytes:
        raise ZoError(f"{path.parent} has {free / 2**30:.2f} GiB free but the block store "
                      f"needs {nbytes / 2**30:.2f} GiB; enlarge it or give --shm-dir another folder")


def _reserve(fd: int, nbytes: int) -> None:
    """Allocate the file's pages now (ENOSPC here, not SIGBUS later) where the file
    system can; otherwise just set its size."""
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, nbytes)


def attach_store(path: Path, *, num_blocks: int, block_numel: int, stride: int,
                 dtype: torch.dtype) -> BlockStore:
    """Map a store another rank of this node created."""
    numel = num_blocks * stride
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    if not path.exists() or path.stat().st_size != nbytes:
        raise ZoError(f"block store {path} is missing or not {nbytes} bytes")
    return BlockStore(path=path, flat=_map(path, numel, dtype), num_blocks=num_blocks,
                      block_numel=block_numel, stride=stride)
