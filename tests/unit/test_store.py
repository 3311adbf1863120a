"""The block store in one process: padding, pieces, sharing through the file, cleanup."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from zoexec.runtime import hostmem
from zoexec.runtime.hostmem import mapping_pss_bytes
from zoexec.store.blocks import (
    attach_store,
    create_store,
    remove_run_files,
    store_path,
)
from zoplan.errors import ZoError
from zoplan.memory import store_stride


@pytest.mark.parametrize("numel,slices,ranks", [(1000, 1, 1), (1000, 2, 4), (4097, 4, 4),
                                                (64 * 6, 2, 3)])
def test_stride_splits_into_aligned_slices_and_shares(numel, slices, ranks):
    stride = store_stride(numel, slices=slices, local_ranks=ranks)
    assert stride >= numel and stride - numel < 64 * slices * ranks
    for parts in (slices, ranks):
        assert stride % parts == 0 and (stride // parts) % 64 == 0


@pytest.fixture
def path():
    run_id = f"t{uuid.uuid4().hex[:10]}"
    yield store_path(run_id, 0)
    remove_run_files(run_id)
    assert not store_path(run_id, 0).exists()


def test_create_fill_attach_share_the_same_pages(path):
    shape = dict(num_blocks=3, block_numel=100, stride=store_stride(100, slices=2, local_ranks=2),
                 dtype=torch.float32)
    flats = [torch.full((100,), float(b + 1)) for b in range(3)]
    store = create_store(path, **shape)
    for block, flat in enumerate(flats):
        store.weights(block).copy_(flat)
    other = attach_store(path, **shape)
    path.unlink()                       # the mapping outlives the name
    assert torch.equal(other.weights(2), flats[2])
    assert other.block(1)[100:].abs().sum() == 0            # padding stays zero
    other.piece(1, 1, 2).fill_(7.0)                          # a write-back share ...
    assert store.block(1)[store.stride // 2:].eq(7.0).all()  # ... is seen through the other map
    assert store.piece(0, 0, 2).numel() == store.stride // 2
    pss, rss = mapping_pss_bytes(path)
    assert 0 < pss <= rss


def test_create_refuses_an_existing_name_and_attach_a_missing_one(path):
    shape = dict(num_blocks=1, block_numel=64, stride=64, dtype=torch.float16)
    create_store(path, **shape)
    with pytest.raises(ZoError, match="cannot create the block store"):
        create_store(path, **shape)
    path.unlink()
    with pytest.raises(ZoError, match="missing or not"):
        attach_store(path, **shape)


def test_remove_run_files_removes_only_that_run(path):
    create_store(path, num_blocks=1, block_numel=64, stride=64, dtype=torch.float32)
    run_id = path.name.removeprefix("zoexec-").rsplit("-n", 1)[0]
    assert remove_run_files(run_id) == [str(path)]
    assert not path.exists()


def test_the_store_is_interleaved_before_its_pages_exist(path, monkeypatch):
    from zoexec.store import blocks as zstore
    order = []
    monkeypatch.setattr(zstore.numa, "interleave",
                        lambda addr, nbytes, **kw: order.append(("interleave", addr, nbytes)))
    reserve = zstore._reserve
    monkeypatch.setattr(zstore, "_reserve",
                        lambda fd, nbytes: order.append(("reserve", nbytes)) or reserve(fd, nbytes))
    store = create_store(path, num_blocks=2, block_numel=1000, stride=1024, dtype=torch.float16)
    assert order == [("interleave", store.flat.data_ptr(), 4096), ("reserve", 4096)]
    assert store.flat.abs().sum() == 0 and path.stat().st_size == 4096


def test_a_regular_file_store_is_named_as_such(tmp_path, path, monkeypatch, capsys):
    from zoexec.store import blocks as zstore
    shm = create_store(path, num_blocks=1, block_numel=64, stride=64, dtype=torch.float32)
    path.unlink()
    assert hostmem.mapped_file(shm.flat.data_ptr()) == path          # even once unlinked
    assert hostmem.filesystem_type(path) == hostmem.filesystem_type(zstore.SHM_DIR / "x")
    kind = hostmem.filesystem_type(tmp_path / "x")
    if kind in (None, "tmpfs"):
        pytest.skip(f"{tmp_path} is on {kind}")
    monkeypatch.setattr(zstore.numa, "interleave", lambda addr, nbytes, **kw: True)
    monkeypatch.setattr(zstore.numa, "_said", set())
    create_store(tmp_path / "blocks", num_blocks=1, block_numel=64, stride=64,
                 dtype=torch.float32)
    assert f"a file on {kind}, not tmpfs" in capsys.readouterr().err
    assert hostmem.mapped_file(torch.zeros(4).data_ptr()) is None     # anonymous memory


def test_filesystem_type_takes_the_longest_mount_point(tmp_path):
    from zoexec.runtime.hostmem import filesystem_type

    mounts = tmp_path / "mounts"
    mounts.write_text("/dev/vda / ext4 rw 0 0\nshm /dev/shm tmpfs rw 0 0\n"
                      "/dev/vdb /mnt/my\\040disk xfs rw 0 0\nnone /dev/shm/sub overlay rw 0 0\n")
    assert filesystem_type(Path("/dev/shm/zoexec-r-n0"), mounts=mounts) == "tmpfs"
    assert filesystem_type(Path("/dev/shmx/zoexec-r-n0"), mounts=mounts) == "ext4"
    assert filesystem_type(Path("/mnt/my disk/store"), mounts=mounts) == "xfs"
    assert filesystem_type(Path("/dev/shm/sub/store"), mounts=mounts) == "overlay"
    assert filesystem_type(Path("/x"), mounts=tmp_path / "missing") is None
