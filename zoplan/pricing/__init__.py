"""Pricing: every cost term of a step, each a small documented function of the hardware
profile's figures. The profile (zoplan.hardware) is data and its validation; the
simulator (zoplan.sim) lays the tasks and links out and runs them; this package says
what each costs (vidur keeps its execution-time predictor apart from its event loop
the same way). Only this package reads a profile's figures (typed, zoplan.hwsections:
`profile.figures()`, which zoplan.hardware refuses to any other module of the planner;
tests/unit/test_pricing_layer.py tries the spellings).

  figures      how a figure that may be absent is read (given, or_)

  units        the figures' units (US, NS, GBPS, ...)
  work         Work: device and host seconds of a GPU task
  compute      forward passes (CPU and GPU rooflines), GEMM rates by precision, ranks
               sharing a host's cores, memory-bound work at the achieved HBM bandwidth
  zo           the zo maths' primitives: a z draw, a pass, the update, rounding noise
  schedules    the zo maths of each task, per schedule (zoexec's, ZO2's)
  tasks, lora  the embed, update, forward and head tasks of one rank (full, LoRA)
  host         the host lane of a GPU rank: launches, events, layer calls, the batch
  overlap      the compute and collective streams sharing SMs and HBM (and the block
               tasks they slow: shared_gpu_times)
  copies       host<->device and device<->device link capacities, duplex
  collectives  the all-gather table, an all-gather and its inverse (what a refit scales
               the table by), collective latency, scalar all-reduces
  stragglers   ranks and nodes that do not run alike
  estimators   an estimator's direction in place of z (lowrank, sparse; q directions)
  memory       memory, in one home: a layout's bytes per device (zoplan.memory's terms
               and what NVML shows beyond them) and per node against the profile's
               limits, resident capacity, --max-gpu-memory, ZO2's and MeZO's memory
  baselines    ZO2, MeZO and DistZO2 priced as their own code runs
  distzo2      DistZO2's lanes (`zoplan distzo2`)
"""
