"""zoexec: execute a zoplan plan with torch.distributed (NCCL on CUDA, gloo on CPU).

Modules: models (HF adapters: resident parts + one working decoder block bound to a
flat buffer), zo (seeded z, perturb, deferred update, projected gradient), data
(synthetic task, JSONL data, sharding), reference (plain MeZO-SGD loop, the oracle),
store / runtime / engine / checkpoint / cli (the distributed runtime).
Importing the package imports nothing heavy.
"""
