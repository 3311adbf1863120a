"""zoexec: execute a zoplan plan with torch.distributed (NCCL on CUDA, gloo on CPU).

Packages, lowest layer first (docs/code.md; tests/unit/test_import_rules.py): maths/ (the
seed rule, z, perturbation, the deferred update, the lr schedule), data/ (data files,
packed text, the task section and the task types' registry), model/ (one adapter per
HF family, precision, export), config.py (the run configuration) and reference.py (the
plain MeZO-SGD loop, the oracle), runtime/, store/, profiler/, train/, run/, launch/,
and the face: cli.py, flags.py, options.py. Importing the package imports nothing heavy.
"""
