"""Folders of a test module's own for the runs it starts, so that its files (a killed
run's block store, its rendezvous and data folders) are never seen by the runs of tests
beside it (scripts/test.sh runs two test processes): every start sweeps the stale files
it finds in its shared-memory folder and its temporary one, and says so on its stderr,
which tests read; and a test that kills a run or counts what is left sees only its own.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from zoexec.store import shmfiles


@dataclass(frozen=True)
class RunDirs:
    shm: Path     # the block stores' folder: --shm-dir / $ZOEXEC_SHM_DIR
    tmp: Path     # the temporary folder: the rendezvous and data folders ($TMPDIR)

    @property
    def args(self) -> list[str]:
        """What a `zoexec run` in this process takes: its store's folder (no
        environment: a forkserver this process starts would keep it for later tests)."""
        return ["--shm-dir", str(self.shm)]

    @property
    def env(self) -> dict[str, str]:
        """The environment of a `zoexec` started as a process of its own."""
        return {**os.environ, shmfiles.SHM_DIR_ENV: str(self.shm), "TMPDIR": str(self.tmp)}


@pytest.fixture(scope="module")
def private_run_dirs(tmp_path_factory) -> Iterator[RunDirs]:
    """A shared-memory folder of the module's own (/dev/shm/zt-*, on the tmpfs where
    there is one: no sweep of /dev/shm's zoexec-* files looks into it), removed after,
    and a temporary folder; in this process zoexec's defaults for both point there
    (shmfiles.SHM_DIR, RDZV_DIR: the launcher's rendezvous folders), the runs started
    take `args` or `env`."""
    shm = Path("/dev/shm")
    folder = (shm if shm.is_dir() else tmp_path_factory.getbasetemp()) / f"zt-{uuid.uuid4().hex[:12]}"
    folder.mkdir()
    dirs = RunDirs(shm=folder, tmp=tmp_path_factory.mktemp("tmpdir"))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shmfiles, "SHM_DIR", dirs.shm)
            patch.setattr(shmfiles, "RDZV_DIR", dirs.tmp)
            yield dirs
    finally:
        shutil.rmtree(folder, ignore_errors=True)
