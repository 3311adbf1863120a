"""zoplan.modeldir: a model folder's weight files, each inside the folder (issue 41)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoplan.errors import ZoError
from zoplan.modeldir import INDEX_NAME, index_files, weight_files


def _index(folder: Path, shards: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / INDEX_NAME).write_text(json.dumps({"weight_map": shards}))


def test_shards_inside_the_folder_are_read_and_others_refused(tmp_path):
    model = tmp_path / "model"
    _index(model, {"a": "part-1.safetensors", "b": "sub/part-2.safetensors"})
    (model / "sub").mkdir()
    for name in ("part-1.safetensors", "sub/part-2.safetensors"):
        (model / name).write_bytes(b"x")
    assert weight_files(model) == {model / "part-1.safetensors": {"a"},
                                   model / "sub" / "part-2.safetensors": {"b"}}
    (tmp_path / "secret").write_text("s")
    for bad in ("../secret", str(tmp_path / "secret"), "sub/../../secret"):
        _index(model, {"a": bad})
        with pytest.raises(ZoError, match="outside the model folder"):
            weight_files(model)
    (model / "link.safetensors").symlink_to(tmp_path / "secret")
    _index(model, {"a": "link.safetensors"})
    with pytest.raises(ZoError, match="a link to .*secret, outside the model folder"):
        index_files(model)
    _index(model, {"a": 3})
    with pytest.raises(ZoError, match="names the shard 3, not a file name"):
        index_files(model)


def test_a_hub_cache_snapshot_links_to_its_own_blobs(tmp_path):
    """The Hugging Face cache links a snapshot's files to ../../blobs: inside the
    model's cache folder, so they are read; a link out of it is not."""
    repo = tmp_path / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "f00d").write_bytes(b"x")
    snapshot.mkdir(parents=True)
    (snapshot / "model.safetensors").symlink_to("../../blobs/f00d")
    assert list(weight_files(snapshot)) == [snapshot / "model.safetensors"]
    (tmp_path / "elsewhere").write_bytes(b"x")
    (snapshot / "model.safetensors").unlink()
    (snapshot / "model.safetensors").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ZoError, match="a link to .*elsewhere, outside the model folder"):
        weight_files(snapshot)
