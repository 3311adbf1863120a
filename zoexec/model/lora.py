"""LoRA adapters on the working decoder block, in PEFT's format (zoplan.lora).

Each target linear module of a block (found by its short name in the block module's
own module order, whatever the family) gets A [r, in] and B [out, r]; its output
becomes y = W x + B (A x) * (alpha / r), computed as PEFT's LoraLayer does (x through
lora_A, then lora_B, then the scaling), without PEFT's module wrapping: a forward hook
on the module adds the adapter's term, from views into ONE flat buffer of a block's
adapters (`AdapterHooks.bind`), so a rank keeps every block's adapters as flat fp32
rows and streams nothing for them.

A block's adapter tensors, in the flat buffer and as z tensor indices (zo.z_block with
the block's adapter specs): for each target module in module order, lora_A then lora_B;
names as PEFT's state dict has them inside a block ("self_attn.q_proj.lora_A.weight").
Initialisation as PEFT's (init_lora_weights=True): A Kaiming-uniform with a = sqrt(5),
B zeros, drawn for block b from the seed mix_seed(seed, LORA_TAG, b).

Saved adapters (a snapshot, final/, best/) are a PEFT adapter folder: adapter_model.safetensors
(keys "base_model.model." + the HF module path + ".lora_A.weight", fp32) and
adapter_config.json (peft.LoraConfig: r, lora_alpha, target_modules, task_type
CAUSAL_LM, ...), so peft.PeftModel.from_pretrained(base, folder) loads them; the base's
tokenizer files (a few MB at most), so AutoTokenizer.from_pretrained(folder) works;
state.json records the sha256 of every other file (as a full run's saved weights:
zoexec.run.verify), checked when a resume, `zoexec eval` or `zoexec export --merge`
reads them back.
"""

from __future__ import annotations

import errno
import json
import math
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zoexec.maths.zo import mix_seed
from zoexec.model.export import SaveState, atomic_folder
from zoexec.model.families import TensorSpec, make_specs
from zoexec.model.quiet import progress_bars_off
from zoexec.model.saved import check_saved, model_fingerprint
from zoplan.errors import ZoError, first_line
from zoplan.io import loads_strict, need_folder
from zoplan.modeldir import weight_files

LORA_TAG = 0x4C6F5241            # "LoRA": the adapters' init seeds, apart from init_seed's
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
STATE = "state.json"
PEFT_PREFIX = "base_model.model."

if TYPE_CHECKING:
    from peft import PeftConfig


@dataclass(frozen=True, kw_only=True)
class LoraSpec:
    """The adapters of one block: the target modules' names (in the block), their
    tensors' specs (flat layout, z order) and the scaling alpha / r."""

    r: int
    alpha: int
    targets: tuple[str, ...]
    modules: tuple[str, ...]          # module paths inside a block, e.g. self_attn.q_proj
    specs: tuple[TensorSpec, ...]

    @property
    def numel(self) -> int:
        return self.specs[-1].stop if self.specs else 0

    @property
    def scaling(self) -> float:
        return self.alpha / self.r


def lora_spec(block: nn.Module, *, r: int, alpha: int, targets: tuple[str, ...]) -> LoraSpec:
    """The adapters of `block` (a decoder layer module): every nn.Linear whose short
    name is a target; ZoError when a target matches none."""
    modules = [(name, mod) for name, mod in block.named_modules()
               if isinstance(mod, nn.Linear) and name.rsplit(".", 1)[-1] in targets]
    missing = sorted(set(targets) - {name.rsplit(".", 1)[-1] for name, _ in modules})
    if missing:
        raise ZoError(f"--lora-targets {','.join(missing)}: no such linear module in a "
                      f"{type(block).__name__}")
    named = []
    for name, mod in modules:
        named.append((f"{name}.lora_A.weight", torch.empty(r, mod.in_features, device="meta")))
        named.append((f"{name}.lora_B.weight", torch.empty(mod.out_features, r, device="meta")))
    return LoraSpec(r=r, alpha=alpha, targets=tuple(targets),
                    modules=tuple(name for name, _ in modules), specs=tuple(make_specs(named)))


def init_adapters(spec: LoraSpec, *, seed: int, block: int, out: torch.Tensor) -> torch.Tensor:
    """Block `block`'s initial adapters into the flat fp32 `out`: A as PEFT draws it
    (kaiming_uniform_, a = sqrt(5)), B zeros."""
    gen = torch.Generator(device="cpu").manual_seed(mix_seed(seed, LORA_TAG, block))
    out.zero_()
    for tensor in spec.specs:
        if ".lora_A." in tensor.name:
            weight = torch.empty(tensor.shape, dtype=torch.float32)
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=gen)
            out[tensor.offset:tensor.stop].copy_(weight.reshape(-1))
    return out


