"""Write the byte-code of what zoplan, zoexec and their tests import, by importing it
once (scripts/setup.sh, after the install).

Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it), Python never
writes byte-code, so every process would compile torch, transformers and the rest again
at each import; pip's own compile step (or compileall over site-packages) writes it for
all of the 16,000 files installed, most of which no process imports (of pandas' 1,440
files 251 are imported, of sympy's 1,532 419, of mlflow's 1,244 495, none of pip's):
42 s of two cores. Importing what is used, with writing on, writes exactly that (4,500
files; 19 s on two cores: the torch-free libraries in a child beside the rest)."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys

sys.dont_write_bytecode = False

# the libraries the tools and the tests use (scripts/setup.sh's import check, and what
# they import on their own paths): those that import torch, and those that do not (the
# second list in a child process beside this one: two cores, 29 s -> about 20)
WITH_TORCH = ("torch", "torch.distributed", "torch.distributed.elastic", "torch.distributed.run",
              "torch.multiprocessing", "transformers", "transformers.modeling_utils",
              "transformers.tokenization_utils_base", "transformers.models.auto",
              "transformers.generation", "safetensors.torch", "peft", "accelerate", "triton")
TORCH_FREE = ("datasets", "gguf", "psutil", "numpy", "simpy", "networkx", "rich", "rich.progress",
              "typer", "pydantic", "yaml", "pytest", "xdist", "execnet", "wandb", "mlflow",
              "tokenizers", "huggingface_hub")


def _import(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an optional part missing here is compiled at first use
        return False
    return True


def _imported(names: tuple[str, ...]) -> list[str]:
    """The names that did not import."""
    return [name for name in names if not _import(name)]


def main() -> int:
    if sys.argv[1:] == ["--torch-free"]:
        missing = _imported(TORCH_FREE)
        if missing:
            print(" ".join(missing))
        return 0
    child = subprocess.Popen([sys.executable, __file__, "--torch-free"], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""})
    missing = _imported(WITH_TORCH)
    for top in ("zoplan", "zoexec"):
        package = importlib.import_module(top)
        for module in pkgutil.walk_packages(package.__path__, prefix=f"{top}."):
            _import(module.name)
    from zoexec.model.families import ADAPTERS

    for family in ADAPTERS:   # the model types zoexec adapts: their HF modules
        for part in ("configuration", "modeling", "tokenization"):
            _import(f"transformers.models.{family}.{part}_{family}")
    _import("transformers.models.gpt2.tokenization_gpt2_fast")
    missing += (child.communicate()[0] or "").split()
    if missing:
        print(f"warm_bytecode: not importable here: {', '.join(missing)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
