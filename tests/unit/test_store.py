"""The block store in one process: padding, pieces, sharing through the file, cleanup."""

from __future__ import annotations

import uuid

import pytest
import torch

from zoexec.store import (
    attach_store,
    create_store,
    fill_store,
    mapping_pss_bytes,
    remove_run_files,
    store_path,
    stride_for,
)
from zoplan.errors import ZoError


@pytest.mark.parametrize("numel,slices,ranks", [(1000, 1, 1), (1000, 2, 4), (4097, 4, 4),
                                                (64 * 6, 2, 3)])
def test_stride_splits_into_aligned_slices_and_shares(numel, slices, ranks):
    stride = stride_for(numel, slices=slices, local_ranks=ranks)
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
    shape = dict(num_blocks=3, block_numel=100, stride=stride_for(100, slices=2, local_ranks=2),
                 dtype=torch.float32)
    flats = [torch.full((100,), float(b + 1)) for b in range(3)]
    store = create_store(path, **shape)
    fill_store(store, flats)
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
