"""A model folder as save_pretrained writes it, from the flat block buffers.

Weights (a snapshot or final/) are an HF folder: config.json, generation_config.json
(the source folder's, else derived from the config as GenerationConfig.from_model_config
does), the weights in safetensors (one model.safetensors, or shards
model-00001-of-0000N.safetensors + model.safetensors.index.json when they pass
max_shard_bytes), and the tokenizer files of the model folder the run started from.
Shards are written tensor by tensor straight from the flat block buffers, so saving holds
at most one converted tensor beside the store, never the model. A folder is written into
a temporary folder and renamed, so it is either whole or absent; non-finite weights are
refused, never saved.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import GenerationConfig

from zoexec.model.families import resident_param_specs
from zoplan.errors import ZoError
from zoplan.io import usual_mode

# Files of a model folder that a saved model carries along for AutoTokenizer (fast and
# slow tokenizers: BPE, WordPiece, SentencePiece, tiktoken) and chat templates.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
                   "tokenizer.model", "spiece.model", "sentencepiece.bpe.model",
                   "chat_template.jinja", "chat_template.json")
TOKENIZER_PATTERNS = ("*.tiktoken",)
TOKENIZER_DIRS = ("additional_chat_templates",)
GENERATION_CONFIG = "generation_config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
MAX_SHARD_BYTES = 5 * 10**9        # --max-shard-size default: 5GB (decimal, as HF counts)


def export_weights(parts, block_flats, folder: Path, *, resident=None,
                   extra_files: Path | None = None,
                   state: dict | Callable[[Path], dict] | None = None,
                   max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Write `folder` atomically as save_pretrained would (see the module docstring), in
    the stored precision (the blocks' dtype); `extra_files`: the model folder the run
    started from (its tokenizer and generation config); `state`: state.json (or a
    function of the folder written so far that returns it: checksums of its files);
    `resident`: the resident weights' clean flat copy (resident_specs order), else the
    resident modules' own weights. Non-finite weights are refused."""
    for index, flat in enumerate(block_flats):
        _check_finite(flat, f"block {index}")
    if resident is not None:
        _check_finite(resident, "the resident parts (embeddings, norm, head)")
    with atomic_folder(folder) as tmp:
        dtype = block_flats[0].dtype
        config = save_config(parts.config, type(parts.resident).__name__, tmp, dtype)
        save_generation_config(config, tmp, extra_files)
        write_safetensors(hf_tensors(parts, block_flats, resident=resident), tmp, dtype=dtype,
                          max_shard_bytes=max_shard_bytes)
        copy_tokenizer(extra_files, tmp)
        if state is not None:   # a callable: state(the folder written so far)
            content = state(tmp) if callable(state) else state
            (tmp / "state.json").write_text(json.dumps(content, indent=1, allow_nan=False) + "\n")
    return Path(folder)


