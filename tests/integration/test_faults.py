"""The fault table: each kind of damage a run folder really meets, and what `zoexec run
--resume` must do with it. Beside the bad-input table (test_bad_input.py), for run
folders.

Every row ends one of two ways, never a third ("different weights, exit 0"):
- EXACT: exit 0, and the run's log and final weights are bit-identical to an
  uninterrupted run of the same length (a warning may say what was passed over);
- REFUSED: exit 2, exactly one `error:` line naming the problem, no traceback, and the
  run folder unchanged (every file's path and sha256 compared before and after).

Fast: one uninterrupted reference run (12 steps, a snapshot every 3) is made once for
the module; the "interrupted" folder is the reference cut back to what a run killed
after step 7 leaves (no final/, the log through step 7, the snapshots through step 6:
zoexec.run.folder writes them in that order); each row copies it (a tiny model's folder),
damages the copy and resumes it in this process through the CLI (no interpreter to start).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.options import build_config
from zoexec.run.verify import seal
from zoplan.catalogue import CATALOGUE_CONFIGS
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.models import get_model
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import make_model_dir  # noqa: E402

STEPS, KILLED_AFTER = 12, 7
COMMON = ["--lr", "1e-3", "--seed", "7", "--save-every", "3", "--keep", "3", "--threads", "1", "-q"]
EXACT, REFUSED = "exact", "refused"
MINI_OPT = {"num_hidden_layers": 1, "hidden_size": 32, "ffn_dim": 64, "num_attention_heads": 2,
            "word_embed_proj_dim": 32, "vocab_size": 64, "max_position_embeddings": 32}


def _zoexec(*args, cwd: Path | None = None):
    """`zoexec run ARGS` in this process: (exit code, stdout, stderr, exception)."""
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, ["run", *map(str, args)])
    finally:
        os.chdir(old)
    return result.exit_code, result.stdout, result.stderr, result.exception


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """The plan, the data, the model, the reference run, the interrupted folder, a
    finished shorter run of the same settings, and a finished linear-schedule run."""
    where = tmp_path_factory.mktemp("faults")
    plan = where / "plan.json"
    workload = Workload(batch=4, seq=16, param_dtype="fp32", compute_dtype="fp32")
    hand_plan(model="tiny-opt", layout=Layout(), workload=workload).save(plan)
    data = where / "data.jsonl"
    data.write_text("".join(json.dumps({"input_ids": [(i * 7 + j) % 500 + 4 for j in range(40)]})
                            + "\n" for i in range(40)))
    model = make_model_dir(where / "model", seed=3)
    base = ["--data", "data.jsonl", "--model-path", "model", *COMMON]   # relative, as typed
    runs = {}
    for name, steps, extra in (("reference", STEPS, ()), ("short", 9, ()),
                               ("linear", 4, ("--lr-schedule", "linear")),
                               ("other-lr", 6, ("--lr", "2e-3")), ("other-seed", 9, ("--seed", "8"))):
        options = [*base[:4], *(c for c in COMMON if c not in ("--lr", "1e-3", "--seed", "7")),
                   *extra] if name.startswith("other") else [*base, *extra]
        code, _, err, exc = _zoexec("plan.json", "--out", name, "--steps", steps, *options,
                                    cwd=where)
        assert code == 0, f"{name}: {err} {exc!r}"
        runs[name] = where / name
    interrupted = where / "interrupted"
    shutil.copytree(runs["reference"], interrupted)
    _cut_back(interrupted, KILLED_AFTER)
    return {"where": where, "plan": plan, "data": data, "model": model, **runs,
            "interrupted": interrupted}


def _cut_back(folder: Path, step: int) -> None:
    """What a run killed right after logging `step` leaves of a finished run's folder."""
    shutil.rmtree(folder / "final")
    log = folder / "losses.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:step]))
    metrics = folder / "metrics.jsonl"
    metrics.unlink(missing_ok=True)
    for snap in (folder / "snapshots").iterdir():
        if int(snap.name.split("-")[1]) > step:
            shutil.rmtree(snap)


