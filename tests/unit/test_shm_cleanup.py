"""Shared-memory files never leak: they are named after their owner, those of dead
owners are swept (at every start, by `zoexec clean`, by the last rank of a dead
launcher), and a live owner's files are never touched. Torch-free."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.runtime.procwatch import ProcessId
from zoexec.store import shmfiles
from zoplan.errors import ZoError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shm(tmp_path, monkeypatch):
    """An empty SHM_DIR of our own: the sweep never sees another run's files."""
    monkeypatch.setattr(shmfiles, "SHM_DIR", tmp_path)
    monkeypatch.setattr(shmfiles, "RDZV_DIR", tmp_path / "tmp")
    monkeypatch.setattr(shmfiles, "_owner", None)
    (tmp_path / "tmp").mkdir()
    return tmp_path


@pytest.fixture
def dead() -> ProcessId:
    """The identity of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    me = ProcessId.of(proc.pid)
    proc.kill()
    proc.wait()
    assert me is not None and not me.alive()
    return me


def _make(owner: ProcessId | None, run: str, nbytes: int = 1 << 20, node: int = 0) -> Path:
    shmfiles.set_owner(owner)
    path = shmfiles.store_path(run, node)
    path.write_bytes(b"x" * nbytes)
    shmfiles.set_owner(None)
    return path


def test_the_owner_is_named_with_its_start_time(shm):
    me = ProcessId.me()
    assert shmfiles.store_path("r1", 3).name == f"zoexec-r1-o{shmfiles.machine_id()}.{me.pid}.{me.start}-n3"
    assert me.alive()
    assert not ProcessId(pid=me.pid, start=me.start + 1).alive()    # a reused pid is not us


def test_a_zombie_is_not_alive():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    me = ProcessId.of(proc.pid)
    deadline = time.monotonic() + 10
    while me.alive() and time.monotonic() < deadline:   # exited, not yet reaped: a zombie
        time.sleep(0.01)
    assert not me.alive()
    proc.wait()


def test_the_sweep_removes_dead_owners_files_only(shm, dead):
    blocks = _make(dead, "a")
    resident = blocks.with_name(blocks.name + "-resident")       # node.py's sibling files
    resident.write_bytes(b"y" * 2048)
    other_node = _make(dead, "a", 4096, node=1)
    live = _make(None, "c")                                     # this process owns it
    made = _make(dead, "d")                                     # ... on another machine
    foreign = made.rename(made.with_name(made.name.replace(f"o{shmfiles.machine_id()}", "o0badf00d")))
    unowned = shm / "zoexec-test123-n0"
    unowned.write_bytes(b"z")
    shmfiles.set_owner(dead)
    dead_rendezvous = shmfiles.rendezvous_dir()                  # a killed launch's folder
    (dead_rendezvous / "store").write_bytes(b"r" * 512)
    shmfiles.set_owner(None)
    live_rendezvous = shmfiles.rendezvous_dir()
    states = {item.path.name: item.state for item in shmfiles.scan()}
    assert states[dead_rendezvous.name] == shmfiles.STALE and states[live_rendezvous.name] == shmfiles.LIVE
    assert states[live.name] == shmfiles.LIVE and states[foreign.name] == shmfiles.FOREIGN
    assert states[unowned.name] == shmfiles.UNOWNED
    assert {states[p.name] for p in (blocks, resident, other_node)} == {shmfiles.STALE}
    found = shmfiles.sweep()
    freed = sum(item.nbytes for item in found if item.state == shmfiles.STALE)
    assert freed >= (1 << 20) + 2048
    assert sorted(p.name for p in shm.iterdir()) == sorted([live.name, foreign.name, unowned.name, "tmp"])
    assert list((shm / "tmp").iterdir()) == [live_rendezvous]
    line = shmfiles.freed_line(found)
    assert line.startswith("zoexec: removed 4 stale files of dead runs from ") and "MiB" in line
    assert shmfiles.freed_line(shmfiles.sweep()) is None


def test_zoexec_clean_lists_then_removes(shm, dead):
    stale, live = _make(dead, "a"), _make(None, "b")
    result = CliRunner().invoke(app, ["clean", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert f"would remove {stale}" in " ".join(result.output.split())
    assert stale.exists() and live.exists()
    result = CliRunner().invoke(app, ["clean"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert f"removed {stale}" in out and "has exited" in out
    assert f"kept {live}" in out and "is running" in out
    assert not stale.exists() and live.exists()


def test_zoexec_clean_sweeps_the_shm_dir_given_or_named_by_the_environment(shm, dead, monkeypatch):
    other = shm / "other"
    other.mkdir()
    shmfiles.set_owner(dead)
    stale = shmfiles.store_path("a", 0, directory=other)
    shmfiles.set_owner(None)
    stale.write_bytes(b"x")
    result = CliRunner().invoke(app, ["clean", "--dry-run"])
    assert str(stale) not in " ".join(result.output.split())       # not in the default folder
    monkeypatch.setenv("ZOEXEC_SHM_DIR", str(other))
    result = CliRunner().invoke(app, ["clean", "--dry-run"])
    assert f"would remove {stale}" in " ".join(result.output.split()), result.output
    monkeypatch.delenv("ZOEXEC_SHM_DIR")
    result = CliRunner().invoke(app, ["clean", "--shm-dir", str(other)])
    assert result.exit_code == 0 and not stale.exists(), result.output


def test_remove_owner_files_takes_that_owner_only(shm, dead):
    mine, other = _make(dead, "a"), _make(None, "a")
    assert shmfiles.remove_owner_files(dead) == [str(mine)]
    assert other.exists() and not mine.exists()


def test_a_process_killed_after_creating_its_store_leaves_what_the_next_start_removes(shm):
    """SIGKILL right after the store file is made (a kill during start-up): the name
    stays; the next start's sweep (launch.sweep_stale_files) removes it, a live
    owner's file stays."""
    run = f"t{uuid.uuid4().hex[:8]}"
    code = (f"import os, time, sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from zoexec.store import shmfiles\n"
            f"path = shmfiles.store_path({run!r}, 0, directory={str(shm)!r})\n"
            "fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)\n"
            "os.posix_fallocate(fd, 0, 1 << 22)\n"
            "print(path, flush=True)\n"
            "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    left = Path(proc.stdout.readline().strip())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    live = _make(None, run)
    assert left.exists() and left.parent == shm and left != live
    found = shmfiles.sweep()
    assert [item.path for item in found if item.state == shmfiles.STALE] == [left]
    assert not left.exists() and live.exists()


def test_a_rank_dies_with_its_launcher_and_removes_its_files(shm):
    """procwatch.die_with in a stand-in rank: when the stand-in launcher is SIGKILLed,
    the rank removes the launcher's files and kills itself within about a second."""
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owner = ProcessId.of(launcher.pid)
    files = [_make(owner, "a"), _make(owner, "a", node=1)]
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r})\n"
            "from zoexec.runtime import procwatch\nfrom zoexec.store import shmfiles\n"
            f"owner = procwatch.ProcessId(pid={owner.pid}, start={owner.start})\n"
            "procwatch.die_with(owner, what='rank 0', period_s=0.1,\n"
            f"                   cleanup=lambda: shmfiles.remove_owner_files(owner, directory={str(shm)!r}))\n"
            "print('watching', flush=True)\n"
            "time.sleep(60)\n")
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "watching"
        time.sleep(0.3)
        assert rank.poll() is None and all(f.exists() for f in files)
        launcher.kill()
        launcher.wait()
        start = time.monotonic()
        assert rank.wait(timeout=5) == -signal.SIGKILL
        assert time.monotonic() - start < 2
        assert f"its launcher (pid {owner.pid}) has exited" in rank.stderr.read()
        assert not any(f.exists() for f in files)
    finally:
        for proc in (launcher, rank):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_the_profilers_buffers_are_mapped_in_the_folder_the_environment_names(shm, monkeypatch):
    """`zoplan profile` has no --shm-dir: it maps its host buffers where the runs keep
    their stores, $ZOEXEC_SHM_DIR when set (a machine whose /dev/shm is small)."""
    from zoexec.profiler import cpu as pcpu
    from zoexec.store import blocks

    seen = []
    real = blocks.create_store
    monkeypatch.setattr(blocks, "create_store", lambda path, **kw: seen.append(path) or real(path, **kw))
    other = shm / "other"
    other.mkdir()
    monkeypatch.setenv("ZOEXEC_SHM_DIR", str(other))
    assert shmfiles.shm_dir() == other and shmfiles.shm_dir(shm) == shm
    assert pcpu.shm_store(64).numel() == 64
    assert seen and seen[0].parent == other and not seen[0].exists()
    monkeypatch.delenv("ZOEXEC_SHM_DIR")
    assert shmfiles.shm_dir() == shmfiles.SHM_DIR


