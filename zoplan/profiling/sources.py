"""The source note of each figure of a measured profile ("[M] zoplan profile <date> how")."""

from __future__ import annotations

from typing import Any, Protocol

from zoplan.execrules import threads_per_rank
from zoplan.profiling.fits import SHARE_THRESHOLD

KIB, MIB = 2**10, 2**20


class SampleSettings(Protocol):
    """What the profiler measured (zoexec.profiler.settings.Settings, as its samples
    carry it: to_dict), the attributes the profile's assembly reads."""

    device: str
    ranks: int
    cores: int
    copy_bytes: int
    store_bytes: int
    gather_sizes: list[int]
    reference_shape: list[Any]            # (family, hidden, batch, seq)
    z_hiddens: list[int]
    zo_hidden: int
    z_gpu_blocks: list[list[int]]         # (tensors, elements each)
    speed_checks: dict[str, dict[str, Any]]


def note(date: str, what: str) -> str:
    return f"[M] zoplan profile {date} {what}"


def cpu_sources(settings: SampleSettings, *, threads: int, fit: dict[str, Any], date: str,
                 num_forwards: int) -> dict[str, Any]:
    """The source note of each figure of a CPU profile."""
    c = note(date, "")
    k = settings.ranks
    return {
        "device.memory_gib": f"{c}host memory (a CPU rank's memory is the host's, shared)",
        "device.reserved_gib": f"{c}host memory in use before the run + 1 GiB runtime",
        "device.concurrent_engines": f"{c}a gloo rank runs its tasks one at a time (zoexec's CPU schedule)",
        "host.memory_gib": f"{c}psutil total memory",
        "host.mem_bw_gbps": f"{c}{k} ranks copying {settings.copy_bytes // MIB} MiB at once "
                            f"({threads_per_rank(settings.cores, k)} threads each), sum of their rates",
        "host.cores": f"{c}cores this process may use (os.sched_getaffinity)",
        "pcie.h2d_gbps": f"{c}one rank ({threads} threads) copying {settings.copy_bytes // MIB} MiB "
                         f"pieces of a {settings.store_bytes // MIB} MiB /dev/shm store into its "
                         "buffer in turn (Tensor.copy_, as zoexec's h2d)",
        "pcie.d2h_gbps": f"{c}one rank ({threads} threads) copying its buffer into "
                         f"{settings.copy_bytes // MIB} MiB pieces of a {settings.store_bytes // MIB} "
                         "MiB /dev/shm store in turn (as zoexec's write-back)",
        "pcie.duplex_gbps": f"{c}a CPU rank copies one way at a time: max of the two directions",
        "pcie.switch_uplink_gbps": f"{c}no switches: the host memory figure",
        "fabric.p2p_gbps": f"{c}gloo all-gather bus bandwidth at the largest size",
        "collective.latency_us": f"{c}gloo all_gather_single of {settings.gather_sizes[0] // KIB} KiB "
                                 f"over {k} ranks (median, from the last rank's arrival)",
        "collective.allreduce_small_us": f"{c}gloo all-reduce of two float64 over {k} ranks "
                                         "(median, from the last rank's arrival)",
        "collective.allgather_busbw": f"{c}gloo all_gather_single over {k} ranks: "
                                      "(s-1)/s x bytes / (time - latency)",
        "network.gbps": "[D] unused (one host): the gloo bus bandwidth",
        "network.latency_us": "[D] unused (one host): the gloo latency",
        "compute.peak_tflops": f"{c}fit of {num_forwards} fp32 OPT-block forwards, "
                               f"1 rank x {threads} threads (rel. rms {fit['rel_rms_pct']:.1f}%)",
        "compute.m_half_tokens": f"{c}same fit",
        "compute.overhead_us": f"{c}same fit (per forward call: op dispatch)",
        "compute.mem_gbps": f"{c}2 x the one-rank copy rate (read + write)",
        "compute.zo_ns_per_param": f"{c}zoexec update task (z, apply_update, z, perturb_into) on an "
                                   f"OPT block of hidden {settings.zo_hidden}, {threads} threads",
        "compute.rank_scaling": f"{c}forward of an {settings.reference_shape[0]} block "
                                f"h={settings.reference_shape[1]}: {k} ranks at once (cores // ranks "
                                "threads each) and rank 0 alone (all cores) in turn, median of the pairs",
        "compute.attn_tflops": f"{c}same fit (attention FLOPs apart from the GEMMs)",
        "compute.elem_ns": f"{c}same fit (element-wise operator outputs, zoplan.models)",
        "compute.rope_overhead_us": f"{c}same fit (a Llama-family block's dispatch beyond an "
                                    f"OPT block's: its norms, gated MLP and rotary embedding "
                                    f"are more operators)",
        "compute.z_ns_per_elem": f"{c}z draws (zoexec.maths.zo.z_block) of OPT blocks h={'/'.join(map(str, settings.z_hiddens))}, "
                                 f"{threads} threads: per element of the busiest thread",
        "compute.z_call_us": f"{c}same fit (handing the chunks to the thread pool)",
        "compute.z_chunk_us": f"{c}z draw over 256 tiny tensors on one thread, per chunk",
        "compute.zo_pass_ns": f"{c}apply_update and perturb_into over an OPT block of hidden "
                              f"{settings.zo_hidden}, {threads} threads: per element and pass",
        "compute.z_rank_scaling": f"{c}z draws, {k} ranks at once and rank 0 alone in turn: "
                                  "per-element speed of the busiest thread, together / alone",
        "compute.rank_jitter": f"{c}{k} ranks running the same forward or z draw at once: "
                               "(slowest - mean) / mean per sample, median",
        "compute.mem_rank_scaling": f"{c}a memory-bound OPT block forward (h={settings.speed_checks['memory']['hidden']}, "
                                    f"{settings.speed_checks['memory']['batch']}x{settings.speed_checks['memory']['seq']} tokens), "
                                    f"{k} ranks at once and rank 0 alone in turn: the rank scaling "
                                    "of its attention and element-wise parts",
        "compute.zo_rank_scaling": f"{c}update task on 1 rank vs {k} ranks at once",
    }



