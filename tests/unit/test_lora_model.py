"""zoexec.model.lora on its own: the adapters of a block found by module name, PEFT's
initialisation rule, the hook's forward equal to peft's LoraLayer, and the adapter
folder's round trip with its checks (a changed file, other settings)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from zoexec.model.families import adapter_for, build_hf_model
from zoexec.model.lora import (
    ADAPTER_WEIGHTS,
    STATE,
    AdapterHooks,
    init_adapters,
    load_adapters,
    lora_spec,
    save_adapters,
)
from zoexec.model.saved import folder_checksums
from zoexec.reference import peft_lora_model
from zoplan.errors import ZoError
from zoplan.lora import adapter_tensor_numels
from zoplan.models import get_model

TARGETS = ("q_proj", "v_proj")


def _model_and_spec(name="tiny-opt", targets=TARGETS):
    model = build_hf_model(name, seed=1)
    adapter = adapter_for(model.config)
    holder, prefix = adapter.decoder(model), adapter.layer_prefix   # holder.layers: the blocks
    return model, holder, prefix, lora_spec(holder.layers[0], r=8, alpha=16, targets=targets)


@pytest.mark.parametrize("name, targets", [("tiny-opt", TARGETS),
                                           ("tiny-llama", ("q_proj", "k_proj", "down_proj"))])
def test_the_adapters_match_the_planners_shapes(name, targets):
    _, _, _, spec = _model_and_spec(name, targets)
    got = sorted(s.numel for s in spec.specs)
    assert got == sorted(adapter_tensor_numels(get_model(name), r=8, targets=targets))
    assert all(m.rsplit(".", 1)[-1] in targets for m in spec.modules)


def test_an_unknown_target_is_refused():
    model, holder, _, _ = _model_and_spec()
    with pytest.raises(ZoError, match="fc9: no such linear module"):
        lora_spec(holder.layers[0], r=8, alpha=16, targets=("q_proj", "fc9"))


def test_init_is_peft_s_rule_a_kaiming_uniform_b_zero():
    _, _, _, spec = _model_and_spec()
    flat = init_adapters(spec, seed=0, block=2, out=torch.empty(spec.numel))
    for tensor in spec.specs:
        value = flat[tensor.offset:tensor.stop]
        if ".lora_B." in tensor.name:
            assert not value.any()
        else:   # kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
            bound = 1 / math.sqrt(tensor.shape[1])
            assert bound * 0.9 < float(value.abs().max()) <= bound
    again = init_adapters(spec, seed=0, block=2, out=torch.empty(spec.numel))
    other = init_adapters(spec, seed=0, block=3, out=torch.empty(spec.numel))
    assert torch.equal(flat, again) and not torch.equal(flat, other)


def test_the_hook_computes_what_peft_computes():
    model, holder, _, spec = _model_and_spec()
    layer = holder.layers[1]
    flat = init_adapters(spec, seed=4, block=1, out=torch.empty(spec.numel))
    flat += 0.01 * torch.randn(spec.numel, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 5, model.config.hidden_size, generator=torch.Generator().manual_seed(1))
    hooks = AdapterHooks(layer.self_attn, lora_spec(layer.self_attn, r=8, alpha=16,
                                                    targets=TARGETS))
    hooks.bind(flat)
    ours = {name: layer.self_attn.get_submodule(name)(x) for name in hooks.spec.modules}
    hooks.remove()
    wrapped, addresses = peft_lora_model(model, seed=4, r=8, alpha=16, targets=TARGETS)
    with torch.no_grad():
        for param, block, index in addresses:
            if block == 1:
                tensor = spec.specs[index]
                param.copy_(flat[tensor.offset:tensor.stop].view(tensor.shape))
    peft_attn = wrapped.base_model.model.model.decoder.layers[1].self_attn
    for name, value in ours.items():
        torch.testing.assert_close(value, peft_attn.get_submodule(name)(x), rtol=0, atol=1e-6)


def test_the_adapter_folder_round_trips_and_is_checked(tmp_path):
    _, _, prefix, spec = _model_and_spec()
    adapters = torch.randn(4, spec.numel, generator=torch.Generator().manual_seed(2))
    folder = save_adapters(tmp_path / "a", adapters, spec, layer_prefix=prefix, base="tiny-opt",
                           state=lambda tmp: {"step": 5, "files": folder_checksums(tmp)})
    state = json.loads((folder / STATE).read_text())
    assert state["step"] == 5 and set(state["files"]) == {ADAPTER_WEIGHTS, "adapter_config.json"}
    assert torch.equal(load_adapters(folder, spec, layer_prefix=prefix, num_blocks=4), adapters)
    other = lora_spec(_model_and_spec()[1].layers[0], r=4, alpha=16, targets=TARGETS)
    with pytest.raises(ZoError, match="adapters of \\(r, alpha, targets\\)"):
        load_adapters(folder, other, layer_prefix=prefix, num_blocks=4)
    raw = bytearray((folder / ADAPTER_WEIGHTS).read_bytes())
    raw[-1] ^= 1
    (folder / ADAPTER_WEIGHTS).write_bytes(bytes(raw))
    with pytest.raises(ZoError, match="adapter_model.safetensors changed \\(sha256"):
        load_adapters(folder, spec, layer_prefix=prefix, num_blocks=4)
    with pytest.raises(ZoError, match="non-finite"):
        save_adapters(tmp_path / "b", adapters * float("nan"), spec, layer_prefix=prefix,
                      base="x", state={})
    assert not (tmp_path / "b").exists()
