"""What a run folder checks before it trusts what it reads back: checksums of the files
of saved weights (snapshots, final/, best/; full weights and LoRA adapters alike), what
ties saved weights to their run (the run's digest, the step, the digest of the logged
history they continue), fingerprints of the run's inputs (the data's content hash; the
model folder's safetensors headers and sizes, cheap for any size), the facts that decide
z (device model, software versions), and the digest that seals run.json's settings.
Torch-free except `z_environment`, which reads the device.

A problem is a ZoError naming the file and what differs; none of these functions
writes anything.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any, cast

from zoexec.maths.history import Update
from zoexec.model.saved import STATE, model_fingerprint
from zoplan.errors import ZoError
from zoplan.io import loads_strict, sha256_json, sha256_path


# ---- what ties saved weights to their run ----------------------------------------------------
def history_digest(previous: str | None, step: int, update: Update | None) -> str:
    """The digest of a run's history through the step of index `step` (counted from 0:
    the steps done before it): the one through the step before (`previous`; before the
    first, the run's digest: None for a config built by hand, without a run.json) and
    this step's update ((seed, g, lr), and each direction's g when a step takes several;
    None for a step that applied none). Saved weights record it; a resume recomputes it
    from the log, so weights are used only after the very updates they hold."""
    applied: list[Any] | None = None if update is None else [update.seed, update.g, update.lr]
    if update is not None and update.gs:
        cast(list[Any], applied).append(list(update.gs))
    body = json.dumps([step, applied])
    return hashlib.sha256(f"{previous}\n{body}".encode()).hexdigest()


def _state(folder: Path) -> dict[str, Any]:
    """A saved folder's state.json ({} when it cannot be read as a JSON object)."""
    try:
        state = loads_strict((Path(folder) / STATE).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return state if isinstance(state, dict) else {}


def saved_step(state: dict[str, Any]) -> int | None:
    """The steps a saved folder's weights hold (state.json's "global_step"; one more
    than "step" in a folder saved before it was recorded, which counted from 0); None:
    it records neither as an integer."""
    step = state.get("global_step")
    if type(step) is int:
        return step
    old = state.get("step") if "global_step" not in state else None
    return old + 1 if type(old) is int else None


def binding_of(folder: Path) -> tuple[str, int, str] | None:
    """(run digest, steps done, history digest) a saved folder's state.json records
    (None: it records none, or not in their types)."""
    state = _state(folder)
    digest, history = state.get("run_digest"), state.get("history_sha256")
    step = saved_step(state)
    if isinstance(digest, str) and step is not None and isinstance(history, str):
        return digest, step, history
    return None


def unbound(folder: Path) -> str | None:
    """Why a saved folder whose state.json does not say which run, step and history it
    is (saved before zoexec recorded them, or damaged) is not resumed from (None: it
    says)."""
    if binding_of(folder) is not None:
        return None
    what = "a malformed step or history" if "run_digest" in _state(folder) else "no run digest"
    return f"{Path(folder) / STATE} records {what}"


def binding(*, run_digest: str | None, step: int, history: str | None) -> dict[str, Any]:
    """The fields of a saved folder's state.json that tie it to its run: the steps its
    weights hold (`step`, "global_step": N after N updates), the run and the history
    (None: a run without a run.json, its config built by hand: bound to no run)."""
    return {"global_step": step, "run_digest": run_digest, "history_sha256": history}


def binding_problem(folder: Path, *, step: int | None, run_digest: str,
                    histories: list[str]) -> str | None:
    """Why saved weights in `folder` are not this run's (None: they are): state.json
    names another run, another step than the folder's name (`step`, the steps done;
    None: final/ and best/, named by no step), a step past the log, or another history
    than the log's (`histories[n - 1]`: the digest through n steps). A folder whose
    state.json records no run (written before zoexec recorded it, or damaged) is not
    judged here: check_saved and the resume's start point pass it over."""
    recorded = binding_of(folder)
    if recorded is None:
        return None
    digest, saved, history = recorded
    where = Path(folder) / STATE
    if digest != run_digest:
        return (f"{where} is another run's (run digest {str(digest)[:12]}, this run's "
                f"{run_digest[:12]})")
    if step is not None and saved != step:
        return f"{where} records step {saved}, but its folder is named for step {step}"
    if not 1 <= saved <= len(histories):
        return f"{where} records step {saved}, past the {len(histories)} logged steps"
    if history != histories[saved - 1]:
        return (f"{where} continues another history than the log's through step {saved} "
                f"(history {str(history)[:12]}, the log's {histories[saved - 1][:12]})")
    return None


# ---- the run's inputs ------------------------------------------------------------------------
# The order a run draws its data in, recorded with the data's fingerprint: 2 since packed
# text is read in blocks of consecutive windows (zoexec.data.packed); a run recorded without
# it was started by an older zoexec, whose packed text order was another one
DATA_ORDER = 2


def fingerprints(*, data: str, model: str) -> dict[str, Any]:
    """run.json's "inputs": each input's absolute path and fingerprint (None: built in),
    the data's with the order its rows are drawn in (DATA_ORDER)."""
    out: dict[str, Any] = {"data": None, "model": None}
    if data != "synthetic":
        out["data"] = {"path": str(Path(data).resolve()), "sha256": sha256_path(data),
                       "order": DATA_ORDER}
    if model != "random":
        out["model"] = {"path": str(Path(model).resolve()), "fingerprint": model_fingerprint(model)}
    return out


def order_change(recorded: dict[str, Any] | None, task: object) -> str | None:
    """Why a run whose data was recorded with `recorded` cannot resume exactly in this
    zoexec's data order (None: it can): packed text's order changed with DATA_ORDER 2; the
    other tasks' did not."""
    if recorded is None or recorded.get("order") == DATA_ORDER:
        return None
    name = task.get("name") if isinstance(task, dict) else task
    if "order" not in recorded and name != "text":
        return None   # an older zoexec's run of a task whose order did not change
    return (f"the run drew its {name} data in another order (data order "
            f"{recorded.get('order', 1)}, this zoexec's {DATA_ORDER}: packed text is now read "
            f"in blocks of windows) and cannot resume exactly here; resume it with the "
            f"zoexec that started it, or start it again")


def input_change(kind: str, recorded: dict[str, Any] | None, path: str | None) -> str | None:
    """What differs between a recorded input ("data" or "model") and the one at `path`
    (None: the same content), in words naming the file."""
    if recorded is None:
        return None
    where = Path(path or recorded["path"])
    if not where.exists():
        return f"{kind} {where} does not exist"
    if kind == "data":
        have, want, what = sha256_path(where), recorded["sha256"], "sha256"
    else:
        have, want, what = model_fingerprint(where), recorded["fingerprint"], "fingerprint"
    if have != want:
        detail = "its weights" if kind == "model" else "its content"
        return (f"{kind} {where} changed since the run started ({detail}: {what} "
                f"{have[:12]}, recorded {want[:12]})")
    return None


# ---- run.json's seal --------------------------------------------------------------------------
def seal(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with "digest": the sha256 of everything else in it."""
    body = {k: v for k, v in data.items() if k != "digest"}
    return {**body, "digest": sha256_json(body)}


def check_seal(data: dict[str, Any], path: Path) -> None:
    """ZoError unless run.json's digest matches its settings."""
    body = {k: v for k, v in data.items() if k != "digest"}
    if "digest" not in data:
        raise ZoError(f"{path} has no digest of its settings (written by an older zoexec, "
                      f"or edited): the run cannot be verified; start a new run")
    if sha256_json(body) != data["digest"]:
        raise ZoError(f"{path} was edited after the run started (its settings no longer "
                      f"match their digest {str(data['digest'])[:12]}): a resumed run keeps "
                      f"the settings it started with")


# ---- what decides z ---------------------------------------------------------------------------
def z_environment(device: Any) -> dict[str, Any]:   # a torch.device (torch-free module)
    """The facts z depends on besides the seed: the device model (on CUDA the Philox
    launch grid follows the SM count) and the versions of torch and CUDA."""
    import torch

    out: dict[str, Any] = {"device_kind": device.type, "torch": torch.__version__.split("+")[0]}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(device=props.name, sm_count=props.multi_processor_count,
                   cuda=torch.version.cuda)
    return out


def z_difference(recorded: dict[str, Any], have: dict[str, Any]) -> str | None:
    """The first fact that decides z and differs, in words (None: the same)."""
    for key in sorted(set(recorded) | set(have)):
        if recorded.get(key) != have.get(key):
            return f"{key} {have.get(key)} (the run's: {recorded.get(key)})"
    return None


def free_bytes(path: Path) -> int | None:
    """Free space of the file system holding `path` (or its nearest existing folder)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def z_problem(every: list[dict[str, Any]], *, recorded: dict[str, Any] | None, resumed: bool,
              local_ranks: int) -> str | None:
    """Why the ranks' z would not be the run's (None: it is): on a resume each rank
    against run.json's record, on a new run each rank against rank 0 (one device model
    and one software stack for the whole job)."""
    if resumed and recorded is None:
        return "run.json records no device for z (written without it): the run cannot be resumed exactly"
    every = [{"zo_kernel": "torch", **have} for have in every]   # before --zo-kernel: torch's z
    want = {"zo_kernel": "torch", **recorded} if resumed and recorded else every[0]
    for rank, have in enumerate(every):
        diff = z_difference(want, have)
        if diff is None:
            continue
        where = f"rank {rank} (node {rank // local_ranks})"
        if want.get("zo_kernel") != have.get("zo_kernel"):
            return _path_problem(where, want["zo_kernel"], have.get("zo_kernel"), resumed=resumed)
        if resumed:
            return (f"{where} would draw z on {diff}: a resume on another device model or "
                    f"software version replays the logged updates along another z; resume "
                    f"it where it ran")
        return (f"the ranks would draw different z: {where} has {diff.replace('(the run', '(rank 0')}; "
                f"a run needs one device model and one torch/CUDA version on every node")
    return None


def _path_problem(where: str, want: str, have: str | None, *, resumed: bool) -> str:
    """A rank whose --zo-kernel path (run.json's z "zo_kernel") is not the run's, in words."""
    if resumed:
        return (f"--zo-kernel takes the {have} path on {where}, but the run used {want}: a "
                f"resume replays the logged updates along the run's z; resume it with "
                f"--zo-kernel {want} where that path runs")
    return (f"the ranks would take different --zo-kernel paths: {where} {have}, rank 0 "
            f"{want}; give one --zo-kernel the whole job can run")


def check_safetensors(path: Path) -> str | None:
    """What is wrong with a safetensors file's framing (None: its header parses and its
    tensors' bytes fill the file exactly): a truncated or damaged shard, found before
    any rank loads it."""
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{path} is {size} bytes, too short for a safetensors header"
        (length,) = struct.unpack("<Q", head)
        if 8 + length > size:
            return (f"{path} is truncated: its header alone needs {8 + length} bytes, the "
                    f"file has {size}")
        try:
            header = loads_strict(handle.read(length))
            ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{path} has a damaged safetensors header"
    have, need = size - 8 - length, max(ends, default=0)
    if have != need:
        what = "truncated" if have < need else "longer than its header says"
        return (f"{path} is {what}: its tensors need {need} bytes after the header, the file "
                f"holds {have}")
    return None