def cuda_sources(settings: SampleSettings, *, fit: dict[str, Any], date: str, num_forwards: int,
                 uplink_duplex: bool = False) -> dict[str, Any]:
    """The source note of each figure of a CUDA profile."""
    n = settings.ranks
    c = note(date, "")
    size = f"{settings.copy_bytes // MIB} MiB"
    timed = f"{size} copies timed in pieces with CUDA events while all run"
    draws = ", ".join(f"{t} x {e} elements" for t, e in settings.z_gpu_blocks)
    sources = {
        "device.memory_gib": f"{c}torch.cuda.mem_get_info total",
        "device.reserved_gib": f"{c}memory in use at profile time + 2 GiB NCCL/allocator slack [D]",
        "device.hbm_gbps": f"{c}zoexec's zo passes (apply_update, perturb_into) over "
                           f"{settings.z_gpu_blocks[0][0] * settings.z_gpu_blocks[0][1]} "
                           "elements with a 16-bit and an fp32 store on GPU 0: bytes read + "
                           "written / time, median of the passes",
        **{f"device.{kind}{store}_gbps": f"{c}zoexec's {call} over "
           f"{settings.z_gpu_blocks[0][0] * settings.z_gpu_blocks[0][1]} elements with "
           f"{what} and 16-bit z on GPU 0: bytes read + written / time (the resident "
           "parts' passes are priced at it)"
           for kind, call in (("update", "apply_update"), ("perturb", "perturb_into"))
           for store, what in (("16", "a 16-bit store"), ("32", "an fp32 store"))},
        "host.memory_gib": f"{c}psutil total memory",
        "host.mem_bw_gbps": f"{c}all {n} GPUs copying {size} pinned at once, one way and both "
                            "ways (the larger total; a lower bound of the host ceiling)",
        "host.cores": f"{c}os.sched_getaffinity",
        "pcie.h2d_gbps": f"{c}pinned H2D {size}, one GPU alone (median over GPUs)",
        "pcie.d2h_gbps": f"{c}pinned D2H {size}, one GPU alone (median over GPUs)",
        "pcie.h2d_duplex_gbps": f"{c}H2D of one GPU while its D2H runs ({timed}; median over GPUs)",
        "pcie.d2h_duplex_gbps": f"{c}D2H of one GPU while its H2D runs ({timed}; median over GPUs)",
        "pcie.switch_groups": f"{c}GPU pairs pulling at once: < {SHARE_THRESHOLD:.0%} of alone = shared uplink",
        "pcie.switch_uplink_gbps": f"{c}a sharing group pulling at once, total (or one GPU alone)",
        "fabric.p2p_gbps": f"{c}GPU0 -> GPU1 copy {size}" if n > 1 else "[D] unused with one GPU",
        "fabric.groups": f"{c}nvidia-smi topo -m (NV# entries)",
        "collective.latency_us": f"{c}NCCL all-gather of {settings.gather_sizes[0] // KIB} KiB over "
                                 f"{n} GPUs (median, from the last rank's arrival)",
        "collective.allreduce_small_us": f"{c}NCCL all-reduce of two float64 over {n} GPUs "
                                         "(median, from the last rank's arrival)",
        "collective.allgather_busbw": f"{c}NCCL all_gather_single over {n} GPUs: (s-1)/s x bytes / (time - latency)",
        "network.gbps": "[D] not measured (one node): a 400 Gb/s NIC assumed",
        "network.latency_us": "[D] not measured (one node): ~20 us assumed",
        "compute.peak_tflops": f"{c}fit of {num_forwards} OPT-block forwards on GPU 0 in bf16, "
                               f"fp32 with TF32 and fp32 (rel. rms {fit['rel_rms_pct']:.1f}%): "
                               "the bf16 (16-bit) GEMM rate",
        "compute.tf32_tflops": f"{c}same fit: fp32 GEMMs with TF32 allowed",
        "compute.fp32_tflops": f"{c}same fit: fp32 GEMMs without TF32",
        "compute.m_half_tokens": f"{c}same fit (one efficiency term for every precision)",
        "compute.overhead_us": f"{c}same fit (launch cost per forward)",
        "compute.z_launch_us": f"{c}z draws (zoexec.maths.zo.z_block, one launch per 2**24-element chunk) of "
                               f"blocks of {draws} on GPU 0: per launch",
        "compute.z_ns_per_elem": f"{c}same fit: per element",
        "compute.rank_scaling": "[D] one GPU per rank: no sharing",
    }
    if uplink_duplex:
        sources["pcie.uplink_h2d_duplex_gbps"] = (
            f"{c}all {n} GPUs copying both ways at once: a sharing group's H2D total "
            "(median over groups; the host ceiling may hold it lower)")
        sources["pcie.uplink_d2h_duplex_gbps"] = (
            f"{c}all {n} GPUs copying both ways at once: a sharing group's D2H total")
    if n == 1:
        sources["collective.latency_us"] = sources["collective.allreduce_small_us"] = \
            sources["collective.allgather_busbw"] = "[D] one GPU: no collectives"
    return sources
