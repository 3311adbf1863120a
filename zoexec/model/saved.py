"""What identifies model and weights folders on disk: the checksums of a folder of
saved weights (a snapshot, final/, best/: an HF model folder or a LoRA adapter folder;
state.json records the sha256 of every other file, "files", and a folder read back is
checked against them), and the fingerprint of a model folder (a run's base, cheap for
any size). Torch-free: the writers (zoexec.model.export, zoexec.model.lora), the merge
and the run folder's checks (zoexec.run.verify, zoexec.run.folder) share it.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from zoplan.io import loads_strict, need_folder, sha256_file
from zoplan.modeldir import index_files

STATE = "state.json"


def folder_checksums(folder: Path) -> dict[str, str]:
    """{file name: sha256} of every file of a saved weights folder but state.json."""
    folder = Path(folder)
    return {p.name: sha256_file(p) for p in sorted(folder.iterdir())
            if p.is_file() and p.name != STATE}


def check_saved(folder: Path) -> str | None:
    """What is wrong with a saved weights folder against the checksums its state.json
    records (None: every file is whole): a missing, changed or unexpected file."""
    folder = Path(folder)
    try:
        state = loads_strict((folder / STATE).read_text())
        recorded = state["files"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return f"{folder / STATE} records no checksums"
    if not isinstance(recorded, dict) or not recorded:
        return f"{folder / STATE} records no checksums"
    for name, want in sorted(recorded.items()):
        if Path(name).name != name or name in ("", ".", ".."):
            return f"{folder / STATE} names {name!r}, not a file of the folder"
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        have = sha256_file(path)
        if have != want:
            return f"{path} changed (sha256 {have[:12]}, saved as {want[:12]})"
    extra = sorted(p.name for p in folder.glob("*.safetensors") if p.name not in recorded)
    if extra:
        return f"{folder / extra[0]} was not saved with this folder"
    return None


SAMPLES, SAMPLE_BYTES = 16, 1 << 16   # windows of each shard's bytes in its fingerprint


def model_fingerprint(folder: str | Path) -> str:
    """sha256 of a model folder's config.json and, for each safetensors file (those of
    its index included, wherever inside the folder: zoplan.modeldir), its name,
    size, header (the tensors' names, shapes, dtypes and offsets) and SAMPLES windows
    of its bytes spread over the file: another size, layout or set of weights shows
    (new weights change every window), for about 1 MiB read a shard whatever its size."""
    folder = need_folder(folder, what="model")
    digest = hashlib.sha256()
    config = folder / "config.json"
    digest.update(config.read_bytes() if config.is_file() else b"")
    files = {path.name: path for path in folder.glob("*.safetensors")}
    for shard in index_files(folder):   # shards in subfolders too (each inside the folder)
        files.setdefault(str(shard.relative_to(folder)), shard)
    for name, path in sorted(files.items()):
        if not path.is_file():
            continue
        size = path.stat().st_size
        digest.update(f"\0{name}\0{size}\0".encode())
        digest.update(_safetensors_header(path, size))
        digest.update(_samples(path, size))
    return digest.hexdigest()


def _samples(path: Path, size: int) -> bytes:
    """SAMPLES windows of SAMPLE_BYTES spread evenly over a file (the whole of a small one)."""
    with path.open("rb") as handle:
        if size <= SAMPLES * SAMPLE_BYTES:
            return handle.read()
        out = []
        for index in range(SAMPLES):
            handle.seek((size - SAMPLE_BYTES) * index // (SAMPLES - 1))
            out.append(handle.read(SAMPLE_BYTES))
        return b"".join(out)


def _safetensors_header(path: Path, size: int) -> bytes:
    """The header of a safetensors file (its length first), or what there is of it."""
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return head
        (length,) = struct.unpack("<Q", head)
        return head + handle.read(min(length, max(0, size - 8), 100 << 20))