def _older(folder: Path, world: dict) -> None:
    """The folder as a zoexec before steps counted from 1 wrote it: the log's steps from
    0, snapshots named step-NNNNNN by their last step's index, state.json's "step" that
    index (no "global_step"; state.json is not under its own checksums)."""
    _edit_lines(folder / "losses.jsonl", lambda ls: [
        json.dumps({**d, "step": d["step"] - 1}) + "\n" for d in map(json.loads, ls)])
    for snap in list((folder / "snapshots").iterdir()):
        state = json.loads((snap / "state.json").read_text())
        state["step"] = state.pop("global_step") - 1
        (snap / "state.json").write_text(json.dumps(state))
        snap.rename(snap.with_name(f"step-{state['step']:06d}"))


def _listing(folder: Path) -> dict[str, str]:
    """Every path under `folder` with its sha256 (folders: "dir")."""
    return {str(p.relative_to(folder)): ("dir" if p.is_dir() else "fifo" if p.is_fifo() else
                                         hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*"))}


def _weights(folder: Path) -> dict:
    return load_file(str(folder / "final" / "model.safetensors"))


def _log(folder: Path) -> list:
    """(step, seed, g, lr) of each line; the steps count from 1 (a log an older zoexec
    began counts from 0, and a resume goes on so: mapped)."""
    lines = list(map(json.loads, (folder / "losses.jsonl").read_text().splitlines()))
    first = lines[0]["step"] if lines else 1
    assert [d["step"] for d in lines] == list(range(first, first + len(lines))), lines
    return [(d["step"] + 1 - first, d["seed"], d["g"], d["lr"]) for d in lines]


# ---- the damage ------------------------------------------------------------------------------
def _edit_lines(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    path.write_text("".join(change(path.read_text().splitlines(keepends=True))))


def _line(number: int, change: Callable[[dict], dict]):
    def edit(lines: list[str]) -> list[str]:
        lines[number] = json.dumps(change(json.loads(lines[number]))) + "\n"
        return lines
    return edit


def _flip(path: Path, *, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.write_bytes(bytes(data))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 2 // 3])


def _snap(folder: Path, step: int) -> Path:
    return folder / "snapshots" / f"checkpoint-{step}"


def _reseal(folder: Path, change: Callable[[dict], None]) -> None:
    """run.json changed and sealed again (as a zoexec of other facts would write it)."""
    ident = json.loads((folder / "run.json").read_text())
    change(ident)
    (folder / "run.json").write_text(json.dumps(seal(ident), indent=1) + "\n")


def _foreign(source: str, into: str):
    """A saved folder of another run copied over one of this run's (or beside them)."""
    def change(folder: Path, world: dict) -> None:
        target = folder / into
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(world[source.split("/")[0]] / source.split("/", 1)[1], target)
    return change


def _state(step: int, change: Callable[[dict], None]):
    """Snapshot `step`'s state.json edited (it is not under its own checksums)."""
    def edit(folder: Path, world: dict) -> None:
        path = _snap(folder, step) / "state.json"
        state = json.loads(path.read_text())
        change(state)
        path.write_text(json.dumps(state))
    return edit


def _link(name: str, *, folder: bool = False):
    """`name` in the run folder replaced by a symbolic link to a copy of it outside (the
    user's folder beside it holds the copy and a file of its own)."""
    def change(run: Path, world: dict) -> None:
        outside = run.parent / "outside"
        target = outside / name.replace("/", "-")
        if (run / name).is_dir():
            shutil.copytree(run / name, target)
            (target / "users-own").mkdir()
            shutil.rmtree(run / name)
        elif (run / name).exists():
            shutil.copy(run / name, target)
            (run / name).unlink()
        else:
            target.write_text("the user's own file\n")
        (run / name).symlink_to(target, target_is_directory=folder)
    return change


def _fifo(name: str):
    """`name` in the run folder replaced by a FIFO (opening one blocks until the other
    end opens: a read or a write of it would wait forever)."""
    def change(run: Path, world: dict) -> None:
        (run / name).unlink()
        os.mkfifo(run / name)
    return change


def _torn_temp(folder: Path) -> None:
    for name in ("snapshots/.checkpoint-9.tmp", "snapshots/.step-000008.tmp", ".final.tmp"):
        (folder / name).mkdir(parents=True)
        (folder / name / "model.safetensors").write_bytes(b"\0" * 100)


@dataclass(frozen=True)
class Row:
    id: str
    damage: Callable            # (folder, world) -> extra args for the resume
    expect: str                 # EXACT or REFUSED
    says: str = ""              # a fragment of the error line (REFUSED) or of stderr (EXACT)
    start: str = "interrupted"  # the folder the row copies


def _args(*extra):
    return lambda folder, world: list(extra)


def _do(change, *extra):
    def damage(folder, world):
        change(folder, world)
        return list(extra)
    return damage


ROWS = [
    Row("clean", _args(), EXACT),
    Row("torn-last-line", _do(lambda f, w: (f / "losses.jsonl").open("a").write('{"step": 8, "se')),
        EXACT),
    Row("log-deleted", _do(lambda f, w: (f / "losses.jsonl").unlink()), REFUSED,
        "losses.jsonl is missing but the folder holds weights saved after step 6"),
    Row("log-empty", _do(lambda f, w: (f / "losses.jsonl").write_text("")), REFUSED,
        "losses.jsonl is empty but the folder holds weights saved after step 6"),
    Row("log-first-line-corrupt", _do(lambda f, w: _edit_lines(
        f / "losses.jsonl", lambda ls: ["{oops\n", *ls[1:]])), REFUSED, "losses.jsonl:1 is not a step record"),
    Row("log-middle-line-corrupt", _do(lambda f, w: _edit_lines(
        f / "losses.jsonl", lambda ls: [*ls[:3], ls[3][:20] + "\n", *ls[4:]])), REFUSED,
        "losses.jsonl:4 is not a step record"),
    Row("log-line-missing", _do(lambda f, w: _edit_lines(
        f / "losses.jsonl", lambda ls: [*ls[:3], *ls[4:]])), REFUSED,
        "losses.jsonl:4: step 5 where step 4 belongs"),
    Row("log-lines-lost-at-the-end", _do(lambda f, w: _edit_lines(
        f / "losses.jsonl", lambda ls: ls[:4])), REFUSED,
        "ends after step 4 but the folder holds weights saved after step 6: the log lost lines"),
    Row("log-seed-tampered", _do(lambda f, w: _edit_lines(
        f / "losses.jsonl", _line(4, lambda d: {**d, "seed": d["seed"] + 1}))), REFUSED,
        "losses.jsonl:5: step 5 has seed"),
    Row("log-lr-tampered", _do(lambda f, w: _edit_lines(
        f / "losses.jsonl", _line(6, lambda d: {**d, "lr": 0.5}))), REFUSED,
        "losses.jsonl:7: step 7 has lr 0.5, but the run's schedule gives 0.001"),
    Row("snapshot-bits-flipped", _do(lambda f, w: _flip(_snap(f, 6) / "model.safetensors")),
        EXACT, "checkpoint-6 is damaged"),
    Row("snapshot-truncated-shard", _do(lambda f, w: _truncate(_snap(f, 6) / "model.safetensors")),
        EXACT, "checkpoint-6 is damaged"),
    Row("snapshot-config-edited", _do(lambda f, w: _edit_lines(
        _snap(f, 6) / "config.json", lambda ls: [ls[0], '  "dropout": 0.5,\n', *ls[1:]])),
        EXACT, "config.json changed"),
    Row("every-snapshot-damaged", _do(lambda f, w: [_flip(_snap(f, s) / "model.safetensors")
                                                    for s in (3, 6)]), EXACT, "checkpoint-3 is damaged"),
    Row("snapshot-without-state", _do(lambda f, w: (_snap(f, 6) / "state.json").unlink()), EXACT),
    Row("torn-temp-folders", _do(lambda f, w: _torn_temp(f)), EXACT),
    Row("run-json-lr-edited", _do(lambda f, w: _edit_lines(
        f / "run.json", lambda ls: [line.replace('"lr": 0.001', '"lr": 0.002') for line in ls])),
        REFUSED, "run.json was edited after the run started"),
    Row("run-json-steps-edited", _do(lambda f, w: _edit_lines(
        f / "run.json", lambda ls: [line.replace('"steps": 12', '"steps": 13') for line in ls])),
        REFUSED, "run.json was edited after the run started"),
    Row("run-json-another-torch", _do(lambda f, w: _reseal(
        f, lambda d: d["z"].update(torch="1.0.0"))), REFUSED,
        "rank 0 (node 0) would draw z on torch"),
    Row("data-changed", _args(), REFUSED, "changed since the run started (its content"),
    Row("data-gone", _args(), REFUSED, "data.jsonl does not exist"),
    Row("data-moved-not-accepted", _args(), REFUSED, "give --accept-moved-inputs to resume with it"),
    Row("data-moved-accepted", _args(), EXACT, "data moved:"),
    Row("model-changed", _args(), REFUSED, "changed since the run started (its weights"),
    Row("model-shard-truncated", _args(), REFUSED, "changed since the run started (its weights"),
    Row("moved-run-folder", _args(), EXACT),   # resumed from another folder: absolute inputs
    Row("resumed-with-another-lr", _args("--lr", "0.01"), REFUSED,
        "--lr 0.01 differs from the run being resumed"),
    Row("extended-steps-constant", _args("--steps", STEPS), EXACT,
        "the run goes from 9 to 12 steps after step 9: the constant lr 0.001 continues",
        start="short"),
    Row("extended-final-bits-flipped", _do(lambda f, w: _flip(f / "final" / "model.safetensors"),
                                           "--steps", STEPS), EXACT, "final is damaged", start="short"),
    Row("extended-decaying-schedule", _args("--steps", 8), REFUSED,
        "schedule decays over 4 steps and would change after step 4; give --new-schedule", start="linear"),
    # saved weights of another run, step or history (copied in): refused before a step
    Row("snapshot-from-a-run-of-another-lr", _do(_foreign("other-lr/snapshots/checkpoint-3",
                                                          "snapshots/checkpoint-6")),
        REFUSED, "checkpoint-6/state.json is another run's (run digest"),
    Row("final-from-a-run-of-another-seed", _do(_foreign("other-seed/final", "final"),
                                                "--steps", STEPS),
        REFUSED, "final/state.json is another run's (run digest", start="short"),
    Row("best-from-another-run", _do(_foreign("other-lr/snapshots/checkpoint-3", "best")),
        REFUSED, "best/state.json is another run's (run digest"),
    Row("snapshot-renamed-to-a-later-step", _do(_foreign("interrupted/snapshots/checkpoint-3",
                                                         "snapshots/checkpoint-6")),
        REFUSED, "records step 3, but its folder is named for step 6"),
    Row("snapshot-of-another-history", _do(_state(6, lambda s: s.update(history_sha256="0" * 64))),
        REFUSED, "continues another history than the log's through step 6"),
    Row("snapshot-that-names-no-run", _do(_state(6, lambda s: s.pop("run_digest"))), EXACT,
        "checkpoint-6/state.json records no run digest"),
    # a folder an older zoexec wrote (steps counted from 0): read as it was written
    Row("older-numbering", _do(_older), EXACT),
    # symbolic links in the run folder: refused before anything is read, written or removed
    Row("metrics-linked-outside", _do(_link("metrics.jsonl")), REFUSED,
        "metrics.jsonl is a symbolic link (to"),
    Row("log-linked-outside", _do(_link("losses.jsonl")), REFUSED,
        "losses.jsonl is a symbolic link (to"),
    Row("lock-linked-outside", _do(_link(".lock")), REFUSED, ".lock is a symbolic link (to"),
    Row("snapshots-linked-outside", _do(_link("snapshots", folder=True)), REFUSED,
        "snapshots is a symbolic link (to"),
    Row("a-snapshot-linked-outside", _do(_link("snapshots/checkpoint-3", folder=True)), REFUSED,
        "checkpoint-3 is a symbolic link (to"),
    Row("final-linked-outside", _do(_link("final", folder=True), "--steps", STEPS), REFUSED,
        "final is a symbolic link (to", start="short"),
    # the hostile round: what a FIFO or a line nested too deeply did to a resume
    Row("metrics-a-fifo", _do(_fifo("metrics.jsonl")), REFUSED,
        "metrics.jsonl is a FIFO (named pipe), not a regular file", start="short"),
    Row("log-a-fifo", _do(_fifo("losses.jsonl")), REFUSED, "losses.jsonl is a FIFO (named pipe)"),
    Row("snapshot-shard-a-fifo", _do(_fifo("snapshots/checkpoint-6/model.safetensors")), REFUSED,
        "checkpoint-6/model.safetensors is a FIFO (named pipe)"),
    Row("log-line-nested-too-deeply", _do(lambda f, w: (f / "losses.jsonl").open("a").write(
        "[" * 100_000 + "]" * 100_000 + "\n")), REFUSED, "losses.jsonl:8 is not a step record"),
]


def _swap(path: Path, make: Callable[[Path], None]):
    """Replace `path` for a row (the original put back afterwards)."""
    saved = path.with_name(path.name + ".saved")
    shutil.move(path, saved)
    make(path)
    return lambda: (shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True),
                    shutil.move(saved, path))


def _inputs_for(row: Row, world: dict, folder: Path) -> tuple[list, Callable | None, Path | None]:
    """The rows that change the run's inputs (put back afterwards), or move the folder."""
    data, model = world["data"], world["model"]
    if row.id == "data-changed":
        return [], _swap(data, lambda p: p.write_text((p.with_name("data.jsonl.saved")).read_text()
                                                      + json.dumps({"input_ids": [5] * 40}) + "\n")), None
    if row.id == "data-gone":
        return [], _swap(data, lambda p: None), None
    if row.id in ("data-moved-not-accepted", "data-moved-accepted"):
        moved = folder.parent / "moved-data.jsonl"
        shutil.copy(data, moved)
        extra = ["--accept-moved-inputs"] if row.id.endswith("accepted") and "not" not in row.id else []
        return ["--data", moved, *extra], None, None
    if row.id == "model-changed":
        return [], _swap(model, lambda p: make_model_dir(p, seed=4)), None
    if row.id == "model-shard-truncated":
        return [], _swap(model, lambda p: (shutil.copytree(p.with_name("model.saved"), p),
                                           _truncate(p / "model.safetensors"))), None
    if row.id == "moved-run-folder":
        elsewhere = folder.parent / "elsewhere"
        elsewhere.mkdir()
        return [], None, elsewhere
    return [], None, None


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_a_damaged_run_folder_resumes_exactly_or_is_refused(world, row, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(world[row.start], folder)
    outside = tmp_path / "outside"   # the user's folder beside the run: never touched
    (outside / "mine").mkdir(parents=True)
    (outside / "mine" / "notes.txt").write_text("the user's\n")
    extra = row.damage(folder, world)
    untouched = _listing(outside)
    more, restore, cwd = _inputs_for(row, world, tmp_path)
    if cwd is not None:
        moved = cwd / "run"
        shutil.move(folder, moved)
        folder = moved
    before = _listing(folder)
    try:
        code, out, err, exc = _zoexec(world["plan"], "--resume", folder, "--threads", "1", *extra, *more,
                                      cwd=cwd)
    finally:
        if restore is not None:
            restore()
    shown = f"exit {code}\nstdout:\n{out}\nstderr:\n{err}\nexception: {exc!r}"
    assert "Traceback" not in out + err, shown
    assert _listing(outside) == untouched, f"a file outside the run folder changed\n{shown}"
    if row.expect == REFUSED:
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), shown
        assert row.says in lines[0], shown
        assert _listing(folder) == before, "a refused resume changed the folder"
        return
    assert code == 0, shown
    assert row.says in err, shown
    assert _log(folder) == _log(world["reference"]), shown
    reference, got = _weights(world["reference"]), _weights(folder)
    assert got.keys() == reference.keys()
    assert all(torch.equal(got[k], reference[k]) for k in reference), "weights differ"
    assert not list(folder.rglob("*.tmp")), "torn temporary folders left"


class _FullDisk:
    """A file whose write of a text holding `marker` fails as on a full disk."""

    def __init__(self, handle, marker: str) -> None:
        self._handle, self._marker = handle, marker

    def write(self, text: str) -> int:
        if self._marker in text:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._handle.write(text)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._handle.close()


def _fill_disk(monkeypatch, where: str) -> None:
    """The disk full at `where` from step 8 on (issue 41)."""
    from zoexec.run import checkpoint, loop, report

    def own(module, name: str, marker: str):
        real = module.open_own
        monkeypatch.setattr(module, "open_own", lambda path, mode: (
            _FullDisk(real(path, mode), marker) if Path(path).name == name else real(path, mode)))

    def export(folder: str):
        real = loop.export_weights

        def fail(parts, flats, path, **kw):
            if Path(path).name.startswith(folder):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(parts, flats, path, **kw)
        monkeypatch.setattr(loop, "export_weights", fail)

    if where == "log":
        own(checkpoint, "losses.jsonl", '"step": 9,')
    elif where == "metrics":
        own(report, "metrics.jsonl", '"step": 9,')
    elif where == "final":   # a snapshot's weights go the same way (TrainLoop._write_weights)
        export("final")
    return []


DISK_FULL_AT = {"log": "cannot write the log", "metrics": "cannot write the metrics",
                "final": "cannot write the weights to"}   # the trace: tests/unit/test_writes.py


@pytest.mark.parametrize("where", list(DISK_FULL_AT))
def test_a_full_disk_anywhere_is_one_line_and_the_run_resumes_exactly(world, where, tmp_path,
                                                                      monkeypatch):
    """A full disk while the log, the metrics or final/ (a snapshot alike) is written:
    one `error:` line naming the file and the free space, exit 2; the resume once
    there is room ends bit for bit where the uninterrupted run ends."""
    folder = tmp_path / "run"
    shutil.copytree(world["interrupted"], folder)
    with monkeypatch.context() as patch:
        _fill_disk(patch, where)
        code, out, err, exc = _zoexec(world["plan"], "--resume", folder, "--threads", "1", "-q")
    shown = f"exit {code}\nstdout:\n{out}\nstderr:\n{err}\nexception: {exc!r}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in out + err, shown
    assert len(lines) == 1 and lines[0].startswith("error: "), shown
    assert DISK_FULL_AT[where] in lines[0] and "No space left on device" in lines[0], shown
    assert "free on its file system" in lines[0], shown
    code, out, err, exc = _zoexec(world["plan"], "--resume", folder, "--threads", "1", "-q")
    assert code == 0, f"{err} {exc!r}"
    assert _log(folder) == _log(world["reference"])
    reference, got = _weights(world["reference"]), _weights(folder)
    assert all(torch.equal(got[k], reference[k]) for k in reference), "weights differ"


def test_the_fault_table_covers_every_kind_of_damage():
    kinds = {"log-deleted", "log-empty", "older-numbering", "log-first-line-corrupt", "log-seed-tampered",
             "snapshot-bits-flipped", "extended-final-bits-flipped", "run-json-lr-edited",
             "data-changed", "model-changed", "torn-temp-folders", "snapshot-truncated-shard",
             "moved-run-folder", "extended-steps-constant"}
    assert kinds <= {r.id for r in ROWS} and len({r.id for r in ROWS}) == len(ROWS)


def test_a_lora_run_resumes_from_its_last_snapshot(tmp_path):
    """A LoRA run of 1,000 steps with a snapshot every 100, killed after 950: the resume
    loads the adapters after step 900 (checked as a full run's weights) and replays the 50
    logged steps after it, not the 950 from the start, and ends bit for bit where the
    uninterrupted run ends."""
    plan, config = tmp_path / "lora.json", tmp_path / "config.json"
    config.write_text(json.dumps({**CATALOGUE_CONFIGS["tiny-opt"], **MINI_OPT}))   # one small block
    workload = Workload(batch=1, seq=8, param_dtype="fp32", compute_dtype="fp32", tuning="lora")
    hand_plan(model=get_model(str(config)), layout=Layout(), workload=workload).save(plan)
    code, _, err, exc = _zoexec(plan, "--out", tmp_path / "whole", "--steps", 1000, "--lr", "1e-3",
                                "--seed", "7", "--save-every", "100", "--keep", "2", "--threads", "1", "-q")
    assert code == 0, f"{err} {exc!r}"
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "whole", killed)
    _cut_back(killed, 950)
    assert sorted(p.name for p in (killed / "snapshots").iterdir()) == ["checkpoint-800", "checkpoint-900"]
    cfg = build_config(plan=plan, resume=str(killed))
    assert (cfg.start_step, len(cfg.replay)) == (950, 50) and cfg.load_from.endswith("checkpoint-900")
    assert cfg.notes == ()   # no snapshot passed over
    code, _, err, exc = _zoexec(plan, "--resume", killed, "--threads", "1", "-q")
    assert code == 0, f"{err} {exc!r}"
    assert _log(killed) == _log(tmp_path / "whole")
    got, want = (load_file(str(f / "final" / "adapter_model.safetensors"))
                 for f in (killed, tmp_path / "whole"))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
