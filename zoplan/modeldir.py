"""The files of a local HF model folder that hold its weights, each one inside the
folder. Torch-free: a contract both halves use (`zoplan optimize --model DIR`, every
zoexec command that reads weights: run, eval, export, the fingerprint in run.json).

A `model.safetensors.index.json` names its shards by file name; a name that is
absolute, climbs out with `..`, or is a symbolic link whose target lies outside the
folder would make a reader open some other file (a secret, /proc/self/environ) and
report it as a damaged shard. Every weight file is resolved here (links followed) and
must lie inside the resolved folder, or the folder is refused in one line naming the
shard. One exception: a snapshot folder of the Hugging Face cache
(`models--ORG--NAME/snapshots/REV/`) links its files to `../../blobs/`, inside the
model's own cache folder (`models--ORG--NAME/`), which is then the folder they must
lie in.
"""

from __future__ import annotations

import json
from pathlib import Path

from zoplan.errors import ZoError

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


def home_of(folder: Path) -> Path:
    """The folder a model folder's weight files must lie in (resolved): the folder
    itself, or for a Hugging Face cache snapshot its model's cache folder."""
    root = folder.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("models--"):
        return root.parent.parent
    return root


def inside(folder: Path, name: object, *, what: str) -> Path:
    """`folder / name` when it names a file inside `folder` (links followed: see
    home_of); else ZoError naming `what` (where the name comes from) and the name."""
    if not isinstance(name, str) or not name or "\0" in name:
        raise ZoError(f"{what} names the shard {name!r}, not a file name")
    path = folder / name
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ZoError(f"{what} names the shard {name!r}, outside the model folder {folder}: "
                      f"shards are read only from inside it")
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as exc:   # a loop of links
        raise ZoError(f"{what} names the shard {name!r}, which cannot be resolved ({exc})") from None
    if not resolved.is_relative_to(home_of(folder)):
        raise ZoError(f"{what} names the shard {name!r}, a link to {resolved}, outside the "
                      f"model folder {folder}: shards are read only from inside it")
    return path


def weight_files(folder: Path | str) -> dict[Path, set[str] | None]:
    """{safetensors file: the tensor names the index puts there (None: a single file)},
    every file inside the folder; a ZoError for a folder without safetensors weights,
    with shards missing or outside it (cheap: preflight checks it before a rank starts)."""
    folder = Path(folder)
    if (folder / INDEX_NAME).is_file():
        files = index_files(folder)
        absent = sorted(p.name for p in files if not p.is_file())
        if absent:
            raise ZoError(f"checkpoint {folder}: {len(absent)} of the {len(files)} shards in "
                          f"{INDEX_NAME} are missing, the first {absent[0]}")
        return dict(files)
    if (folder / SINGLE_NAME).is_file():
        return {inside(folder, SINGLE_NAME, what=f"model folder {folder}"): None}
    if any(folder.glob("pytorch_model*.bin")):
        raise ZoError(f"{folder} holds only pytorch_model*.bin weights; convert them to "
                      f"safetensors (load the model with transformers and save_pretrained it)")
    raise ZoError(f"{folder} has neither {SINGLE_NAME} nor {INDEX_NAME}")


def index_files(folder: Path | str) -> dict[Path, set[str]]:
    """{shard: the tensor names the folder's index puts there}, each shard inside the
    folder (there or not); {} without an index. What the planner checks of a model
    folder: it reads the config, never the weights."""
    folder = Path(folder)
    index = folder / INDEX_NAME
    if not index.is_file():
        return {}
    try:
        items = list(json.loads(index.read_text())["weight_map"].items())
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise ZoError(f"{index} is not a safetensors index ({exc})") from None
    files: dict[Path, set[str]] = {}
    for name, file in items:
        files.setdefault(inside(folder, file, what=str(index)), set()).add(str(name))
    return files
