"""Models by Hub id from the local Hugging Face cache, never downloaded: the folder a
repo id (`HuggingFaceTB/SmolLM2-135M`) names there, found as huggingface_hub finds it
offline (`snapshot_download(repo_id, local_files_only=True)`, what transformers does
with HF_HUB_OFFLINE=1):

    $HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub
      models--ORG--NAME/refs/main              the commit the cache holds for main
      models--ORG--NAME/snapshots/<commit>/    that commit's files (config.json, ...)

`zoexec run --model-path`, `zoexec eval`, `zoexec lengths` and `zoplan optimize --model`
take an existing folder as it is and an id through this. Torch-free, and without
huggingface_hub (not a planner dependency).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from zoplan.errors import ZoError

# an id huggingface_hub accepts: NAME or ORG/NAME of letters, digits, - _ . (no "--" or
# ".." in it, not starting or ending with - or .)
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")


def hub_cache() -> Path:
    """The Hub cache folder, as huggingface_hub picks it from the environment."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(base).expanduser() / "huggingface" / "hub"


def is_repo_id(text: str) -> bool:
    return bool(REPO_ID.fullmatch(text)) and "--" not in text and ".." not in text


def cached_snapshot(repo_id: str, *, revision: str = "main") -> Path | None:
    """The snapshot folder of `repo_id` at `revision` (a branch or tag the cache's refs
    name, or a commit) in the local cache; None when the cache does not hold it."""
    repo = hub_cache() / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    try:
        commit = ref.read_text().strip() if ref.is_file() else revision
    except OSError:
        return None
    folder = repo / "snapshots" / commit
    return folder if folder.is_dir() else None


def model_folder(text: str, *, what: str = "--model-path") -> Path:
    """`text` as a model folder: an existing path as it is, else a repo id resolved in
    the local Hub cache (a snapshot with its config.json). ZoError, one line saying
    where it looked, when it is neither."""
    path = Path(text).expanduser()
    if path.exists() or not is_repo_id(text):
        return path
    snapshot = cached_snapshot(text)
    if snapshot is not None and (snapshot / "config.json").is_file():
        return snapshot
    repo = hub_cache() / ("models--" + text.replace("/", "--"))
    held = "holds no snapshot of main" if repo.is_dir() else "does not hold it"
    raise ZoError(f"{what} {text}: no such folder, and the local Hugging Face cache {held} "
                  f"(looked in {repo}; set HF_HUB_CACHE or HF_HOME to another cache, or "
                  f"download it first: huggingface-cli download {text}); nothing is "
                  f"downloaded at run time")
