"""Write the byte-code of what zoplan, zoexec and their tests import, by importing it
once (scripts/setup.sh, after the install).

Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), Python never
writes byte-code, so every process would compile torch, transformers and the rest again
at each import (about 3x a process's start-up); pip's own compile step (or compileall
over site-packages) writes it for all of the 16,000 files installed, most of which no
process imports (pandas, sympy's unused parts, mlflow's server, pip itself): half a
minute of two cores. Importing what is used, with writing on, writes exactly that."""

from __future__ import annotations

import importlib
import pkgutil
import sys

sys.dont_write_bytecode = False

# the model families zoexec adapts (zoexec.model.families): their HF modules
FAMILIES = ("opt", "llama", "gpt2", "gpt_neox", "mistral", "qwen2", "qwen3", "gemma")
# the libraries the tools and the tests use (scripts/setup.sh's import check, and what
# they import on their own paths)
LIBRARIES = ("torch", "torch.distributed", "torch.distributed.elastic", "torch.distributed.run",
             "torch.multiprocessing", "transformers", "transformers.modeling_utils",
             "transformers.tokenization_utils_base", "transformers.models.auto",
             "transformers.generation", "safetensors.torch", "datasets", "peft", "accelerate",
             "gguf", "psutil", "numpy", "simpy", "networkx", "rich", "rich.progress", "typer",
             "pydantic", "yaml", "pytest", "xdist", "execnet", "triton", "wandb", "mlflow",
             "tokenizers", "huggingface_hub")


def _import(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an optional part missing here is compiled at first use
        return False
    return True


def main() -> int:
    missing = [name for name in LIBRARIES if not _import(name)]
    for family in FAMILIES:
        for part in ("configuration", "modeling", "tokenization"):
            _import(f"transformers.models.{family}.{part}_{family}")
    _import("transformers.models.gpt2.tokenization_gpt2_fast")
    for top in ("zoplan", "zoexec"):
        package = importlib.import_module(top)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{top}."):
            _import(module.name)
    if missing:
        print(f"warm_bytecode: not importable here: {', '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