class AdapterHooks:
    """Forward hooks on the working block's target modules adding B (A x) * scaling,
    with A and B views into whichever flat adapter buffer is bound."""

    def __init__(self, block: nn.Module, spec: LoraSpec) -> None:
        self.spec = spec
        self.views: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self.handles = [block.get_submodule(name).register_forward_hook(self._hook(name))
                        for name in spec.modules]

    def bind(self, flat: torch.Tensor) -> None:
        """Make the adapters views into `flat` (a block's adapters, spec layout)."""
        assert flat.dim() == 1 and flat.numel() == self.spec.numel, (flat.shape, self.spec.numel)
        specs = iter(self.spec.specs)
        for name in self.spec.modules:
            a, b = next(specs), next(specs)
            self.views[name] = (flat[a.offset:a.stop].view(a.shape),
                                flat[b.offset:b.stop].view(b.shape))

    def _hook(self, name: str) -> Callable[[nn.Module, tuple[Any, ...], torch.Tensor], torch.Tensor]:
        scaling = self.spec.scaling

        def hook(_module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            lora_a, lora_b = self.views[name]
            x = args[0].to(lora_a.dtype)
            delta = nn.functional.linear(nn.functional.linear(x, lora_a), lora_b) * scaling
            return output + delta.to(output.dtype)
        return hook

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []


# ---- PEFT's folder -----------------------------------------------------------------------
def peft_key(layer_prefix: str, block: int, name: str) -> str:
    """The PEFT state-dict key of adapter tensor `name` of block `block`."""
    return f"{PEFT_PREFIX}{layer_prefix}{block}.{name}"


def save_adapters(folder: Path, adapters: torch.Tensor, spec: LoraSpec, *, layer_prefix: str,
                  base: str, state: SaveState = None, tokenizer_from: Path | None = None) -> Path:
    """Write `folder` atomically as a PEFT adapter folder (module docstring) from the
    [blocks, numel] fp32 `adapters`, with the tokenizer files of model folder
    `tokenizer_from` (the base's: AutoTokenizer.from_pretrained(folder) works);
    `state`: as write_peft_folder takes it. Non-finite adapters are refused."""
    from peft import LoraConfig

    if not bool(torch.isfinite(adapters).all()):
        raise ZoError("the LoRA adapters hold non-finite weights: not saved (the run "
                      "diverged; resume from an earlier snapshot with a smaller --lr)")
    tensors = {peft_key(layer_prefix, b, t.name):
               adapters[b, t.offset:t.stop].view(t.shape).to("cpu", torch.float32).clone()
               for b in range(adapters.shape[0]) for t in spec.specs}
    config = LoraConfig(r=spec.r, lora_alpha=spec.alpha, target_modules=list(spec.targets),
                        lora_dropout=0.0, bias="none", task_type="CAUSAL_LM",
                        base_model_name_or_path=base)
    return write_peft_folder(folder, tensors, config, state=state, tokenizer_from=tokenizer_from)


def write_peft_folder(folder: Path, tensors: dict[str, torch.Tensor], config: PeftConfig, *,
                      state: SaveState = None, tokenizer_from: Path | None = None) -> Path:
    """A PEFT adapter folder written aside and renamed (whole or absent): the tensors
    as adapter_model.safetensors, the PEFT `config` (its save_pretrained), the tokenizer
    files of `tokenizer_from` and state.json: `state` (or a function of the folder
    written so far that returns it: the checksums of its files, as a full run's saved
    weights, which a resume checks before it trusts the folder)."""
    from safetensors.torch import save_file

    from zoexec.model.export import copy_tokenizer

    with atomic_folder(Path(folder)) as tmp:
        try:
            save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        except Exception as exc:   # safetensors' own error, even for a full disk: an OSError
            raise OSError(errno.EIO, f"{ADAPTER_WEIGHTS}: {first_line(exc)}") from exc
        config.save_pretrained(str(tmp))
        copy_tokenizer(tokenizer_from, tmp)
        if state is not None:
            content = state(tmp) if callable(state) else state
            (tmp / STATE).write_text(json.dumps(content, indent=1, allow_nan=False) + "\n")
    return Path(folder)


def load_adapters(folder: Path, spec: LoraSpec, *, layer_prefix: str,
                  num_blocks: int) -> torch.Tensor:
    """The [blocks, numel] fp32 adapters of a folder save_adapters (or PEFT) wrote: its
    files checked (check_adapter_file), its adapter settings and every key and shape
    against `spec` (ZoError naming what differs)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    check_adapter_file(folder)
    check_adapter_config(folder, spec.r, spec.alpha, spec.targets, what="the plan's")
    tensors = load_file(str(folder / ADAPTER_WEIGHTS))
    out = torch.empty(num_blocks, spec.numel, dtype=torch.float32)
    expected = {peft_key(layer_prefix, b, t.name) for b in range(num_blocks) for t in spec.specs}
    if set(tensors) != expected:
        extra, missing = sorted(set(tensors) - expected), sorted(expected - set(tensors))
        raise ZoError(f"{folder / ADAPTER_WEIGHTS}: keys differ from the plan's adapters "
                      f"(missing {missing[:2]}, unexpected {extra[:2]})")
    for b in range(num_blocks):
        for t in spec.specs:
            value = tensors[peft_key(layer_prefix, b, t.name)]
            if tuple(value.shape) != t.shape:
                raise ZoError(f"{folder}: {peft_key(layer_prefix, b, t.name)} has shape "
                              f"{tuple(value.shape)}, expected {t.shape}")
            out[b, t.offset:t.stop] = value.reshape(-1)
    return out


def check_adapter_file(folder: Path) -> None:
    """ZoError unless a folder zoexec wrote (one with a state.json) is whole: every file
    as the checksums its state.json records (zoexec.model.saved.check_saved). A folder
    without state.json (PEFT's own save_pretrained writes none) is checked by whoever
    reads it: `zoexec eval` checks the weights file's framing (zoexec.launch.evaluate);
    a resume reads only snapshots whose checksums hold (zoexec.run.folder)."""
    folder = Path(folder)
    if (folder / STATE).is_file():
        problem = check_saved(folder)
        if problem:
            raise ZoError(f"{folder}: {problem}: the adapters were changed or torn")


def check_adapter_config(folder: Path, r: object, alpha: object, targets: Collection[str], *,
                         what: str) -> None:
    """ZoError unless adapter_config.json's (r, lora_alpha, target_modules) are these."""
    config = _read_json(Path(folder) / ADAPTER_CONFIG)
    got = (config.get("r"), config.get("lora_alpha"), sorted(config.get("target_modules") or []))
    want = (r, alpha, sorted(targets))
    if got != want:
        raise ZoError(f"{folder}: adapters of (r, alpha, targets) {got}, {what} are {want}")


# PEFT LoraConfig settings that change what the adapters compute; each must be off
# (None, False, "none", empty) for y = W x + B (A x) * alpha / r on every block, which
# is what zoexec computes
LORA_EXTRAS = ("use_rslora", "use_dora", "use_qalora", "bias", "lora_bias", "fan_in_fan_out",
               "rank_pattern", "alpha_pattern", "layers_to_transform", "modules_to_save",
               "exclude_modules", "trainable_token_indices", "target_parameters",
               "layer_replication", "alora_invocation_tokens")
_OFF: tuple[object, ...] = (None, False, "none", [], {})


def adapter_settings(folder: Path) -> dict[str, Any]:
    """What a PEFT LoRA folder's adapter_config.json says that zoexec reads: {"r",
    "alpha", "targets", "base"} (base: base_model_name_or_path, may be None); a ZoError
    for a folder that is not LoRA or uses a setting zoexec does not compute (DoRA,
    rsLoRA, per-layer ranks, ...)."""
    folder = Path(folder)
    config = _read_json(folder / ADAPTER_CONFIG)
    if config.get("peft_type") != "LORA":
        raise ZoError(f"{folder / ADAPTER_CONFIG}: peft_type {config.get('peft_type')!r}, "
                      f"zoexec reads LORA adapters")
    for key in LORA_EXTRAS:
        if config.get(key) not in _OFF:
            raise ZoError(f"{folder / ADAPTER_CONFIG}: {key} {config[key]!r}: zoexec computes "
                          f"plain LoRA only (y = W x + B A x * alpha / r on every block)")
    targets = config.get("target_modules")
    r, alpha = config.get("r"), config.get("lora_alpha")
    if not (isinstance(targets, list) and targets and all(isinstance(t, str) for t in targets)) \
            or not isinstance(r, int) or not isinstance(alpha, int):
        raise ZoError(f"{folder / ADAPTER_CONFIG}: give r, lora_alpha (whole numbers) and "
                      f"target_modules (a list of module names); got r {r!r}, lora_alpha "
                      f"{alpha!r}, target_modules {targets!r}")
    return {"r": r, "alpha": alpha, "targets": tuple(targets),
            "base": config.get("base_model_name_or_path")}


def is_adapter_folder(folder: Path | str | None) -> bool:
    return folder is not None and (Path(folder) / ADAPTER_WEIGHTS).is_file()


def _read_json(path: Path) -> dict[str, Any]:   # a JSON object: its values unchecked
    try:
        data = loads_strict(path.read_text())
    except (OSError, ValueError) as exc:
        raise ZoError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ZoError(f"{path}: not a JSON object")
    return data


# ---- merging (zoexec export --merge) ---------------------------------------------------------
def merge_adapters(adapter_dir: Path, base_dir: Path, out_dir: Path, *,
                   accept_other_base: bool = False) -> Path:
    """Load the base HF model, apply the PEFT adapters, merge_and_unload, save the plain
    HF model (and the base's tokenizer) into `out_dir` (written aside and renamed:
    whole or absent). Checked first (check_merge): the adapters' files against their
    checksums, their settings against the run's, the base against the run's."""
    check_merge(Path(adapter_dir), Path(base_dir), accept_other_base=accept_other_base)
    with progress_bars_off():   # the command's one line is its output
        return _merged(adapter_dir, base_dir, out_dir)


def _merged(adapter_dir: Path, base_dir: Path, out_dir: Path) -> Path:
    """merge_adapters' work, its checks done."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from zoexec.model.export import copy_tokenizer

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)   # peft calls deprecated names
            base = AutoModelForCausalLM.from_pretrained(str(base_dir), local_files_only=True)
            merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ZoError(f"cannot merge {adapter_dir} into {base_dir}: {first_line(exc)}") from None
    try:
        with atomic_folder(Path(out_dir)) as tmp:
            merged.save_pretrained(str(tmp))
            copy_tokenizer(Path(base_dir), tmp)
    except Exception as exc:   # safetensors raises its own error for a full disk
        raise ZoError(f"cannot write {out_dir}: {getattr(exc, 'strerror', None) or first_line(exc)}") from None
    return Path(out_dir)


def check_merge(adapter_dir: Path, base_dir: Path, *, accept_other_base: bool) -> None:
    """ZoError (one line) unless `adapter_dir` is a whole adapter folder a LoRA run
    saved (every file's sha256 as its state.json records; adapter_config.json's r,
    lora_alpha and target_modules the run's) and `base_dir` is the base the run trained
    on (the fingerprint the run recorded: zoexec.model.saved.model_fingerprint),
    unless `accept_other_base` (a deliberate swap)."""
    need_folder(adapter_dir, what="--merge")
    need_folder(base_dir, what="--base")
    if not is_adapter_folder(adapter_dir):
        raise ZoError(f"--merge {adapter_dir}: not a LoRA adapter folder (no {ADAPTER_WEIGHTS})")
    if _read_json(adapter_dir / ADAPTER_CONFIG).get("peft_type") == "PREFIX_TUNING":
        raise ZoError(f"--merge {adapter_dir}: a prefix has no weights to merge into the base "
                      f"(it is extra keys and values); load it with PeftModel.from_pretrained "
                      f"or evaluate it with zoexec eval {adapter_dir}")
    if not (base_dir / "config.json").is_file():
        raise ZoError(f"--base {base_dir}: not an HF model folder (no config.json)")
    weight_files(base_dir)   # every shard inside the folder (transformers would open any)
    problem = check_saved(adapter_dir)
    if problem:
        raise ZoError(f"--merge {adapter_dir}: {problem}: the adapters are not as the run "
                      f"saved them")
    state = _read_json(adapter_dir / STATE)
    lora, base = state.get("lora"), state.get("base")
    if not isinstance(lora, dict):
        raise ZoError(f"--merge {adapter_dir}: {adapter_dir / STATE} records no LoRA settings "
                      f"(not saved by a LoRA run of this zoexec)")
    check_adapter_config(adapter_dir, lora.get("r"), lora.get("alpha"), lora.get("targets") or (),
                         what="the run's")
    if accept_other_base:
        return
    if not isinstance(base, dict) or not base.get("fingerprint"):
        raise ZoError(f"--base {base_dir}: the run trained on random weights (no model "
                      f"folder recorded): no base to check it against; give "
                      f"--accept-other-base to merge into it")
    have = model_fingerprint(base_dir)
    if have != base["fingerprint"]:
        raise ZoError(f"--base {base_dir} is not the base the run trained on ({base.get('path')}:"
                      f" fingerprint {str(base['fingerprint'])[:12]}, this one {have[:12]}); "
                      f"give --accept-other-base to merge into another base on purpose")
