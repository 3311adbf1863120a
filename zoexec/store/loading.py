"""Where a model's weights come from, one block at a time: seeded random
initialisation or a local HF safetensors checkpoint, written straight into flat
buffers (the node's block store, or the in-process buffers of build_parts).

A process that builds the model holds at most its resident parts (embeddings, final
norm, LM head: the modules in the compute dtype plus `resident_master`, the flat
resident weights in the param dtype) and about one block beyond the buffers it fills:
- random init: block b is the model class's own initialisation of ONE decoder layer
  (models.init_layer_random) drawn from its own seed `init_seed(seed, b)`; the resident
  parts from `init_seed(seed, -1)`. One fp32 template layer is re-initialised per block
  and written into the block's buffer in the param dtype. build_hf_model(init="random")
  makes the same weights (models.init_model_random).
- a checkpoint: `model.safetensors`, or `model.safetensors.index.json` and its shards,
  read tensor by tensor with safe_open (a tensor up to READ_ELEMENTS whole, with pread;
  a bigger one in row chunks, each through a mapping closed right after it), each
  converted to the param dtype as it is copied into place. A folder with only
  pytorch_model*.bin files is refused; every tensor the config implies must be there
  with its shape, and nothing else (a tied LM head may be present or not; rotary
  frequency buffers are ignored).
A random init makes the resident parts in fp32 first (as HF's init), so with a 16-bit
store it holds them at 4 + 2 bytes per parameter for a moment.

`fill_timeout_s` sizes how long the node's other ranks wait for the builder.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import torch

from zoexec.model import families as zm
from zoplan.errors import ZoError
from zoplan.modeldir import INDEX_NAME, weight_files

if TYPE_CHECKING:
    from zoexec.model.adapter import Adapter
    from zoexec.model.families import ModelGiven
    from zoexec.store.blocks import BlockStore

IGNORED_SUFFIXES = (".inv_freq",)      # buffers some checkpoints carry: recomputed here
READ_ELEMENTS = 1 << 22                # a checkpoint's tensors are read 4 Mi elements at a time

# The slowest fill we allow for before calling the builder lost: 32 MiB/s of stored
# bytes, 5x and more below what it takes here (benchmarks/executor/bench_load_memory.py on a
# 2-core VM, opt-125m: random init 0.17-0.37 GiB/s of fp32 and 0.12-0.29 GiB/s of bf16
# store, single-threaded like torch's CPU normal_; checkpoint reads 0.25-1 GiB/s).
FILL_FLOOR_BYTES_PER_S = 32 * 2**20


def fill_timeout_s(nbytes: int, *, base_s: float) -> float:
    """How long a rank waits for its node's builder to fill `nbytes` (store and
    resident parts): the usual timeout `base_s` plus the bytes at FILL_FLOOR."""
    return base_s + nbytes / FILL_FLOOR_BYTES_PER_S


# ---- the checkpoint -----------------------------------------------------------------------------
class Checkpoint:
    """The tensors of a local HF safetensors checkpoint: name -> (file, shape).
    `adapter`: the family's (its body prefix, older checkpoints' names and the mask
    buffers they carry); None: a "model." body, no renames."""

    def __init__(self, folder: Path, adapter: Adapter | None = None) -> None:
        self.folder = Path(folder)
        self.files = weight_files(self.folder)
        self.where: dict[str, tuple[Path, tuple[int, ...]]] = {}
        for path, names in self.files.items():
            self._read_header(path, names)
        self.body = adapter.body.split(".")[0] + "." if adapter else "model."
        self.renames = dict(adapter.renames) if adapter else {}
        self.ignored = IGNORED_SUFFIXES + (adapter.ignored if adapter else ())
        self.strip = not any(name.startswith(self.body) for name in self.where)

    def _read_header(self, path: Path, names: set[str] | None) -> None:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt", backend="pread") as handle:
                have = set(handle.keys())
                for name in have if names is None else names & have:
                    self.where[name] = (path, tuple(handle.get_slice(name).get_shape()))
        except (OSError, RuntimeError, ValueError) as exc:
            raise ZoError(f"cannot read the safetensors file {path}: {exc}") from None
        missing = sorted((names or set()) - have)
        if missing:
            raise ZoError(f"{INDEX_NAME} in {self.folder} puts {missing[0]} in {path.name}, "
                          f"which does not hold it ({len(missing)} such tensors)")

    def name_of(self, name: str) -> str:
        """The checkpoint's name of a *ForCausalLM tensor (a base model's checkpoint
        has no 'model.' (GPT-2: 'transformer.') prefix; older ones may name a tensor
        otherwise: the adapter's renames)."""
        old = self.renames.get(name)
        if old is not None and old in self.where and name not in self.where:
            return old
        return name.removeprefix(self.body) if self.strip else name

    def check(self, expected: list[tuple[str, tuple[int, ...]]], *, tied_head: bool) -> None:
        """Every expected (name, shape) is there with its shape, nothing else is."""
        for name, shape in expected:
            entry = self.where.get(self.name_of(name))
            if entry is None:
                raise ZoError(f"checkpoint {self.folder} does not match its config: "
                              f"{name} is missing ({len(self.where)} tensors in the checkpoint, "
                              f"{len(expected)} expected)")
            if entry[1] != tuple(shape):
                raise ZoError(f"checkpoint {self.folder} does not match its config: "
                              f"{name} has shape {list(entry[1])}, the config gives {list(shape)}")
        known = {self.name_of(name) for name, _ in expected}
        if tied_head:
            known.add("lm_head.weight")
        extra = sorted(n for n in self.where if n not in known and not n.endswith(self.ignored))
        if extra:
            raise ZoError(f"checkpoint {self.folder} does not match its config: it holds "
                          f"{extra[0]}, which the config's model does not have "
                          f"({len(extra)} such tensors)")

    def read_into(self, named: list[tuple[str, zm.TensorSpec]], out: torch.Tensor) -> None:
        """Copy each (name, spec) tensor into out[spec.offset:spec.stop] (converted to
        out's dtype), one file at a time; a tensor over READ_ELEMENTS in row chunks."""
        by_file: dict[Path, list[tuple[str, zm.TensorSpec]]] = {}
        for name, spec in named:
            by_file.setdefault(self.where[self.name_of(name)][0], []).append((name, spec))
        from safetensors import safe_open

        for path, items in by_file.items():
            with safe_open(str(path), framework="pt", backend="pread") as handle:
                for name, spec in items:
                    dest = out[spec.offset:spec.stop].view(spec.shape)
                    if spec.numel <= READ_ELEMENTS or dest.dim() == 0:
                        dest.copy_(handle.get_tensor(self.name_of(name)))
                    else:
                        _read_rows(path, self.name_of(name), dest)
                    check_finite(dest, name=self.name_of(name), path=path)


