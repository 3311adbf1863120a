"""The CPU write-back fence's read stamps (zoexec.store.fence): a wait returns only after
every local rank stamped the block, across processes sharing the shm file, and gives
up with a message naming the block and the late ranks."""

from __future__ import annotations

import multiprocessing
import time
import uuid

import pytest
import torch

from zoexec.store.blocks import SHM_DIR, create_store
from zoexec.store.fence import ReadFlags
from zoplan.errors import ZoError

RANKS, BLOCKS = 2, 3


@pytest.fixture
def stamps_path():
    path = SHM_DIR / f"zoexec-test{uuid.uuid4().hex[:8]}-fence"
    yield path
    path.unlink(missing_ok=True)


def _shared(path):
    # row RANKS is a scratch row the test uses as a "block" the writer updates
    store = create_store(path, num_blocks=RANKS + 1, block_numel=BLOCKS, stride=BLOCKS,
                         dtype=torch.int64)
    return store.flat.view(RANKS + 1, BLOCKS)


def _late_reader(path, block: int, stamp: int, go) -> None:
    """Local rank 1: waits for the go, then 'reads' (records what it saw) and stamps."""
    view = torch.from_file(str(path), shared=True, size=(RANKS + 1) * BLOCKS,
                           dtype=torch.int64).view(RANKS + 1, BLOCKS)
    flags = ReadFlags(stamps=view[:RANKS], local_rank=1, timeout_s=30)
    go.wait(30)
    time.sleep(0.1)                          # let rank 0 reach its wait (not asserted)
    view[RANKS, 0] = view[RANKS, 1]          # what rank 1 read of the block
    flags.mark(block, stamp)


def test_wait_returns_only_after_every_rank_stamped_the_block(stamps_path):
    view = _shared(stamps_path)
    flags = ReadFlags(stamps=view[:RANKS], local_rank=0, timeout_s=30)
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    proc = ctx.Process(target=_late_reader, args=(stamps_path, 1, 1, go))
    proc.start()
    try:
        flags.mark(1, 1)
        flags.wait(0, 0)                      # stamps start at 0: pass 0 is always done
        go.set()
        flags.wait(1, 1)                      # blocks until rank 1 stamped block 1
        view[RANKS, 1] = 7                    # the write-back, after the fence
    finally:
        go.set()
        proc.join(30)
    assert proc.exitcode == 0
    # only now has rank 1 surely read: had the wait not held the write-back, it read 7
    assert int(view[RANKS, 0]) == 0
    assert view[:RANKS, 1].tolist() == [1, 1]


def test_wait_gives_up_naming_the_block_and_late_ranks(stamps_path):
    view = _shared(stamps_path)
    flags = ReadFlags(stamps=view[:RANKS], local_rank=0, first_rank=4, timeout_s=0.05)
    flags.mark(2, 3)
    view[1, 2] = 2                            # local rank 1 is one pass behind
    with pytest.raises(ZoError, match=r"rank 4 waited 0 s for rank\(s\) 5 \(local 1, "
                                      r"stamp 2\) to read block 2 of pass 3"):
        flags.wait(2, 3)
    flags.wait(2, 2)                          # an older pass is complete
