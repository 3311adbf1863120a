"""The ONE device and backend choice of a zoexec rank, and the few CUDA facts the rest
of the executor asks for (device count, free and total memory, peaks, TF32, the CPUs
near a GPU, NCCL's environment).

`select_device` picks the device and the backend: a CUDA GPU + NCCL where the plan is
for CUDA GPUs and the job has more than one rank, a CUDA GPU + gloo for a job of one
rank (no collective runs there: the default group only carries host-side objects, and
no NCCL communicator takes device memory) or where `--backend gloo` asks for it (ranks
sharing one GPU, which NCCL refuses; gloo reduces and broadcasts CUDA tensors, and the
block all-gather is composed from broadcasts: `gather_by_broadcasts`), the CPU + gloo
otherwise. Nothing else in
zoexec calls `.cuda()`, names a backend or creates a stream; the rest of the code moves
tensors with `.to(env.device)` and runs its tasks through the lanes (zoexec.runtime.lanes).

What this module decides for a CUDA rank (a CPU rank keeps torch's defaults):
- which GPU: devicemap.cuda_index (the local rank among the visible GPUs, or the one
  GPU a per-task binding leaves the process);
- TF32: whether fp32 matmuls and convolutions may use TF32 tensor cores (the plan's
  workload.tf32);
- where its threads run: the CPUs of its GPU's socket (numa.bind_near_pci);
- NCCL NVLS off unless the environment says otherwise (nccl_defaults).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import torch

from zoexec.runtime import numa
from zoexec.runtime.devicemap import ENV_VISIBLE, cuda_index, visible_env
from zoplan.errors import ZoError

# NCCL's NVLink SHARP (NVLS) buffers: on NVSwitch H100/H200 hosts NCCL enables NVLS
# for communicators of more than 2 ranks and takes about 300 MB more device memory per
# rank (NCCL's environment documentation, NCCL_NVLS_ENABLE; issue notes of NCCL 2.17+).
# zoplan.memory prices NCCL with A100 figures, which have no NVLS: it is turned off
# unless the user sets the variable (docs/gpu.md says why).
NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0"}


def backend_for(device_kind: str, world_size: int, choice: str = "auto") -> str:
    """The default group's backend: NCCL for CUDA jobs of more than one rank; gloo for
    the CPU and for a CUDA job of one rank (no collective runs on its device), and
    wherever `choice` (--backend) is "gloo" (ranks sharing one GPU: NCCL refuses two
    ranks on one device)."""
    if choice not in ("auto", "gloo"):
        raise ZoError(f"--backend must be auto or gloo, got {choice!r}")
    return "nccl" if device_kind == "cuda" and world_size > 1 and choice == "auto" else "gloo"


def gather_by_broadcasts(backend: str, tensor_device: str) -> bool:
    """Whether a group's all-gather of tensors on `tensor_device` is composed from one
    broadcast per member (zoexec.runtime.groups.all_gather_flat): gloo has no all-gather
    of CUDA tensors, but broadcasts them; NCCL and gloo on the CPU gather natively."""
    return backend == "gloo" and tensor_device == "cuda"


def select_device(device_kind: str, local_rank: int, *, local_world_size: int,
                  world_size: int, backend: str = "auto") -> tuple[torch.device, str]:
    """(device, backend) of a rank: a CUDA GPU (devicemap.cuda_index), made the
    process's current device, or the CPU; the backend is backend_for's (`backend`:
    the --backend choice)."""
    if device_kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ZoError("the plan is for CUDA GPUs but this process sees none "
                          f"({ENV_VISIBLE}={visible_env() or 'unset'})")
        index = cuda_index(local_rank, local_world_size=local_world_size, num_visible=count,
                           visible_env=visible_env())
        torch.cuda.set_device(index)
        return torch.device("cuda", index), backend_for(device_kind, world_size, backend)
    if device_kind != "cpu":
        raise ZoError(f"profile.device_kind {device_kind!r} is neither 'cuda' nor 'cpu'")
    backend_for(device_kind, world_size, backend)    # the choice checked
    return torch.device("cpu"), "gloo"


def nccl_defaults(backend: str, environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set NCCL_DEFAULTS in `environ` where the user has not (NCCL reads them when its
    first communicator starts); returns what was set. Nothing for gloo."""
    if backend != "nccl":
        return {}
    added = {k: v for k, v in NCCL_DEFAULTS.items() if k not in environ}
    environ.update(added)
    return added


def set_tf32(device: torch.device, tf32: bool) -> None:
    """CUDA: let fp32 matmuls (cuBLAS) and convolutions (cuDNN) use TF32 tensor cores,
    or keep them in full fp32. The CPU is left as torch has it: float32 matmul
    precision also steers CPU kernels there."""
    if device.type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")


def bind_near_gpu(device: torch.device) -> str:
    """CUDA: move the rank's threads to the CPUs of its GPU's socket (its PCI
    device's local_cpulist), so that its host work and staging run beside the GPU.
    Returns the CPU list ('' where nothing changed); the CPU path is left alone."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device.index)
    address = numa.pci_address(*(getattr(props, f"pci_{part}_id", None)
                                 for part in ("domain", "bus", "device")))
    if address is None:
        numa.say_once("bind", "this torch does not give the GPU's PCI address; the rank's "
                      "threads are not bound near it")
        return ""
    return numa.bind_near_pci(address)


def device_count(device_kind: str) -> int:
    """How many devices of the plan's kind this process sees (CPU: unlimited)."""
    if device_kind == "cuda":
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    return 1 << 30


def device_memory_bytes(device_kind: str, index: int) -> int | None:
    """Total memory of CUDA device `index` (None on the CPU)."""
    if device_kind != "cuda":
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def device_memory_free(device_kind: str, index: int) -> tuple[int, int] | None:
    """(free, total) bytes of CUDA device `index` as the driver reports them now (other
    processes' use and this process's CUDA context already taken: asking creates the
    context); None on the CPU."""
    if device_kind != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(index)
    return int(free), int(total)


def device_memory_peak(device: torch.device) -> dict[str, int]:
    """Peak memory the GPU allocator held on `device` (empty on the CPU)."""
    if device.type != "cuda":
        return {}
    return {"gpu_peak_allocated": int(torch.cuda.max_memory_allocated(device)),
            "gpu_peak_reserved": int(torch.cuda.max_memory_reserved(device))}


def fused_zo_problem(device: torch.device) -> str | None:
    """Why the fused ZO kernel (zoexec.maths.fused: Triton, CUDA only) cannot run on
    `device` (None: it can): `--zo-kernel auto` takes it where it can."""
    if device.type != "cuda":
        return f"the fused kernel runs on CUDA GPUs, this rank's device is {device.type}"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return f"triton is not importable ({exc}); pip install '.[cuda]' pins it"
    import shutil

    # triton builds its launcher with a C compiler at the first launch (its runtime/build.py)
    if not (os.environ.get("CC") or shutil.which("clang") or shutil.which("gcc")):
        return "triton finds no C compiler to build its launcher (no $CC, clang or gcc)"
    return None