def check_finite(weights: torch.Tensor, *, name: str, path: Path) -> None:
    """ZoError naming the tensor and its file when `weights` (as read) hold a NaN or an
    infinity: found as the checkpoint is read, before a step runs (a NaN weight would
    make every loss NaN: a "diverged" first step, an evaluation with nothing to score)."""
    if not weights.is_floating_point() or bool(torch.isfinite(weights).all()):
        return
    nans = int(torch.isnan(weights).sum())
    infs = int(torch.isinf(weights).sum())
    what = " and ".join(f"{count:,} {kind}" for count, kind in ((nans, "NaN"), (infs, "infinite"))
                        if count)
    raise ZoError(f"checkpoint {path}: tensor {name} holds {what} value"
                  f"{'s' if nans + infs > 1 else ''} (of {weights.numel():,}): the model's "
                  f"weights are damaged; nothing was trained or written")


def _read_rows(path: Path, name: str, dest: torch.Tensor) -> None:
    """Copy a big tensor into `dest` about READ_ELEMENTS at a time, each chunk through
    a mapping of the file closed right after it (safetensors' pread backend reads the
    whole tensor for a slice; a mapping kept open would keep the pages it touched):
    a vocabulary-sized embedding is never held twice."""
    from safetensors import safe_open

    rows = dest.shape[0]
    step = max(1, READ_ELEMENTS // max(1, dest.numel() // rows))
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        with safe_open(str(path), framework="pt", backend="mmap") as handle:
            dest[start:stop].copy_(handle.get_slice(name)[start:stop])


# ---- the source of a model's weights ------------------------------------------------------------
@dataclass(kw_only=True, eq=False)
class ModelSource:
    """A blueprint and where its weights come from: `checkpoint`, or random init from
    `seed` (weights False: a skeleton whose weights come from elsewhere).
    `master`: the resident weights, flat, param dtype (None for a skeleton)."""

    blueprint: zm.Blueprint
    param_dtype: torch.dtype
    compute_dtype: torch.dtype
    seed: int = 0
    checkpoint: Checkpoint | None = None
    master: torch.Tensor | None = None

    @property
    def num_blocks(self) -> int:
        return self.blueprint.num_blocks

    @property
    def block_numel(self) -> int:
        return self.blueprint.block_numel

    @property
    def block_bytes(self) -> int:
        return self.block_numel * _itemsize(self.param_dtype)

    @property
    def resident_numel(self) -> int:
        return sum(p.numel() for p in self.blueprint.resident.parameters())

    def block_names(self, block: int) -> list[tuple[str, zm.TensorSpec]]:
        prefix = f"{self.blueprint.layer_prefix}{block}."
        return [(prefix + spec.name, spec) for spec in self.blueprint.block_specs]

    def block_into(self, block: int, out: torch.Tensor) -> torch.Tensor:
        """Block `block`'s weights written into `out` (block_numel, param dtype)."""
        assert out.numel() == self.block_numel and out.dtype == self.param_dtype
        if self.checkpoint is not None:
            self.checkpoint.read_into(self.block_names(block), out)
        else:
            bp = self.blueprint
            zm.init_layer_random(bp.resident, bp.template, self.seed, block)
            zm.write_params(bp.template, out)
        return out

    def fill(self, store: BlockStore, progress: LoadProgress | None = None) -> None:
        """Every block into the store (zoexec.store.blocks.BlockStore), one at a time."""
        for block in range(self.num_blocks):
            self.block_into(block, store.weights(block))
            if progress is not None:
                progress.block_done(self.block_bytes)

    def finish(self, *, first_block: torch.Tensor | None) -> zm.ModelParts:
        """The ModelParts (see models.parts_from_blueprint); the source is spent."""
        return zm.parts_from_blueprint(self.blueprint, param_dtype=self.param_dtype,
                                       compute_dtype=self.compute_dtype, master=self.master,
                                       first_block=first_block)


def open_source(spec_or_config: ModelGiven, *, init: str = "random", param_dtype: str = "fp32",
                compute_dtype: str = "fp32", seed: int = 0, attn_implementation: str = "auto",
                weights: bool = True) -> ModelSource:
    """The model's blueprint with its resident weights made (random init) or read
    (a checkpoint folder `init`, checked against its config first); `weights` False:
    a skeleton, nothing initialised or read."""
    p_dtype, c_dtype = zm.torch_dtype(param_dtype), zm.torch_dtype(compute_dtype)
    init = str(init)
    config = zm._config_from(spec_or_config, init)
    zm.adapter_for(config)
    zm.check_matches(spec_or_config, config, init)
    random = init == "random"
    made_here = random and weights     # random init: in fp32, tied by init_resident_random
    bp = zm.make_blueprint(config, dtype=torch.float32 if made_here else c_dtype,
                           attn_implementation=attn_implementation, tie=not made_here)
    source = ModelSource(blueprint=bp, param_dtype=p_dtype, compute_dtype=c_dtype, seed=seed)
    if not weights:
        return source
    if random:
        zm.init_resident_random(bp.resident, seed)
        source.master = zm.write_params(bp.resident, torch.empty(source.resident_numel, dtype=p_dtype))
        return source
    source.checkpoint = Checkpoint(Path(init), bp.adapter)
    specs = bp.resident_specs()
    expected = [(s.name, s.shape) for s in specs]
    for block in range(bp.num_blocks):
        expected += [(name, spec.shape) for name, spec in source.block_names(block)]
    source.checkpoint.check(expected, tied_head=_tied(bp))
    master = torch.empty(source.resident_numel, dtype=p_dtype)
    source.checkpoint.read_into([(s.name, s) for s in specs], master)
    source.master = master
    return source


def _tied(bp: zm.Blueprint) -> bool:
    resident = bp.resident
    return resident.get_output_embeddings().weight is resident.get_input_embeddings().weight


def _itemsize(dtype: torch.dtype) -> int:
    return int(torch.empty(0, dtype=dtype).element_size())


# ---- progress -----------------------------------------------------------------------------------
class LoadProgress:
    """'zoexec: loading blocks 12/96 from DIR, 3.4 GiB, 1.2 GiB/s' on stderr, at most
    every `period_s` and after the last block (overwritten in place on a terminal)."""

    def __init__(self, *, total: int, what: str, period_s: float = 2.0, stream: TextIO | None = None) -> None:
        self.total, self.what, self.period_s = total, what, period_s
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.nbytes = 0
        self.start = self.last = time.monotonic()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def block_done(self, nbytes: int) -> None:
        self.done += 1
        self.nbytes += nbytes
        now = time.monotonic()
        if self.done == self.total or now - self.last >= self.period_s:
            self.last = now
            self._print(now)

    def _print(self, now: float) -> None:
        rate = self.nbytes / max(now - self.start, 1e-9)
        line = (f"zoexec: {self.what} {self.done}/{self.total}, {self.nbytes / 2**30:.2f} GiB, "
                f"{rate / 2**30:.2f} GiB/s")
        end = "" if self.tty and self.done < self.total else "\n"
        self.stream.write(("\r" if self.tty else "") + line + end)
        self.stream.flush()


def build_parts(spec_or_config: ModelGiven, *, init: str = "random", param_dtype: str = "fp32",
                compute_dtype: str = "fp32", seed: int = 0,
                attn_implementation: str = "auto") -> tuple[zm.ModelParts, list[torch.Tensor]]:
    """Resident parts + one flat CPU buffer per block (param dtype), made block by
    block (ModelSource: random init, or a local directory's safetensors)
    exactly as the node's store is filled. The working block is bound to a
    compute-dtype copy of block 0."""
    source = open_source(spec_or_config, init=init, param_dtype=param_dtype,
                         compute_dtype=compute_dtype, seed=seed,
                         attn_implementation=attn_implementation)
    flats = [source.block_into(b, torch.empty(source.block_numel, dtype=source.param_dtype))
             for b in range(source.num_blocks)]
    return source.finish(first_block=flats[0]), flats
