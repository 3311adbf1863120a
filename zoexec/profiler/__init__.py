"""The torch side of `zoplan profile`: measure this machine and return plain samples.

    settings = zoexec.profiler.make_settings(ranks=None, repeats=5, quick=False,
                                             force_cpu=False)
    samples = zoexec.profiler.measure(settings, tick=print, warn=print)

`zoplan.profiling` turns the samples into a validated HardwareProfile; nothing here
fits or prices anything. Two paths, one shape of samples:
- CUDA (cuda.py): one rank per GPU; pinned copies, NCCL collectives, bf16 forwards;
- CPU (cpu.py): gloo ranks sharing this host, measured with zoexec's own copy,
  collective, forward and z routines and its thread rule and host settings.

The samples (plain JSON types):
    settings          Settings.to_dict(): what was measured and how often
    rounds            one dict per measurement round (cpu.measure_cpu / cuda.measure_cuda)
    date              UTC date of the measurement
    host              name, cpu_model, os, total_gib, used_gib
    versions          torch, transformers, python
    devices           GPU names, or "cpu rank r"
    other_load_pct    CPU use of other processes before measuring
    rejected_samples  samples retaken because other processes used the CPUs
    command           the command line
"""

from __future__ import annotations

from zoexec.runtime.hostenv import quiet_openmp

quiet_openmp()   # as zoexec runs its ranks: before torch (libgomp) is loaded

from zoexec.profiler.machine import make_settings, measure  # noqa: E402
from zoexec.profiler.settings import Settings  # noqa: E402

__all__ = ["Settings", "make_settings", "measure"]
