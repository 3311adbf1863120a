"""The checksums of a folder of saved weights (a snapshot, final/, best/: an HF model
folder or a LoRA adapter folder): state.json records the sha256 of every other file
("files"), and a folder read back is checked against them. Torch-free: the writers
(zoexec.model.export, zoexec.model.lora) and the run folder's checks
(zoexec.run.verify, zoexec.run.folder) share it.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoplan.io import sha256_file

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
        state = json.loads((folder / STATE).read_text())
        recorded = state["files"]
    except (OSError, ValueError, KeyError, TypeError):
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
