"""Ranks sharing one GPU (--backend gloo), on the CPU with CUDA faked: the backend
choice, the all-gather's path (composed from broadcasts for gloo and CUDA tensors, the
backend's own otherwise: zoexec.runtime.device.gather_by_broadcasts, the one place
it is decided), and the preflight letting two local ranks share one visible GPU."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from zoexec.config import RuntimeOptions
from zoexec.launch import preflight
from zoexec.runtime import device as zdevice
from zoexec.runtime import groups as zgroups
from zoplan.errors import ZoError
from zoplan.layout import Layout


def test_the_backend_choice():
    assert zdevice.backend_for("cuda", 4) == "nccl"
    assert zdevice.backend_for("cuda", 4, "gloo") == "gloo"
    assert zdevice.backend_for("cuda", 1, "auto") == "gloo"
    assert zdevice.backend_for("cpu", 4, "gloo") == "gloo"
    with pytest.raises(ZoError, match="--backend must be auto or gloo, got 'nccl'"):
        zdevice.backend_for("cuda", 2, "nccl")


def test_two_ranks_on_a_faked_gpu_join_over_gloo(monkeypatch):
    """--backend gloo on CUDA: both local ranks on GPU 0, the group gloo, no NCCL
    device binding nor NCCL environment."""
    calls: list = []
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: None)
    monkeypatch.setattr(zgroups, "bind_near_gpu", lambda device: "")
    monkeypatch.setattr(zgroups, "set_tf32", lambda device, tf32: None)
    monkeypatch.setattr(zgroups.dist, "init_process_group", lambda *a, **k: calls.append((a, k)))
    monkeypatch.setattr(zgroups, "_build_groups", lambda env: None)
    for rank in (0, 1):
        place = zgroups.RankPlace(rank=rank, local_rank=rank, world_size=2, local_world_size=2)
        env = zgroups.init_distributed(place=place, layout=Layout(pertp=2), device_kind="cuda",
                                       runtime=RuntimeOptions(backend="gloo"))
        assert env.device == torch.device("cuda", 0) and env.backend == "gloo"
    assert [(a, k["device_id"]) for a, k in calls] == [(("gloo",), None)] * 2
    assert "NCCL_NVLS_ENABLE" not in zgroups.os.environ


@pytest.mark.parametrize(("backend", "device", "composed"), [
    ("gloo", "cuda", True), ("nccl", "cuda", False), ("gloo", "cpu", False)])
def test_the_all_gather_path_is_decided_in_one_place(monkeypatch, backend, device, composed):
    """all_gather_flat asks gather_by_broadcasts (backend, tensor device) and takes
    the broadcasts or the backend's own all-gather accordingly."""
    taken: list[str] = []
    monkeypatch.setattr(zgroups.dist, "get_backend", lambda group: backend)
    monkeypatch.setattr(zgroups, "gather_by_broadcasts",
                        lambda out, mine, **kw: taken.append("broadcasts"))
    monkeypatch.setattr(zgroups, "all_gather_call",
                        lambda: lambda out, mine, **kw: taken.append("native"))
    mine = SimpleNamespace(device=torch.device(device))
    zgroups.all_gather_flat(None, mine, group="slice")
    assert taken == ["broadcasts" if composed else "native"]
    assert zdevice.gather_by_broadcasts(backend, device) is composed


def _cfg(backend: str):
    return SimpleNamespace(device_kind="cuda", layout=Layout(pertp=2),
                           runtime=RuntimeOptions(backend=backend))


def test_a_local_launch_shares_one_gpu_only_over_gloo(monkeypatch):
    monkeypatch.setattr(preflight, "device_count", lambda kind: 1)
    monkeypatch.setattr(preflight, "place_from_env", lambda: None)
    preflight._check_devices(_cfg("gloo"))
    with pytest.raises(ZoError, match="sees 1 .*--backend gloo"):
        preflight._check_devices(_cfg("auto"))