@contextlib.contextmanager
def atomic_folder(folder: Path):
    """Yield a temporary folder beside `folder` to write into; on success its files are
    synced and it replaces `folder`; on any error it is removed: `folder` is either
    whole or as it was."""
    folder = Path(folder)
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        yield tmp
        _fsync_tree(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def hf_tensors(parts, block_flats, *, resident=None):
    """(HF state-dict key, view) of every tensor of the model, in save order (a tied
    head once, as save_pretrained writes it): views into the flat buffers, nothing
    copied. `resident`: the resident weights as one flat tensor (resident_specs order:
    a run's clean copy, fp32 masters with update "master"), else the resident modules'
    own weights. The ONE rule from flat buffers to HF names (export_weights and the
    tests' state dicts use it)."""
    assert len(block_flats) == parts.num_blocks, (len(block_flats), parts.num_blocks)
    if resident is not None:
        for spec in parts.resident_specs:
            yield spec.name, resident[spec.offset:spec.stop].view(spec.shape)
    else:
        for name, tensor, _ in resident_param_specs(parts):
            yield name, tensor.detach()
    for index, flat in enumerate(block_flats):
        for spec in parts.block_specs:
            yield f"{parts.layer_prefix}{index}.{spec.name}", flat[spec.offset:spec.stop].view(spec.shape)


def save_config(model_config, architecture: str, folder: Path, dtype):
    """config.json: a copy of the model config, its dtype the saved one, its
    architectures the *ForCausalLM class (as save_pretrained sets them)."""
    config = model_config.__class__.from_dict(model_config.to_dict())
    config.dtype = dtype
    config.architectures = [architecture]
    config.save_pretrained(folder)
    return config


def save_generation_config(config, folder: Path, source: Path | None) -> None:
    """generation_config.json: the source folder's, else the one transformers derives
    from the model config (bos / eos / pad token ids)."""
    given = Path(source) / GENERATION_CONFIG if source else None
    if given is not None and given.is_file():
        shutil.copy2(given, folder / GENERATION_CONFIG)
        return

    GenerationConfig.from_model_config(config).save_pretrained(folder)


def tokenizer_files(source: Path | None) -> list[Path]:
    """The tokenizer files and folders of model folder `source` (none: [])."""
    if source is None or not Path(source).is_dir():
        return []
    source = Path(source)
    found = [source / name for name in TOKENIZER_FILES if (source / name).is_file()]
    found += sorted(p for pattern in TOKENIZER_PATTERNS for p in source.glob(pattern) if p.is_file())
    found += [source / name for name in TOKENIZER_DIRS if (source / name).is_dir()]
    return found


def copy_tokenizer(source: Path | None, folder: Path) -> list[str]:
    """Copy the tokenizer of `source` into `folder`; the names copied."""
    names = []
    for path in tokenizer_files(source):
        if path.is_dir():
            shutil.copytree(path, folder / path.name)
        else:
            shutil.copy2(path, folder / path.name)
        names.append(path.name)
    return names


# ---- safetensors, shard by shard, tensor by tensor -------------------------------------
_SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
                       "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
                       "uint8": "U8", "bool": "BOOL"}


def plan_shards(sizes: list[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Tensor names grouped into shards in order, as huggingface_hub splits a state dict:
    a shard takes tensors until the next would pass `max_shard_bytes`; a tensor larger
    than that has a shard of its own."""
    shards: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, nbytes in sizes:
        if nbytes > max_shard_bytes:
            shards.append([name])
            continue
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def write_safetensors(tensors, folder: Path, *, dtype, max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write (name, tensor) pairs, each converted to `dtype`, as model.safetensors or as
    HF shards + index; one tensor in memory at a time. The file names written."""

    items = list(tensors)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    sizes = [(name, tensor.numel() * itemsize) for name, tensor in items]
    groups = plan_shards(sizes, max_shard_bytes)
    by_name = dict(items)
    if len(groups) == 1:
        names = [WEIGHTS]
    else:
        names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for file_name, group in zip(names, groups):
        _write_one(Path(folder) / file_name, [(n, by_name[n]) for n in group], dtype)
    if len(groups) > 1:
        index = {"metadata": {"total_parameters": sum(t.numel() for _, t in items),
                              "total_size": sum(n for _, n in sizes)},
                 "weight_map": {n: f for f, group in zip(names, groups) for n in group}}
        (Path(folder) / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        names.append(WEIGHTS_INDEX)
    return names


def _write_one(path: Path, items: list, dtype) -> None:
    """One safetensors file: an 8-byte header length, the JSON header (padded with
    spaces to 8 bytes), then each tensor's bytes in order (little-endian, row-major)."""

    code = _SAFETENSORS_DTYPES[str(dtype).removeprefix("torch.")]
    itemsize = torch.empty(0, dtype=dtype).element_size()
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, tensor in items:
        nbytes = tensor.numel() * itemsize
        header[name] = {"dtype": code, "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(raw)))
        handle.write(raw)
        for _, tensor in items:
            data = tensor.detach().to("cpu", dtype).contiguous().reshape(-1)
            handle.write(memoryview(data.view(torch.uint8).numpy()))


def _check_finite(flat, what: str) -> None:

    if not bool(torch.isfinite(flat).all()):
        raise ZoError(f"{what} hold non-finite weights: not saved (the run diverged; "
                      f"resume from an earlier snapshot with a smaller --lr)")


def _fsync_tree(folder: Path) -> None:
    """Data of every file under `folder` on disk before the folder is renamed into
    place, and every file and folder in the mode the user's umask gives (one mode for
    everything a run saves, whichever library wrote it: zoplan.io.usual_mode)."""
    for path in (folder, *folder.rglob("*")):
        if path.is_symlink():
            continue
        usual_mode(path)
        if path.is_file():
            with path.open("rb") as handle:
                os.fsync(handle.fileno())
