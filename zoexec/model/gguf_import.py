"""`zoexec import-gguf FILE -o DIR`: an ordinary HF model folder from a GGUF file.

transformers reads GGUF files (`gguf_file=`) but refuses to save_pretrained a model
loaded from one, and loading needs `accelerate`; so the folder is rebuilt here from
transformers' own GGUF readers: the config and the tokenizer as transformers parses
them, the tensors dequantised by the `gguf` package and renamed (and un-permuted,
un-transposed) by transformers' GGUF tensor processors for the architecture, checked
against the model the config describes (every tensor there with its shape, nothing
else), then written with zoexec's exporter: config.json, generation_config.json,
model.safetensors (shards past 5 GB) and the tokenizer files, atomically.

The architectures are those transformers reads from GGUF whose family zoexec takes
apart (Llama, Mistral, Qwen2, Qwen3, Gemma 2, GPT-2, ...; see docs/models.md). The
dequantised model is held in memory once, in the output precision: `dtype` "auto" is
fp32 for a file of F32 weights, fp16 for F16 and bf16 for anything else (quantised
weights dequantise to more bits than they had, not to the original ones).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from zoexec.model.export import (
    atomic_folder,
    save_config,
    save_generation_config,
    write_safetensors,
)
from zoexec.model.families import TORCH_DTYPES, adapter_for
from zoexec.model.quiet import progress_bars_off
from zoplan.errors import ZoError, first_line
from zoplan.io import need_file

if TYPE_CHECKING:
    from gguf import GGUFReader
    from transformers import PretrainedConfig

MAGIC = b"GGUF"


def import_gguf(path: Path, out: Path, *, dtype: str = "auto") -> Path:
    """Write the HF folder `out` (which must not exist) from GGUF file `path`; ZoError
    for a missing or non-GGUF file, an architecture zoexec or transformers cannot take,
    a quantisation gguf cannot dequantise, or tensors that do not fit the config."""
    path, out = Path(path), Path(out)
    _check_file(path)
    if out.exists():
        raise ZoError(f"{out} exists: give -o a folder that does not exist yet")
    reader = _reader(path)
    config = _config(path, reader)
    tensors, out_dtype = _tensors(path, reader, config, dtype)
    try:
        with atomic_folder(out) as tmp:
            save_generation_config(save_config(config, _architecture(config), tmp, out_dtype),
                                   tmp, None)
            write_safetensors(tensors.items(), tmp, dtype=out_dtype)
            _save_tokenizer(path, tmp)
    except OSError as exc:   # a read-only or full destination
        raise ZoError(f"cannot write {out}: {exc.strerror or exc}") from None
    return out


def _check_file(path: Path) -> None:
    need_file(path, what="GGUF file")
    with path.open("rb") as handle:
        head = handle.read(4)
    if head != MAGIC:
        raise ZoError(f"{path} is not a GGUF file (it starts with {head!r}, not {MAGIC!r})")


def _reader(path: Path) -> GGUFReader:
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (ValueError, OSError, IndexError) as exc:
        raise ZoError(f"cannot read the GGUF file {path}: truncated or damaged "
                      f"({first_line(exc)})") from None


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """transformers' GGUF reader logs and draws a progress bar; the command prints its
    own one line. Both are as they were afterwards."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with progress_bars_off(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(verbosity)


def _config(path: Path, reader: GGUFReader) -> PretrainedConfig:
    """The model config transformers parses from the file's metadata, if zoexec has an
    adapter for its family."""
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    arch = _field(reader, "general.architecture")
    try:
        with _quiet():
            parsed = load_gguf_checkpoint(str(path), return_tensors=False)
    except (ValueError, KeyError) as exc:
        raise ZoError(f"{path}: GGUF architecture {arch!r} is not one transformers reads "
                      f"({exc})") from None
    data = {k: v for k, v in parsed["config"].items() if not k.startswith("_")}
    model_type = data.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError) as exc:
        raise ZoError(f"{path}: model_type {model_type!r} from GGUF architecture {arch!r}: "
                      f"{exc}") from None
    adapter_for(config)
    return config


def _field(reader: GGUFReader, key: str) -> str:
    field = reader.fields.get(key)
    if field is None:
        return "?"
    return bytes(field.parts[field.data[0]]).decode(errors="replace")


def _output_dtype(reader: GGUFReader, dtype: str) -> torch.dtype:
    """`dtype` ("auto": the file's F32 / F16, else bf16) as a torch dtype."""
    from gguf import GGMLQuantizationType as Q

    if dtype != "auto":
        if dtype not in TORCH_DTYPES:
            raise ZoError(f"--dtype {dtype!r}: use auto, {', '.join(TORCH_DTYPES)}")
        return TORCH_DTYPES[dtype]
    kinds = {t.tensor_type for t in reader.tensors if len(t.shape) >= 2}
    if kinds <= {Q.F32}:
        return torch.float32
    return torch.float16 if kinds <= {Q.F16} else torch.bfloat16


def _check_quantisations(path: Path, reader: GGUFReader) -> None:
    """Every tensor's type is one the gguf package dequantises."""
    from gguf import GGMLQuantizationType as Q
    from gguf.quants import _type_traits

    known = set(_type_traits) | {Q.F32, Q.F16}
    bad = [t for t in reader.tensors if t.tensor_type not in known]
    if bad:
        kinds = sorted({t.tensor_type.name for t in bad})
        raise ZoError(f"{path}: {len(bad)} of {len(reader.tensors)} tensors are quantised as "
                      f"{', '.join(kinds)}, which the gguf package cannot dequantise "
                      f"(the first: {bad[0].name})")


def _tensors(path: Path, reader: GGUFReader, config: PretrainedConfig,
             dtype: str) -> tuple[dict[str, torch.Tensor], torch.dtype]:
    """{HF name: tensor} of the file, dequantised, renamed by transformers' GGUF
    processors, in the model's own order, each checked against the config's model."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    _check_quantisations(path, reader)
    out_dtype = _output_dtype(reader, dtype)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    with _quiet():
        parsed = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=skeleton,
                                      torch_dtype=out_dtype)
    found = parsed["tensors"]
    expected = dict(skeleton.named_parameters())     # a tied head once
    for name, param in expected.items():
        if name not in found:
            raise ZoError(f"{path}: no tensor for {name} ({len(found)} tensors read, "
                          f"{len(expected)} expected by its config)")
        if tuple(found[name].shape) != tuple(param.shape):
            raise ZoError(f"{path}: {name} has shape {list(found[name].shape)}, its config "
                          f"gives {list(param.shape)}")
        if not bool(torch.isfinite(found[name]).all()):
            raise ZoError(f"{path}: {name} holds non-finite values")
    return {name: found[name] for name in expected}, out_dtype


def _architecture(config: PretrainedConfig) -> str:
    from transformers import AutoModelForCausalLM

    name: str = AutoModelForCausalLM._model_mapping[type(config)].__name__
    return name


def _save_tokenizer(path: Path, folder: Path) -> None:
    """The tokenizer transformers builds from the file's vocabulary, saved as files."""
    from transformers import AutoTokenizer

    try:
        with _quiet():
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, OSError, TypeError) as exc:
        raise ZoError(f"{path}: transformers cannot build its tokenizer ({exc})") from None
    tokenizer.save_pretrained(str(folder))