def test_the_ranks_of_a_torchrun_agent_share_one_folder_the_last_out_removes(shm):
    """shmfiles.node_folder: every rank of one agent joins one folder (each holds a
    shared flock on its members file: two joins here are two open files, as two ranks'
    are); it lives while one is inside, `zoexec clean` lists it as the live agent's,
    the last one out removes it, and a rank that comes later makes it again."""
    agent = ProcessId.me()
    with shmfiles.node_folder(agent) as first:
        assert first == shm / "tmp" / f"zoexec-rdzv-{shmfiles.owner_tag(agent)}-node"
        assert first.stat().st_mode & 0o777 == 0o700
        (first / "tokens").mkdir()
        with shmfiles.node_folder(agent) as second:
            assert second == first and (second / "tokens").is_dir()
        assert first.is_dir()                           # the first rank is still inside
        assert {item.path: item.state for item in shmfiles.sweep()}[first] == shmfiles.LIVE
        assert first.is_dir()
    assert not first.exists()                           # the last one out removed it
    with shmfiles.node_folder(agent) as again:
        assert again == first and list(again.iterdir()) == [again / shmfiles.MEMBERS]
    assert not first.exists()


def test_a_node_folder_removed_while_a_rank_joins_is_made_again(shm, monkeypatch):
    """The last rank out removes the folder between a joining rank's opening its members
    file and its lock, and a third rank makes it again: the joining rank joins the new
    folder (not the removed one's file), so it does not remove the folder on the way
    out while the third is inside."""
    agent, flock, third = ProcessId.me(), shmfiles.fcntl.flock, []

    def late(fd, operation):
        if operation == shmfiles.fcntl.LOCK_SH and not third:
            third.append(None)
            shutil.rmtree(shmfiles.node_dir(agent))                  # the last rank out
            third.append(shmfiles._join(shmfiles.node_dir(agent)))   # a new rank, inside
        flock(fd, operation)

    monkeypatch.setattr(shmfiles.fcntl, "flock", late)
    with shmfiles.node_folder(agent) as folder:
        assert folder.is_dir()
    assert folder.is_dir()                                 # the third rank is still inside
    os.close(third[1])
    with shmfiles.node_folder(agent):
        pass
    assert not folder.exists()


def test_a_killed_jobs_node_folder_is_swept_once_its_agent_has_exited(shm, dead):
    folder = shmfiles.node_dir(dead)
    folder.mkdir()
    (folder / shmfiles.MEMBERS).touch()
    (folder / "tokens").mkdir()
    (folder / "tokens" / "chunk-0.tok").write_bytes(b"t" * 4096)
    assert {item.path: item.state for item in shmfiles.sweep()}[folder] == shmfiles.STALE
    assert not folder.exists()
    folder.mkdir()
    assert shmfiles.remove_owner_files(dead) == [] and not folder.exists()   # die_with's cleanup


@pytest.mark.parametrize("what", ["a link", "not a folder"])
def test_a_node_folder_that_is_not_a_private_folder_is_refused_in_one_line(shm, what):
    folder = shmfiles.node_dir(ProcessId.me())
    elsewhere = shm / "elsewhere"
    elsewhere.mkdir()
    if what == "a link":
        folder.symlink_to(elsewhere)
    else:
        folder.write_text("")
    with pytest.raises(ZoError, match=re.escape(f"node's temporary folder {folder} is {what}: not used")):
        with shmfiles.node_folder(ProcessId.me()):
            pass
    assert list(elsewhere.iterdir()) == []
